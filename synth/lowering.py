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

from synth.hierarchy import SynthesisHierarchy
from synth.language import Program, Step
from synth.semantics import FORMS, Semantics


@dataclass(frozen=True)
class GroupCall:
    """One collective call by one group.

    `lo`, `hi`: the chunk range the call spans. AllReduce, Reduce, Broadcast: the range every
    member holds (Broadcast: the root's). ReduceScatter: the input range; member i keeps the
    i-th of k equal blocks. AllGather: the joined output range; member i contributes the i-th
    block.
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

    @property
    def group_size(self) -> int:
        return len(self.calls[0].members)


@dataclass(frozen=True)
class LoweredProgram:
    program: Program
    level_names: tuple[str, ...]
    sizes: tuple[int, ...]
    steps: tuple[LoweredStep, ...]

    @property
    def group_size(self) -> int:
        """N: members per reduction group, also the number of chunks a buffer is cut into."""
        result = 1
        for size in self.sizes:
            result *= size
        return result


def lower(program: Program, hierarchy: SynthesisHierarchy) -> LoweredProgram:
    """Check the program (InvalidProgramError if it is not valid) and lower it."""
    return lower_on(program, hierarchy.level_names, hierarchy.sizes)


def lower_on(program: Program, level_names: tuple[str, ...], sizes: tuple[int, ...]) -> LoweredProgram:
    Semantics(level_names, sizes, quotient=True).run(program)
    n = 1
    for size in sizes:
        n *= size
    ranges: list[tuple[int, int] | None] = [(0, n)] * n
    steps = []
    for step in program.steps:
        level = level_names.index(step.level)
        groups, varying = FORMS[step.form](sizes, level)
        calls, busy = [], set()
        for members in sorted(groups):
            busy.update(members)
            held = [ranges[m] for m in members]
            # AllGather spans the joined blocks; every other call the range its root holds.
            lo, hi = (held[0][0], held[-1][1]) if step.collective == "AllGather" else held[0]
            calls.append(GroupCall(tuple(members), lo, hi))
            _advance(ranges, step.collective, members, lo, hi)
        idle = tuple(m for m in range(n) if m not in busy)
        steps.append(LoweredStep(step, step.collective, varying, tuple(calls), idle))
    return LoweredProgram(program, tuple(level_names), tuple(sizes), tuple(steps))


def _advance(ranges, collective: str, members, lo: int, hi: int) -> None:
    k = len(members)
    if collective == "ReduceScatter":
        block = (hi - lo) // k
        for i, m in enumerate(members):
            ranges[m] = (lo + i * block, lo + (i + 1) * block)
    elif collective == "Reduce":
        for m in members[1:]:
            ranges[m] = None
    else:  # AllReduce keeps, AllGather joins, Broadcast copies the root's range
        for m in members:
            ranges[m] = (lo, hi)
