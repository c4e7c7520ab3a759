"""The expert-parallel term (MoE models, synth/plan/moe.py): the token dispatch and combine
over the `ep` groups, 4 per MoE layer (6 with full recomputation: 2 dispatches and 2 combines,
3 of each), on the critical path; with tensor parallelism the routed tokens' all-gather and
reduce-scatter over `tp` beyond the dense FFN's.

Each is priced as the dispatcher the launch names runs it (synth/plan/dispatcher.py, the one
decision both read): Megatron's `alltoall` as the fastest all-to-all program of `tokens x h x
k x c` values per device (the flat call among them: one copy per token and expert); the `flex`
dispatcher (DeepEP, HybridEP: expert groups across hosts, top-k > 1) as the fastest two-stage
dispatch and combine programs of the model's routing (CommunicationCosts.two_stage: once per
destination host across them, then inside the host, the copies counted from the routing's
fan-out with the model's group-limited routing as a node limit, synth/model/fanout.py), each
step priced by the one cost engine as NCCL's grouped send/recv. Stage one's levels run as
consecutive steps where the groups span more than one level above the host (DeepEP sends over
all of them at once): an upper estimate there.

With MoE parallel folding (synth/plan/folding.py) the groups are the expert mesh's: the
dispatch and combine over the expert-parallel groups (which may span tensor, context and
data-parallel ranks), and the routed tokens' all-gather and reduce-scatter over the expert
tensor-parallel groups (none with `etp = 1`), beyond the dense FFN's sequence-parallel pair
over `tp` that the tensor-parallel term already counts for every layer: a MoE layer does not
run that pair, but the difference is never taken below zero (an upper estimate where `etp <
tp`).

With `ep_overlap` (Megatron's --overlap-moe-expert-parallel-comm) the schedule pairs each
steady-state forward with the backward of another micro-batch and runs one's all-to-alls
while the other computes (megatron-core pipeline_parallel/combined_1f1b.py: "overlap EP A2A
communications with independent computations of different micro-batches in 1f1b phase").
Assumed here: a layer's two forward all-to-alls hide behind that layer's backward compute of
the other micro-batch, its two backward ones behind the forward compute, each showing only
beyond it; the warm-up forwards and cool-down backwards have no partner and stay exposed
(`ep_overlap_steady`). So the overlap is never slower than without it."""

from __future__ import annotations

from dataclasses import dataclass

from synth.goals import COMBINE, DISPATCH
from synth.plan import moe
from synth.plan.dispatcher import HIERARCHICAL, choose_dispatcher, system_hosts
from synth.routing import Routing


@dataclass(frozen=True)
class ExpertParallel:
    """Seconds per MoE layer per micro-batch (all, and of the backward); the all-to-all, for the route."""

    layer: float = 0.0
    backward: float = 0.0
    call_s: float = 0.0  # one all-to-all
    calls: int = 0  # all-to-alls per MoE layer per micro-batch
    bytes: int = 0  # per all-to-all per device
    program: str = ""
    levels: str = ""
    form: str = ""  # the dispatcher's form priced (synth/plan/dispatcher.py): "flat" or "hierarchical"


def ep_overlap_steady(microbatches: int, pp: int, virtual: int) -> float:
    """The share of a device's micro-batch chunks that run in the combined 1F1B steady state:
    without a pipeline all but the first forward and the last backward; with one, the first
    stage's warm-up of megatron-core's interleaved schedule ((p - 1) 2 + (v - 1) p chunks, and
    the one more that the overlap schedules: schedules.py get_pp_rank_microbatches) is unpaired."""
    chunks = microbatches * virtual
    warm = 1 if pp == 1 else (pp - 1) * 2 + (virtual - 1) * pp + 1
    return max(0, chunks - warm) / chunks if chunks else 0.0


def expert_parallel(model, costs, placement, settings, tp: int, ep: int, tokens: int,
                    activation: int, forward_s: float = 0.0, backward_s: float = 0.0,
                    steady: float = 0.0, group=("ep",), etp_group=("tp",), etp: int = 0) -> ExpertParallel:
    """One MoE layer's exposed expert traffic, `tokens` per device per micro-batch, `activation`
    the dense layer's tensor-parallel call size (`settings`: step.Settings); `forward_s` and
    `backward_s` the layer's compute and `steady` the paired share (`ep_overlap_steady`), used
    with `settings.ep_overlap` only. `group`, `etp_group`: the expert-parallel and expert
    tensor-parallel groups (axes, or folded digit groups: Degrees.expert_group), `etp` the expert
    tensor-parallel degree when it is not tp (0: tp, its groups the `tp` axis)."""
    full = settings.recompute == "full"
    layer = backward = call_s = 0.0
    calls, dispatched, program, levels, form = 0, 0, "", "", ""
    if ep > 1:
        local = tokens // (tp if settings.sequence_parallel else 1)  # tokens a device routes
        dispatched = moe.dispatch_bytes(model, local)
        factors = costs.factors(placement, group)
        dispatcher = choose_dispatcher(model, factors, system_hosts(costs.topology))  # what the launch names
        calls = moe.DISPATCHES_PER_LAYER + (2 if full else 0)
        form = dispatcher.form
        if form == HIERARCHICAL:
            routing = expert_routing(model, local, factors)
            dispatch = costs.two_stage(DISPATCH, placement, group, routing, dispatcher.host)
            combine = costs.two_stage(COMBINE, placement, group, routing, dispatcher.host)
            call_s = (dispatch.time_s + combine.time_s) / 2  # as many dispatches as combines
            program, levels = f"{dispatch.program}; then {combine.program}", dispatch.levels
            dispatched = routing.buffer_bytes * routing.topk
        else:
            exchange = costs.all_to_all(placement, group, dispatched)
            call_s, program, levels = exchange.time_s, exchange.program, exchange.levels
        layer = calls * call_s
        backward = 2 * call_s  # dispatch and combine of the backward
        if settings.ep_overlap:
            forward_a2a = layer - backward
            hidden_forward = forward_a2a - max(0.0, forward_a2a - backward_s)
            hidden_backward = backward - max(0.0, backward - forward_s)
            layer -= steady * (hidden_forward + hidden_backward)
            backward -= steady * hidden_backward
    if model.is_moe and etp:  # folded with an expert tensor-parallel degree of its own (module docstring)
        pair = lambda axes, size: (costs.reduce_scatter(placement, axes, size).time_s  # noqa: E731
                                   + costs.all_gather(placement, axes, size).time_s)
        local = tokens // tp if settings.sequence_parallel else tokens
        gathered = pair(etp_group, moe.dispatch_bytes(model, local * etp)) if etp > 1 else 0.0
        dense = pair(("tp",), activation) if tp > 1 and settings.sequence_parallel else 0.0
        layer += (2 + (1 if full else 0)) * max(0.0, gathered - dense)
    elif model.is_moe and tp > 1 and settings.sequence_parallel:
        # Expert tensor parallelism (= tp) all-gathers the routed tokens before the experts and
        # reduce-scatters after: k c times the dense FFN's sequence-parallel pair, whose own
        # size the tensor-parallel term already counts; the difference is charged here.
        routed = moe.dispatch_bytes(model, tokens)
        pair = lambda size: (costs.reduce_scatter(placement, ("tp",), size).time_s  # noqa: E731
                             + costs.all_gather(placement, ("tp",), size).time_s)
        layer += (2 + (1 if full else 0)) * max(0.0, pair(routed) - pair(activation))
    return ExpertParallel(layer, backward, call_s, calls, dispatched, program, levels, form)


def expert_routing(model, tokens: int, factors: tuple[int, ...]) -> Routing:
    """The routing one MoE layer's dispatch moves over expert-parallel groups spanning
    `factors`: `tokens` per member (times the routed work's factor over balanced,
    `moe.capacity`, as the flat all-to-all's bytes are), the model's top-k and experts, its
    group-limited routing as a node limit over the groups' nodes (`moe.node_limit`), its
    activations' width and bytes."""
    spans = [factor for factor in factors if factor > 1]
    members = 1
    for factor in spans:
        members *= factor
    nodes = members // spans[-1] if spans else 1
    return Routing(max(1, round(tokens * moe.capacity(model))), model.top_k, model.experts, model.hidden,
                   model.bytes_per_value, moe.node_limit(model, nodes))
