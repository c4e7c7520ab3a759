"""How well the simulator's ranking matches measurements, for one set of programs run on one
placement (a "case"): the figures the published work reports for its simulator.

* top-1 / top-K: the measured-best program is the simulator's first / among its K first;
* Spearman's rank correlation between predicted and measured times (average ranks for ties);
* slowdown: the best measured time among the simulator's K first over the true best (>= 1),
  what a user who measures the simulator's K first programs loses;
* speedup: the default all-reduce's measured time over that of the simulator's first choice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Measured:
    program: str
    predicted_s: float
    measured_s: float
    default: bool = False


@dataclass(frozen=True)
class CaseMetrics:
    programs: int
    top1: bool
    topk: bool
    k: int
    spearman: float  # nan with fewer than 3 programs or constant times
    slowdown_topk: float
    speedup_first_over_default: float
    speedup_best_over_default: float  # what a perfect ranking would give
    first_within: float  # measured time of the simulator's first choice over the true best
    best_program: str
    first_program: str


def ranks(values) -> np.ndarray:
    """Ranks 1..n, ties given the average of the ranks they span (as scipy.stats.rankdata)."""
    values = np.asarray(values, dtype=float)
    order = np.argsort(values, kind="mergesort")
    ranked = np.empty(len(values))
    sorted_values = values[order]
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        ranked[order[start:end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return ranked


def spearman(predicted, measured) -> float:
    """Pearson correlation of the ranks; nan when undefined."""
    if len(predicted) < 3:
        return math.nan
    a, b = ranks(predicted), ranks(measured)
    if np.std(a) == 0 or np.std(b) == 0:
        return math.nan
    return float(np.corrcoef(a, b)[0, 1])


def case_metrics(rows: list[Measured], k: int = 10) -> CaseMetrics:
    """The metrics of one case; the simulator's order breaks ties by program text, as synth rank does."""
    if not rows:
        raise ValueError("a case needs at least one program")
    by_prediction = sorted(rows, key=lambda r: (r.predicted_s, r.program))
    best = min(rows, key=lambda r: (r.measured_s, r.program))
    first = by_prediction[0]
    top = by_prediction[:k]
    defaults = [r for r in rows if r.default]
    speedup = defaults[0].measured_s / first.measured_s if defaults else math.nan
    possible = defaults[0].measured_s / best.measured_s if defaults else math.nan
    return CaseMetrics(
        programs=len(rows), top1=first.program == best.program, topk=any(r.program == best.program for r in top), k=k,
        spearman=spearman([r.predicted_s for r in rows], [r.measured_s for r in rows]),
        slowdown_topk=min(r.measured_s for r in top) / best.measured_s,
        speedup_first_over_default=speedup, speedup_best_over_default=possible, first_within=first.measured_s / best.measured_s,
        best_program=best.program, first_program=first.program)


@dataclass(frozen=True)
class Summary:
    cases: int
    top1: float  # fraction of cases
    topk: float
    top1_within_5pct: float  # the first choice measures within 5% of the best
    spearman_mean: float  # over cases where it is defined
    spearman_median: float
    slowdown_geomean: float
    slowdown_max: float
    speedup_geomean: float
    speedup_min: float
    possible_speedup_geomean: float  # the measured best over the default
    possible_speedup_max: float


def summarize(metrics: list[CaseMetrics]) -> Summary:
    if not metrics:
        raise ValueError("no cases to summarize")
    rho = [m.spearman for m in metrics if not math.isnan(m.spearman)]
    speedups = [m.speedup_first_over_default for m in metrics if not math.isnan(m.speedup_first_over_default)]
    possible = [m.speedup_best_over_default for m in metrics if not math.isnan(m.speedup_best_over_default)]

    def geomean(values):
        return float(np.exp(np.mean(np.log(values)))) if values else math.nan

    return Summary(
        cases=len(metrics), top1=float(np.mean([m.top1 for m in metrics])), topk=float(np.mean([m.topk for m in metrics])),
        top1_within_5pct=float(np.mean([m.first_within <= 1.05 for m in metrics])),
        spearman_mean=float(np.mean(rho)) if rho else math.nan, spearman_median=float(np.median(rho)) if rho else math.nan,
        slowdown_geomean=geomean([m.slowdown_topk for m in metrics]), slowdown_max=max(m.slowdown_topk for m in metrics),
        speedup_geomean=geomean(speedups), speedup_min=min(speedups) if speedups else math.nan,
        possible_speedup_geomean=geomean(possible), possible_speedup_max=max(possible) if possible else math.nan)
