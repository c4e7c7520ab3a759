"""Programs ranked by predicted time, the K best by a best-first search, and a Pareto filter.

Order: by predicted time, ties by canonical program text, so every run on every machine (and
every rank of a job) picks the same program. The default all-reduce (the one program of
length 1) is always listed and marked, whatever its place. Times come from one estimate
(synth/model/estimate.py, lockstep or pipelined) through the costing engine.

`top=K` does not list every program. It is a best-first search over the tree of program
prefixes: a node is a prefix with its quotient state (synth/analysis/programs.py), an edge a
valid step; a prefix's key is the estimate's `value`, a lower bound on every program that
extends it which equals the program's time once it is complete (the estimate module proves
both for each estimate). So complete programs are popped in exactly the order of the full
ranking, (time, text) included (a prefix's text sorts before its extensions'), and the first
K popped are its head. The value is raised by what any completion must still add: an exact
bound over a small abstraction of the prefix's state (synth/analysis/completion.py: range
lengths, doublings still needed, empty members; infinite when the state cannot reach the goal
in the steps left, so such a prefix is never pushed), computed once per abstract state. The
enumerator's Z3 dead-prefix oracle is not asked: the bound already refuses most dead prefixes,
for far less than a solver call per state.

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

import heapq
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from synth.analysis.completion import INFINITY, CompletionBound
from synth.analysis.programs import ProgramSet, ProgramSets, StateWalker, program_set
from synth.language import Program
from synth.model.bound import LowerBound, achievable_line, bound_line
from synth.model.context import CostContext
from synth.model.cost import baseline_program, bus_factor
from synth.model.engine import CostEngine, ProgramTable, StepCalls, engine_for
from synth.model.estimate import ESTIMATES, Estimate, resolve_estimate

__all__ = ["ESTIMATES", "RankedProgram", "Ranker", "pareto_front", "rank_programs"]

_PREFIX, _STEPS, _PROGRAM = 0, 1, 2  # heap entry kinds (see Ranker.cheapest)
_UNSET = object()


@dataclass(frozen=True)
class RankedProgram:
    program: Program
    matrix: tuple[tuple[int, ...], ...]
    bytes: int
    time_s: float
    algbw_GBps: float
    busbw_GBps: float
    speedup: float  # baseline time / this time
    bound_ratio: float  # this time / lower bound, >= 1
    baseline: bool
    extra_memory_bytes: int
    communicators: int
    calls_per_device: int
    length: int

    @property
    def objectives(self) -> tuple[float, int, int, int]:
        return (self.time_s, self.extra_memory_bytes, self.communicators, self.calls_per_device)

    def to_json(self) -> dict:
        return {
            "program": str(self.program), "matrix": [list(row) for row in self.matrix], "bytes": self.bytes,
            "time_s": self.time_s, "algbw_GBps": self.algbw_GBps, "busbw_GBps": self.busbw_GBps,
            "speedup": self.speedup, "bound_ratio": self.bound_ratio, "baseline": self.baseline,
            "extra_memory_bytes": self.extra_memory_bytes, "communicators": self.communicators,
            "calls_per_device": self.calls_per_device, "length": self.length,
        }


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
        for members in step.calls:
            made[d, list(members)] += 1
    total = np.zeros((len(table), group_size), dtype=np.int64)
    for position in range(table.rows.shape[1]):
        total += made[table.rows[:, position]]
    return total.max(axis=1) if len(table) else np.zeros(0, dtype=np.int64)


class Ranker:
    """Ranks the programs of one context under one estimate; keeps the engine, the state
    walker and the enumerated programs, so many sizes (and the search) reuse them."""

    def __init__(self, context: CostContext, max_len: int = 5, estimate: str | Estimate | None = None,
                 sets: ProgramSets | None = None, engine: CostEngine | None = None):
        self.context = context
        self.hierarchy = context.hierarchy
        self.max_len = max_len
        self.estimate = resolve_estimate(estimate)
        self.engine = engine or engine_for(context)
        self.walker = StateWalker(context.hierarchy)
        self.sets = sets or ProgramSets()
        self.baseline = baseline_program(context.hierarchy)

    # --- program sets -------------------------------------------------------------------------

    def every_program(self) -> ProgramSet:
        """Every valid program up to max_len steps (the default all-reduce among them)."""
        return self.sets.get(self.hierarchy, self.max_len, self.walker)

    def programs(self, programs: Sequence[Program]) -> ProgramSet:
        """The given programs as a set, the default all-reduce appended when missing."""
        programs = list(programs)
        if not any(len(program) == 1 for program in programs):
            programs.append(self.baseline)
        return program_set(self.walker, programs)

    def times(self, programs: ProgramSet, sizes) -> np.ndarray:
        """[program, size] predicted seconds."""
        return self.estimate.program_times(self.engine, programs.table, sizes)

    def bound_times(self, sizes) -> np.ndarray:
        """The lower bound under this estimate, per size."""
        return self.estimate.bound_times(bound_line(self.context), sizes)

    def lower_bound(self, size: int) -> LowerBound:
        """The lower bound at one size, its time under this estimate (what `bound_ratio` divides by)."""
        line = bound_line(self.context)
        return LowerBound(size, float(self.bound_times([size])[0]), size * line.seconds_per_byte, line.latency_s,
                          line.bottleneck)

    def achievable_bound(self, size: int) -> LowerBound:
        """The achievable bound at one size (each link at the rate NCCL reaches on it), under
        this estimate."""
        line = achievable_line(self.context)
        return LowerBound(size, float(self.estimate.bound_times(line, [size])[0]), size * line.seconds_per_byte,
                          line.latency_s, line.bottleneck)

    # --- full rankings ----------------------------------------------------------------------------

    def rank(self, sizes, programs: ProgramSet | None = None) -> list[list[RankedProgram]]:
        """For each size, every program of the set (default: every valid program), fastest first."""
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
        n = self.context.group_size
        matrix = self.hierarchy.placement.matrix
        lengths = programs.table.lengths
        order = chosen[np.lexsort((programs.text_rank[chosen], times[chosen]))]
        rows = []
        for i in order.tolist():
            time = float(times[i])
            algbw = size / time
            rows.append(RankedProgram(
                program=programs.program(i), matrix=matrix, bytes=size, time_s=time, algbw_GBps=algbw / 1e9,
                busbw_GBps=algbw * bus_factor(n) / 1e9, speedup=baseline_time / time, bound_ratio=time / bound,
                baseline=i == baseline, extra_memory_bytes=math.ceil(float(extra[i])),
                communicators=int(communicators[i]), calls_per_device=int(calls[i]), length=int(lengths[i])))
        return rows

    def _extra_memory(self, table: ProgramTable, size: int) -> np.ndarray:
        figures = self.engine.figures(table.steps, [size])
        per_step = np.array([self.engine.regimes[int(r)].extra_memory for r in figures.regime[:, 0]] + [0.0])
        largest = np.array([step.largest for step in table.steps] + [0], dtype=np.int64)
        per_step = per_step * (largest * size / self.context.group_size)
        return per_step[table.rows].max(axis=1) if table.rows.shape[1] else np.zeros(len(table))

    # --- the search -----------------------------------------------------------------------------------

    def cheapest(self, size: int) -> Iterator[tuple[float, Program]]:
        """Every valid program up to max_len steps, cheapest first (ties by text), lazily.

        A best-first search over program prefixes (see the module docstring). Three kinds of
        entries share one heap, each keyed by a lower bound on every program below it:

        * a prefix (its state, its estimate so far): key = its value raised by the completion
          bound of its state (synth/analysis/completion.py);
        * a step not yet taken from a prefix (an edge): key = the prefix's value raised by the
          bound on completions that begin with that step, known from the prefix's abstraction
          alone. Taking the step (applying it, costing it exactly) waits until the edge is
          popped; a prefix's edges are pushed one at a time, in (key, text) order, the next
          one when the previous is popped, so an edge's key and text never exceed those of the
          edges behind it;
        * a complete program: key = its time.

        Every program below an entry has a time at least its key and a text that extends its
        text, so complete programs come out in (time, text) order: the full ranking's."""
        walker, engine, estimate = self.walker, self.engine, self.estimate
        size = int(size)
        machine, abstraction = walker.machine, walker.abstraction
        bound = CompletionBound(walker.semantics, walker.calls, engine, size)
        max_len, goal, alphabet = self.max_len, machine.goal, walker.alphabet
        rank_of, index_of = self._text_ranks()
        value, extend = estimate.value, estimate.extend
        costed: dict[StepCalls, object] = {}
        count = len(alphabet)
        tie = itertools.count()
        push, pop = heapq.heappush, heapq.heappop
        orders: dict[tuple, tuple] = {}
        followers: dict[tuple, tuple] = {}
        applied: dict[tuple[int, ...], dict[int, tuple[int, ...] | None]] = {}  # state -> {index: next state}

        def steps_from(state: tuple[int, ...], a, left: int) -> tuple:
            """The valid steps from a state that may begin a completion of at most `left` steps:
            ((least, text rank, index, next state, its abstraction), ...) by least then rank,
            `least` bounding every completion that begins with the step (the bound from the
            state's abstraction, raised by the step's least cost plus the next state's bound);
            and for each position the smallest rank from there on."""
            found = followers.get((state, left))
            if found is None:
                firsts = orders.get((a, left))
                if firsts is None:
                    firsts = orders[(a, left)] = sorted(
                        (least, rank_of[index], index) for index in range(count)
                        if (least := bound.edge(a, index, left)) != INFINITY)
                kept = []
                known = applied.get(state)
                if known is None:
                    known = applied[state] = {}
                for least, rank, index in firsts:
                    after = known.get(index, _UNSET)
                    if after is _UNSET:
                        after = known[index] = machine.apply(state, index)
                    if after is None:
                        continue
                    if after == goal or left > 1:
                        kept.append((least, rank, index, after))
                kept.sort()
                smallest = [0] * len(kept)
                lowest = count
                for position in range(len(kept) - 1, -1, -1):
                    lowest = min(lowest, kept[position][1])
                    smallest[position] = lowest
                found = followers[(state, left)] = (tuple(kept), tuple(smallest))
            return found

        def push_steps(text, depth, state, prefix, steps, position):
            """The untaken steps steps[position:] of a prefix as one entry: keyed by the first's
            bound (the least of them) and the smallest text among them."""
            kept, smallest = steps
            if position < len(kept):
                push(heap, (value(prefix, size, (kept[position][0],)), text + (smallest[position],), next(tie), _STEPS,
                            depth, state, prefix, (steps, position)))

        initial = machine.initial
        a = abstraction.of(initial)
        if a is None:
            return
        start = estimate.start(engine, size)
        least = bound.bound(a, max_len)
        if least == INFINITY:
            return
        heap = [(value(start, size, (least,)), (), next(tie), _PREFIX, 0, initial, start, a)]
        while heap:
            key, text, _, what, depth, state, prefix, extra = pop(heap)
            if what == _PROGRAM:
                yield key, Program(tuple(alphabet[index_of[rank]][0] for rank in text))
                continue
            if what == _PREFIX:
                push_steps(text, depth, state, prefix, steps_from(state, extra, max_len - depth), 0)
                continue
            # the untaken steps of a prefix: take the first, keep the rest as one entry
            steps, position = extra
            text = text[:-1]
            push_steps(text, depth, state, prefix, steps, position + 1)
            _, rank, index, after = steps[0][position]
            text += (rank,)
            if after != goal:
                following = abstraction.of(after)
                if following is None:
                    continue
                least = bound.bound(following, max_len - depth - 1)
                if least == INFINITY:
                    continue
            step = walker.interned_step(state, index)
            figures = costed.get(step)
            if figures is None:
                figures = costed[step] = engine.figures([step], [size])
            extended = extend(engine, prefix, figures, 0)
            if after == goal:
                push(heap, (value(extended, size), text, next(tie), _PROGRAM, depth + 1, after, extended, None))
                continue
            push(heap, (max(key, value(extended, size, (least,))), text, next(tie), _PREFIX, depth + 1, after,
                        extended, following))

    def _text_ranks(self) -> tuple[list[int], dict[int, int]]:
        """Each alphabet entry's place in text order, and back. A prefix's text is the tuple of
        its steps' places: no step's text is a proper beginning of another's (each ends with
        its closing brackets), so tuples compare as the "; "-joined texts do."""
        texts = [str(step) for step, _ in self.walker.alphabet]
        order = sorted(range(len(texts)), key=texts.__getitem__)
        for a, b in zip(order, order[1:]):
            if texts[b].startswith(texts[a]):
                raise AssertionError(f"step text {texts[a]!r} begins {texts[b]!r}: text ranks would misorder ties")
        rank_of = [0] * len(texts)
        for place, index in enumerate(order):
            rank_of[index] = place
        return rank_of, {place: index for place, index in enumerate(order)}

    def top(self, size: int, k: int) -> list[RankedProgram]:
        """The K fastest programs at `size` (the default all-reduce added when not among them),
        without listing every program."""
        if k < 1:
            raise ValueError("top must be at least 1")
        chosen = list(itertools.islice((program for _, program in self.cheapest(size)), k))
        return self.rank([size], self.programs(chosen))[0]

    def best(self, size: int) -> tuple[RankedProgram, RankedProgram]:
        """(the fastest program, the default all-reduce) at `size`, as ranking rows."""
        rows = self.top(size, 1)
        return rows[0], next(row for row in rows if row.baseline)


def rank_programs(context: CostContext, bytes_per_device: int, max_len: int = 5, top: int | None = None,
                  estimate: str | Estimate | None = None, programs: Sequence[Program] | None = None,
                  ranker: Ranker | None = None) -> list[RankedProgram]:
    """Programs ordered by predicted time (ties by text), the baseline always included.

    Every valid program up to `max_len` steps; or the ones given in `programs`; or, with
    `top=K`, the K best found by the search, plus the baseline if it is not among them. A
    reduction group of one member has nothing to rank: the result is empty. Pass a `ranker`
    (for this context) to reuse its caches across calls."""
    if context.group_size == 1:
        return []
    if top is not None and top < 1:
        raise ValueError("top must be at least 1")
    ranker = ranker or Ranker(context, max_len, estimate)
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
