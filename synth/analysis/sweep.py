"""Sweeps: every placement x every reduction request x every size, and the best program of each.

A configuration is (placement, request, size). For each one the sweep reports the best
program under the model (ties broken by canonical text, as `rank_programs` orders them), the
default all-reduce's time on the same configuration, the speedup, the ratio to the lower
bound and how many valid programs were ranked: row for row what `synth rank` would put on top.

Why it is fast enough for thousands of configurations:

* The valid programs, and what each step of each program does to the reduction group (its
  calls as member-rank tuples and the chunks each call spans), depend only on the synthesis
  hierarchy's level names and sizes, not on the placement or the size in bytes. A
  `Catalogue` enumerates and walks them once per (names, sizes, max_len) and keeps each
  program as a row of indices into a table of distinct steps.
* Per (placement, request) one `Simulator` costs each distinct step once per size (it caches
  compiled plans and per-byte phase times across sizes), and a program's time is the sum of
  its steps' times: a few numpy gathers per size instead of one Python object per program.
  The sum runs in program order, as `Simulator.cost_of_steps` adds, so times agree exactly.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from synth.hierarchy import SynthesisHierarchy, build_hierarchy
from synth.language import Step
from synth.placement import Axis, Placement
from synth.model.bound import lower_bound
from synth.model.algorithms import Backend, resolve_backend
from synth.model.cost import Simulator, bus_factor
from synth.analysis.rank import ProgramWalker
from synth.topology import Topology

StepKey = tuple  # (collective, sorted calls, chunks of each call): what Simulator.step_time takes


@dataclass(frozen=True)
class Shape:
    """Every valid program of one hierarchy shape (level sizes), level names aside: each
    program as a row of indices into the distinct steps it makes."""

    programs: tuple[tuple[tuple[str, str, int], ...], ...]  # (collective, form, level index) per step
    steps: tuple[StepKey, ...]
    table: np.ndarray  # [program, position] -> index into `steps`; len(steps) pads short programs
    lengths: np.ndarray  # [program] -> number of steps
    baseline: int  # the one program of length 1: the default all-reduce


@dataclass(frozen=True)
class Catalogue:
    """A shape with its level names: the programs' canonical texts and their sorted order."""

    shape: Shape
    texts: tuple[str, ...]
    text_rank: np.ndarray  # [program] -> position in sorted text order, the tie-break

    @property
    def size(self) -> int:
        return len(self.texts)


def build_shape(hierarchy: SynthesisHierarchy, max_len: int) -> Shape:
    """Enumerate and walk every valid program of the hierarchy once."""
    walker = ProgramWalker(hierarchy)
    programs, rows, index_of = [], [], {}
    for program in walker.enumerator(max_len).programs():
        row = []
        for step, calls, chunks in walker.steps(program):
            row.append(index_of.setdefault((step.collective, calls, chunks), len(index_of)))
        programs.append(tuple((s.collective, s.form, hierarchy.level_index(s.level)) for s in program.steps))
        rows.append(row)
    table = np.full((len(rows), max(map(len, rows))), len(index_of), dtype=np.int64)
    for i, row in enumerate(rows):
        table[i, : len(row)] = row
    lengths = np.array([len(row) for row in rows], dtype=np.int64)
    return Shape(tuple(programs), tuple(index_of), table, lengths, int(np.flatnonzero(lengths == 1)[0]))


def name_shape(shape: Shape, level_names: tuple[str, ...]) -> Catalogue:
    """The shape's programs spelled with these level names (the enumeration only numbers levels)."""
    texts = tuple("; ".join(str(Step(c, f, level_names[l])) for c, f, l in program) for program in shape.programs)
    text_rank = np.empty(len(texts), dtype=np.int64)
    text_rank[sorted(range(len(texts)), key=texts.__getitem__)] = np.arange(len(texts))
    return Catalogue(shape, texts, text_rank)


class Catalogues:
    """Catalogues shared by every placement and request with the same hierarchy shape: the
    enumeration runs once per (sizes, max_len), the spelling once per level names."""

    def __init__(self):
        self._shapes: dict[tuple, Shape] = {}
        self._named: dict[tuple, Catalogue] = {}

    @property
    def shapes(self) -> int:
        """How many enumerations ran."""
        return len(self._shapes)

    def get(self, hierarchy: SynthesisHierarchy, max_len: int) -> Catalogue:
        key = (hierarchy.sizes, max_len)
        if key not in self._shapes:
            self._shapes[key] = build_shape(hierarchy, max_len)
        named = (hierarchy.level_names, *key)
        if named not in self._named:
            self._named[named] = name_shape(self._shapes[key], hierarchy.level_names)
        return self._named[named]


# Relative margin below which a program only ties the default all-reduce (sums of the same
# step times in another order can differ in the last bits).
WIN_MARGIN = 1e-9


@dataclass(frozen=True)
class SweepRow:
    """One configuration: the best program and the default all-reduce on it (docs/model.md section 8)."""

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
    hierarchy: str
    max_len: int
    sizes: tuple[int, ...]
    placements: int
    requests: tuple[str, ...]
    skipped: tuple[str, ...]  # requests whose groups have one member: nothing to reduce
    rows: tuple[SweepRow, ...]

    def to_json(self) -> dict:
        return {
            "topology": self.topology, "axes": self.axes, "backend": self.backend, "hierarchy": self.hierarchy,
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


def sweep_hierarchy(hierarchy: SynthesisHierarchy, topology: Topology, sizes: Iterable[int], catalogue: Catalogue,
                    backend: str | Backend = "nccl") -> list[SweepRow]:
    """The best program and the baseline at each size for one (placement, request)."""
    backend = resolve_backend(backend)
    simulator = Simulator(hierarchy, topology, backend)
    n = hierarchy.group_size
    matrix, reduce = hierarchy.placement.to_text(), ",".join(hierarchy.reduce_axes)
    shape = catalogue.shape
    step_times = np.zeros(len(shape.steps) + 1)  # the last entry pads short programs with 0 s
    rows = []
    for size in sizes:
        for i, (collective, calls, chunks) in enumerate(shape.steps):
            step_times[i] = simulator.step_time(collective, calls, chunks, size)
        # Column by column, in program order: the same additions as Simulator.cost_of_steps.
        times = np.zeros(catalogue.size)
        for column in shape.table.T:
            times = times + step_times[column]
        fastest = np.flatnonzero(times == times.min())
        best = int(fastest[np.argmin(catalogue.text_rank[fastest])])
        best_time, baseline_time = float(times[best]), float(times[shape.baseline])
        bound = lower_bound(hierarchy, topology, size).time_s
        rows.append(SweepRow(
            topology=topology.name, backend=backend.name, matrix=matrix, reduce=reduce, group_size=n, bytes=size,
            programs=catalogue.size, best_program=catalogue.texts[best],
            best_length=int(shape.lengths[best]),
            best_time_s=best_time, best_algbw_GBps=size / best_time / 1e9,
            best_busbw_GBps=size / best_time * bus_factor(n) / 1e9,
            baseline_program=catalogue.texts[shape.baseline], baseline_time_s=baseline_time,
            baseline_busbw_GBps=size / baseline_time * bus_factor(n) / 1e9, speedup=baseline_time / best_time,
            lower_bound_s=bound, bound_ratio=best_time / bound, baseline_bound_ratio=baseline_time / bound,
        ))
    return rows


def run_sweep(topology: Topology, placements: list[Placement], axes: tuple[Axis, ...], sizes: list[int],
              backend: str | Backend = "nccl", max_len: int = 5, hierarchy_kind: str = "merged",
              catalogues: Catalogues | None = None,
              on_pair: Callable[[Placement, tuple[str, ...], int], None] | None = None) -> Sweep:
    """Every placement x every non-empty request x every size. `on_pair(placement, request,
    configurations done)` is called after each (placement, request), for a progress display."""
    backend = resolve_backend(backend)
    catalogues = catalogues or Catalogues()
    requests = reduction_requests(axes)
    kept = [request for request in requests if has_members(request, axes)]
    rows: list[SweepRow] = []
    for placement in placements:
        for request in kept:
            hierarchy = build_hierarchy(placement, request, hierarchy_kind)
            catalogue = catalogues.get(hierarchy, max_len)
            rows += sweep_hierarchy(hierarchy, topology, sizes, catalogue, backend)
            if on_pair is not None:
                on_pair(placement, request, len(sizes))
    return Sweep(
        topology=topology.name, axes=",".join(f"{axis.name}={axis.size}" for axis in axes), backend=backend.name,
        hierarchy=hierarchy_kind, max_len=max_len, sizes=tuple(sizes), placements=len(placements),
        requests=tuple(",".join(request) for request in kept),
        skipped=tuple(",".join(request) for request in requests if request not in kept), rows=tuple(rows),
    )


def configurations(placements: int, axes: tuple[Axis, ...], sizes: int) -> int:
    """How many configurations a sweep costs: placements x requests with members x sizes."""
    return placements * sum(has_members(request, axes) for request in reduction_requests(axes)) * sizes
