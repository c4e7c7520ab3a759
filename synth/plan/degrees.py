"""Parallelism degrees: every way to split the devices into data, tensor, pipeline and context
parallel groups that the model and the framework's rules allow.

A `Degrees` becomes the job's axes, outermost first `pp, dp, cp, tp` (axes of size 1 left
out): inside a system level the later axis takes the faster-varying digit, so the usual
layouts (tensor parallelism innermost) number ranks the way Megatron-LM's default order
`tp-cp-ep-dp-pp` does.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from synth.plan.errors import LimitValueError
from synth.names import Sized
from synth.plan.model import Transformer

ROLES = ("pp", "dp", "cp", "tp")  # axis order, outermost first


@dataclass(frozen=True)
class Degrees:
    dp: int
    tp: int
    pp: int
    cp: int = 1

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def of(self, role: str) -> int:
        return getattr(self, role)

    def axes(self) -> tuple[Sized, ...]:
        """The job's axes, outermost first, size-1 roles left out (one axis of size 1 if all are)."""
        axes = tuple(Sized(role, self.of(role)) for role in ROLES if self.of(role) > 1)
        return axes or (Sized("dp", 1),)

    @property
    def text(self) -> str:
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}"]
        return ",".join(parts + ([f"cp={self.cp}"] if self.cp > 1 else []))

    def to_json(self) -> dict:
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp}


@dataclass(frozen=True)
class DegreeLimits:
    """What the user fixes: a degree (None: searched; cp defaults to 1), a largest tensor degree."""

    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    cp: int | None = 1
    max_tp: int | None = None

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "cp", "max_tp"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise LimitValueError(f"{name} {value!r}: give a positive integer", limit=name, value=value)


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def model_problem(model: Transformer, degrees: Degrees) -> str | None:
    """Why the model cannot be split this way (Megatron-LM's checks), or None."""
    if model.heads % degrees.tp or model.query_groups % degrees.tp:
        return "tp does not divide the attention heads"
    if model.ffn % degrees.tp:
        return "tp does not divide the FFN size"
    from synth.plan.formulas import stage_layers

    if stage_layers(model.layers, degrees.pp) is None:
        return "pp cannot split the layers (more stages than layers)"
    if degrees.cp > 1 and model.seq_len % (2 * degrees.cp):
        return "2 cp does not divide the sequence"
    if model.global_batch % degrees.dp:
        return "dp does not divide the global batch"
    return None


def enumerate_degrees(devices: int, model: Transformer, limits: DegreeLimits = DegreeLimits(),
                      refused: Counter | None = None):
    """Every Degrees with dp x tp x pp x cp = devices that the limits and the model allow, tp
    ascending then pp ascending; each refused one is counted in `refused` by its reason."""
    for cp in ([limits.cp] if limits.cp else divisors(devices)):
        if devices % cp:
            continue
        for tp in divisors(devices // cp):
            for pp in divisors(devices // (cp * tp)):
                degrees = Degrees(devices // (cp * tp * pp), tp, pp, cp)
                reason = limit_problem(degrees, limits) or model_problem(model, degrees)
                if reason:
                    if refused is not None:
                        refused[reason] += 1
                    continue
                yield degrees


def limit_problem(degrees: Degrees, limits: DegreeLimits) -> str | None:
    for role in ("dp", "tp", "pp", "cp"):
        fixed = getattr(limits, role)
        if fixed is not None and degrees.of(role) != fixed:
            return f"{role} fixed to {fixed}"
    if limits.max_tp is not None and degrees.tp > limits.max_tp:
        return f"tp above the largest allowed, {limits.max_tp}"
    return None
