"""A planned candidate as the launch settings frameworks take.

* Megatron-LM: the command-line sizes (`--tensor-model-parallel-size`, ...) and its rank order.
  Megatron numbers ranks by an order string over the tokens `tp cp ep dp pp`, innermost first
  (megatron/core/parallel_state.py, `RankGenerator`: rank = sum of each token's coordinate
  times the product of the sizes before it). Its command line offers two orders,
  `tp-cp-ep-dp-pp` (default) and `tp-cp-ep-pp-dp` (`--use-tp-pp-dp-mapping`)
  (megatron/training/initialize.py). A placement is expressible when it is a permutation of
  whole axes (synth.export.mesh.axis_order) whose order, ignoring roles of size 1, is one of
  those two (and, for the second, not with context and pipeline parallelism both on, which
  megatron-core's initialize_model_parallel refuses); otherwise the reason is given and the
  rank lists / DeviceMesh are the way. The order itself is synth.export.mesh.megatron_order.
  A candidate is *launchable* by Megatron when its placement is expressible so; the planner
  names the best launchable candidate when the winner is not (`--launchable` keeps only those).
  The arguments pass megatron-core's own checks (TransformerConfig: full recomputation needs a
  method and `--recompute-num-layers`), and the environment holds what Megatron-LM's
  validate_args asserts (`CUDA_DEVICE_MAX_CONNECTIONS=1` whenever tensor or context
  parallelism is on; megatron/training/arguments.py).
* torch: the `DeviceMesh` rank array with dimension names `pp, dp, cp, tp` (sizes > 1); with
  experts `pp, edp, ep, cp, tp`, and the dense data-parallel group (`edp` and `ep` together)
  given too (`data_parallel`, `rank_groups.dp`).
* JAX: the shapes `jax.experimental.mesh_utils.create_hybrid_device_mesh(mesh_shape,
  dcn_mesh_shape, process_is_granule=True)` takes: per axis its factor inside a node (the
  innermost level, one process per node) and across nodes (the product of the outer levels'
  factors). That helper lays each node's devices out row-major in `mesh_shape` and the nodes
  row-major in `dcn_mesh_shape`; when the placement interleaves axes across two outer levels
  that layout differs from the placement's, and the permutation for `Mesh` is the way.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import numpy as np

from synth.export.mesh import MegatronOrder, device_mesh_array, jax_permutation, megatron_order
from synth.names import product
from synth.placement import Placement
from synth.plan.degrees import Degrees
from synth.plan.dispatcher import NO_EQUIVALENT, MoeDispatcher, megatron_dispatcher  # noqa: F401 (the launch's names)
from synth.plan.formulas import stage_layers
from synth.plan.model import Transformer
from synth.plan.step import Prediction


def megatron_launchable(placement: Placement, degrees: Degrees | None = None) -> bool:
    """Whether Megatron-LM can launch this placement of these degrees: its rank order is one
    Megatron's command line selects and megatron-core accepts for them (megatron_launch_order;
    without degrees, the placement's order alone)."""
    return megatron_launch_order(placement, degrees).order is not None


def megatron_model_arguments(model: Transformer, dispatcher: MoeDispatcher | None = None) -> list[str]:
    """The model's shape and architecture on Megatron-LM's command line (pretrain_gpt.py): the
    flags that make Megatron build the model the plan priced (Megatron's defaults are GPT's:
    learned positions, biases, tied embeddings, GeLU FFN, dropout 0.1, LayerNorm)."""
    args = ["--num-layers", str(model.layers), "--hidden-size", str(model.hidden),
            "--ffn-hidden-size", str(model.ffn), "--num-attention-heads", str(model.heads)]
    if model.kv_lora_rank:  # Megatron-Core's MultiLatentAttention
        args += ["--multi-latent-attention", "--kv-lora-rank", str(model.kv_lora_rank),
                 "--qk-head-dim", str(model.qk_nope_head_dim), "--qk-pos-emb-head-dim", str(model.qk_rope_head_dim),
                 "--v-head-dim", str(model.v_head_dim)]
        args += ["--q-lora-rank", str(model.q_lora_rank)] if model.q_lora_rank else []
    elif model.query_groups != model.heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.query_groups)]
    if model.head_size:
        args += ["--kv-channels", str(model.head_size)]
    args += ["--seq-length", str(model.seq_len), "--max-position-embeddings", str(model.seq_len)]
    if model.gated_mlp:
        args.append("--swiglu")
    if not model.biases:
        args += ["--disable-bias-linear", "--normalization", "RMSNorm"]
    if not model.learned_positions:
        args += ["--position-embedding-type", "rope"]
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not model.dropout:
        args += ["--attention-dropout", "0", "--hidden-dropout", "0"]
    if model.precision != "fp32":
        args.append(f"--{model.precision}")
    return args + megatron_moe_arguments(model, dispatcher)


def megatron_moe_arguments(model: Transformer, dispatcher: MoeDispatcher | None = None) -> list[str]:
    """The MoE layers on Megatron-LM's command line (megatron/training/arguments.py, _add_moe_args;
    megatron-core's TransformerConfig fields num_moe_experts, moe_router_topk, ...): the experts,
    their routing and sizes, which layers (`--moe-layer-freq` as Megatron's pattern expression,
    e.g. `([0]*1+[1]*27)`), the group-limited routing, the capacity (padded, as priced) and the
    all-to-all dispatcher the plan priced (synth/plan/dispatcher.py). Nothing for a dense model."""
    if not model.is_moe:
        return []
    from synth.plan import moe

    args = ["--num-experts", str(model.experts), "--moe-router-topk", str(model.top_k),
            "--moe-ffn-hidden-size", str(moe.expert_ffn(model)),
            *(dispatcher.arguments if dispatcher is not None else ("--moe-token-dispatcher-type", "alltoall"))]
    if model.shared_ffn:
        args += ["--moe-shared-expert-intermediate-size", str(model.shared_ffn)]
    if model.router_groups:  # group-limited routing, as the expert term prices it (synth/plan/moe.py node_limit)
        args += ["--moe-router-num-groups", str(model.router_groups),
                 "--moe-router-group-topk", str(model.router_group_topk)]
    pattern = [1 if moe.is_moe_layer(model, index) else 0 for index in range(model.layers)]
    if 0 in pattern:
        args += ["--moe-layer-freq", moe_layer_pattern(pattern)]
    if model.capacity_factor:
        args += ["--moe-expert-capacity-factor", f"{model.capacity_factor:g}", "--moe-pad-expert-input-to-capacity"]
    return args


def moe_layer_pattern(pattern: list[int]) -> str:
    """A 0/1 per-layer list as Megatron's `--moe-layer-freq` expression: runs, `([0]*1+[1]*27)`."""
    runs: list[list[int]] = []
    for value in pattern:
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return "(" + "+".join(f"[{value}]*{count}" for value, count in runs) + ")"


def megatron_environment(prediction: Prediction) -> dict[str, str]:
    """Environment variables Megatron-LM requires for this candidate: validate_args asserts
    CUDA_DEVICE_MAX_CONNECTIONS=1 with tensor or context parallelism (on GPUs before
    Blackwell; harmless after), so that communication kernels are queued in issue order."""
    degrees = prediction.degrees
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if degrees.tp > 1 or degrees.cp > 1 else {}


def megatron_command(model: Transformer, prediction: Prediction, topology=None) -> str:
    """One shell line: the environment, then pretrain_gpt.py's arguments (data, tokenizer and
    launcher left to the user)."""
    environment = " ".join(f"{name}={value}" for name, value in megatron_environment(prediction).items())
    arguments = shlex.join(megatron_arguments(model, prediction, topology))  # quoted: a MoE layer pattern has brackets
    return " ".join(part for part in (environment, "pretrain_gpt.py", arguments) if part)


def megatron_arguments(model: Transformer, prediction: Prediction, topology=None) -> list[str]:
    """The model, sizes and settings on Megatron-LM's command line (pretrain_gpt.py); the MoE
    dispatcher for the placement on `topology` (megatron_dispatcher)."""
    dispatcher = megatron_dispatcher(model, prediction.placement, topology, prediction.degrees.expert_group())
    return megatron_model_arguments(model, dispatcher) + megatron_parallel_arguments(model, prediction)


def megatron_parallel_arguments(model: Transformer, prediction: Prediction) -> list[str]:
    """The degrees and settings on Megatron-LM's command line."""
    degrees, settings = prediction.degrees, prediction.settings
    args = ["--tensor-model-parallel-size", str(degrees.tp), "--pipeline-model-parallel-size", str(degrees.pp)]
    if degrees.cp > 1:
        args += ["--context-parallel-size", str(degrees.cp)]
    if model.is_moe:
        # Expert tensor parallelism as the plan priced it: the tensor-parallel degree (Megatron's
        # default) or, folded, its own (synth/plan/folding.py).
        args += ["--expert-model-parallel-size", str(degrees.ep), "--expert-tensor-parallel-size", str(degrees.expert_tp)]
    if settings.virtual > 1:
        args += ["--num-layers-per-virtual-pipeline-stage", str(model.layers // (degrees.pp * settings.virtual))]
    stages = stage_layers(model.layers, degrees.pp)
    if stages is not None and stages.uneven:
        args += ["--decoder-first-pipeline-num-layers", str(stages.first),
                 "--decoder-last-pipeline-num-layers", str(stages.last)]
    args += ["--micro-batch-size", str(settings.micro_batch), "--global-batch-size", str(model.global_batch)]
    if settings.sequence_parallel:
        args.append("--sequence-parallel")
    if settings.recompute == "full":
        # Every layer's input kept, each layer recomputed alone (the memory model's 2sbh per
        # layer); megatron-core's TransformerConfig refuses full recomputation without the count.
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    elif settings.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    if settings.sharded_optimizer:
        args.append("--use-distributed-optimizer")
        if settings.zero > 1:  # Megatron-FSDP's required flags (its README, "Required Configurations")
            args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                     "optim_grads" if settings.zero == 2 else "optim_grads_params", "--no-gradient-accumulation-fusion"]
        if settings.hsdp:  # sharded inside the node, replicated across: one optimizer instance per replica
            from synth.plan.step import hsdp_placement

            split = hsdp_placement(prediction.placement)
            replicas = split.axis_sizes[split.axis_index("dp_replica")]
            args += ["--outer-dp-sharding-strategy", "no_shard", "--num-distributed-optimizer-instances", str(replicas)]
    if degrees.dp > 1 and settings.overlap_gradients:
        args.append("--overlap-grad-reduce")
    if settings.overlap_param_gather:
        args.append("--overlap-param-gather")
    if settings.tp_overlap:
        args.append("--tp-comm-overlap")
    if settings.ep_overlap:  # megatron-core's overlap_moe_expert_parallel_comm (step.ep_overlap_problem)
        args.append("--overlap-moe-expert-parallel-comm")
    if settings.offload_layers:  # megatron-core's layer-level CPU offloading (synth/plan/offload.py)
        args += ["--cpu-offloading", "--cpu-offloading-num-layers", str(settings.offload_layers)]
    if settings.virtual > 1 and not settings.overlap_p2p:  # Megatron overlaps by default when interleaved
        args.append("--no-overlap-p2p-communication")
    order = launch_order(prediction)
    if order.flag:
        args.append(order.flag)
    return args


def launch_order(prediction: Prediction) -> MegatronOrder:
    """The Megatron order of the candidate (megatron_launch_order of its placement and degrees)."""
    return megatron_launch_order(prediction.placement, prediction.degrees)


def megatron_launch_order(placement: Placement, degrees: Degrees | None = None) -> MegatronOrder:
    """The Megatron order of the placement (synth.export.mesh.megatron_order), less the one
    megatron-core refuses for folded experts: with --use-tp-pp-dp-mapping and pipeline
    parallelism, initialize_model_parallel asserts that the attention and MoE layers' data-
    parallel sizes are equal (its expert rank generator shares the order string). The one rule
    behind the printed launch, the best launchable candidate and `--launchable`'s filter."""
    order = megatron_order(placement)
    if degrees is not None and order.flag and degrees.folded and degrees.pp > 1 and degrees.expert_dp != degrees.dp:
        return MegatronOrder(None, None, (
            f"not launchable by Megatron: the placement numbers ranks with {order.flag}, which megatron-core's "
            f"initialize_model_parallel refuses with pipeline parallelism when the MoE layers' data-parallel size "
            f"({degrees.expert_dp}) differs from the attention layers' ({degrees.dp}); use the rank lists"))
    return order


@dataclass(frozen=True)
class HybridMesh:
    mesh_shape: tuple[int, ...] | None  # inside one node (ICI), per axis
    dcn_mesh_shape: tuple[int, ...] | None  # across nodes (DCN), per axis
    axis_names: tuple[str, ...]
    reason: str


def hybrid_mesh_layout(mesh_shape, dcn_mesh_shape, devices_per_node: int) -> np.ndarray:
    """The ranks create_hybrid_device_mesh(mesh_shape, dcn_mesh_shape, process_is_granule=True)
    puts at each mesh position, for devices numbered node-major (its documented layout: each
    node's devices reshaped row-major to mesh_shape, the nodes' blocks tiled row-major over
    dcn_mesh_shape)."""
    nodes = product(dcn_mesh_shape)
    blocks = np.arange(nodes * devices_per_node).reshape((nodes,) + tuple(mesh_shape))
    grid = blocks.reshape(tuple(dcn_mesh_shape) + tuple(mesh_shape))
    dims = len(mesh_shape)
    order = [axis for pair in zip(range(dims), range(dims, 2 * dims)) for axis in pair]
    return grid.transpose(order).reshape(tuple(a * b for a, b in zip(dcn_mesh_shape, mesh_shape)))


def jax_hybrid_mesh(placement: Placement) -> HybridMesh:
    """The within-node and across-node mesh shapes, checked against the helper's layout."""
    names = placement.axis_names
    inner = tuple(row[-1] for row in placement.matrix)
    outer = tuple(product(row[:-1]) for row in placement.matrix)
    expected = device_mesh_array(placement)
    got = hybrid_mesh_layout(inner, outer, placement.level_sizes[-1])
    if np.array_equal(got, expected):
        return HybridMesh(inner, outer, names, "one process per node (process_is_granule=True), devices in rank order")
    return HybridMesh(None, None, names, (
        "not expressible as create_hybrid_device_mesh shapes: the placement interleaves axes across the outer "
        "levels, which the helper tiles row-major; use Mesh(np.array(jax.devices())[perm].reshape(shape), names) "
        "with the device permutation"))


def launch_document(model: Transformer, prediction: Prediction, topology=None) -> dict:
    """Everything a launcher needs for one candidate, as JSON. With experts the axes are named
    for what they are (Degrees.exported_names: `edp` the expert data-parallel group, `ep` the
    expert-parallel one) and `data_parallel` gives the dense data-parallel group, the two axes
    together, in every form (Megatron builds both groups). Folded experts (synth/plan/folding.py)
    keep the dense axes' names and give the expert groups as rank lists, `rank_groups.ep`,
    `etp` and `edp`, in `expert_parallel` (Megatron's expert rank generator's groups)."""
    placement, degrees = prediction.placement, prediction.degrees
    order = launch_order(prediction)
    hybrid = jax_hybrid_mesh(placement)
    names = list(degrees.exported_names(placement.axis_names))
    groups = {name: placement.axis_groups(axis) for name, axis in zip(names, placement.axis_names)}
    document = {
        "degrees": degrees.to_json(),
        "settings": prediction.settings.to_json(),
        "placement": placement.to_text(),
        "axes": dict(zip(names, placement.axis_sizes)),
        "megatron": {"launchable": order.order is not None,
                     "arguments": megatron_arguments(model, prediction, topology),
                     "environment": megatron_environment(prediction), "order": order.order,
                     "flag": order.flag, "statement": order.reason},
        "torch_device_mesh": {"mesh": device_mesh_array(placement).tolist(), "mesh_dim_names": names},
        "jax": {"mesh_shape": list(hybrid.mesh_shape) if hybrid.mesh_shape else None,
                "dcn_mesh_shape": list(hybrid.dcn_mesh_shape) if hybrid.dcn_mesh_shape else None,
                "axis_names": names, "statement": hybrid.reason,
                "device_permutation": jax_permutation(placement)},
        "rank_groups": groups,
    }
    dispatcher = megatron_dispatcher(model, placement, topology, degrees.expert_group())
    if dispatcher is not None:
        document["megatron"]["moe_dispatcher"] = {"arguments": list(dispatcher.arguments), "form": dispatcher.form,
                                                  "statement": dispatcher.statement}
    if degrees.folded:
        expert = {group.name: group for group in (degrees.expert_group(), degrees.expert_tp_group())
                  if group.size > 1}
        if degrees.expert_dp > 1:
            expert["edp"] = degrees.expert_data_axes()
        groups.update({name: group.groups(placement) for name, group in expert.items()})
        document["expert_parallel"] = {
            "ep": degrees.ep, "etp": degrees.expert_tp, "edp": degrees.expert_dp, "groups": sorted(expert),
            "statement": (f"MoE parallel folding: the expert layers number each pipeline stage's {degrees.tp * degrees.cp * degrees.dp} "
                          f"ranks etp-ep-edp innermost first ({degrees.expert_tp} x {degrees.ep} x {degrees.expert_dp}) "
                          f"over the dense tp-cp-dp index: rank_groups.{', rank_groups.'.join(sorted(expert))}")}
    elif degrees.ep > 1:
        if order.order is not None:
            document["megatron"]["statement"] += "; its dp token there is the expert generator's, the edp axis"
        dense = list(degrees.exported_names(degrees.data_axes()))
        groups["dp"] = placement.groups_over(degrees.data_axes())
        document["data_parallel"] = {
            "size": degrees.dp, "axes": dense,
            "statement": (f"the dense weights' data-parallel group (size {degrees.dp}) spans the axes "
                          f"{', '.join(dense)}: rank_groups.dp; the expert data-parallel group (size "
                          f"{degrees.expert_dp}, the experts' gradients) is {'the axis edp' if 'edp' in names else 'each rank alone'}"),
            "torch": f"mesh[{', '.join(map(repr, dense))}]._flatten('dp')" if len(dense) > 1 else f"mesh[{dense[0]!r}]",
            "jax": f"psum(x, {tuple(dense)!r})" if len(dense) > 1 else f"psum(x, {dense[0]!r})"}
    return document


def published_placement(degrees: Degrees, topology, flag: str | None = None) -> Placement:
    """The placement Megatron's default order (or the tp-pp-dp one) gives these degrees on this system."""
    from synth.placement import make_placement

    order = "tp-cp-ep-pp-dp" if flag else "tp-cp-ep-dp-pp"
    axes = degrees.axes()
    sizes = {axis.name: axis.size for axis in axes}
    # Fill levels innermost first with the axes innermost first, as rank numbering does; the
    # result is checked against Megatron's own numbering below.
    remaining = list(topology.sizes)
    matrix = {axis.name: [1] * len(remaining) for axis in axes}
    level = len(remaining) - 1
    for token in order.split("-"):
        size = sizes.get(token, 1)
        while size > 1:
            if level < 0:
                raise ValueError("the degrees do not fit the system")
            take = np.gcd(size, remaining[level])
            if take == 1:
                level -= 1
                continue
            matrix[token][level] *= int(take)
            remaining[level] //= int(take)
            size //= int(take)
            if remaining[level] == 1:
                level -= 1
    placement = make_placement(topology, axes, tuple(tuple(matrix[axis.name]) for axis in axes))
    if not np.array_equal(device_mesh_array(placement), megatron_rank_mesh(degrees, order)):
        raise ValueError(f"Megatron's order {order} with {degrees.text} is not a placement on {topology.name}")
    return placement


def megatron_rank_mesh(degrees: Degrees, order: str) -> np.ndarray:
    """`mesh[x_pp, x_dp, x_cp, x_tp]` (roles of size > 1) = the rank Megatron's RankGenerator
    gives those coordinates: each token's coordinate times the product of the sizes of the
    tokens before it in the order string."""
    axes = degrees.axes()
    shape = tuple(axis.size for axis in axes)
    coordinates = np.indices(shape)
    rank = np.zeros(shape, dtype=np.int64)
    stride = 1
    for token in order.split("-"):
        size = degrees.axis_size(token) if token in ("dp", "ep", "tp", "pp", "cp") else 1
        names = [axis.name for axis in axes]
        if token in names and size > 1:
            rank += coordinates[names.index(token)] * stride
        stride *= size
    return rank
