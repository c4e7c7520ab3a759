"""Ranking programs of any goal (docs/model.md section 7, "Goals") by predicted time.

The all-reduce has its own fast path (synth/search/rank.py: shared enumerations, the
best-first top-K search and its completion bound). The other goals are ranked here by the
same engine and estimates (synth/model/engine.py, estimate.py): every valid program up to the
length is enumerated for the goal, lowered, and its collective steps costed in one
`ProgramTable` batch, every reduction group's calls of a step together, sharing links. A
`Permute` step calls no collective: it is a local copy of what each member holds, charged at
the backend's copy rate below. The baseline is the goal's own flat call over the whole group
(`ReduceScatter(InsideGroup(h_1))` and so on: what a framework calls), costed the same way.
The K best (`top_goal`) come from the best-first search (synth/search/best_first.py), which
pops every goal's programs in this ranking's order with its times, without listing the rest.

Lower bound. For every goal other than all-reduce, the all-reduce bound's latency plus half
its bytes term (synth/model/bound.py) bounds the time: a reduce-scatter must send out of each
of the q parties of a cut (q-1)/q of the buffer (its contributions to every other party's
blocks exist nowhere else), an all-gather must bring as much into each, an all-to-all sends
at least as much, a broadcast or a reduce moves the whole buffer across every unit it
crosses; the all-reduce bound's bytes are 2(q-1)/q of the buffer (or the whole buffer per
crossing unit, whose half is also at most (q-1)/q of it for q >= 2).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from synth.search.rank import RankedProgram, _calls_per_device, _communicators
from synth.collectives import collective
from synth.goals import Goal, parse_goal
from synth.language import Program, Step, permute_step
from synth.lowering import lower, lower_on
from synth.model.bound import LowerBound, bound_line
from synth.model.context import CostContext
from synth.model.engine import CostEngine, ProgramTable, engine_for, step_calls
from synth.model.estimate import resolve_estimate
from synth.search import Enumerator, SearchOptions
from synth.search.best_first import cheapest_programs
from synth.search.walker import StateWalker
from synth.semantics import QUOTIENT_CAP, Semantics

# Bytes per second a Permute copies on one device: estimates until a calibration measures them.
# GPU (nccl): half of an A100's 1.55 TB/s HBM2 (a copy reads and writes every byte).
# CPU (gloo): one core's memcpy of a large buffer, a few GB/s.
COPY_BYTES_PER_S = {"nccl": 0.75e12, "gloo": 5e9}
PREFETCH_BATCH = 4096  # sizes costed per engine call
COPY_SOURCE = "estimate: half the device memory bandwidth (A100 HBM2 1.55 TB/s; one CPU core ~10 GB/s)"


def goal_baseline(hierarchy, goal: Goal) -> Program:
    """The goal's own flat call over the whole reduction group."""
    return goal.flat_call(hierarchy.level_names[0])


def goal_bound(context: CostContext, goal: Goal, size: int) -> LowerBound:
    """The all-reduce bound's latency and the goal's share of its bytes (module docstring)."""
    line = bound_line(context)
    transfer = goal.bound_share * size * line.seconds_per_byte
    cut = line.bottleneck if goal.bound_share == 1 else f"half the all-reduce bound's bytes: {line.bottleneck}"
    return LowerBound(size, line.latency_s + transfer, transfer, line.latency_s, cut)


def copy_rate(context: CostContext) -> float:
    name = getattr(context.backend, "name", str(context.backend))
    return COPY_BYTES_PER_S.get("gloo" if "gloo" in name else "nccl")


def _lowered(context: CostContext, goal: Goal, programs) -> tuple[ProgramTable, np.ndarray]:
    """(ProgramTable of the programs' collective steps, bytes each copies locally per byte of
    buffer in its Permute steps)."""
    hierarchy = context.hierarchy
    rows, copied = [], []
    for program in programs:
        lowered = lower(program, hierarchy, goal)
        rows.append([step_calls(step) for step in lowered.steps if step.places is None])
        copied.append(sum(step.copied for step in lowered.steps if step.places is not None))
    return ProgramTable.of(rows), np.array(copied, dtype=float)


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


def _costed(context: CostContext, goal: Goal, programs, sizes, estimate, engine=None):
    """(ProgramTable, times[program, size]) of valid programs of the goal: their collective
    steps in one batch through the estimate, each Permute at the copy rate."""
    engine = engine or CostEngine(context)
    table, copied = _lowered(context, goal, programs)
    times = estimate.program_times(engine, table, sizes)
    return table, times + np.outer(copied, np.array(sizes, dtype=float)) / copy_rate(context)


def goal_program_times(context: CostContext, goal, programs, sizes, estimate=None) -> np.ndarray:
    """Predicted seconds of the given valid programs of the goal (rows) at each size (columns),
    costed as rank_goal costs them (what `synth bench` predicts beside its measurements)."""
    goal = parse_goal(goal)
    sizes = [int(size) for size in sizes]
    return _costed(context, goal, list(programs), sizes, resolve_estimate(estimate))[1]


@dataclass(frozen=True)
class GoalChoice:
    """The fastest program of a goal at one size, and its flat call's time at that size."""

    bytes: int
    program: Program
    time_s: float
    baseline_time_s: float

    @property
    def synthesized(self) -> bool:
        """True when a program other than the flat call is strictly the fastest."""
        return self.time_s < self.baseline_time_s


class GoalPrograms:
    """Every valid program of one goal on one context, enumerated and lowered once, costed at
    any size (memoized): what `rank_goal` ranks and what the planner prices a reduce-scatter,
    all-gather or all-to-all by (synth/plan/costs.py), so the two agree by construction."""

    def __init__(self, context: CostContext, goal, max_len: int = 5, estimate=None, engine: CostEngine | None = None):
        self.context = context
        self.goal = parse_goal(goal)
        self.max_len = max_len
        self.estimate = resolve_estimate(estimate)
        self.engine = engine or CostEngine(context)  # one engine per context, shared by its goals
        hierarchy = context.hierarchy
        self.programs, self.texts, self.baseline_index, self.table, self.copied = _enumerated(
            hierarchy.level_names, hierarchy.sizes, self.goal.name, max_len)
        self._best: dict[int, GoalChoice] = {}

    @property
    def baseline(self) -> Program:
        return self.programs[self.baseline_index]

    def times(self, sizes) -> np.ndarray:
        """Seconds of every program (rows) at each size (columns)."""
        sizes = [int(size) for size in sizes]
        times = self.estimate.program_times(self.engine, self.table, sizes)
        return times + np.outer(self.copied, np.array(sizes, dtype=float)) / copy_rate(self.context)

    def best(self, size: int) -> GoalChoice:
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
                self._best[size] = GoalChoice(size, self.programs[fastest], float(column[fastest]),
                                              float(column[self.baseline_index]))


def rank_goal(context: CostContext, goal, sizes, max_len: int = 5, estimate=None) -> list[list[RankedProgram]]:
    """Every valid program of the goal up to max_len steps, per size, fastest first (ties by
    text), the baseline always listed."""
    every = GoalPrograms(context, goal, max_len, estimate)
    sizes = [int(size) for size in sizes]
    times = every.times(sizes)
    return [_rows(context, every.goal, every.programs, every.texts, every.table, times[:, z], every.baseline_index,
                  size) for z, size in enumerate(sizes)]


def top_goal(context: CostContext, goal, sizes, k: int, max_len: int = 5, estimate=None) -> list[list[RankedProgram]]:
    """Per size, the first `k` rows of `rank_goal`, and the baseline's row where it is not among
    them, without listing every program: the best-first search (synth/search/best_first.py)
    pops the goal's programs in the full ranking's (time, text) order, each with its time (the
    full ranking's, to the bit); the flat call (which the search's alphabet may not spell) is
    priced as `rank_goal` prices it, and the first K of all these are the full ranking's. The
    rows' call counts come from the steps the search walked."""
    if k < 1:
        raise ValueError("top must be at least 1")
    goal = parse_goal(goal)
    estimate = resolve_estimate(estimate)
    walker = StateWalker(context.hierarchy, goal)
    engine = engine_for(context)  # the search's engine prices the rows too: its call plans are built once
    baseline = goal_baseline(context.hierarchy, goal)
    result = []
    for size in (int(size) for size in sizes):
        popped = list(itertools.islice(
            cheapest_programs(walker, engine, estimate, size, max_len, copy_rate(context)), k))
        programs, times = [program for _, program in popped], [time for time, _ in popped]
        rows = [_walked_calls(walker, program) for program in programs]
        if baseline not in programs:
            table, baseline_times = _costed(context, goal, [baseline], [size], estimate, engine)
            programs.append(baseline)
            times.append(float(baseline_times[0, 0]))
            rows.append(list(table.program(0)))
        ranked = _rows(context, goal, programs, [str(program) for program in programs], ProgramTable.of(rows),
                       np.array(times), programs.index(baseline), size)
        result.append(ranked[:k] + [row for row in ranked[k:] if row.baseline])
    return result


def _walked_calls(walker, program: Program) -> list:
    """The collective steps of a program the search popped, as `StepCalls`, walked over the
    interned states as the search walked it (its Permutes call nothing)."""
    machine, state, calls = walker.machine, walker.machine.initial, []
    for step in program.steps:
        index = walker.index_of(step)
        if not walker.permutes[index]:
            calls.append(walker.interned_step(state, index))
        state = machine.apply(state, index)
    return calls


def _rows(context: CostContext, goal: Goal, programs, texts, table: ProgramTable, times: np.ndarray, base: int,
          size: int) -> list[RankedProgram]:
    """Ranking rows of the programs at one size, fastest first (ties by text)."""
    n = context.hierarchy.group_size
    communicators = _communicators(table)
    calls = _calls_per_device(table, n)
    factor = collective(goal.collective).bus_factor(n)
    matrix = context.hierarchy.placement.matrix
    bound = goal_bound(context, goal, size).time_s
    ranked = []
    for i in sorted(range(len(programs)), key=lambda i: (times[i], texts[i])):
        time = float(times[i])
        algbw = size / time if time > 0 else math.inf
        ranked.append(RankedProgram(
            program=programs[i], matrix=matrix, bytes=size, time_s=time, algbw_GBps=algbw / 1e9,
            busbw_GBps=algbw * factor / 1e9, speedup=float(times[base]) / time, bound_ratio=time / bound,
            baseline=i == base, extra_memory_bytes=0, communicators=int(communicators[i]),
            calls_per_device=int(calls[i]), length=len(programs[i])))
    return ranked
