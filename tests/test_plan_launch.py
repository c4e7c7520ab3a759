"""The planner's launch exports against the frameworks' own rules: Megatron-LM's RankGenerator
(megatron-core) and JAX's create_hybrid_device_mesh, each called itself when installed; the
memoized communication costs against fresh searches."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from synth.search import BestPrograms
from synth.model.context import cost_context
from synth.export.mesh import device_mesh_array
from synth.hierarchy import build_hierarchy
from synth.placement import enumerate_placements
from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import Degrees
from synth.cli import main
from synth.plan.launch import (hybrid_mesh_layout, jax_hybrid_mesh, megatron_arguments, megatron_environment,
                               megatron_launchable, megatron_order, megatron_rank_mesh, published_placement)
from synth.plan.model import PRESETS
from synth.plan.step import Settings
from synth.topology_file import load_topology

CASES = [(load_topology("dgx-a100-x4"), Degrees(2, 4, 4)), (load_topology("dgx-a100-x4"), Degrees(4, 8, 1)),
         (load_topology("dgx-h100-2x8x8"), Degrees(4, 8, 4)), (load_topology("dgx-h100-2x8x8"), Degrees(8, 2, 4, 2))]


def _groups_by_role(placement):
    return {name: sorted(sorted(group) for group in placement.axis_groups(name)) for name in placement.axis_names}


def _megatron_groups(degrees, order):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_state = pytest.importorskip("megatron.core.parallel_state",
                                             reason="megatron-core is not installed (pip install megatron-core==0.16.1)")
    generator = parallel_state.RankGenerator(tp=degrees.tp, ep=1, dp=degrees.dp, pp=degrees.pp, cp=degrees.cp,
                                             order=order)
    return {role: sorted(sorted(group) for group in generator.get_ranks(role))
            for role in ("pp", "dp", "cp", "tp") if degrees.of(role) > 1}


@pytest.mark.parametrize("topology, degrees", CASES)
def test_megatron_order_numbers_ranks_like_the_placement(topology, degrees):
    for placement in enumerate_placements(topology, degrees.axes()):
        order = megatron_order(placement)
        expressible = order.order is not None
        mesh = device_mesh_array(placement)
        for megatron, flag in (("tp-cp-ep-dp-pp", None), ("tp-cp-ep-pp-dp", "--use-tp-pp-dp-mapping")):
            same = np.array_equal(mesh, megatron_rank_mesh(degrees, megatron))
            refused = flag is not None and degrees.cp > 1 and degrees.pp > 1  # initialize_model_parallel asserts
            if same:
                assert expressible != refused, (placement.to_text(), megatron)
        if expressible:
            assert np.array_equal(mesh, megatron_rank_mesh(degrees, order.order))


@pytest.mark.parametrize("topology, degrees", CASES)
def test_megatron_rank_generator_agrees(topology, degrees):
    """Megatron's own RankGenerator gives the placement's groups for the order we name."""
    checked = 0
    for placement in enumerate_placements(topology, degrees.axes()):
        order = megatron_order(placement)
        if order.order is None:
            continue
        assert _megatron_groups(degrees, order.order) == _groups_by_role(placement)
        checked += 1
    assert checked >= 1
    default = published_placement(degrees, topology)
    assert megatron_order(default).order == "tp-cp-ep-dp-pp"
    assert _megatron_groups(degrees, "tp-cp-ep-dp-pp") == _groups_by_role(default)


def test_not_expressible_orders_say_why():
    topology = load_topology("dgx-a100-x4")
    placements = enumerate_placements(topology, Degrees(2, 4, 4).axes())
    refused = [megatron_order(p) for p in placements if megatron_order(p).order is None]
    assert refused and all("not expressible" in order.reason for order in refused)


def _fake_devices(nodes, per_node):
    return [SimpleNamespace(id=rank, process_index=rank // per_node, platform="gpu", device_kind="fake")
            for rank in range(nodes * per_node)]


@pytest.mark.parametrize("topology, degrees", CASES)
def test_jax_hybrid_mesh_shapes_against_create_hybrid_device_mesh(topology, degrees):
    for placement in enumerate_placements(topology, degrees.axes()):
        hybrid = jax_hybrid_mesh(placement)
        inner = tuple(row[-1] for row in placement.matrix)
        outer = tuple(int(np.prod(row[:-1])) for row in placement.matrix)
        layout = hybrid_mesh_layout(inner, outer, placement.level_sizes[-1])
        assert (hybrid.mesh_shape is not None) == np.array_equal(layout, device_mesh_array(placement))
        if hybrid.mesh_shape is None:
            continue
        mesh_utils = pytest.importorskip("jax.experimental.mesh_utils")
        nodes = int(np.prod(outer))
        devices = _fake_devices(nodes, placement.level_sizes[-1])
        mesh = mesh_utils.create_hybrid_device_mesh(hybrid.mesh_shape, hybrid.dcn_mesh_shape, devices,
                                                    process_is_granule=True)
        ranks = np.vectorize(lambda device: device.id)(mesh)
        assert np.array_equal(ranks, device_mesh_array(placement)), placement.to_text()


def test_memoized_costs_equal_fresh_searches():
    """Placements whose reduced axes span the same units per level cost the same (costs.py)."""
    topology = load_topology("dgx-h100-2x8x8")
    costs = CommunicationCosts(topology)
    checked = 0
    placements = enumerate_placements(topology, Degrees(8, 4, 4).axes())
    for placement in placements:
        for axes, size in ((("dp",), 3 << 20), (("tp",), 64 << 20)):
            memoized = costs.all_reduce(placement, axes, size)
            fresh = BestPrograms(cost_context(build_hierarchy(placement, axes), topology)).best(size)
            assert (memoized.program, memoized.time_s) == (str(fresh.program), fresh.time_s)
            checked += 1
    assert checked == 2 * len(placements)
    assert len(costs._best) < checked  # some placements shared a search


def test_point_to_point_contention_and_levels():
    topology = load_topology("dgx-a100-x4")
    costs = CommunicationCosts(topology)
    inside = published_placement(Degrees(4, 2, 4), topology)  # pp innermost of the node? tp inner, dp, then pp
    seconds, link = costs.point_to_point(inside, "pp", 1 << 20)
    assert seconds > 0 and link
    placements = enumerate_placements(topology, Degrees(1, 4, 8).axes())
    times = {p.to_text(): costs.point_to_point(p, "pp", 64 << 20)[0] for p in placements}
    assert min(times.values()) < max(times.values())  # crossing nodes costs more than NVLink


# --- the exported Megatron-LM arguments against megatron-core's own validation ---------------------

def _megatron_core(module: str):
    """megatron-core's module, or a skip saying how to get it (CI installs it: .ci/run)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip(module, reason="megatron-core is not installed (pip install megatron-core==0.16.1)")


def _megatron_parser():
    """The Megatron-LM (pretrain_gpt.py) flags the export writes, with Megatron's own names,
    types and defaults (megatron/training/arguments.py); anything else is an error."""
    import argparse

    parser = argparse.ArgumentParser(exit_on_error=False)
    for flag in ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
                 "--seq-length", "--max-position-embeddings", "--tensor-model-parallel-size",
                 "--pipeline-model-parallel-size", "--context-parallel-size", "--num-layers-per-virtual-pipeline-stage",
                 "--micro-batch-size", "--global-batch-size", "--recompute-num-layers",
                 "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                 "--num-distributed-optimizer-instances"):
        parser.add_argument(flag, type=int)
    for flag in ("--group-query-attention", "--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
                 "--bf16", "--fp16", "--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce",
                 "--use-tp-pp-dp-mapping", "--overlap-param-gather", "--tp-comm-overlap", "--use-megatron-fsdp"):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("--no-overlap-p2p-communication", action="store_false", dest="overlap_p2p_comm")
    parser.add_argument("--no-gradient-accumulation-fusion", action="store_false", dest="gradient_accumulation_fusion")
    parser.add_argument("--data-parallel-sharding-strategy", choices=("no_shard", "optim", "optim_grads", "optim_grads_params"))
    parser.add_argument("--outer-dp-sharding-strategy", choices=("no_shard", "optim"))
    parser.add_argument("--normalization", choices=("LayerNorm", "RMSNorm"), default="LayerNorm")
    parser.add_argument("--position-embedding-type", choices=("learned_absolute", "rope"), default="learned_absolute")
    parser.add_argument("--attention-dropout", type=float, default=0.1)
    parser.add_argument("--hidden-dropout", type=float, default=0.1)
    parser.add_argument("--recompute-granularity", choices=("full", "selective"))
    parser.add_argument("--recompute-method", choices=("uniform", "block"))
    return parser


def _transformer_config(arguments: list[str]):
    """megatron-core's TransformerConfig built from the exported flags as Megatron-LM's
    core_transformer_config_from_args does (megatron/training/arguments.py)."""
    import torch

    config = _megatron_core("megatron.core.transformer.transformer_config")
    args = _megatron_parser().parse_args(arguments)
    pp = args.pipeline_model_parallel_size
    virtual = None
    if args.num_layers_per_virtual_pipeline_stage is not None:
        virtual = args.num_layers // pp // args.num_layers_per_virtual_pipeline_stage
    dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else torch.float32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its advice on CUDA graphs and fused attention, not errors
        return args, _build(config, args, pp, virtual, dtype)


def _build(config, args, pp, virtual, dtype):
    return config.TransformerConfig(
        num_layers=args.num_layers, hidden_size=args.hidden_size, ffn_hidden_size=args.ffn_hidden_size,
        num_attention_heads=args.num_attention_heads,
        num_query_groups=args.num_query_groups if args.group_query_attention else None,
        tensor_model_parallel_size=args.tensor_model_parallel_size, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=virtual, context_parallel_size=args.context_parallel_size or 1,
        sequence_parallel=args.sequence_parallel, recompute_granularity=args.recompute_granularity,
        recompute_method=args.recompute_method, recompute_num_layers=args.recompute_num_layers,
        gated_linear_unit=args.swiglu, add_bias_linear=not args.disable_bias_linear, normalization=args.normalization,
        attention_dropout=args.attention_dropout, hidden_dropout=args.hidden_dropout, bf16=args.bf16, fp16=args.fp16,
        params_dtype=dtype, pipeline_dtype=dtype,
        num_layers_in_first_pipeline_stage=args.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=args.decoder_last_pipeline_num_layers,
        tp_comm_overlap=args.tp_comm_overlap, overlap_p2p_comm=args.overlap_p2p_comm)


def _candidate(model, degrees, settings, topology):
    """A stand-in prediction: what the launch export reads (degrees, settings, placement)."""
    return SimpleNamespace(degrees=degrees, settings=settings, placement=published_placement(degrees, topology))


LAUNCH_CASES = [  # (model, degrees on 32 or 128 devices, settings)
    ("llama2-70b", Degrees(4, 8, 4), Settings(1, 2, True, "full", True)),
    ("llama2-70b", Degrees(2, 8, 4, 2), Settings(1, 1, True, "selective", False)),
    ("llama3-8b", Degrees(8, 2, 2), Settings(2, 4, False, "full", True)),
    ("llama3.2-1b", Degrees(32, 1, 1), Settings(1, 1, False, "none", True)),
    ("gpt3-1.3b", Degrees(4, 4, 2), Settings(4, 1, True, "none", True)),
    ("megatron-145.6b", Degrees(2, 8, 8), Settings(2, 5, True, "full", False)),
]


@pytest.mark.parametrize("name, degrees, settings", LAUNCH_CASES)
def test_megatron_arguments_pass_transformer_config(name, degrees, settings):
    """The flags build, through megatron-core's own TransformerConfig checks, the model and the
    parallel settings the plan priced; full recomputation carries its method and layer count."""
    model = PRESETS[name]
    topology = load_topology({32: "dgx-a100-x4", 128: "dgx-h100-2x8x8"}[degrees.devices])
    candidate = _candidate(model, degrees, settings, topology)
    arguments = megatron_arguments(model, candidate)
    args, config = _transformer_config(arguments)
    assert (config.num_layers, config.hidden_size, config.ffn_hidden_size, config.num_attention_heads) == (
        model.layers, model.hidden, model.ffn, model.heads)
    assert config.num_query_groups == model.query_groups
    assert config.gated_linear_unit == model.gated_mlp and config.add_bias_linear == model.biases
    assert (args.position_embedding_type == "rope") == (not model.learned_positions)
    assert args.untie_embeddings_and_output_weights == (not model.tied_embeddings)
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size, config.context_parallel_size) == (
        degrees.tp, degrees.pp, degrees.cp)
    assert (config.virtual_pipeline_model_parallel_size or 1) == settings.virtual
    assert config.sequence_parallel == settings.sequence_parallel
    assert config.recompute_granularity == (None if settings.recompute == "none" else settings.recompute)
    if settings.recompute == "full":
        assert config.recompute_method == "uniform" and config.recompute_num_layers == 1
    assert args.micro_batch_size == settings.micro_batch and args.global_batch_size == model.global_batch
    assert args.use_distributed_optimizer == settings.sharded_optimizer
    environment = megatron_environment(candidate)
    assert (environment.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1") == (degrees.tp > 1 or degrees.cp > 1)


def test_full_recompute_without_a_layer_count_is_what_megatron_refuses():
    """The check above is live: megatron-core raises on the flags the export used to write."""
    model = PRESETS["llama2-7b"]
    candidate = _candidate(model, Degrees(8, 4, 4), Settings(1, 1, True, "full", False), load_topology("dgx-h100-2x8x8"))
    arguments = megatron_arguments(model, candidate)
    at = arguments.index("--recompute-num-layers")
    with pytest.raises(ValueError, match="recompute_num_layers"):
        _transformer_config(arguments[:at] + arguments[at + 2:])


@pytest.mark.parametrize("topology, degrees", CASES)
def test_launchable_placements_get_megatrons_groups_from_the_exported_flag(topology, degrees):
    """For every placement called launchable, RankGenerator with the order the exported flags
    select (the default, or --use-tp-pp-dp-mapping) forms exactly the placement's groups."""
    _megatron_core("megatron.core.parallel_state")
    launchable = 0
    for placement in enumerate_placements(topology, degrees.axes()):
        if not megatron_launchable(placement):
            continue
        flag = megatron_order(placement).flag
        order = "tp-cp-ep-pp-dp" if flag == "--use-tp-pp-dp-mapping" else "tp-cp-ep-dp-pp"
        assert _megatron_groups(degrees, order) == _groups_by_role(placement), placement.to_text()
        launchable += 1
    assert launchable >= 1


def test_plan_names_the_best_launchable_layout_when_the_winner_is_not(capsys):
    assert main(["plan", "-t", "dgx-a100-x4", "-m", "gpt3-2.7b", "--tp", "1", "--pp", "2", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "Megatron-LM cannot launch the winner" in out and "Best launchable" in out
    assert main(["plan", "-t", "dgx-a100-x4", "-m", "gpt3-2.7b", "--tp", "1", "--pp", "2", "--top", "3", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert not document["ranked"][0]["megatron_launchable"]
    best = document["best_launchable"]
    assert best["megatron_launchable"] and best["step_s"] >= document["ranked"][0]["step_s"]
    assert main(["plan", "-t", "dgx-a100-x4", "-m", "gpt3-2.7b", "--tp", "1", "--pp", "2", "--top", "3", "--json",
                 "--launchable"]) == 0
    launchable = json.loads(capsys.readouterr().out)
    assert all(row["megatron_launchable"] for row in launchable["ranked"])
    assert launchable["ranked"][0]["step_s"] == best["step_s"]
    assert launchable["best_launchable"]["step_s"] == best["step_s"]


def test_plan_export_carries_the_best_launchable_layout(tmp_path, capsys):
    out = tmp_path / "launch.json"
    assert main(["plan", "-t", "dgx-a100-x4", "-m", "gpt3-2.7b", "--tp", "1", "--pp", "2", "--top", "1",
                 "--export", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["megatron"]["launchable"] is False and document["megatron"]["order"] is None
    best = document["best_launchable"]
    assert best["megatron"]["launchable"] and best["megatron"]["order"] == "tp-cp-ep-dp-pp"
    assert best["slower_than_winner"] >= 0


@pytest.mark.parametrize("axes, matrix, order", [
    ("dp=2,tp=4", [[2, 1], [1, 4]], "tp-cp-ep-dp-pp"),
    ("pp=2,tp=4", [[2, 1], [1, 4]], "tp-cp-ep-dp-pp"),
    ("dp=2,pp=2,tp=2", [[2, 1], [1, 2], [1, 2]], "tp-cp-ep-pp-dp"),
    ("data=2,model=4", [[2, 1], [1, 4]], None),
    ("dp=2,tp=4", [[1, 2], [2, 2]], None),
])
def test_mesh_export_writes_only_orders_megatron_takes(axes, matrix, order):
    """`export --format mesh`: the rank order in the user's names, and Megatron's order only in
    Megatron's tokens and orders; RankGenerator with it forms the placement's groups."""
    from synth.export import mesh
    from synth.export.provenance import Provenance
    from synth.placement import make_placement, parse_axes
    from synth.topology import topology_from_levels

    placement = make_placement(topology_from_levels("node=2,gpu=4"), parse_axes(axes), matrix)
    document = mesh.mesh_document(placement, Provenance(("synth", "export")), {})
    assert document["megatron"]["order"] == order
    if order is None:
        assert "not expressible" in document["megatron"]["statement"]
        return
    assert set(document["megatron"]["order"].split("-")) <= set(mesh.MEGATRON_TOKENS)
    sizes = dict(zip(placement.axis_names, placement.axis_sizes))
    parallel_state = _megatron_core("megatron.core.parallel_state")
    generator = parallel_state.RankGenerator(tp=sizes.get("tp", 1), ep=1, dp=sizes.get("dp", 1), pp=sizes.get("pp", 1),
                                             cp=1, order=order)
    for name in placement.axis_names:
        assert sorted(map(sorted, generator.get_ranks(name))) == sorted(map(sorted, placement.axis_groups(name)))


# --- megatron-core's own initialize_model_parallel, on a fake process group -----------------------

_INITIALIZE = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from megatron.core import parallel_state as ps

results = []
for case in json.load(sys.stdin):
    groups = {}
    for rank in case["ranks"]:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=case["world"])
        try:
            ps.initialize_model_parallel(tensor_model_parallel_size=case["tp"], pipeline_model_parallel_size=case["pp"],
                                         context_parallel_size=case["cp"], order=case["order"],
                                         create_gloo_process_groups=False)
            groups[rank] = {"tp": dist.get_process_group_ranks(ps.get_tensor_model_parallel_group()),
                            "pp": dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group()),
                            "dp": dist.get_process_group_ranks(ps.get_data_parallel_group()),
                            "cp": dist.get_process_group_ranks(ps.get_context_parallel_group())}
        except AssertionError as error:
            groups[rank] = {"refused": str(error)}
        finally:
            ps.destroy_model_parallel()
            dist.destroy_process_group()
    results.append(groups)
print(json.dumps(results))
"""


def test_megatron_cores_initialize_model_parallel_agrees_with_launchable():
    """megatron-core's own initialize_model_parallel (on torch's fake process group, in a fresh
    interpreter): for every launchable placement, with the order its exported flag selects,
    each sampled rank's TP, PP, DP and CP groups are the placement's; the tp-pp-dp order with
    context and pipeline parallelism, which launchable refuses, megatron-core refuses too."""
    import subprocess
    import sys

    _megatron_core("megatron.core.parallel_state")
    pytest.importorskip("torch.testing._internal.distributed.fake_pg", reason="torch without the fake process group")
    cases, expected = [], []
    for topology, degrees in CASES:
        for placement in enumerate_placements(topology, degrees.axes()):
            if not megatron_launchable(placement):
                continue
            flag = megatron_order(placement).flag
            world = placement.device_count
            ranks = sorted({0, world // 3, world - 1})
            cases.append({"world": world, "tp": degrees.tp, "pp": degrees.pp, "cp": degrees.cp, "ranks": ranks,
                          "order": "tp-cp-ep-pp-dp" if flag else "tp-cp-ep-dp-pp"})
            roles = {role: placement.axis_groups(role) if degrees.of(role) > 1 else None for role in ("tp", "pp", "dp", "cp")}
            expected.append({rank: {role: next(sorted(g) for g in groups if rank in g) if groups else [rank]
                                    for role, groups in roles.items()} for rank in ranks})
    from synth.topology import topology_from_levels

    refused = published_placement(Degrees(2, 2, 4, 2), topology_from_levels("a=2,b=4,c=2,d=2"),
                                  flag="--use-tp-pp-dp-mapping")
    assert not megatron_launchable(refused) and "initialize_model_parallel" in megatron_order(refused).reason
    cases.append({"world": 32, "tp": 2, "pp": 4, "cp": 2, "ranks": [0], "order": "tp-cp-ep-pp-dp"})
    expected.append({0: "refused"})
    run = subprocess.run([sys.executable, "-c", _INITIALIZE], input=json.dumps(cases), capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(results) == len(expected) >= len(CASES) + 1
    for case, got, want in zip(cases, results, expected):
        for rank, groups in want.items():
            if groups == "refused":
                assert "data parallel size" in got[str(rank)]["refused"]
            else:
                assert got[str(rank)] == groups, (case, rank)


@pytest.mark.parametrize("argv", [
    ["-t", "dgx-a100-x4", "-m", "llama3-8b", "--launchable"],
    ["-t", "dgx-a100-x4", "-m", "llama2-7b", "--tp", "2", "--recompute", "full"],
    ["-t", "dgx-a100-x4", "-m", "gpt3-1.3b", "--pp", "2", "--virtual-stages", "2"],
])
def test_exported_plans_pass_megatron_cores_checks(argv, tmp_path):
    """End to end: the file `plan --export` writes, its Megatron arguments through
    TransformerConfig and its rank groups against RankGenerator with the order its flag picks."""
    out = tmp_path / "launch.json"
    assert main(["plan", *argv, "--top", "1", "--export", str(out)]) == 0
    document = json.loads(out.read_text())
    launch = document if document["megatron"]["launchable"] else document["best_launchable"]
    arguments = launch["megatron"]["arguments"]
    args, config = _transformer_config(arguments)
    degrees = Degrees(**launch["degrees"])
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (degrees.tp, degrees.pp)
    order = "tp-cp-ep-pp-dp" if args.use_tp_pp_dp_mapping else "tp-cp-ep-dp-pp"
    assert order == launch["megatron"]["order"]
    groups = {role: sorted(sorted(group) for group in launch["rank_groups"][role]) for role in launch["rank_groups"]
              if degrees.of(role) > 1}
    assert _megatron_groups(degrees, order) == groups
    assert ("CUDA_DEVICE_MAX_CONNECTIONS" in launch["megatron"]["environment"]) == (degrees.tp > 1 or degrees.cp > 1)
