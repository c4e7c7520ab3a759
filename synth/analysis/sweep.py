"""Sweeps: every placement x every reduction request x every size, and the best program of each.

A configuration is (placement, request, size). For each one the sweep reports the best
program under the model (ties broken by canonical text, as `rank_programs` orders them), the
default all-reduce's time on the same configuration, the speedup, the ratio to the lower
bound and how many valid programs were ranked: row for row what `synth rank` would put on top.

Why it is fast: the valid programs, and what each step of each program does to the
reduction group (its calls and the chunks each spans), depend only on the synthesis
hierarchy's level sizes, so `ProgramSets` enumerates and walks them once per shape for every
placement and request (synth/search/programs.py); per (placement, request) the costing
engine (synth/model/engine.py, shared by placements whose groups sit on the system alike)
costs each distinct step once for all sizes and the estimate combines them for every
program at once; the lower bound is a line in the size.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from synth.search.programs import ProgramSet, ProgramSets
from synth.search.rank import Ranker
from synth.hierarchy import build_hierarchy
from synth.model.context import CostContext, cost_context
from synth.model.engine import engine_for
from synth.model.estimate import Estimate, resolve_estimate
from synth.placement import Axis, Placement
from synth.topology import Topology

# Relative margin below which a program only ties the default all-reduce (sums of the same
# step times in another order can differ in the last bits).
WIN_MARGIN = 1e-9


@dataclass(frozen=True)
class SweepRow:
    """One configuration: the best program and the default all-reduce on it (docs/model.md section 8),
    as the files record it (programs as text)."""

    topology: str
    backend: str
    matrix: str  # the placement as compact JSON, the form --placement takes
    reduce: str  # reduced axes joined by ","
    group_size: int
    bytes: int
    programs: int  # valid programs ranked
    best_program: str
    best_length: int
    best_time_s: float
    best_algbw_GBps: float
    best_busbw_GBps: float
    baseline_program: str
    baseline_time_s: float
    baseline_busbw_GBps: float
    speedup: float  # baseline time / best time, >= 1
    lower_bound_s: float
    bound_ratio: float  # best time / lower bound, >= 1
    baseline_bound_ratio: float

    @property
    def beats_baseline(self) -> bool:
        """A win: faster than the default all-reduce by more than float rounding."""
        return self.speedup > 1 + WIN_MARGIN

    def to_json(self) -> dict:
        return dict(self.__dict__)


FIELDS = tuple(SweepRow.__dataclass_fields__)


@dataclass(frozen=True)
class Sweep:
    """What one sweep ran and found; rows ordered by placement, request, then size."""

    topology: str
    axes: str
    backend: str
    estimate: str
    hierarchy: str
    max_len: int
    sizes: tuple[int, ...]
    placements: int
    requests: tuple[str, ...]
    skipped: tuple[str, ...]  # requests whose groups have one member: nothing to reduce
    rows: tuple[SweepRow, ...]

    def to_json(self) -> dict:
        return {
            "topology": self.topology, "axes": self.axes, "backend": self.backend, "estimate": self.estimate,
            "hierarchy": self.hierarchy,
            "max_len": self.max_len, "sizes": list(self.sizes), "placements": self.placements,
            "requests": list(self.requests), "skipped_requests": list(self.skipped),
            "rows": [row.to_json() for row in self.rows],
        }


def reduction_requests(axes: Iterable[Axis]) -> list[tuple[str, ...]]:
    """Every non-empty set of axes, smallest first, each in axis order."""
    names = [axis.name for axis in axes]
    return [combo for count in range(1, len(names) + 1) for combo in itertools.combinations(names, count)]


def has_members(request: tuple[str, ...], axes: Iterable[Axis]) -> bool:
    """Whether a request's groups have more than one member (axes of size 1 reduce nothing)."""
    return any(axis.size > 1 for axis in axes if axis.name in request)


def sweep_hierarchy(context: CostContext, sizes: Iterable[int], programs: ProgramSet,
                    estimate: str | Estimate | None = None, times_cache: dict | None = None) -> list[SweepRow]:
    """The best program and the baseline at each size for one (placement, request).
    `times_cache` keeps program times by (engine, programs, sizes, estimate): configurations
    whose groups sit on the system alike share an engine and so every time (the README's
    sweep costs 51 such classes for its 133 placement x request pairs)."""
    ranker = Ranker(context, estimate=estimate, engine=engine_for(context))
    hierarchy = context.hierarchy
    sizes = [int(size) for size in sizes]
    n = hierarchy.group_size
    factor = ranker.goal.bus_factor(n)
    matrix, reduce = hierarchy.placement.to_text(), ",".join(hierarchy.reduce_axes)
    key = (ranker.engine, id(programs.table), tuple(sizes), ranker.estimate.name)
    times = None if times_cache is None else times_cache.get(key)
    if times is None:
        times = ranker.times(programs, sizes)
        if times_cache is not None:
            times_cache[key] = times
    bounds = ranker.bound_times(sizes)
    lengths = programs.table.lengths
    baseline = programs.baseline
    rows = []
    for z, size in enumerate(sizes):
        column = times[:, z]
        best = programs.fastest(column)
        best_time, baseline_time, bound = float(column[best]), float(column[baseline]), float(bounds[z])
        rows.append(SweepRow(
            topology=context.topology.name, backend=context.backend.name, matrix=matrix, reduce=reduce, group_size=n,
            bytes=size, programs=len(programs), best_program=programs.texts[best], best_length=int(lengths[best]),
            best_time_s=best_time, best_algbw_GBps=size / best_time / 1e9,
            best_busbw_GBps=size / best_time * factor / 1e9,
            baseline_program=programs.texts[baseline], baseline_time_s=baseline_time,
            baseline_busbw_GBps=size / baseline_time * factor / 1e9, speedup=baseline_time / best_time,
            lower_bound_s=bound, bound_ratio=best_time / bound, baseline_bound_ratio=baseline_time / bound,
        ))
    return rows


def run_sweep(topology: Topology, placements: list[Placement], axes: tuple[Axis, ...], sizes: list[int],
              backend: str = "nccl", max_len: int = 5, hierarchy_kind: str = "merged",
              program_sets: ProgramSets | None = None,
              on_pair: Callable[[Placement, tuple[str, ...], int], None] | None = None,
              estimate: str | Estimate | None = None, times_cache: dict | None = None) -> Sweep:
    """Every placement x every non-empty request x every size. `on_pair(placement, request,
    configurations done)` is called after each (placement, request), for a progress display;
    `program_sets` and `times_cache` carry what one call costs to the next (a sweep run one
    placement at a time)."""
    estimate = resolve_estimate(estimate)
    program_sets = program_sets or ProgramSets()
    times_cache = {} if times_cache is None else times_cache
    requests = reduction_requests(axes)
    kept = [request for request in requests if has_members(request, axes)]
    rows: list[SweepRow] = []
    backend_name = backend if isinstance(backend, str) else backend.name
    for placement in placements:
        for request in kept:
            hierarchy = build_hierarchy(placement, request, hierarchy_kind)
            context = cost_context(hierarchy, topology, backend)
            backend_name = context.backend.name
            rows += sweep_hierarchy(context, sizes, program_sets.get(hierarchy, max_len), estimate, times_cache)
            if on_pair is not None:
                on_pair(placement, request, len(sizes))
    return Sweep(
        topology=topology.name, axes=",".join(f"{axis.name}={axis.size}" for axis in axes), backend=backend_name,
        estimate=estimate.name, hierarchy=hierarchy_kind, max_len=max_len, sizes=tuple(sizes),
        placements=len(placements), requests=tuple(",".join(request) for request in kept),
        skipped=tuple(",".join(request) for request in requests if request not in kept), rows=tuple(rows),
    )


def configurations(placements: int, axes: tuple[Axis, ...], sizes: int) -> int:
    """How many configurations a sweep costs: placements x requests with members x sizes."""
    return placements * sum(has_members(request, axes) for request in reduction_requests(axes)) * sizes
