"""Every goal's programs priced per group shape, for the planner; rankings of a goal by name.

Rankings of every goal come from one `Ranker(context, goal=...)` (synth/search/rank.py: the
full ranking, the best-first top K, the goal's lower bound); `rank_goal` and `top_goal` are
its per-size lists, for callers holding a goal's name. `GoalPrograms` is the exhaustive price
list of a goal on a group shape (the benchmarks' and tests' oracle; the planner asks the
ranker, synth.search.best.BestPrograms, and counts its search by `program_count`): every valid program up to the length is enumerated once per
level count and quotient sizes, lowered once per real sizes (memoized across contexts, as the
planner asks thousands of shapes), and costed in one `ProgramTable` batch through the same
engine and estimate, each Permute at the copy rate: the same times as the `Ranker`'s
(tests/test_plan_goal_costs.py).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from synth.goals import Goal, parse_goal
from synth.language import Program, Step, permute_step
from synth.lowering import lower_on
from synth.model.context import CostContext
from synth.model.engine import CostEngine, ProgramTable, step_calls
from synth.model.estimate import resolve_estimate
from synth.search import Enumerator, SearchOptions
from synth.search.best import Choice
from synth.search.programs import program_set
from synth.search.rank import RankedProgram, Ranker, copy_rate
from synth.semantics import QUOTIENT_CAP, Semantics

PREFETCH_BATCH = 4096  # sizes costed per engine call


@lru_cache(maxsize=256)
def _canonical_programs(levels: int, capped: tuple[int, ...], goal_name: str, max_len: int) -> tuple[Program, ...]:
    """Every valid program of the goal on a hierarchy of `levels` levels named level0, level1,
    ... of the quotient sizes `capped`: the search runs on the quotient state, which decides
    validity exactly as the real sizes do (synth/semantics.py, QUOTIENT_CAP), so one
    enumeration serves every hierarchy of that level count and capped sizes."""
    names = tuple(f"level{index}" for index in range(levels))
    semantics = Semantics(names, capped, quotient=True, goal=parse_goal(goal_name))
    return tuple(Enumerator(semantics, SearchOptions(max_len=max_len)).programs())


def program_count(sizes: tuple[int, ...], goal_name: str, max_len: int = 5) -> int:
    """How many programs a GoalPrograms on a hierarchy of these sizes prices (the flat call
    included): one enumeration per level count and quotient sizes, memoized, so counting them
    before a search costs the search nothing (the planner's estimate, synth/plan/search.py)."""
    return len(_priced_programs(sizes, goal_name, max_len)[0])


@lru_cache(maxsize=512)
def _priced_programs(sizes: tuple[int, ...], goal_name: str, max_len: int) -> tuple[tuple[Program, ...], int]:
    """(canonical programs, index of the flat call) priced on a hierarchy of these sizes: the
    enumeration of its level count and quotient sizes, with the goal's flat call over the whole
    group added where the enumeration does not already hold it."""
    goal = parse_goal(goal_name)
    capped = tuple(min(size, QUOTIENT_CAP) for size in sizes)
    programs = list(_canonical_programs(len(sizes), capped, goal.name, max_len))
    baseline = goal.flat_call("level0")
    if baseline not in programs:
        programs.append(baseline)
    return tuple(programs), programs.index(baseline)


def _renamed(program: Program, names: tuple[str, ...]) -> Program:
    """The canonical program with level{i} spelled names[i]."""
    rename = {f"level{index}": name for index, name in enumerate(names)}
    return Program(tuple(permute_step(rename[level] for level in step.order) if step.is_permute
                         else Step(step.collective, step.form, rename[step.level]) for step in program.steps))


def _enumerated(level_names: tuple[str, ...], sizes: tuple[int, ...], goal_name: str, max_len: int):
    """(programs, texts, baseline index, ProgramTable, copied) of every valid program of the
    goal on a hierarchy of this shape: the programs depend on the level count and the
    quotient sizes only (one enumeration, renamed), the table on the real sizes only (the
    steps' member groups name no level; which devices the members are only changes the
    costs). Lowering checks every program again on the real sizes."""
    canonical, table, copied, baseline_index = _lowered_shape(sizes, goal_name, max_len)
    programs = tuple(_renamed(program, level_names) for program in canonical)
    return programs, tuple(str(program) for program in programs), baseline_index, table, copied


@lru_cache(maxsize=512)
def _lowered_shape(sizes: tuple[int, ...], goal_name: str, max_len: int):
    """(canonical programs, ProgramTable, copied, baseline index) for real sizes `sizes`."""
    goal = parse_goal(goal_name)
    names = tuple(f"level{index}" for index in range(len(sizes)))
    programs, baseline_index = _priced_programs(sizes, goal_name, max_len)
    rows, copied = [], []
    for program in programs:
        lowered = lower_on(program, names, sizes, goal)
        rows.append([step_calls(step) for step in lowered.steps if step.places is None])
        copied.append(sum(step.copied for step in lowered.steps if step.places is not None))
    return programs, ProgramTable.of(rows), np.array(copied, dtype=float), baseline_index


def goal_program_times(context: CostContext, goal, programs, sizes, estimate=None) -> np.ndarray:
    """Predicted seconds of the given valid programs of the goal (rows) at each size (columns),
    costed as the `Ranker` costs them (what `synth bench` predicts beside its measurements)."""
    ranker = Ranker(context, estimate=estimate, goal=parse_goal(goal))
    return ranker.times(program_set(ranker.walker, list(programs)), [int(size) for size in sizes])


class GoalPrograms:
    """Every valid program of one goal on one context, enumerated and lowered once, costed at
    any size (memoized): every program `rank_goal` ranks, costed through the same engine and
    estimate, so the two agree by construction."""

    def __init__(self, context: CostContext, goal, max_len: int = 5, estimate=None, engine: CostEngine | None = None):
        self.context = context
        self.goal = parse_goal(goal)
        self.max_len = max_len
        self.estimate = resolve_estimate(estimate)
        self.engine = engine or CostEngine(context)  # one engine per context, shared by its goals
        hierarchy = context.hierarchy
        self.programs, self.texts, self.baseline_index, self.table, self.copied = _enumerated(
            hierarchy.level_names, hierarchy.sizes, self.goal.name, max_len)
        self._best: dict[int, Choice] = {}

    @property
    def baseline(self) -> Program:
        return self.programs[self.baseline_index]

    def times(self, sizes) -> np.ndarray:
        """Seconds of every program (rows) at each size (columns)."""
        sizes = [int(size) for size in sizes]
        times = self.estimate.program_times(self.engine, self.table, sizes)
        return times + np.outer(self.copied, np.array(sizes, dtype=float)) / copy_rate(self.context)

    def best(self, size: int) -> Choice:
        """The fastest program at `size` (ties by text, the flat call winning a tie with itself)."""
        size = int(size)
        found = self._best.get(size)
        if found is None:
            self.prefetch([size])
            found = self._best[size]
        return found

    def prefetch(self, sizes) -> None:
        """Cost the sizes not asked yet in one batch (a fusion DP asks hundreds)."""
        missing = sorted({int(size) for size in sizes} - self._best.keys())
        for start in range(0, len(missing), PREFETCH_BATCH):
            batch = missing[start:start + PREFETCH_BATCH]
            times = self.times(batch)
            for z, size in enumerate(batch):
                column = times[:, z]
                fastest = min(range(len(self.programs)), key=lambda i: (column[i], self.texts[i]))
                self._best[size] = Choice(size, self.programs[fastest], float(column[fastest]),
                                              float(column[self.baseline_index]))


def rank_goal(context: CostContext, goal, sizes, max_len: int = 5, estimate=None) -> list[list[RankedProgram]]:
    """Every valid program of the goal up to max_len steps, per size, fastest first (ties by
    text), the baseline always listed: `Ranker.rank`."""
    return Ranker(context, max_len, estimate, goal=parse_goal(goal)).rank(sizes)


def top_goal(context: CostContext, goal, sizes, k: int, max_len: int = 5, estimate=None) -> list[list[RankedProgram]]:
    """Per size, the first `k` rows of `rank_goal`, and the baseline's row where it is not among
    them, without listing every program: `Ranker.top`."""
    if k < 1:
        raise ValueError("top must be at least 1")
    ranker = Ranker(context, max_len, estimate, goal=parse_goal(goal))
    return [ranker.top(int(size), k) for size in sizes]
