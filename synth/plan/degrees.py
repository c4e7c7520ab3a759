"""Parallelism degrees: every way to split the devices into data, tensor, pipeline and context
parallel groups that the model and the framework's rules allow.

A `Degrees` becomes the job's axes, outermost first `pp, dp, ep, cp, tp` (axes of size 1 left
out): inside a system level the later axis takes the faster-varying digit, so the usual
layouts (tensor parallelism innermost) number ranks the way Megatron-LM's default order
`tp-cp-ep-dp-pp` does.

Expert parallelism (MoE models, synth/plan/moe.py) divides the data-parallel ranks as
Megatron-core does: `dp` stays the whole data-parallel degree (the dense weights' replicas, the
batch split), of which `ep` consecutive ranks hold different experts and `dp / ep` hold the same
ones (expert data parallelism). The axes then carry the split: `ep` (size ep) inside `dp` (size
dp / ep), so the dense data-parallel group is the axes `dp, ep` together and the experts'
gradients are reduced over `dp` alone. Expert tensor parallelism is the tensor-parallel degree
(Megatron's default).

MoE parallel folding (synth/plan/folding.py): Megatron-core gives the expert layers a mesh of
their own, `etp x ep x edp` per stage over the same `tp x cp x dp` ranks, so an expert group
may span tensor, context and data-parallel ranks. Degrees whose expert layers need that (an
expert tensor-parallel degree `etp` other than tp, context parallelism with experts, or `ep`
not dividing dp) are *folded*: their axes are the dense ones only, `pp, dp, cp, tp` (dp whole),
and the expert groups are digit ranges of the stage index (`expert_group`, `expert_tp_group`,
`expert_data_group`). The others keep the `ep` axis above, so their placements and
predictions are those of the layouts without folding.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property

from synth.plan.errors import LimitValueError
from synth.plan.folding import DigitGroup
from synth.names import Sized
from synth.plan.model import Transformer

ROLES = ("pp", "dp", "ep", "cp", "tp")  # axis order, outermost first


@dataclass(frozen=True)
class Degrees:
    dp: int
    tp: int
    pp: int
    cp: int = 1
    ep: int = 1  # expert parallelism: a divisor of dp, or of tp x cp x dp when folded (module docstring)
    etp: int = 0  # expert tensor parallelism; 0: the tensor-parallel degree (Megatron's default)

    def __post_init__(self):
        if self.etp == self.tp:  # one spelling of the default, so equal layouts compare equal
            object.__setattr__(self, "etp", 0)

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @cached_property
    def folded(self) -> bool:
        """Whether the expert layers need their own mesh (module docstring)."""
        return bool(self.etp) or (self.ep > 1 and (self.cp > 1 or self.dp % self.ep != 0))

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def of(self, role: str) -> int:
        return getattr(self, role)

    def axis_size(self, role: str) -> int:
        """The size of the role's axis: the data-parallel axis is what expert parallelism leaves."""
        if self.folded:
            return 1 if role == "ep" else self.of(role)
        return self.dp // self.ep if role == "dp" else self.of(role)

    def axes(self) -> tuple[Sized, ...]:
        """The job's axes, outermost first, size-1 roles left out (one axis of size 1 if all are)."""
        axes = tuple(Sized(role, self.axis_size(role)) for role in ROLES if self.axis_size(role) > 1)
        return axes or (Sized("dp", 1),)

    def data_axes(self) -> tuple[str, ...]:
        """The axes of the dense weights' data-parallel group (dp, and ep inside it)."""
        return tuple(role for role in ("dp", "ep") if self.axis_size(role) > 1) or ("dp",)

    def expert_data_axes(self) -> tuple[str, ...] | DigitGroup:
        """The groups over which the experts' gradients are reduced (none when the expert data
        parallelism is 1): the `dp` axis, or when folded the stage index's digits above ep x etp."""
        if self.folded:
            return DigitGroup("edp", self.ep * self.expert_tp, self.tp * self.cp * self.dp) if self.expert_dp > 1 else ()
        return ("dp",) if self.axis_size("dp") > 1 else ()

    def expert_group(self) -> tuple[str, ...] | DigitGroup:
        """The expert-parallel groups (dispatch and combine): the `ep` axis, or the folded digits."""
        return DigitGroup("ep", self.expert_tp, self.expert_tp * self.ep) if self.folded else ("ep",)

    def expert_tp_group(self) -> tuple[str, ...] | DigitGroup:
        """The expert tensor-parallel groups: the `tp` axis, or the folded stage index's lowest digits."""
        return DigitGroup("etp", 1, self.expert_tp) if self.folded else ("tp",)

    def expert_aligned(self, placement) -> bool:
        """Whether the folded expert groups have a per-level span on `placement` (folding.py)."""
        groups = (self.expert_group(), self.expert_tp_group(), self.expert_data_axes()) if self.folded else ()
        return all(group.aligned(placement) for group in groups if group)

    @property
    def expert_dp(self) -> int:
        """The expert data-parallel degree: tp x cp x dp / (ep x etp), dp / ep without folding."""
        if self.folded:
            return self.tp * self.cp * self.dp // (self.ep * self.expert_tp)
        return self.dp // self.ep

    @cached_property
    def text(self) -> str:  # kept: a ranking key, asked thousands of times
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}"]
        parts += ([f"cp={self.cp}"] if self.cp > 1 else []) + ([f"ep={self.ep}"] if self.ep > 1 else [])
        return ",".join(parts + ([f"etp={self.etp}"] if self.etp else []))

    def to_json(self) -> dict:
        """The degrees; with experts, also `edp`, the expert data-parallel size, and when folded
        `etp`, the expert tensor-parallel one."""
        expert = {"edp": self.expert_dp} if self.ep > 1 or self.etp else {}
        expert.update({"etp": self.expert_tp, "folded": True} if self.folded else {})
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp, "ep": self.ep, **expert}

    def exported_names(self, axis_names: tuple[str, ...]) -> tuple[str, ...]:
        """The axes as exports name them: with experts the `dp` axis (size dp / ep) is the expert
        data-parallel group, `edp` (Megatron's expert data-parallel group); the dense one spans
        `edp` and `ep` (`data_axes`). Without experts the names are the axes'."""
        return tuple("edp" if name == "dp" and self.ep > 1 and not self.folded else name for name in axis_names)


@dataclass(frozen=True)
class DegreeLimits:
    """What the user fixes: a degree (None: searched; cp defaults to 1), a largest tensor degree."""

    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    cp: int | None = 1
    max_tp: int | None = None
    ep: int | None = None  # MoE models: None searches every divisor of the experts that the ranks allow
    etp: int | None = None  # MoE models: None tries the tensor-parallel degree and 1

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "cp", "max_tp", "ep", "etp"):
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
    if degrees.ep > 1 or degrees.etp or model.is_moe:
        from synth.plan.moe import expert_problem

        reason = expert_problem(model, degrees)
        if reason:
            return reason
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
                dp = devices // (cp * tp * pp)
                for ep, etp in _expert_degrees(model, dp, tp, cp, limits):
                    degrees = Degrees(dp, tp, pp, cp, ep, etp)
                    reason = limit_problem(degrees, limits) or model_problem(model, degrees)
                    if reason:
                        if refused is not None:
                            refused[reason] += 1
                        continue
                    yield degrees


def _expert_degrees(model: Transformer, dp: int, tp: int, cp: int, limits: DegreeLimits) -> list[tuple[int, int]]:
    """(ep, etp) pairs to try: (1, 0) for dense models; for MoE models first every divisor of dp
    that divides the experts (without context parallelism: the layouts without folding, in their
    order), then the folded ones (module docstring): expert tensor parallelism the tensor-parallel
    degree or 1, and every ep > 1 dividing the experts and tp x cp x dp / etp with ep x etp at
    least tp x cp (expert data parallelism at most dp). A fixed --ep or --etp is kept as given
    (to be refused with its reason)."""
    if not model.is_moe:
        return [(limits.ep or 1, limits.etp or 0)] if limits.ep or limits.etp else [(1, 0)]
    etps = [limits.etp] if limits.etp is not None else sorted({tp, 1}, reverse=True)
    pairs = []
    if limits.ep is None and limits.etp in (None, tp):
        pairs = [(ep, 0) for ep in divisors(dp) if model.experts % ep == 0] if cp == 1 else [(1, 0)]
    for etp in etps:
        if limits.ep is not None:
            candidates = [limits.ep]
        else:
            ranks = tp * cp * dp
            # searched folding keeps the expert mesh's model-parallel block (ep x etp) at least the
            # dense one's (tp x cp): below it the experts replicate inside the tensor and context
            # groups (edp above dp), a layout the unfolded ones already cover better
            candidates = [ep for ep in divisors(ranks // etp) if ep > 1 and model.experts % ep == 0
                          and ep * etp >= tp * cp] if ranks % etp == 0 else []
        for ep in candidates:
            pair = (ep, 0 if etp == tp else etp)
            if pair not in pairs:
                pairs.append(pair)
    return pairs or [(1, 0)]


def limit_problem(degrees: Degrees, limits: DegreeLimits) -> str | None:
    for role in ("dp", "tp", "pp", "cp", "ep"):
        fixed = getattr(limits, role)
        if fixed is not None and degrees.of(role) != fixed:
            return f"{role} fixed to {fixed}"
    if limits.etp is not None and degrees.expert_tp != limits.etp:
        return f"etp fixed to {limits.etp}"
    if limits.max_tp is not None and degrees.tp > limits.max_tp:
        return f"tp above the largest allowed, {limits.max_tp}"
    return None
