"""The context-parallel term: the keys and values all-gathered in forward (and recomputation)
and their gradients reduce-scattered in backward, exposed where they exceed the attention's own
compute (the ring exchange overlaps with it)."""

from __future__ import annotations

from dataclasses import dataclass

from synth.plan import attention as attention_forms


@dataclass(frozen=True)
class ContextParallel:
    """Seconds per layer per micro-batch: exposed (all, and of the backward); the exchange's
    whole time and calls, for the step's route."""

    layer: float = 0.0
    backward: float = 0.0
    exchange: float = 0.0
    kv_bytes: int = 0
    program: str = ""
    levels: str = ""


def context_parallel(model, costs, placement, settings, tp: int, cp: int, tokens: int,
                     scores_s: float) -> ContextParallel:
    """One layer's exposed key/value exchange over the `cp` groups, `tokens` per device per
    micro-batch, `scores_s` the attention scores' forward (`settings`: step.Settings)."""
    if cp <= 1:
        return ContextParallel()
    full = settings.recompute == "full"
    kv = tokens * cp * attention_forms.kv_values_per_token(model) * model.bytes_per_value // tp  # gathered keys and values
    gather = costs.all_gather(placement, ("cp",), kv)
    scatter = costs.reduce_scatter(placement, ("cp",), kv)
    exchange = gather.time_s * (2 if full else 1) + scatter.time_s
    attention = scores_s * (3 + (1 if full or settings.recompute == "selective" else 0))
    layer = max(0.0, exchange - attention)
    backward = layer * scatter.time_s / exchange if exchange > 0 else 0.0
    return ContextParallel(layer, backward, exchange, kv, f"{gather.program}; {scatter.program}", gather.levels)
