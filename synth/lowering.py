"""Lowering: a valid program becomes concrete collective calls with buffer ranges.

This is what the simulator costs and what every export emits: for each step, the groups
that call the collective (member ranks in the reduction group, root first), the chunk range
each call covers, and the members left idle. Ranges follow docs/model.md section 7 exactly, so the
in-place offsets and counts are the ones NCCL needs.

All reduction groups have the same shape and run the same calls at the same time, so a
lowered program is written once in member ranks; `hierarchy.groups[g][member]` gives the
global rank of a member in reduction group g.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from synth.collectives import collective
from synth.goals import ALL_REDUCE, OWN_BLOCK, ROOT_ONLY, Goal, parse_goal
from synth.language import Program, Step
from synth.semantics import FORMS, Semantics, place_map

if TYPE_CHECKING:
    from synth.hierarchy import SynthesisHierarchy


@dataclass(frozen=True)
class GroupCall:
    """One collective call by one group.

    `lo`, `hi`: the chunk range the call spans (`Collective.span`): a join's output (member i
    contributes the i-th of k blocks, AllGather), else the root's range (member i keeps the
    i-th block when the collective delivers blocks, ReduceScatter).
    """

    members: tuple[int, ...]
    lo: int
    hi: int

    @property
    def chunks(self) -> int:
        return self.hi - self.lo

    @property
    def root(self) -> int:
        return self.members[0]


@dataclass(frozen=True)
class LoweredStep:
    step: Step
    collective: str
    varying_levels: tuple[int, ...]
    calls: tuple[GroupCall, ...]
    idle: tuple[int, ...]  # members in no group of this step (Master steps)
    # A Permute: every member's chunk at place p moves to place places[p] (no calls), and the
    # share of the buffer each member copies (1 for a whole buffer, 1/N for one block).
    places: tuple[int, ...] | None = None
    copied: float = 0.0

    @property
    def group_size(self) -> int:
        return len(self.calls[0].members)


@dataclass(frozen=True)
class LoweredProgram:
    program: Program
    level_names: tuple[str, ...]
    sizes: tuple[int, ...]
    steps: tuple[LoweredStep, ...]
    goal: Goal = ALL_REDUCE
    # Where each block (the goal's block index) sits at the end: the final layout's places.
    final_places: tuple[int, ...] | None = None

    @property
    def group_size(self) -> int:
        """N: members per reduction group, also the number of chunks a buffer is cut into."""
        result = 1
        for size in self.sizes:
            result *= size
        return result


def lower(program: Program, hierarchy: SynthesisHierarchy, goal: Goal | str = ALL_REDUCE) -> LoweredProgram:
    """Check the program (InvalidProgramError if it is not valid) and lower it."""
    return lower_on(program, hierarchy.level_names, hierarchy.sizes, goal)


def lower_on(program: Program, level_names: tuple[str, ...], sizes: tuple[int, ...],
             goal: Goal | str = ALL_REDUCE) -> LoweredProgram:
    """The program checked and lowered on a hierarchy of these level names and sizes; kept per
    (program, hierarchy, goal), as a ranking lowers its rows more than once (at 4096 members a
    lowering costs tens of milliseconds)."""
    return _lowered(program, tuple(level_names), tuple(int(size) for size in sizes), parse_goal(goal))


@lru_cache(maxsize=256)
def _lowered(program: Program, level_names: tuple[str, ...], sizes: tuple[int, ...], goal: Goal) -> LoweredProgram:
    Semantics(level_names, sizes, quotient=True, goal=goal).run(program)
    n = 1
    for size in sizes:
        n *= size
    canonical = tuple(i for i, size in enumerate(sizes) if size > 1)
    layout = canonical
    if goal.start == OWN_BLOCK:
        ranges: list[tuple[int, int] | None] = [(m, m + 1) for m in range(n)]
    elif goal.start == ROOT_ONLY:
        ranges = [(0, n)] + [None] * (n - 1)
    else:
        ranges = [(0, n)] * n
    steps = []
    for step in program.steps:
        if step.is_permute:
            order = tuple(level_names.index(name) for name in step.order)
            places = place_map(tuple(sizes), layout, order)
            copied = max((held[1] - held[0]) / n for held in ranges if held is not None)
            ranges = [None if held is None else (held if held[1] - held[0] == n else (places[held[0]], places[held[0]] + 1))
                      for held in ranges]
            layout = order
            steps.append(LoweredStep(step, step.collective, (), (), tuple(range(n)), places, copied))
            continue
        level = level_names.index(step.level)
        groups, varying = FORMS[step.form](sizes, level)
        calls, busy = [], set()
        record = collective(step.collective)
        for members in sorted(groups):
            busy.update(members)
            lo, hi = record.span([ranges[m] for m in members])
            calls.append(GroupCall(tuple(members), lo, hi))
            for member, held in zip(members, record.ranges_after(lo, hi, len(members))):
                ranges[member] = held
        idle = tuple(m for m in range(n) if m not in busy)
        steps.append(LoweredStep(step, step.collective, varying, tuple(calls), idle))
    final = place_map(tuple(sizes), canonical, layout) if goal.permutes else None
    return LoweredProgram(program, tuple(level_names), tuple(sizes), tuple(steps), goal, final)

