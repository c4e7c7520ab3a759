"""A training step's communication as several reductions at once, placements ranked by its total.

A placement that is best for the data-parallel gradient all-reduce may put the model axis
across a slow link, and a model-parallel all-reduce runs once per layer. So placements are
ranked by the step's whole reduction time:

    total(M)          = sum over reductions r of count_r * best_time_M(axes_r, bytes_r)
    baseline_total(M) = sum over reductions r of count_r * baseline_time_M(axes_r, bytes_r)

with `best_time` the fastest program's time (the exact top-1 search) and `baseline_time` the
default all-reduce's, both for one call on placement M. Reductions are taken to run one
after another (no overlap between them), which is what a sum models; it is the time the
step spends in reductions, not the step's wall time when they overlap with compute.

A reduction is written `AXES:BYTES[xCOUNT]`: AXES are axis names joined by `+` (a comma is
read the same, as `--reduce` does), BYTES a size as `--bytes` takes it, COUNT the number of
calls per step (default 1). E.g. `data:1GiB` (one gradient all-reduce) and `model:64MiBx96`
(two per layer in a 48-layer Megatron transformer) or `data+model:8MiB`. A reduction that runs
behind compute (the gradient all-reduce behind backward) ends in `@overlap`, e.g.
`data:1GiB@overlap`: it is summed apart, as overlapped time, and placements are ranked by the
exposed time first. Whether the overlapped time really fits behind compute, compute itself,
memory and pipeline transfers are not modelled here (`synth plan` models the whole step).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from synth.search import BestPrograms
from synth.analysis.explore import hierarchy_text
from synth.errors import UsageError
from synth.hierarchy import build_hierarchy
from synth.language import Program
from synth.model.algorithms import Backend
from synth.model.backends import resolve_backend
from synth.model.context import cost_context
from synth.model.estimate import Estimate
from synth.model.network import check_costable
from synth.placement import Axis, Placement, enumerate_placements
from synth.topology import Topology
from synth.units import format_bytes, parse_bytes

_REDUCTION = re.compile(r"\s*(?P<axes>[^:]*?)\s*:\s*(?P<bytes>.*?)\s*(?:[x\u00d7]\s*(?P<count>[^x\u00d7]*?)\s*)?\Z")
OVERLAP_SUFFIX = "@overlap"
IGNORED = ("compute", "memory", "pipeline point-to-point", "whether overlapped reductions fit behind compute")
EXAMPLE = "data:1GiB or model:64MiBx96"


@dataclass(frozen=True)
class Reduction:
    axes: tuple[str, ...]  # in axis order
    bytes: int  # per device, per call
    count: int  # calls per step
    overlapped: bool = False  # runs behind compute (written with the @overlap suffix)

    @property
    def text(self) -> str:
        count = f"x{self.count}" if self.count != 1 else ""
        suffix = OVERLAP_SUFFIX if self.overlapped else ""
        return f"{'+'.join(self.axes)}:{format_bytes(self.bytes).replace(' ', '')}{count}{suffix}"


def parse_reduction(text: str, axis_names: tuple[str, ...]) -> Reduction:
    """`AXES:BYTES[xCOUNT]` (see the module docstring) against the job's axes."""
    where = f"reduction {text!r}"
    overlapped = (text or "").rstrip().endswith(OVERLAP_SUFFIX)
    if overlapped:
        text = text.rstrip()[: -len(OVERLAP_SUFFIX)]
    match = _REDUCTION.match(text or "")
    if not match or not match["axes"] or not match["bytes"]:
        raise UsageError(f"{where}: write AXES:BYTES[xCOUNT], e.g. {EXAMPLE}")
    names = [name.strip() for name in re.split(r"[+,]", match["axes"])]
    if not all(names):
        raise UsageError(f"{where}: an empty axis name; join axes with '+', e.g. data+model:8MiB")
    for name in names:
        if name not in axis_names:
            raise UsageError(f"{where}: unknown axis {name!r}; the axes are {', '.join(axis_names)}")
    if len(set(names)) != len(names):
        raise UsageError(f"{where}: names an axis twice")
    axes = tuple(name for name in axis_names if name in names)
    size = parse_bytes(match["bytes"], where=where)
    count_text = match["count"]
    if count_text is None:
        count = 1
    elif not re.fullmatch(r"[0-9]{1,9}", count_text) or int(count_text) < 1:  # ASCII digits, at most a billion
        raise UsageError(f"{where}: the count {count_text!r} after 'x' is not a positive integer; e.g. {EXAMPLE}")
    else:
        count = int(count_text)
    return Reduction(axes, size, count, overlapped)


@dataclass(frozen=True)
class ReductionTerm:
    """One reduction on one placement: its fastest program and both times, per call and per step."""

    reduction: Reduction
    hierarchy: str
    program: Program
    time_s: float  # one call of the fastest program
    baseline_time_s: float  # one call of the default all-reduce

    @property
    def total_s(self) -> float:
        return self.reduction.count * self.time_s

    @property
    def baseline_total_s(self) -> float:
        return self.reduction.count * self.baseline_time_s

    def to_json(self) -> dict:
        return {
            "reduction": self.reduction.text, "axes": list(self.reduction.axes), "bytes": self.reduction.bytes,
            "count": self.reduction.count, "hierarchy": self.hierarchy, "program": str(self.program),
            "time_s": self.time_s, "baseline_time_s": self.baseline_time_s, "total_s": self.total_s,
            "baseline_total_s": self.baseline_total_s, "overlapped": self.reduction.overlapped,
        }


@dataclass(frozen=True)
class WorkloadRow:
    matrix: tuple[tuple[int, ...], ...]
    placement: str
    terms: tuple[ReductionTerm, ...]  # in the order the reductions were given
    total_s: float
    baseline_total_s: float
    spread_vs_best: float  # total / the fastest placement's total
    baseline_spread_vs_best: float  # baseline total / the fastest placement's baseline total

    @property
    def speedup(self) -> float:
        return self.baseline_total_s / self.total_s

    @property
    def exposed_s(self) -> float:
        """The reductions on the critical path (those not marked @overlap)."""
        return _sum(term.total_s for term in self.terms if not term.reduction.overlapped)

    @property
    def overlapped_s(self) -> float:
        """The reductions behind compute (marked @overlap), not added to the exposed time."""
        return _sum(term.total_s for term in self.terms if term.reduction.overlapped)

    def to_json(self) -> dict:
        return {
            "matrix": [list(row) for row in self.matrix], "placement": self.placement, "total_s": self.total_s,
            "exposed_s": self.exposed_s, "overlapped_s": self.overlapped_s, "ignores": list(IGNORED),
            "baseline_total_s": self.baseline_total_s, "speedup": self.speedup,
            "spread_vs_best": self.spread_vs_best, "baseline_spread_vs_best": self.baseline_spread_vs_best,
            "reductions": [term.to_json() for term in self.terms],
        }


@dataclass(frozen=True)
class WorkloadResult:
    topology: str
    reductions: tuple[Reduction, ...]
    backend: str
    rows: tuple[WorkloadRow, ...]  # smallest total first, ties by matrix text
    interrupted: bool = False  # Ctrl-C: the rows are the placements done before it

    @property
    def spread(self) -> float:
        return max(row.spread_vs_best for row in self.rows)

    @property
    def baseline_spread(self) -> float:
        return max(row.baseline_spread_vs_best for row in self.rows)


def _sum(values) -> float:
    """Summed left to right, so a caller adding the terms in order gets the same float."""
    total = 0.0
    for value in values:
        total += value
    return total


def evaluate_workload(topology: Topology, axes: tuple[Axis, ...], reductions: list[Reduction],
                      placements: list[Placement] | None = None, constraints=(), max_len: int = 5,
                      backend: str | Backend = "nccl", hierarchy_kind: str = "merged",
                      estimate: str | Estimate | None = None) -> WorkloadResult:
    """Every placement (or the ones given) with its step's total reduction time, smallest first.

    Raises ValueError for a reduction whose groups have one member: it has nothing to reduce
    on any placement, so it is a mistake in the workload rather than a zero term."""
    check_costable(topology)
    backend = resolve_backend(backend)
    if not reductions:
        raise ValueError("a workload needs at least one reduction")
    if placements is None:
        placements = enumerate_placements(topology, axes, constraints)
    measured, interrupted = [], False
    try:
        for placement in placements:
            choosers: dict[tuple[str, ...], BestPrograms] = {}
            terms = []
            for reduction in reductions:
                if reduction.axes not in choosers:
                    hierarchy = build_hierarchy(placement, reduction.axes, hierarchy_kind)
                    if hierarchy.group_size == 1:
                        raise ValueError(f"reduction {reduction.text} involves one device per group: nothing to reduce")
                    choosers[reduction.axes] = BestPrograms(cost_context(hierarchy, topology, backend), max_len, estimate)
                chooser = choosers[reduction.axes]
                choice = chooser.best(reduction.bytes)
                terms.append(ReductionTerm(reduction, hierarchy_text(chooser.hierarchy), choice.program, choice.time_s,
                                           choice.baseline_time_s))
            measured.append((placement, tuple(terms), _sum(term.total_s for term in terms),
                             _sum(term.baseline_total_s for term in terms)))
    except KeyboardInterrupt:  # keep the placements done (the caller says the result is partial)
        if not measured:
            raise
        interrupted = True
    fastest = min(total for _, _, total, _ in measured)
    fastest_baseline = min(baseline for _, _, _, baseline in measured)
    rows = [WorkloadRow(placement.matrix, placement.to_text(), terms, total, baseline, total / fastest,
                        baseline / fastest_baseline)
            for placement, terms, total, baseline in measured]
    rows.sort(key=lambda row: (row.exposed_s, row.overlapped_s, row.placement))
    return WorkloadResult(topology.name, tuple(reductions), backend.name, tuple(rows), interrupted)
