"""The fastest program of one placement and request at a given buffer size, and its baseline.

Exploration, workloads, fusion and the training-step planner all ask the same question many
times: on this context, which program is fastest for S bytes per device, how long does it
take, and how long does the default all-reduce take? `BestPrograms` answers it for one cost
context, keeping one `Ranker` (engine, state walker, search caches) for every size.

Two ways to answer, both giving the engine's times of real programs under one estimate:

* `best(S)`: exact. The best-first search of `Ranker.top(S, 1)`; the first program it pops is
  the fastest of every valid program up to `max_len` steps (ties by text). Memoized by size.
* `candidates(sizes)`: for many sizes (fusion asks for every sum of consecutive tensors,
  O(n^2) of them). The programs that are fastest somewhere in a range are found by the
  search on a log-spaced grid of sizes (powers of two, the top 3 at each, and the default
  all-reduce); every asked size then costs those candidates exactly, in batches, and the
  fastest wins (ties by text). At a grid size the answer is the exact optimum; between grid
  sizes it is the best candidate's time, an upper bound on the optimum (a program best only
  strictly between two grid sizes, and in no grid size's top 3, would be missed), and never
  slower than the default all-reduce. Checked against `best` at random sizes on every
  built-in topology tried, with no miss (tests/test_explore_workload_fusion.py samples it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from synth.goals import ALL_REDUCE, Goal
from synth.search.programs import ProgramSet, ProgramSets
from synth.search.rank import RankedProgram, Ranker
from synth.hierarchy import SynthesisHierarchy
from synth.language import Program
from synth.model.context import CostContext
from synth.model.engine import CostEngine
from synth.model.estimate import Estimate

GRID_FACTOR = 2  # candidate grid: powers of two spanning the asked sizes
GRID_TOP = 3  # programs kept from each grid size's search
BATCH = 4096  # sizes costed per engine call when candidates are asked for many sizes


@dataclass(frozen=True)
class Choice:
    """The fastest program of a goal at one size and its flat call's time at that size."""

    bytes: int
    program: Program
    time_s: float
    baseline_time_s: float

    @property
    def synthesized(self) -> bool:
        """True when a program other than the flat call is strictly the fastest."""
        return self.time_s < self.baseline_time_s


class BestPrograms:
    """The fastest program at any size on one context, with memoized answers."""

    def __init__(self, context: CostContext, max_len: int = 5, estimate: str | Estimate | None = None, *,
                 goal: Goal = ALL_REDUCE, engine: CostEngine | None = None, sets: ProgramSets | None = None):
        """`engine`: the context's shared engine where the caller holds it (engine_for's);
        `sets`: the program sets shared by the caller's rankers (one enumeration per shape)."""
        if context.group_size == 1:
            raise ValueError("a reduction group of one member has no program to choose")
        self.context = context
        self.max_len = max_len
        self.ranker = Ranker(context, max_len, estimate, sets, engine=engine, goal=goal)
        self._ranked: dict[tuple[int, int], tuple[RankedProgram, ...]] = {}

    @property
    def hierarchy(self) -> SynthesisHierarchy:
        return self.context.hierarchy

    def ranked(self, size: int, top: int = 1) -> tuple[RankedProgram, ...]:
        """The `top` fastest programs at `size` (the baseline appended when not among them)."""
        key = (size, top)
        if key not in self._ranked:
            self._ranked[key] = tuple(self.ranker.top(size, top))
        return self._ranked[key]

    def best_row(self, size: int) -> tuple[RankedProgram, RankedProgram]:
        """(fastest program, the goal's flat call) as ranking rows, with bandwidths and bound ratio."""
        rows = self.ranked(size)
        return rows[0], next(row for row in rows if row.baseline)

    def best(self, size: int) -> Choice:
        best, baseline = self.best_row(size)
        return Choice(size, best.program, best.time_s, baseline.time_s)

    def candidates(self, sizes, factor: int = GRID_FACTOR, top: int = GRID_TOP) -> CandidateTimes:
        """Candidate programs from the top `top` at each power of `factor` spanning `sizes`."""
        return CandidateTimes(self, grid_sizes(min(sizes), max(sizes), factor), top)

    def every(self) -> CandidateTimes:
        """Every valid program as a candidate: exact at every size (for a goal whose programs
        are few enough to cost them all, as the reduce-scatter's and the reduce's are)."""
        return CandidateTimes(self, (), programs=self.ranker.every_program())


def grid_sizes(low: int, high: int, factor: int = GRID_FACTOR) -> tuple[int, ...]:
    """Powers of `factor` from the largest at or below `low` to the smallest at or above `high`."""
    if low < 1 or high < low or factor < 2:
        raise ValueError("grid sizes need 1 <= low <= high and factor >= 2")
    size = factor ** int(math.floor(math.log(low, factor) + 1e-12))
    while size > low:  # guard the float logarithm
        size //= factor
    sizes = [size]
    while sizes[-1] < high:
        sizes.append(sizes[-1] * factor)
    return tuple(sizes)


class CandidateTimes:
    """Fastest-of-candidates at any size: the candidates found once on a grid, every asked
    size costed exactly (see the module docstring for what this guarantees)."""

    def __init__(self, best: BestPrograms, grid: tuple[int, ...], top: int = GRID_TOP,
                 programs: ProgramSet | None = None):
        self.best_programs = best
        self.grid = grid
        if programs is None:
            found: dict[str, Program] = {}
            for size in grid:
                for row in best.ranked(size, top):
                    found.setdefault(str(row.program), row.program)
            programs = best.ranker.programs([found[text] for text in sorted(found)])
        self.set = programs
        self.programs: tuple[Program, ...] = self.set.programs
        self._memo: dict[int, Choice] = {}

    def prefetch(self, sizes: Iterable[int]) -> None:
        """Cost these sizes in batches (many sizes cost little more than one)."""
        missing = sorted({int(size) for size in sizes} - self._memo.keys())
        ranker = self.best_programs.ranker
        baseline = self.set.baseline
        for start in range(0, len(missing), BATCH):
            chunk = missing[start:start + BATCH]
            times = ranker.times(self.set, chunk)
            for z, size in enumerate(chunk):
                column = times[:, z]
                fastest = self.set.fastest(column)
                self._memo[size] = Choice(size, self.programs[fastest], float(column[fastest]),
                                          float(column[baseline]))

    def __call__(self, size: int) -> Choice:
        if size not in self._memo:
            self.prefetch([size])
        return self._memo[size]

