"""Mixture-of-experts layers: their parameters, FLOPs, memory and all-to-all traffic.

A MoE layer (Shazeer et al. 2017; Fedus et al. 2021, Switch Transformer; Jiang et al. 2024,
Mixtral; Dai et al. 2024, DeepSeekMoE) keeps the attention of a dense layer and replaces its FFN
by a router (an `h x E` matrix, no bias), `E` routed experts, each an FFN of inner size `f_e`,
of which each token uses `k`, and optionally shared experts every token uses (inner size `f_s`
in all). With `m` matrices per FFN (3 gated, 2 not), per MoE layer:

* parameters: `E m h f_e` routed + `m h f_s` shared + `h E` router (+ the experts' biases);
* active parameters (those one token touches): `k m h f_e + m h f_s + h E`;
* forward FLOPs per token: `2 (k c m h f_e + m h f_s + h E)`, where `c` is the capacity factor:
  with a capacity each expert computes `c` times its even share of the tokens, padding
  included (Megatron's drop-and-pad), so the devices execute `c` times the routed work; a
  dropless model (`capacity_factor = 0`) is counted as balanced, `c = 1`. Model FLOPs (the MFU
  numerator) count `c = 1` always.

Token imbalance (`expert_imbalance`, `u`): dropless routing is balanced only on average; the
step waits for the busiest expert, whose tokens are `u` times its even share. The model prices
the routed work, its activations and its all-to-all at `u` times the balanced figure (as it
prices a capacity factor: the busiest device's share). No single published figure holds for
every router and batch, so `u` is the user's, and 1 (balanced, what DeepSeek-V3's
auxiliary-loss-free balancing aims at) is an assumption when not given.

Which layers are MoE: layer `i` (from 0) is MoE when `i >= first_dense` and
`(i - first_dense) % moe_every == 0`; the other layers keep the dense FFN of size `ffn`.

Expert parallelism (Megatron-core, `--expert-model-parallel-size`): the `E` routed experts of
a layer are split over `ep` devices (each holds `E / ep` whole experts), inside the data-parallel
ranks: `ep` divides `dp` and expert data parallelism is `dp / ep` (the experts' gradients are
reduced, and their optimizer states sharded, over `dp / ep` replicas only). Expert tensor
parallelism is Megatron's default, the tensor-parallel degree: each expert is split over `tp`.
With MoE parallel folding (synth/plan/folding.py) the expert layers have a mesh of their own:
`ep` experts' groups and `etp` (expert tensor parallelism, often 1) over the stage's `tp x cp x
dp` ranks, expert data parallelism what is left, `tp cp dp / (ep etp)`; each device then holds
`E / ep` experts split by `etp`. Shared experts and the router are dense weights (whole on every
expert-parallel rank, split by tp).

All-to-all (Megatron's `alltoall` token dispatcher): each MoE layer dispatches every token's
hidden vector to its `k` experts and combines the results back, forward and backward, 4
all-to-alls per MoE layer per micro-batch, each of `tokens x h x k x c` values per device spread
over the expert-parallel group; across hosts with top-k > 1 Megatron's `flex` dispatcher (DeepEP,
HybridEP) sends a token once per destination host instead (synth/plan/dispatcher.py decides,
synth/plan/terms/expert.py prices either form).

Group-limited routing (`router_groups`, `router_group_topk`: DeepSeek-V3 keeps 4 of 8 groups of
experts per token) bounds the nodes a token's copies reach (`node_limit`).
"""

from __future__ import annotations

from functools import lru_cache

from synth.errors import InputRangeError, UsageError

DISPATCHES_PER_LAYER = 4  # dispatch and combine, in forward and in backward


def check_moe(model) -> None:
    """The MoE keys' rules, each broken one named with its fix (called by Transformer)."""
    name = model.name
    for key in ("experts", "top_k", "expert_ffn", "shared_ffn", "first_dense", "router_groups", "router_group_topk"):
        value = getattr(model, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UsageError(f"model {name!r}: {key} = {value!r} is not a non-negative integer")
    if isinstance(model.moe_every, bool) or not isinstance(model.moe_every, int) or model.moe_every < 1:
        raise UsageError(f"model {name!r}: moe_every = {model.moe_every!r} is not a positive integer (1: every layer)")
    factor = model.capacity_factor
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 0 or factor == float("inf"):
        raise UsageError(f"model {name!r}: capacity_factor = {factor!r} is not a finite number >= 0 (0: dropless)")
    imbalance = model.expert_imbalance
    if isinstance(imbalance, bool) or not isinstance(imbalance, (int, float)) or not 1 <= imbalance < float("inf"):
        raise UsageError(f"model {name!r}: expert_imbalance = {imbalance!r} is not a finite number >= 1 (1: balanced)")
    if imbalance != 1 and factor:
        raise UsageError(f"model {name!r}: expert_imbalance = {imbalance} with capacity_factor = {factor}: the capacity "
                         f"caps every expert's tokens; give one of them")
    if model.experts == 0:
        moe_keys = ("top_k", "expert_ffn", "shared_ffn", "capacity_factor", "first_dense", "router_groups",
                    "router_group_topk")
        stated = [key for key in moe_keys if getattr(model, key)] + (["moe_every"] if model.moe_every != 1 else [])
        stated += ["expert_imbalance"] if imbalance != 1 else []
        if stated:
            raise UsageError(f"model {name!r}: {', '.join(stated)} set without experts; give experts = E (> 1) "
                             f"or leave the MoE keys out")
        return
    if model.experts < 2:
        raise UsageError(f"model {name!r}: experts = {model.experts}; a MoE layer needs 2 or more (0: dense)")
    if not 1 <= model.top_k <= model.experts:
        raise UsageError(f"model {name!r}: top_k = {model.top_k} with {model.experts} experts; give 1 to {model.experts}")
    if 0 < factor < 1:
        raise UsageError(f"model {name!r}: capacity_factor = {factor} drops tokens on every expert; give >= 1 or 0 (dropless)")
    if factor > model.experts / model.top_k:
        # Past E / k an expert's capacity holds every token routed at all: only padding is added.
        raise InputRangeError(f"model {name!r}: capacity_factor = {factor:g} is more than experts / top_k = "
                              f"{model.experts / model.top_k:g} (one expert then takes every token); "
                              f"give 1 to {model.experts / model.top_k:g}, or 0 (dropless)")
    check_router_groups(model)
    if model.first_dense >= model.layers:
        raise UsageError(f"model {name!r}: first_dense = {model.first_dense} leaves none of its {model.layers} layers "
                         f"MoE; give fewer than {model.layers}")


def check_router_groups(model) -> None:
    """Group-limited routing's rules (megatron-core's group_limited_topk: equal groups, the
    token's k experts found inside the groups it keeps)."""
    name, groups, keep = model.name, model.router_groups, model.router_group_topk
    if not groups and not keep:
        return
    if not groups or not keep:
        raise UsageError(f"model {name!r}: router_groups = {groups} with router_group_topk = {keep}: give both "
                         f"(group-limited routing) or neither")
    if model.experts % groups:
        raise UsageError(f"model {name!r}: router_groups = {groups} does not divide experts = {model.experts}; give "
                         f"a divisor of {model.experts}")
    if keep > groups:
        raise UsageError(f"model {name!r}: router_group_topk = {keep} is more than router_groups = {groups}; give "
                         f"1 to {groups}")
    if keep * (model.experts // groups) < model.top_k:
        raise UsageError(f"model {name!r}: router_group_topk = {keep} groups of {model.experts // groups} experts "
                         f"hold fewer than top_k = {model.top_k}; raise router_group_topk")


def node_limit(model, nodes: int) -> int | None:
    """The most of `nodes` equal nodes (consecutive experts each) a token's experts can sit on
    under the model's group-limited routing, None when unlimited: `router_group_topk` groups
    when groups do not straddle nodes, each group's nodes times that when a group spans
    several; None where the groups cut nodes unevenly (not modelled: unlimited)."""
    groups, keep = model.router_groups, model.router_group_topk
    if not groups or nodes < 2:
        return None
    if groups % nodes == 0:
        limit = keep
    elif nodes % groups == 0:
        limit = keep * (nodes // groups)
    else:
        return None
    return limit if limit < nodes else None


def expert_problem(model, degrees) -> str | None:
    """Why these degrees cannot split the experts (Megatron-core's checks), or None."""
    if (degrees.ep > 1 or degrees.etp) and not model.is_moe:
        return "ep > 1 for a model without experts" if degrees.ep > 1 else "etp for a model without experts"
    if model.experts % degrees.ep:
        return "ep does not divide the experts"
    if (degrees.tp * degrees.cp * degrees.dp) % (degrees.ep * degrees.expert_tp):
        # parallel_state.initialize_model_parallel: the expert mesh etp x ep x edp per stage
        return "ep x etp does not divide tp x cp x dp"
    if model.is_moe and model.biases and degrees.expert_tp > 1:
        return "MoE with biases needs expert tp 1 (megatron-core)"
    for size, what, tp in ((expert_ffn(model), "expert FFN size", degrees.expert_tp),
                           (model.shared_ffn, "shared FFN size", degrees.tp)):
        if size % tp:
            return f"{'etp' if tp != degrees.tp else 'tp'} does not divide the {what}"
    return None


def is_moe_layer(model, index: int) -> bool:
    """Whether layer `index` (from 0) has experts (module docstring)."""
    return model.is_moe and index >= model.first_dense and (index - model.first_dense) % model.moe_every == 0


def moe_layers_in(model, start: int, stop: int) -> int:
    """MoE layers among layers start..stop-1 (none in a dense model: asked per candidate)."""
    if not model.is_moe:
        return 0
    # counted, not listed (the search asks it for every candidate): layers first_dense, first_dense
    # + moe_every, ... below `stop`, less those below `start`
    return max(0, _moe_below(model, stop) - _moe_below(model, start))


def _moe_below(model, stop: int) -> int:
    """MoE layers among layers 0..stop-1."""
    return max(0, -(-(stop - model.first_dense) // model.moe_every))


def moe_layer_count(model) -> int:
    return moe_layers_in(model, 0, model.layers)


def expert_ffn(model) -> int:
    """One routed expert's FFN inner size."""
    return model.expert_ffn or model.ffn


def capacity(model) -> float:
    """The routed work's factor over balanced routing on the busiest expert, which the step waits
    for: the capacity factor (every expert padded to it), or when dropless the imbalance the
    model states (1: balanced)."""
    return max(model.capacity_factor, 1.0) if model.capacity_factor else float(model.expert_imbalance)


def _matrices(model) -> int:
    return 3 if model.gated_mlp else 2


def _ffn_weights(model, inner: int) -> int:
    """One FFN's parameters: its matrices and, with biases, the first's (per matrix) and the last's."""
    biases = ((2 if model.gated_mlp else 1) * inner + model.hidden) if model.biases else 0
    return _matrices(model) * model.hidden * inner + biases


def routed_expert_parameters(model) -> int:
    """The routed experts of one MoE layer, all of them."""
    return model.experts * _ffn_weights(model, expert_ffn(model))


def dense_part_parameters(model) -> int:
    """Shared experts and the router of one MoE layer: weights every expert-parallel rank holds."""
    shared = _ffn_weights(model, model.shared_ffn) if model.shared_ffn else 0
    return shared + model.hidden * model.experts


def ffn_parameters(model) -> int:
    """A MoE layer's FFN part: routed experts, shared experts and router."""
    return routed_expert_parameters(model) + dense_part_parameters(model)


def active_ffn_parameters(model) -> int:
    """The FFN parameters one token uses in a MoE layer: k experts, the shared ones, the router."""
    return model.top_k * _ffn_weights(model, expert_ffn(model)) + dense_part_parameters(model)


def dense_ffn_parameters(model) -> int:
    return _ffn_weights(model, model.ffn)


def parameter_delta(model) -> int:
    """Parameters the MoE layers add over the same model with dense FFNs everywhere."""
    return moe_layer_count(model) * (ffn_parameters(model) - dense_ffn_parameters(model))


def active_parameter_delta(model) -> int:
    return moe_layer_count(model) * (active_ffn_parameters(model) - dense_ffn_parameters(model))


def routed_tokens(model, tokens: float, padded: bool = True) -> float:
    """Token-expert pairs the experts compute for `tokens` tokens (x c with the capacity padding)."""
    return tokens * model.top_k * (capacity(model) if padded else 1.0)


def moe_ffn_forward_flops(model, tokens: float, padded: bool = True) -> float:
    """One MoE layer's FFN forward over `tokens` tokens: routed experts, shared experts, router."""
    h = model.hidden
    routed = 2.0 * routed_tokens(model, tokens, padded) * _matrices(model) * h * expert_ffn(model)
    shared = 2.0 * tokens * _matrices(model) * h * model.shared_ffn
    return routed + shared + 2.0 * tokens * h * model.experts


def mean_flops_delta(model, tokens: float, padded: bool = True) -> float:
    """Per layer (averaged over all layers), the forward FLOPs the MoE FFNs add over dense FFNs."""
    if not model.is_moe:
        return 0.0
    dense = 2.0 * tokens * _matrices(model) * model.hidden * model.ffn
    return moe_layer_count(model) * (moe_ffn_forward_flops(model, tokens, padded) - dense) / model.layers


@lru_cache(maxsize=1024)
def stage_ranges(model, stages) -> tuple[tuple[int, int], ...]:
    """(start, stop) of every pipeline stage's layers, first to last, for a
    synth.plan.formulas.StageLayers split (uneven first and last stages included)."""
    if stages.middle == 0 and stages.first + stages.last != model.layers:  # one stage
        return ((0, model.layers),)
    ranges = [(0, stages.first)]
    start = stages.first
    while start + stages.last < model.layers:
        ranges.append((start, start + stages.middle))
        start += stages.middle
    ranges.append((start, model.layers))
    return tuple(ranges)


@lru_cache(maxsize=1024)
def stage_moe_layers(model, stages) -> tuple[int, int, int]:
    """MoE layers of the first pipeline stage, of the middle stage with the most, and of the last
    (asked per candidate: computed once per split)."""
    ranges = stage_ranges(model, stages)
    return (moe_layers_in(model, *ranges[0]), max((moe_layers_in(model, *r) for r in ranges[1:-1]), default=0),
            moe_layers_in(model, *ranges[-1]))


def stage_layers(model, stages) -> tuple[tuple[int, int], tuple[int, int]]:
    """(start, stop) of the first and the last pipeline stage's layers."""
    ranges = stage_ranges(model, stages)
    return ranges[0], ranges[-1]


def expert_parameters_per_device(model, tp: int, ep: int, start: int, stop: int) -> float:
    """Routed-expert parameters one device holds for layers start..stop-1: E/ep experts, split by
    `tp`, the expert tensor-parallel degree."""
    return moe_layers_in(model, start, stop) * routed_expert_parameters(model) / (ep * tp)


def stage_parameter_delta(model, tp: int, ep: int, start: int, stop: int, etp: int = 0) -> float:
    """What the MoE layers among start..stop-1 add to a device's parameters over dense FFNs: its
    E/ep routed experts (split by the expert tensor-parallel degree `etp`, 0: tp), the shared
    experts (split by tp) and the router (whole)."""
    if not model.is_moe:
        return 0.0
    h = model.hidden
    shared = (_ffn_weights(model, model.shared_ffn) if model.shared_ffn else 0) / tp
    per_layer = routed_expert_parameters(model) / (ep * (etp or tp)) + shared + h * model.experts - dense_ffn_parameters(model) / tp
    return moe_layers_in(model, start, stop) * per_layer


def moe_layer_parameters_per_device(model, dense_layer: float, tp: int, ep: int, etp: int = 0) -> tuple[float, float]:
    """(dense part, routed experts) of one MoE layer's parameters on one device, `dense_layer` a
    dense layer's per device: the dense part keeps the attention, swaps the dense FFN for the
    shared experts (split by tp) and the router (whole); the routed part is E/ep experts split by
    the expert tensor-parallel degree `etp` (0: tp)."""
    shared = (_ffn_weights(model, model.shared_ffn) if model.shared_ffn else 0) / tp
    dense_part = dense_layer - dense_ffn_parameters(model) / tp + shared + model.hidden * model.experts
    return dense_part, routed_expert_parameters(model) / (ep * (etp or tp))


def mean_activation_delta(model, tokens: float, tp: int, etp: int = 0) -> float:
    """Per layer (averaged), the activation bytes a device keeps for backward beyond a dense FFN's
    inner activations (4 or 6 bytes x tokens x f / t in 16-bit): the routed tokens' inner
    activations, the shared experts', the permuted inputs the experts saw (2 k c h bytes per token
    of the expert tensor-parallel group: Megatron's expert layer keeps them) and the router's fp32
    probabilities (4 E). `tokens` is the tensor-parallel group's (s b), `etp` the expert
    tensor-parallel degree (0: tp, Megatron's default)."""
    if not model.is_moe:
        return 0.0
    inner = 6 if model.gated_mlp else 4
    dense = inner * tokens * model.ffn / tp
    routed = routed_tokens(model, tokens)
    # The expert layer's rows per device (megatron-core token_dispatcher.py, MoEAlltoAllTokenDispatcher:
    # num_local_tokens = S/TP*B enter each rank (sequence parallelism, which MoE with TP needs); the
    # all-to-all over ep, then dispatch_postprocess's all-gather over the expert tensor-parallel group
    # (gather_from_sequence_parallel_region, group=expt_tp), leave num_global_tokens = num_local_tokens
    # x etp x ep spread over ep ranks: k c s b etp / tp token copies, permuted into expert order
    # (moe_utils.permute) and kept whole (h wide) for the experts' weight gradients. The classic
    # layout (etp = tp) keeps k c s b; folded with etp < tp, etp / tp of it. The inner activations
    # are those rows at f_e / etp: k c s b f_e / tp whatever etp is, as above.
    permuted = 2 * routed * model.hidden
    if etp:
        permuted = permuted * etp / tp
    moe = (inner * routed * expert_ffn(model) + inner * tokens * model.shared_ffn) / tp
    moe += permuted + 4 * tokens * model.experts
    return moe_layer_count(model) * (moe - dense) / model.layers


def mean_traffic_delta(model, tokens: float, tp: int) -> float:
    """Per layer (averaged), the memory-bound bytes a device moves beyond a dense FFN's activation
    (read `f`, write `f`; gated: read `2f`, write `f`, values of the model's precision, `/t`): the
    routed tokens' and the shared experts' activations, and the permutation of the routed tokens
    into expert order and back (each reads and writes `k c h` values per token)."""
    if not model.is_moe:
        return 0.0
    matrices, value = (3 if model.gated_mlp else 2), model.bytes_per_value
    dense = tokens * matrices * model.ffn * value / tp
    routed = routed_tokens(model, tokens)
    moe = (routed * matrices * expert_ffn(model) + tokens * matrices * model.shared_ffn) * value / tp
    moe += 2 * 2 * routed * model.hidden * value
    return moe_layer_count(model) * (moe - dense) / model.layers


def dispatch_bytes(model, tokens: float) -> int:
    """Bytes one device sends in one all-to-all (dispatch or combine) of `tokens` tokens:
    `tokens x h x k x c` values of the activations' precision."""
    return int(routed_tokens(model, tokens) * model.hidden * model.bytes_per_value)
