"""The fastest program of one placement and request at a given buffer size, and its baseline.

Exploration, workloads and fusion all ask the same question many times: on this hierarchy,
which program is fastest for S bytes per device, how long does it take, and how long does
the default all-reduce take? `BestPrograms` answers it for one hierarchy, keeping one
`Simulator` and one `ProgramWalker` (their caches are what make many sizes cheap).

Two ways to answer, both giving simulated times of real programs:

* `best(S)`: exact. The cost-guided search of `rank_programs(top=1)`; the first program it
  pops is the fastest of every valid program up to `max_len` steps (ties by text). Memoized
  by size.
* `CandidateTimes`: for many sizes (fusion asks for every sum of consecutive tensors, O(n^2)
  of them). A program's time is piecewise affine in S: each step is a fixed latency plus a
  per-byte transfer, and the backend's pick of algorithm for a call changes only at a size
  threshold. So the few programs that are best somewhere in a range are found by searching
  a log-spaced grid of sizes (powers of two, the top 3 at each), and each is costed exactly
  at every grid size. Between two grid sizes a candidate's time is the line through its two
  grid times when the backend picks the same algorithms at both ends (then it does so
  throughout) and the midpoint's exact time lies on that line (to 1e-12 relative); in an
  interval where a pick changes, it is costed exactly at the asked size. The fastest
  candidate wins (ties by text). The default all-reduce is always a candidate, so no answer
  is ever slower than the baseline. At a grid size the answer is the exact optimum; between
  grid sizes it is the best candidate's simulated time (to rounding), an upper bound on the
  optimum: a program best only strictly between two grid sizes, and in no grid size's top 3,
  would be missed. Checked against `best` at hundreds of random sizes on every built-in
  topology tried, with no miss (tests/test_explore_workload_fusion.py samples it).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from synth.hierarchy import SynthesisHierarchy
from synth.language import parse_program
from synth.model.algorithms import Backend
from synth.model.cost import Simulator, baseline_program
from synth.analysis.rank import ProgramWalker, RankedProgram, rank_programs
from synth.topology import Topology

GRID_FACTOR = 2  # candidate grid: powers of two spanning the asked sizes
GRID_TOP = 3  # programs kept from each grid size's ranking
AFFINE_TOLERANCE = 1e-12  # relative: a program's time on a grid interval is a line when its midpoint is on it


@dataclass(frozen=True)
class Choice:
    """The fastest program at one size and the default all-reduce's time at that size."""

    bytes: int
    program: str
    time_s: float
    baseline_time_s: float


class BestPrograms:
    """The fastest program at any size on one hierarchy, with memoized answers."""

    def __init__(self, hierarchy: SynthesisHierarchy, topology: Topology, backend: str | Backend = "nccl",
                 max_len: int = 5):
        if hierarchy.group_size == 1:
            raise ValueError("a reduction group of one member has no program to choose")
        self.hierarchy = hierarchy
        self.topology = topology
        self.max_len = max_len
        self.simulator = Simulator(hierarchy, topology, backend)
        self.walker = ProgramWalker(hierarchy)
        self._ranked: dict[tuple[int, int], tuple[RankedProgram, ...]] = {}

    def ranked(self, size: int, top: int = 1) -> tuple[RankedProgram, ...]:
        """The `top` fastest programs at `size` (the baseline appended when not among them)."""
        key = (size, top)
        if key not in self._ranked:
            self._ranked[key] = tuple(rank_programs(self.hierarchy, self.topology, size, max_len=self.max_len, top=top,
                                                    simulator=self.simulator, walker=self.walker))
        return self._ranked[key]

    def best_row(self, size: int) -> tuple[RankedProgram, RankedProgram]:
        """(fastest program, default all-reduce) as ranking rows, with bandwidths and bound ratio."""
        rows = self.ranked(size)
        return rows[0], next(row for row in rows if row.baseline)

    def best(self, size: int) -> Choice:
        best, baseline = self.best_row(size)
        return Choice(size, best.program, best.time_s, baseline.time_s)

    def program_time(self, steps, size: int) -> float:
        """One program's time at `size`, given its walked steps; summed in program order as the
        simulator and the search do, so it equals their figure to the last bit."""
        total = 0.0
        for step, calls, chunks in steps:
            total += self.simulator.step_time(step.collective, calls, chunks, size)
        return total

    def candidates(self, sizes, factor: int = GRID_FACTOR, top: int = GRID_TOP) -> CandidateTimes:
        """Candidate programs from the top `top` at each power of `factor` spanning `sizes`."""
        return CandidateTimes(self, grid_sizes(min(sizes), max(sizes), factor), top)


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
    """Fastest-of-candidates at any size: the candidates found once on a grid, each asked size
    costed from them (see the module docstring for what this guarantees)."""

    def __init__(self, best: BestPrograms, grid: tuple[int, ...], top: int = GRID_TOP):
        self.best_programs = best
        self.grid = grid
        self._baseline = str(baseline_program(best.hierarchy))
        texts = {row.program for size in grid for row in best.ranked(size, top)} | {self._baseline}
        self.programs: tuple[str, ...] = tuple(sorted(texts))
        self._steps = {text: best.walker.steps(parse_program(text)) for text in self.programs}
        self._grid_times = {text: [best.program_time(self._steps[text], size) for size in grid]
                            for text in self.programs}
        self._affine = {text: [self._is_affine(text, i) for i in range(len(grid) - 1)] for text in self.programs}
        self._memo: dict[int, Choice] = {}

    def _regime(self, text: str, size: int) -> tuple:
        """Per step, the algorithms the backend picks and the latency they pay at `size`."""
        simulator = self.best_programs.simulator
        return tuple((cost.algorithm, cost.latency_s)
                     for cost in (simulator.step_cost(step, calls, chunks, size) for step, calls, chunks in self._steps[text]))

    def _interpolate(self, text: str, i: int, size: int) -> float:
        low, high = self.grid[i], self.grid[i + 1]
        t_low, t_high = self._grid_times[text][i], self._grid_times[text][i + 1]
        return t_low + (t_high - t_low) * ((size - low) / (high - low))

    def _is_affine(self, text: str, i: int) -> bool:
        """Whether the program's time is affine between grid sizes i and i+1: the backend picks
        the same algorithms at both ends (the pick for a call changes once per threshold, so
        then it holds throughout) and the midpoint lies on the line."""
        low, high = self.grid[i], self.grid[i + 1]
        if self._regime(text, low) != self._regime(text, high):
            return False
        middle = (low + high) // 2
        exact = self.best_programs.program_time(self._steps[text], middle)
        return math.isclose(exact, self._interpolate(text, i, middle), rel_tol=AFFINE_TOLERANCE, abs_tol=0.0)

    def time_of(self, text: str, size: int) -> float:
        """One candidate's time at `size`: exact on the grid and where the backend switches
        algorithm inside a grid interval, interpolated on the line elsewhere."""
        i = bisect.bisect_right(self.grid, size) - 1
        if 0 <= i < len(self.grid) and self.grid[i] == size:
            return self._grid_times[text][i]
        if 0 <= i < len(self.grid) - 1 and self._affine[text][i]:
            return self._interpolate(text, i, size)
        return self.best_programs.program_time(self._steps[text], size)

    def __call__(self, size: int) -> Choice:
        cached = self._memo.get(size)
        if cached is not None:
            return cached
        times = {text: self.time_of(text, size) for text in self.programs}
        program = min(self.programs, key=lambda text: (times[text], text))
        choice = Choice(size, program, times[program], times[self._baseline])
        self._memo[size] = choice
        return choice
