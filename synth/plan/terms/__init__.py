"""The step's time as typed terms, one module each (compute, tensor-parallel traffic, context
exchange, expert traffic, pipeline transfers and bubble, ZeRO-3's gathers and scatters,
activation offload; the gradient reduction and its contention stay in step.py): each term's
per-layer figures from the model, the candidate and the cost model, which
`synth.plan.step.predict` puts on the slowest stage and sums. `Term` is one line of that sum,
with what it stands for; `Route` one kind of communication the step makes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace


@dataclass(frozen=True)
class Term:
    """One addend of a step's time: its name, its seconds per step and what it counts."""

    name: str
    seconds: float
    what: str


@dataclass(frozen=True)
class Route:
    """One kind of communication of the step: what runs, on which levels, through which link."""

    name: str  # "tensor", "data", "data-shard", "data-replica" (HSDP), "pipeline", "context", "embedding",
    # "expert", "expert-data"
    program: str
    levels: str
    time_s: float  # per call
    calls: float  # per step
    bytes: int  # per call, per device
    axes: tuple[str, ...] = ()  # the groups' axes where they are not the route's own role's (expert parallelism;
    # a folded expert group, synth/plan/folding.py, where the experts have a mesh of their own)
    # the gradient schedule of a bucketed route (costs.GradientSchedule), so its synthesized
    # buckets are told from its own schedule, not from another candidate's alike in program and sizes
    schedule: object = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict:
        """Its figures for the JSON plan (the schedule object left out: its route states it)."""
        figures = asdict(replace(self, schedule=None))  # a folded group in `axes` as its fields
        del figures["schedule"]
        return figures
