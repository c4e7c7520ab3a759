"""The expert-parallel term (MoE models, synth/plan/moe.py): the token dispatch and combine
all-to-alls over the `ep` groups, 4 per MoE layer (6 with full recomputation), each of
`tokens x h x k x c` values per device, on the critical path; with tensor parallelism the
routed tokens' all-gather and reduce-scatter over `tp` beyond the dense FFN's."""

from __future__ import annotations

from dataclasses import dataclass

from synth.plan import moe


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


def expert_parallel(model, costs, placement, settings, tp: int, ep: int, tokens: int,
                    activation: int) -> ExpertParallel:
    """One MoE layer's exposed expert traffic, `tokens` per device per micro-batch, `activation`
    the dense layer's tensor-parallel call size (`settings`: step.Settings)."""
    full = settings.recompute == "full"
    layer = backward = call_s = 0.0
    calls, dispatched, program, levels = 0, 0, "", ""
    if ep > 1:
        local = tokens // (tp if settings.sequence_parallel else 1)  # tokens a device routes
        dispatched = moe.dispatch_bytes(model, local)
        exchange = costs.all_to_all(placement, ("ep",), dispatched)
        calls = moe.DISPATCHES_PER_LAYER + (2 if full else 0)
        call_s, program, levels = exchange.time_s, exchange.program, exchange.levels
        layer = calls * call_s
        backward = 2 * call_s  # dispatch and combine of the backward
    if model.is_moe and tp > 1 and settings.sequence_parallel:
        # Expert tensor parallelism (= tp) all-gathers the routed tokens before the experts and
        # reduce-scatters after: k c times the dense FFN's sequence-parallel pair, whose own
        # size the tensor-parallel term already counts; the difference is charged here.
        routed = moe.dispatch_bytes(model, tokens)
        pair = lambda size: (costs.reduce_scatter(placement, ("tp",), size).time_s  # noqa: E731
                             + costs.all_gather(placement, ("tp",), size).time_s)
        layer += (2 + (1 if full else 0)) * max(0.0, pair(routed) - pair(activation))
    return ExpertParallel(layer, backward, call_s, calls, dispatched, program, levels)
