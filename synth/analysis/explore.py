"""Placement exploration: for one request and size, the best program on every placement.

Where the axes land on the machine often matters more than which program reduces them: the
same all-reduce can be 10x slower when its groups cross a thin uplink. This lists, per
placement, the fastest program (the exact top-1 search), the default all-reduce on that
placement, the speedup, and the ratio to the lower bound, sorted by best time (ties by the
matrix text), plus the spread between placements:

    best spread     = max over placements of best time / min over placements of best time
    baseline spread = the same over the default all-reduce's times

Each row carries its own share of the spread, `spread_vs_best` (its best time over the
fastest placement's) and `baseline_spread_vs_best` (its default all-reduce time over the
fastest placement's default all-reduce), so the largest of each is the spread.
"""

from __future__ import annotations

from dataclasses import dataclass

from synth.search import BestPrograms
from synth.goals import ALL_REDUCE, parse_goal
from synth.hierarchy import build_hierarchy
from synth.language import Program
from synth.model.algorithms import Backend
from synth.model.context import cost_context
from synth.model.estimate import Estimate
from synth.model.network import check_costable
from synth.placement import Axis, Placement, enumerate_placements
from synth.topology import Topology


@dataclass(frozen=True)
class PlacementRow:
    matrix: tuple[tuple[int, ...], ...]
    placement: str  # the matrix as `--placement` takes it
    hierarchy: str  # the synthesis hierarchy's levels, e.g. "vm=2,gpu=8"
    best_program: Program
    best_time_s: float
    best_busbw_GBps: float
    baseline_time_s: float
    baseline_busbw_GBps: float
    speedup: float  # baseline time / best time
    lower_bound_s: float
    bound_ratio: float  # best time / lower bound
    spread_vs_best: float  # best time / the fastest placement's best time
    baseline_spread_vs_best: float  # baseline time / the fastest placement's baseline time

    def to_json(self) -> dict:
        return {
            "matrix": [list(row) for row in self.matrix], "placement": self.placement, "hierarchy": self.hierarchy,
            "best_program": str(self.best_program), "best_time_s": self.best_time_s,
            "best_busbw_GBps": self.best_busbw_GBps, "baseline_time_s": self.baseline_time_s,
            "baseline_busbw_GBps": self.baseline_busbw_GBps, "speedup": self.speedup,
            "lower_bound_s": self.lower_bound_s, "bound_ratio": self.bound_ratio,
            "spread_vs_best": self.spread_vs_best, "baseline_spread_vs_best": self.baseline_spread_vs_best,
        }


@dataclass(frozen=True)
class ExploreResult:
    topology: str
    reduce_axes: tuple[str, ...]
    bytes: int
    backend: str
    rows: tuple[PlacementRow, ...]  # fastest best time first, ties by matrix text
    interrupted: bool = False  # Ctrl-C: the rows are the placements done before it

    @property
    def best_spread(self) -> float:
        """Slowest placement's best time over the fastest placement's best time (>= 1)."""
        return max(row.spread_vs_best for row in self.rows)

    @property
    def baseline_spread(self) -> float:
        """The same for the default all-reduce's times."""
        return max(row.baseline_spread_vs_best for row in self.rows)


def hierarchy_text(hierarchy) -> str:
    return ",".join(f"{level.name}={level.size}" for level in hierarchy.levels)


def explore_placements(topology: Topology, axes: tuple[Axis, ...], reduce_axes: tuple[str, ...], bytes: int,
                       placements: list[Placement] | None = None, constraints=(), max_len: int = 5,
                       backend: str | Backend = "nccl", hierarchy_kind: str = "merged",
                       estimate: str | Estimate | None = None, goal=ALL_REDUCE) -> ExploreResult:
    """The fastest program on each placement for `bytes` per device, sorted by its time.

    Every placement of `axes` satisfying `constraints`, or the `placements` given. Raises
    ValueError when the reduction groups have one member (the group size does not depend on
    the placement, so then no placement has anything to reduce). Every goal (synth/goals.py)
    is ranked by the same search, its baseline the goal's own flat call."""
    goal = parse_goal(goal)
    check_costable(topology)
    if placements is None:
        placements = enumerate_placements(topology, axes, constraints)
    if not placements:
        raise ValueError("no placement to explore")
    measured, interrupted = [], False
    try:
        for placement in placements:
            hierarchy = build_hierarchy(placement, reduce_axes, hierarchy_kind)
            if hierarchy.group_size == 1:
                raise ValueError(f"reducing over {','.join(reduce_axes)} involves one device per group: nothing to reduce")
            context = cost_context(hierarchy, topology, backend)
            chooser = BestPrograms(context, max_len, estimate, goal=goal)
            best, baseline = chooser.best_row(bytes)
            bound = chooser.ranker.bound_times([bytes])[0]
            measured.append((placement, hierarchy, best, baseline, bound))
            backend_name = context.backend.name
    except KeyboardInterrupt:  # keep the placements done (the caller says the result is partial)
        if not measured:
            raise
        interrupted = True
    fastest = min(best.time_s for _, _, best, _, _ in measured)
    fastest_baseline = min(baseline.time_s for _, _, _, baseline, _ in measured)
    rows = [
        PlacementRow(
            matrix=placement.matrix, placement=placement.to_text(), hierarchy=hierarchy_text(hierarchy),
            best_program=best.program, best_time_s=best.time_s, best_busbw_GBps=best.busbw_GBps,
            baseline_time_s=baseline.time_s, baseline_busbw_GBps=baseline.busbw_GBps,
            speedup=baseline.time_s / best.time_s, lower_bound_s=float(bound),
            bound_ratio=best.bound_ratio, spread_vs_best=best.time_s / fastest,
            baseline_spread_vs_best=baseline.time_s / fastest_baseline,
        )
        for placement, hierarchy, best, baseline, bound in measured
    ]
    rows.sort(key=lambda row: (row.best_time_s, row.placement))
    return ExploreResult(topology.name, tuple(reduce_axes), bytes, backend_name, tuple(rows), interrupted)
