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
dead-prefix oracle), and a step's time is cached by (instruction, chunks): a step's cost
depends only on its groups and the bytes per call, so the key is sound.

Objectives besides time, per program:

* extra memory: the largest scratch buffer per device any call of the program allocates
  (the backend's data-sized temporaries: 0 for NCCL, whose calls are all in place as SPEC
  section 7 lowers them; gloo's ReduceScatter clones its input and its AllGather gathers
  into a flat copy). Fixed-size library buffers (NCCL's per-channel FIFOs) are per
  communicator, so they are counted by the next objective.
* communicators: distinct group sets among the steps (each needs its own communicator).
* calls per device: the most collective calls any device makes (Master steps idle some).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass

from synth.hierarchy import SynthesisHierarchy
from synth.language import Program
from synth.lowering import LoweredProgram, lower
from synth.search import Enumerator, SearchOptions, enumerate_programs
from synth.semantics import FORMS, Semantics, StepFailure
from synth.simulate.bound import LowerBound, lower_bound
from synth.simulate.collectives import Backend
from synth.simulate.cost import ProgramCost, Simulator, baseline_program
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


def communicators(lowered: LoweredProgram) -> int:
    """Distinct group sets among the steps (AllReduce and ReduceScatter over the same groups share)."""
    return len({tuple(sorted(call.members for call in step.calls)) for step in lowered.steps})


def calls_per_device(lowered: LoweredProgram) -> int:
    """The most calls any member makes: steps minus the steps it sits out."""
    idle = [0] * lowered.group_size
    for step in lowered.steps:
        for member in step.idle:
            idle[member] += 1
    return len(lowered.steps) - min(idle)


def cheapest_programs(hierarchy: SynthesisHierarchy, simulator: Simulator, bytes_per_device: int,
                      max_len: int = 5) -> Iterator[tuple[float, Program]]:
    """Every valid program up to `max_len` steps, cheapest first (ties by text), lazily."""
    semantics = Semantics(hierarchy.level_names, hierarchy.sizes, quotient=True)
    enumerator = Enumerator(semantics, SearchOptions(max_len=max_len))
    alphabet = semantics.alphabet
    real = []  # per instruction: collective, its calls in the real hierarchy, real group size
    for step, instruction in alphabet:
        groups, _ = FORMS[step.form](hierarchy.sizes, hierarchy.level_index(step.level))
        real.append((step.collective, tuple(sorted(groups)), instruction.real_group_size))
    goal = semantics.goal
    transitions: dict[tuple[tuple, int], tuple | None] = {}
    alive: dict[tuple[tuple, int], bool] = {}

    def advance(state: tuple, index: int):
        key = (state, index)
        if key not in transitions:
            try:
                transitions[key] = semantics.apply(state, alphabet[index][1])
            except StepFailure:  # invalid or a no-op: no valid program goes this way
                transitions[key] = None
        return transitions[key]

    def can_finish(state: tuple, remaining: int) -> bool:
        if state == goal:
            return True
        key = (state, remaining)
        if key not in alive:
            alive[key] = any(enumerator.count(state, steps) for steps in range(1, remaining + 1))
        return alive[key]

    def chunks_of(state: tuple, index: int) -> int:
        """The range one call spans, from the state before the step (lengths are real)."""
        collective, _, real_k = real[index]
        root = state[alphabet[index][1].groups[0][0]]
        return root[3] * real_k if collective == "AllGather" else root[3]

    heap: list[tuple[float, str, int, tuple, tuple[int, ...]]] = [(0.0, "", 0, semantics.initial, ())]
    while heap:
        cost, text, depth, state, path = heapq.heappop(heap)
        if state == goal:
            yield cost, Program(tuple(alphabet[i][0] for i in path))
            continue
        if depth == max_len:
            continue
        for index in range(len(alphabet)):
            following = advance(state, index)
            if following is None or not can_finish(following, max_len - depth - 1):
                continue
            collective, calls, _ = real[index]
            step_time = simulator.step_time(collective, calls, chunks_of(state, index), bytes_per_device)
            step_text = str(alphabet[index][0])
            heapq.heappush(heap, (cost + step_time, f"{text}; {step_text}" if text else step_text, depth + 1,
                                  following, path + (index,)))


def _row(program: Program, cost: ProgramCost, lowered: LoweredProgram, hierarchy: SynthesisHierarchy,
         baseline_time: float, bound: LowerBound) -> RankedProgram:
    extra = max((step.extra_memory_bytes for step in cost.steps), default=0.0)
    return RankedProgram(
        program=str(program), matrix=hierarchy.placement.matrix, bytes=cost.bytes_per_device, time_s=cost.time_s,
        algbw_GBps=cost.algbw_GBps, busbw_GBps=cost.busbw_GBps, speedup=baseline_time / cost.time_s,
        bound_ratio=cost.time_s / bound.time_s, baseline=len(program) == 1,
        extra_memory_bytes=math.ceil(extra), communicators=communicators(lowered),
        calls_per_device=calls_per_device(lowered), length=len(program),
    )


def rank_programs(hierarchy: SynthesisHierarchy, topology: Topology, bytes_per_device: int, max_len: int = 5,
                  top: int | None = None, backend: str | Backend = "nccl",
                  simulator: Simulator | None = None) -> list[RankedProgram]:
    """Programs ordered by predicted time (ties by text), the baseline always included.

    With `top=K`, the K best found by the cost-guided search, plus the baseline if it is not
    among them. A reduction group of one member has nothing to rank: the result is empty.
    """
    if hierarchy.group_size == 1:
        return []
    if top is not None and top < 1:
        raise ValueError("top must be at least 1")
    simulator = simulator or Simulator(hierarchy, topology, backend)
    bound = lower_bound(hierarchy, topology, bytes_per_device)
    if top is None:
        programs = list(enumerate_programs(hierarchy, max_len=max_len))
    else:
        programs = []
        for _, program in cheapest_programs(hierarchy, simulator, bytes_per_device, max_len):
            programs.append(program)
            if len(programs) == top:
                break
    if not any(len(program) == 1 for program in programs):
        programs.append(baseline_program(hierarchy))
    lowered = {program: lower(program, hierarchy) for program in programs}
    costs = {program: simulator.program_cost(lowered[program], bytes_per_device) for program in programs}
    baseline_time = next(cost.time_s for program, cost in costs.items() if len(program) == 1)
    rows = [_row(p, costs[p], lowered[p], hierarchy, baseline_time, bound) for p in programs]
    return sorted(rows, key=lambda row: (row.time_s, row.program))


def pareto_front(rows: list[RankedProgram], keep_baseline: bool = True) -> list[RankedProgram]:
    """The rows no other row beats on every objective (time, extra memory, communicators,
    calls per device) while beating it on one; the baseline stays listed when asked."""

    def dominates(a: RankedProgram, b: RankedProgram) -> bool:
        return all(x <= y for x, y in zip(a.objectives, b.objectives)) and a.objectives != b.objectives

    return [row for row in rows
            if (keep_baseline and row.baseline) or not any(dominates(other, row) for other in rows)]
