"""The step's time as typed terms, one module each (compute, tensor-parallel traffic, context
exchange, expert traffic, pipeline transfers and bubble; data-parallel traffic, offload and
contention in step.py with the modules they call): each term's per-layer figures from the
model, the candidate and the cost model, which `synth.plan.step.predict` puts on the slowest
stage and sums. `Term` is one line of that sum, with what it stands for."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    """One addend of a step's time: its name, its seconds per step and what it counts."""

    name: str
    seconds: float
    what: str
