"""Estimates: how a program's step costs (synth/model/engine.py) become its time.

Both answer one question, the time of one run of the program by every reduction group at
once for S bytes per device (docs/model.md section 8), batched over programs and sizes
(`program_times`) or step by step for a search (`start`, `extend`, `value`):

* `lockstep`: every step waits for all groups' calls of the previous one; a program takes
  the sum of its steps, each costed for all groups' calls together.
* `pipelined`: ranks do not wait for each other between steps, and iterations run back to
  back, so one group's intra-node step runs while another's inter-node step holds the
  uplink. A program then takes the larger of
    - the busiest link's load over the whole program (every step of every group) over its
      capacity, `S * max over links of sum over steps of link-seconds per byte`: no overlap
      beats it; and
    - one group's own chain, the sum of its steps each costed for its calls alone (launch
      and hop latencies included): a group's steps do depend on each other.
  It is about the lockstep sum when one step loads every link the program uses, and below
  it when steps load different links (emu-2x4, two data groups per node pair:
  `AllReduce(InsideGroup(gpu)); AllReduce(Master(node)); Broadcast(InsideGroup(gpu))` measures
  36 ms where the lockstep sum says 60 and the uplink alone needs 34).

`DEFAULT_ESTIMATE` is the one the emulated-cluster measurements favour
(results/estimate-choice/README.md, `python -m benchmarks.estimates`).

Search: `value` of a prefix is a lower bound on the time of every program that extends it
(admissible), and equals the program's time when the prefix is the whole program, so a
best-first search popping prefixes in (value, text) order pops complete programs in exactly
the order of the full ranking (synth/search/rank.py). Proof, per estimate: step times,
chain times and link-seconds are >= 0, and floating-point addition of a non-negative number
never decreases a sum (rounding is monotone: a + b >= a for b >= 0, so fl(a + b) >= a), nor
does multiplying by S > 0 or taking a max. Lockstep: a completion adds step times to the
prefix's sum, in program order, as the batch adds them. Pipelined: a completion adds to every
link's sum and to the chain, so both terms of the max can only grow. The batch computes the
same sums in the same order, so a popped program's value is its ranked time to the last bit.
With `more` (times m_1 .. m_j such that every completion adds j steps or more whose times
can be matched one to one with m_i <= t_i), the sum or chain is raised by the m_i and shaved
by a relative SHAVE: exactly, the completion's sum is at least the prefix's plus the sum of
the m_i; in floating point the completion's rounded sum of n steps is within n units of
rounding (2^-53 relative each) of its exact value and the raised key within j, so the key,
shaved by 1e-14 > 24 * 2^-53 (n, j <= 12 steps), stays at or below the completion's rounded
sum. The key is never below the prefix's own value, and equals it for a complete program
(nothing more to add), so popped programs carry their exact times.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from synth.errors import UsageError
from synth.model.bound import BoundLine
from synth.model.engine import CostEngine, ProgramTable, StepFigures


class Estimate(Protocol):
    """One way of combining step costs into a program's time (see the module docstring)."""

    name: str

    def program_times(self, engine: CostEngine, table: ProgramTable, sizes) -> np.ndarray:
        """[program, size] seconds."""

    def bound_times(self, line: BoundLine, sizes) -> np.ndarray:
        """The lower bound of any correct all-reduce under this estimate, per size."""

    def start(self, engine: CostEngine, size: int):
        """The empty prefix."""

    def extend(self, engine: CostEngine, prefix, figures: StepFigures, index: int):
        """The prefix followed by step `index` of `figures` (costed at the search's one size)."""

    def value(self, prefix, size: int, more: tuple[float, ...] = ()) -> float:
        """A lower bound on every completion of the prefix that adds steps at least as long
        as `more` (ascending); the time when it is complete."""


SHAVE = 1e-14  # relative: more than the rounding of two sums of <= 12 steps in different orders


def _plus(total: float, more: tuple[float, ...] = ()) -> float:
    """`total` raised by the step times `more`, shaved by SHAVE, never below `total` (see the
    module docstring)."""
    if not more:
        return total
    raised = total
    for seconds in more:
        raised = raised + seconds
    return max(total, raised * (1 - SHAVE))


def _padded(values: np.ndarray) -> np.ndarray:
    """[step, size] with a zero row appended, which a ProgramTable's PAD (-1) selects."""
    return np.vstack([values, np.zeros((1, values.shape[1]))])


def _summed(rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """[program, size]: each program's step values added in program order from 0.0."""
    total = np.zeros((len(rows), values.shape[1]))
    for position in range(rows.shape[1]):
        total = total + values[rows[:, position]]
    return total


def _distinct_columns(loads: np.ndarray) -> np.ndarray:
    """The links that carry something, each pattern of loads once (links loaded alike by every
    step, e.g. the same link of every group, give the same sums): fewer columns, same maxima.
    Columns are grouped by a projection (weights spread like random draws) and kept whole
    unless every column of a group equals its first exactly."""
    loads = loads[:, loads.any(axis=0)]
    if loads.shape[1] == 0:
        return np.zeros((len(loads), 1))
    keys = _PROJECTION[:len(loads)] @ loads if len(loads) <= len(_PROJECTION) else loads.sum(axis=0)
    _, first, group = np.unique(keys, return_index=True, return_inverse=True)
    if np.array_equal(loads, loads[:, first[group.reshape(-1)]]):
        return loads[:, np.sort(first)]
    return loads


_DISTINCT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> {regime ids: distinct columns}
_DISTINCT_KEPT = 4096  # answers kept per engine
_DISTINCT_COLUMNS = 4096  # the most columns an answer kept may have


def _distinct_link_rows(engine: CostEngine, regimes: np.ndarray) -> np.ndarray:
    """`_distinct_columns` of the given regimes' link rows (in that order), kept per engine
    while small: a search asks the same few regimes at size after size, and finding the
    distinct columns of a large system's links (a sort of every link) cost more than the
    search's own sums. A regime's number always means the same regime on its engine."""
    kept = _DISTINCT.get(engine)
    if kept is None:
        kept = _DISTINCT[engine] = {}
    key = regimes.tobytes()
    found = kept.get(key)
    if found is None:
        found = _distinct_columns(engine.link_rows(regimes))
        if found.shape[1] <= _DISTINCT_COLUMNS and len(kept) < _DISTINCT_KEPT:
            kept[key] = found
    return found


# The projection's weights: a Weyl sequence in [0.5, 1.5), spread like random draws without
# importing numpy.random. Any weights give the same maxima: a group is kept as its first column
# only when every column in it equals that column exactly.
_PROJECTION = np.modf(np.arange(1, 4097) * 0.6180339887498949)[0] + 0.5


@dataclass(frozen=True)
class Lockstep:
    name: str = "lockstep"

    def program_times(self, engine: CostEngine, table: ProgramTable, sizes) -> np.ndarray:
        figures = engine.figures(table.steps, sizes)
        return _summed(table.rows, _padded(figures.time_s))

    def bound_times(self, line: BoundLine, sizes) -> np.ndarray:
        return line.latency_s + np.asarray(sizes, dtype=np.int64) * line.seconds_per_byte

    def start(self, engine: CostEngine, size: int) -> float:
        return 0.0

    def extend(self, engine: CostEngine, prefix: float, figures: StepFigures, index: int) -> float:
        return prefix + float(figures.time_s[index, 0])

    def value(self, prefix: float, size: int, more: tuple[float, ...] = ()) -> float:
        return _plus(prefix, more)


@dataclass(frozen=True)
class Pipelined:
    name: str = "pipelined"

    def program_times(self, engine: CostEngine, table: ProgramTable, sizes) -> np.ndarray:
        sizes = np.asarray(sizes, dtype=np.int64).reshape(-1)
        figures = engine.figures(table.steps, sizes)
        chain = _summed(table.rows, _padded(figures.chain_s))
        links = np.zeros_like(chain)
        # Sizes at which every step runs the same candidates share one link sum per program.
        groups: dict[bytes, list[int]] = {}
        regimes = np.ascontiguousarray(figures.regime.T)
        for z in range(len(sizes)):
            groups.setdefault(regimes[z].tobytes(), []).append(z)
        for at in groups.values():
            loads = _distinct_link_rows(engine, regimes[at[0]])
            busiest = _summed(table.rows, np.vstack([loads, np.zeros((1, loads.shape[1]))])).max(axis=1)
            links[:, at] = sizes[at][None, :] * busiest[:, None]
        return np.maximum(links, chain)

    def bound_times(self, line: BoundLine, sizes) -> np.ndarray:
        """Back-to-back runs overlap one run's latency with another's transfer, so the bound is
        the larger of the two (the link term alone is at least the cut's transfer time)."""
        return np.maximum(line.latency_s, np.asarray(sizes, dtype=np.int64) * line.seconds_per_byte)

    def start(self, engine: CostEngine, size: int) -> tuple[np.ndarray, float, float]:
        """(link-seconds per byte so far, the chain so far, the busiest link's share)."""
        return np.zeros(engine.link_count), 0.0, 0.0

    def extend(self, engine: CostEngine, prefix, figures: StepFigures, index: int):
        loads, chain, busiest = prefix
        regime = engine.regimes[int(figures.regime[index, 0])]
        chain += float(figures.chain_s[index, 0])
        sparse = regime.busy_links
        if sparse is None:
            loads = loads + regime.link_s
            return loads, chain, float(loads.max())
        where, amounts = sparse  # the other links keep their loads, and so the busiest stays or grows
        loads = loads.copy()
        if len(where):
            loads[where] += amounts
            busiest = max(busiest, float(loads[where].max()))
        return loads, chain, busiest

    def value(self, prefix, size: int, more: tuple[float, ...] = ()) -> float:
        _, chain, busiest = prefix
        return max(size * busiest, _plus(chain, more))


LOCKSTEP = Lockstep()
PIPELINED = Pipelined()
ESTIMATES = {estimate.name: estimate for estimate in (LOCKSTEP, PIPELINED)}
DEFAULT_ESTIMATE = PIPELINED


def resolve_estimate(estimate: str | Estimate | None) -> Estimate:
    if estimate is None:
        return DEFAULT_ESTIMATE
    if not isinstance(estimate, str):
        return estimate
    if estimate not in ESTIMATES:
        raise UsageError(f"unknown estimate {estimate!r}: choose one of {', '.join(ESTIMATES)}")
    return ESTIMATES[estimate]
