"""Programs ranked by predicted time, the K best by a cost-guided search, and a Pareto filter.

Order: by predicted time, ties by canonical program text, so every run on every machine (and
every rank of a job) picks the same program. The default all-reduce (the one program of
length 1) is always listed and marked, whatever its place.

`top=K` does not list every program. It is a uniform-cost search (Dijkstra on the tree of
program prefixes) over the state graph: a node is a prefix with its quotient state
(synth/semantics.py, whose members carry the real range lengths), an edge is a valid step
costing its simulated time for every group at once. Step times are positive (every call
pays a launch), so a prefix is never dearer than its completions and the first K complete
programs popped, in (cost, text) order, are the K best in exactly the order of the full
ranking. Dead prefixes are cut with the enumerator's memoized counts (which use the Z3
dead-prefix oracle), and a step's time is cached by (instruction, chunks of each call): a
step's cost depends only on its groups and the bytes of each call, so the key is sound.

The full ranking walks each program over the same state graph (`ProgramWalker`) instead of
lowering it; the tests check both against `simulate(lower(...))`.

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
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from synth.hierarchy import SynthesisHierarchy
from synth.language import Program, Step, parse_program
from synth.lowering import lower
from synth.search import Enumerator, SearchOptions, enumerate_programs
from synth.semantics import FORMS, Semantics, StepFailure
from synth.model.bound import LowerBound, lower_bound
from synth.model.algorithms import Backend
from synth.model.cost import ProgramCost, Simulator, baseline_program
from synth.model.overlap import pipelined_cost
from synth.topology import Topology


@dataclass(frozen=True)
class RankedProgram:
    program: str
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
            "program": self.program, "matrix": [list(row) for row in self.matrix], "bytes": self.bytes,
            "time_s": self.time_s, "algbw_GBps": self.algbw_GBps, "busbw_GBps": self.busbw_GBps,
            "speedup": self.speedup, "bound_ratio": self.bound_ratio, "baseline": self.baseline,
            "extra_memory_bytes": self.extra_memory_bytes, "communicators": self.communicators,
            "calls_per_device": self.calls_per_device, "length": self.length,
        }


class ProgramWalker:
    """Walks programs over the quotient state graph of one hierarchy: for each step, the calls
    it makes in the real hierarchy (sorted member-rank tuples, as lowering gives them) and the
    chunks each call spans, read from the state before the step (its lengths are real).
    Shared by the full ranking and the search so that both cost a step through one key."""

    def __init__(self, hierarchy: SynthesisHierarchy):
        self.hierarchy = hierarchy
        self.semantics = Semantics(hierarchy.level_names, hierarchy.sizes, quotient=True)
        self.alphabet = self.semantics.alphabet
        self.calls: list[tuple[tuple[int, ...], ...]] = []
        for step, _ in self.alphabet:
            groups, _ = FORMS[step.form](hierarchy.sizes, hierarchy.level_index(step.level))
            self.calls.append(tuple(sorted(groups)))
        # The quotient member standing for each real member: the one with the same zero digits.
        capped = self.semantics.sizes
        self.representative = [
            int(np.ravel_multi_index(tuple(min(p, 1) for p in position), capped))
            for position in itertools.product(*(range(size) for size in hierarchy.sizes))
        ]
        self._index = {(instruction.collective, instruction.groups): i
                       for i, (_, instruction) in enumerate(self.alphabet)}
        self._transitions: dict[tuple[tuple, int], tuple | None] = {}
        self._enumerators: dict[int, Enumerator] = {}

    def enumerator(self, max_len: int) -> Enumerator:
        """The enumerator whose memoized counts tell which states can still reach the goal."""
        if max_len not in self._enumerators:
            self._enumerators[max_len] = Enumerator(self.semantics, SearchOptions(max_len=max_len))
        return self._enumerators[max_len]

    def index_of(self, step: Step) -> int:
        """The alphabet entry of a step, whichever of its equal spellings (docs/model.md section 5) it uses."""
        instruction = self.semantics.instruction_of(step)
        return self._index[(instruction.collective, instruction.groups)]

    def advance(self, state: tuple, index: int) -> tuple | None:
        """The next state, or None when the step is invalid or a no-op (no valid program goes on)."""
        key = (state, index)
        if key not in self._transitions:
            try:
                self._transitions[key] = self.semantics.apply(state, self.alphabet[index][1])
            except StepFailure:
                self._transitions[key] = None
        return self._transitions[key]

    def chunks(self, state: tuple, index: int) -> tuple[int, ...]:
        """The range each call of the step spans: its root's held range, or for AllGather the
        joined output. Calls of one step may differ (members of different classes can hold
        ranges of different lengths), so each call is read from its own root."""
        instruction = self.alphabet[index][1]
        factor = instruction.real_group_size if instruction.collective == "AllGather" else 1
        return tuple(state[self.representative[members[0]]][3] * factor for members in self.calls[index])

    def steps(self, program: Program) -> list[tuple[Step, tuple[tuple[int, ...], ...], int]]:
        """(step, calls, chunks) per step of a valid program."""
        state, result = self.semantics.initial, []
        for step in program.steps:
            index = self.index_of(step)
            result.append((step, self.calls[index], self.chunks(state, index)))
            state = self.advance(state, index)
            if state is None:
                raise ValueError(f"{program} is not a valid program on this hierarchy")
        return result


def communicators(steps) -> int:
    """Distinct group sets among the steps (AllReduce and ReduceScatter over the same groups share)."""
    return len({calls for _, calls, _ in steps})


def calls_per_device(steps, group_size: int) -> int:
    """The most calls any member makes (Master steps leave some members idle)."""
    made = [0] * group_size
    for _, calls, _ in steps:
        for members in calls:
            for member in members:
                made[member] += 1
    return max(made)


def cheapest_programs(hierarchy: SynthesisHierarchy, simulator: Simulator, bytes_per_device: int,
                      max_len: int = 5, walker: ProgramWalker | None = None) -> Iterator[tuple[float, Program]]:
    """Every valid program up to `max_len` steps, cheapest first (ties by text), lazily."""
    walker = walker or ProgramWalker(hierarchy)
    semantics, alphabet = walker.semantics, walker.alphabet
    enumerator = walker.enumerator(max_len)
    goal = semantics.goal
    alive: dict[tuple[tuple, int], bool] = {}

    def can_finish(state: tuple, remaining: int) -> bool:
        if state == goal:
            return True
        key = (state, remaining)
        if key not in alive:
            alive[key] = any(enumerator.count(state, steps) for steps in range(1, remaining + 1))
        return alive[key]

    heap: list[tuple[float, str, int, tuple, tuple[int, ...]]] = [(0.0, "", 0, semantics.initial, ())]
    while heap:
        cost, text, depth, state, path = heapq.heappop(heap)
        if state == goal:
            yield cost, Program(tuple(alphabet[i][0] for i in path))
            continue
        if depth == max_len:
            continue
        for index in range(len(alphabet)):
            following = walker.advance(state, index)
            if following is None or not can_finish(following, max_len - depth - 1):
                continue
            step = alphabet[index][0]
            step_time = simulator.step_time(step.collective, walker.calls[index], walker.chunks(state, index),
                                            bytes_per_device)
            heapq.heappush(heap, (cost + step_time, f"{text}; {step}" if text else str(step), depth + 1,
                                  following, path + (index,)))


def _row(program: Program, cost: ProgramCost, steps, hierarchy: SynthesisHierarchy, baseline_time: float,
         bound: LowerBound) -> RankedProgram:
    extra = max((step.extra_memory_bytes for step in cost.steps), default=0.0)
    return RankedProgram(
        program=str(program), matrix=hierarchy.placement.matrix, bytes=cost.bytes_per_device, time_s=cost.time_s,
        algbw_GBps=cost.algbw_GBps, busbw_GBps=cost.busbw_GBps, speedup=baseline_time / cost.time_s,
        bound_ratio=cost.time_s / bound.time_s, baseline=len(program) == 1,
        extra_memory_bytes=math.ceil(extra), communicators=communicators(steps),
        calls_per_device=calls_per_device(steps, hierarchy.group_size), length=len(program),
    )


def rank_programs(hierarchy: SynthesisHierarchy, topology: Topology, bytes_per_device: int, max_len: int = 5,
                  top: int | None = None, backend: str | Backend = "nccl", simulator: Simulator | None = None,
                  programs: list[Program] | None = None,
                  walker: ProgramWalker | None = None) -> list[RankedProgram]:
    """Programs ordered by predicted time (ties by text), the baseline always included.

    Every valid program up to `max_len` steps; or the ones given in `programs` (e.g. one
    enumeration reused across sizes); or, with `top=K`, the K best found by the cost-guided
    search, plus the baseline if it is not among them. A reduction group of one member has
    nothing to rank: the result is empty. Pass the same `simulator` and `walker` across calls
    on one hierarchy to reuse their caches.
    """
    if hierarchy.group_size == 1:
        return []
    if top is not None and top < 1:
        raise ValueError("top must be at least 1")
    simulator = simulator or Simulator(hierarchy, topology, backend)
    walker = walker or ProgramWalker(hierarchy)
    bound = lower_bound(hierarchy, topology, bytes_per_device)
    if top is not None:
        chosen = []
        for _, program in cheapest_programs(hierarchy, simulator, bytes_per_device, max_len, walker):
            chosen.append(program)
            if len(chosen) == top:
                break
    elif programs is not None:
        chosen = list(programs)
    else:
        chosen = list(enumerate_programs(hierarchy, max_len=max_len))
    if not any(len(program) == 1 for program in chosen):
        chosen.append(baseline_program(hierarchy))
    steps = {program: walker.steps(program) for program in chosen}
    costs = {program: simulator.cost_of_steps(str(program), steps[program], bytes_per_device) for program in chosen}
    baseline_time = next(cost.time_s for program, cost in costs.items() if len(program) == 1)
    rows = [_row(p, costs[p], steps[p], hierarchy, baseline_time, bound) for p in chosen]
    return sorted(rows, key=lambda row: (row.time_s, row.program))


ESTIMATES = ("lockstep", "pipelined")


def rerank_pipelined(rows: list[RankedProgram], hierarchy: SynthesisHierarchy, simulator: Simulator,
                     bytes_per_device: int) -> list[RankedProgram]:
    """The same programs, timed by the pipelined estimate (synth/model/overlap.py: groups do
    not wait for each other between steps) instead of the lockstep sum, and re-ordered.

    That estimate is not a sum of step costs, so the cost-guided search cannot use it; it
    re-times a ranking of every program. It is the one that matched the emulated cluster's
    measurements where several groups share links (docs/accuracy.md)."""
    timed = {row.program: pipelined_cost(simulator, lower(parse_program(row.program), hierarchy), bytes_per_device).time_s
             for row in rows}
    baseline_time = next(timed[row.program] for row in rows if row.baseline)
    bound_time = rows[0].time_s / rows[0].bound_ratio
    result = []
    for row in rows:
        time_s = timed[row.program]
        algbw = bytes_per_device / time_s / 1e9
        result.append(replace(row, time_s=time_s, algbw_GBps=algbw, busbw_GBps=algbw * row.busbw_GBps / row.algbw_GBps,
                              speedup=baseline_time / time_s, bound_ratio=time_s / bound_time))
    return sorted(result, key=lambda row: (row.time_s, row.program))


def pareto_front(rows: list[RankedProgram], keep_baseline: bool = True) -> list[RankedProgram]:
    """The rows no other row beats on every objective (time, extra memory, communicators,
    calls per device) while beating it on one; the baseline stays listed when asked."""

    def dominates(a: RankedProgram, b: RankedProgram) -> bool:
        return all(x <= y for x, y in zip(a.objectives, b.objectives)) and a.objectives != b.objectives

    return [row for row in rows
            if (keep_baseline and row.baseline) or not any(dominates(other, row) for other in rows)]
