"""Programs of one goal ranked by predicted time, the K best by a best-first search, and a Pareto filter.

One `Ranker(context, goal=...)` ranks every goal (synth/goals.py): the all-reduce, the
reduce-scatter, the all-gather, ... Order: by predicted time, ties by canonical program text,
so every run on every machine (and every rank of a job) picks the same program. The goal's
flat call (for the all-reduce, the default all-reduce) is always listed and marked, whatever
its place. Times come from one estimate (synth/model/estimate.py, lockstep or pipelined)
through the costing engine; a `Permute` step calls no collective: it is a local copy of
what each member holds, charged at the backend's copy rate (`COPY_BYTES_PER_S`).

Lower bound: the all-reduce bound (synth/model/bound.py) under the estimate, its bytes term
scaled by the goal's `bound_share`. For every goal other than all-reduce half of it bounds the
time: a reduce-scatter must send out of each of the q parties of a cut (q-1)/q of the buffer
(its contributions to every other party's blocks exist nowhere else), an all-gather must
bring as much into each, an all-to-all sends at least as much, a broadcast or a reduce moves
the whole buffer across every unit it crosses; the all-reduce bound's bytes are 2(q-1)/q of
the buffer (or the whole buffer per crossing unit, whose half is also at most (q-1)/q of it).

The routed goals (dispatch, combine: docs/model.md section 7) take a routing; their programs,
orders and groupings of the levels, are few, so the `Ranker` lists and prices every one for the
routing at each size (synth/search/routed_rank.py) and bounds them by the copies each cut must
carry; sizes are bytes of tokens per member.

`top=K` does not list every program: the best-first search of synth/search/best_first.py
pops complete programs in exactly the order of the full ranking, (time, text) included, and
the first K popped are its head.

Objectives besides time, per program:

* extra memory: the largest scratch buffer per device any call of the program allocates
  (the backend's data-sized temporaries: 0 for NCCL, whose calls are all in place as docs/model.md
  section 7 lowers them; gloo's ReduceScatter clones its input and its AllGather gathers
  into a flat copy). Fixed-size library buffers (NCCL's per-channel FIFOs) are per
  communicator, so they are counted by the next objective.
* communicators: distinct group sets among the steps (each needs its own communicator).
* calls per device: the most collective calls any device makes (Master steps idle some).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from synth.goals import ALL_REDUCE, Goal
from synth.language import Program
from synth.model.bound import BoundLine, LowerBound, achievable_line, bound_line
from synth.model.context import CostContext
from synth.model.engine import CostEngine, ProgramTable, engine_for
from synth.model.estimate import ESTIMATES, Estimate, resolve_estimate
from synth.routing import Routing
from synth.search.best_first import cheapest_programs
from synth.search.programs import ProgramSet, ProgramSets, program_set
from synth.search.ranked import RankedProgram
from synth.search.routed_rank import RoutedPrograms, routing_at
from synth.search.walker import StateWalker

__all__ = ["COPY_BYTES_PER_S", "ESTIMATES", "RankedProgram", "Ranker", "copy_rate", "pareto_front", "rank_programs"]

# Bytes per second a Permute copies on one device: estimates until a calibration measures them.
# GPU (nccl): half of an A100's 1.55 TB/s HBM2 (a copy reads and writes every byte).
# CPU (gloo): one core's memcpy of a large buffer (~10 GB/s), halved likewise.
COPY_BYTES_PER_S = {"nccl": 0.75e12, "gloo": 5e9}


def copy_rate(context: CostContext) -> float:
    """Bytes per second a Permute copies on one device of the context's backend."""
    name = getattr(context.backend, "name", str(context.backend))
    return COPY_BYTES_PER_S.get("gloo" if "gloo" in name else "nccl")


def _communicators(table: ProgramTable) -> np.ndarray:
    """[program] distinct group sets among its steps (AllReduce and ReduceScatter over the same
    groups share one communicator)."""
    ids: dict[tuple, int] = {}
    of_step = np.array([ids.setdefault(step.calls, len(ids)) for step in table.steps] + [-1], dtype=np.int64)
    groups = np.sort(of_step[table.rows], axis=1)
    distinct = (groups[:, :1] != -1).astype(np.int64).reshape(-1)
    if groups.shape[1] > 1:
        distinct = distinct + ((groups[:, 1:] != groups[:, :-1]) & (groups[:, 1:] != -1)).sum(axis=1)
    return distinct


def _calls_per_device(table: ProgramTable, group_size: int) -> np.ndarray:
    """[program] the most calls any member makes (Master steps leave some members idle)."""
    made = np.zeros((len(table.steps) + 1, group_size), dtype=np.int64)
    for d, step in enumerate(table.steps):
        made[d] = np.bincount(np.fromiter(itertools.chain.from_iterable(step.calls), dtype=np.int64),
                              minlength=group_size)
    total = np.zeros((len(table), group_size), dtype=np.int64)
    for position in range(table.rows.shape[1]):
        total += made[table.rows[:, position]]
    return total.max(axis=1) if len(table) else np.zeros(0, dtype=np.int64)


class Ranker:
    """Ranks the programs of one goal on one context under one estimate; keeps the engine, the
    state walker and the enumerated programs, so many sizes (and the search) reuse them."""

    def __init__(self, context: CostContext, max_len: int = 5, estimate: str | Estimate | None = None,
                 sets: ProgramSets | None = None, engine: CostEngine | None = None, *, goal: Goal = ALL_REDUCE,
                 routing: Routing | None = None):
        if not isinstance(goal, Goal):
            raise TypeError(f"goal must be a synth.goals.Goal (parse names with synth.goals.parse_goal), not {goal!r}")
        if goal.routed != (routing is not None):
            raise ValueError(f"goal {goal.name} {'moves tokens by a routing: give one' if goal.routed else 'takes no routing'}")
        self.context = context
        self.hierarchy = context.hierarchy
        self.goal = goal
        self.max_len = max_len
        self.estimate = resolve_estimate(estimate)
        self.engine = engine or engine_for(context)
        self.sets = sets or ProgramSets()
        self.baseline = goal.flat_call(context.hierarchy.level_names[0])
        self.copy_rate = copy_rate(context)
        # A routed goal's programs (dispatch, combine) are few (orders and groupings of the levels)
        # and priced per routing: listed whole, every one priced (synth/search/routed_rank.py).
        self.routed = RoutedPrograms(context, goal, routing, max_len, self.engine) if goal.routed else None

    @cached_property
    def walker(self) -> StateWalker:
        """The goal's state walker on this hierarchy (made when first needed: a sweep over many
        placements of one shape never needs one past the first)."""
        return StateWalker(self.hierarchy, self.goal)

    # --- program sets -------------------------------------------------------------------------

    def every_program(self) -> ProgramSet:
        """Every valid program of the goal up to max_len steps (its flat call among them)."""
        return self.sets.get(self.hierarchy, self.max_len, self.__dict__.get("walker"), self.goal)

    def programs(self, programs: Sequence[Program]) -> ProgramSet:
        """The given programs as a set, the goal's flat call appended when missing."""
        programs = list(programs)
        given = program_set(self.walker, programs, self.baseline)
        if given.baseline is not None:
            return given
        return program_set(self.walker, programs + [self.baseline], self.baseline)

    def times(self, programs: ProgramSet, sizes) -> np.ndarray:
        """[program, size] predicted seconds: the estimate's time of the collective steps, plus
        the Permutes' copies at the copy rate."""
        times = self.estimate.program_times(self.engine, programs.table, sizes)
        if programs.copied is None:
            return times
        return times + np.outer(programs.copied, np.array(sizes, dtype=float)) / self.copy_rate

    def _line(self) -> BoundLine:
        """The goal's bound line: the all-reduce's, its bytes term scaled by the goal's share."""
        line = bound_line(self.context)
        if self.goal.bound_share == 1:
            return line
        return BoundLine(line.latency_s, self.goal.bound_share * line.seconds_per_byte,
                         f"half the all-reduce bound's bytes: {line.bottleneck}")

    def bound_times(self, sizes) -> np.ndarray:
        """The goal's lower bound under this estimate, per size."""
        return self.estimate.bound_times(self._line(), sizes)

    def lower_bound(self, size: int) -> LowerBound:
        """The lower bound at one size, its time under this estimate (what `bound_ratio` divides by)."""
        if self.routed is not None:
            return self.routed.bound(routing_at(self.routed.routing, size))
        line = self._line()
        return LowerBound(size, float(self.bound_times([size])[0]), size * line.seconds_per_byte, line.latency_s,
                          line.bottleneck)

    def achievable_bound(self, size: int) -> LowerBound | None:
        """The achievable bound at one size (each link at the rate NCCL reaches on it), under
        this estimate; None for a goal whose bound is not the all-reduce's cut."""
        if self.goal.bound_share != 1 or self.routed is not None:
            return None
        line = achievable_line(self.context)
        return LowerBound(size, float(self.estimate.bound_times(line, [size])[0]), size * line.seconds_per_byte,
                          line.latency_s, line.bottleneck)

    # --- full rankings ----------------------------------------------------------------------------

    def rank(self, sizes, programs: ProgramSet | None = None) -> list[list[RankedProgram]]:
        """For each size, every program of the set (default: every valid program), fastest first."""
        if self.routed is not None:
            given = None if programs is None else set(programs) | {self.baseline}
            return [[row for row in self.routed.rank(int(size)) if given is None or row.program in given]
                    for size in sizes]
        programs = programs if programs is not None else self.every_program()
        sizes = [int(size) for size in sizes]
        times = self.times(programs, sizes)
        return [self._rows(programs, times[:, z], size, np.arange(len(programs))) for z, size in enumerate(sizes)]

    def _rows(self, programs: ProgramSet, times: np.ndarray, size: int, chosen: np.ndarray) -> list[RankedProgram]:
        """Rows for the programs `chosen` (indices), sorted by (time, text)."""
        baseline = programs.baseline
        baseline_time = float(times[baseline])
        bound = float(self.bound_times([size])[0])
        objectives = programs.__dict__.get("_objectives")
        if objectives is None:
            objectives = programs.__dict__["_objectives"] = (
                _communicators(programs.table), _calls_per_device(programs.table, self.context.group_size))
        communicators, calls = objectives
        extra = self._extra_memory(programs.table, size)
        factor = self.goal.bus_factor(self.context.group_size)
        matrix = self.hierarchy.placement.matrix
        order = chosen[np.lexsort((programs.text_rank[chosen], times[chosen]))]
        rows = []
        for i in order.tolist():
            time = float(times[i])
            algbw = size / time if time > 0 else math.inf
            program = programs.program(i)
            rows.append(RankedProgram(
                program=program, matrix=matrix, bytes=size, time_s=time, algbw_GBps=algbw / 1e9,
                busbw_GBps=algbw * factor / 1e9, speedup=baseline_time / time, bound_ratio=time / bound,
                baseline=i == baseline, extra_memory_bytes=math.ceil(float(extra[i])),
                communicators=int(communicators[i]), calls_per_device=int(calls[i]), length=len(program)))
        return rows

    def _extra_memory(self, table: ProgramTable, size: int) -> np.ndarray:
        figures = self.engine.figures(table.steps, [size])
        per_step = np.array([self.engine.regimes[int(r)].extra_memory for r in figures.regime[:, 0]] + [0.0])
        largest = np.array([step.largest for step in table.steps] + [0], dtype=np.int64)
        per_step = per_step * (largest * size / self.context.group_size)
        return per_step[table.rows].max(axis=1) if table.rows.shape[1] else np.zeros(len(table))

    # --- the search -----------------------------------------------------------------------------------

    def cheapest(self, size: int) -> Iterator[tuple[float, Program]]:
        """Every valid program of the goal up to max_len steps, cheapest first (ties by text),
        lazily: the best-first search of synth/search/best_first.py."""
        return cheapest_programs(self.walker, self.engine, self.estimate, size, self.max_len, self.copy_rate)

    def top(self, size: int, k: int) -> list[RankedProgram]:
        """The K fastest programs at `size` (the flat call added when not among them), without
        listing every program: the full ranking's first K."""
        if k < 1:
            raise ValueError("top must be at least 1")
        if self.routed is not None:
            rows = self.rank([size])[0]
            return rows[:k] + [row for row in rows[k:] if row.baseline]
        chosen = list(itertools.islice((program for _, program in self.cheapest(size)), k))
        rows = self.rank([size], self.programs(chosen))[0]
        return rows[:k] + [row for row in rows[k:] if row.baseline]

    def best(self, size: int) -> tuple[RankedProgram, RankedProgram]:
        """(the fastest program, the flat call) at `size`, as ranking rows."""
        rows = self.top(size, 1)
        return rows[0], next(row for row in rows if row.baseline)


def rank_programs(context: CostContext, bytes_per_device: int, max_len: int = 5, top: int | None = None,
                  estimate: str | Estimate | None = None, programs: Sequence[Program] | None = None,
                  ranker: Ranker | None = None, goal: Goal = ALL_REDUCE) -> list[RankedProgram]:
    """Programs of the goal ordered by predicted time (ties by text), the baseline always included.

    Every valid program up to `max_len` steps; or the ones given in `programs`; or, with
    `top=K`, the K best found by the search, plus the baseline if it is not among them. A
    reduction group of one member has nothing to rank: the result is empty. Pass a `ranker`
    (for this context) to reuse its caches across calls."""
    if context.group_size == 1:
        return []
    if top is not None and top < 1:
        raise ValueError("top must be at least 1")
    ranker = ranker or Ranker(context, max_len, estimate, goal=goal)
    if top is not None:
        return ranker.top(bytes_per_device, top)
    chosen = ranker.programs(programs) if programs is not None else None
    return ranker.rank([bytes_per_device], chosen)[0]


def pareto_front(rows: list[RankedProgram], keep_baseline: bool = True) -> list[RankedProgram]:
    """The rows no other row beats on every objective (time, extra memory, communicators,
    calls per device) while beating it on one; the baseline stays listed when asked."""

    def dominates(a: RankedProgram, b: RankedProgram) -> bool:
        return all(x <= y for x, y in zip(a.objectives, b.objectives)) and a.objectives != b.objectives

    return [row for row in rows
            if (keep_baseline and row.baseline) or not any(dominates(other, row) for other in rows)]
