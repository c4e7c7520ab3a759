"""Programs as the cost model sees them: for each step, its calls and the chunks each spans.

A program's steps become `StepCalls` (synth/model/engine.py) by walking it over the quotient
state graph of its hierarchy (synth.search.StateWalker). That is cheaper than lowering every
program and gives the same calls (tests check both).

A `ProgramSet` is many programs of one hierarchy as one `ProgramTable` (each program a row of
indices into the distinct steps), with the typed programs and their texts for ties.
`ProgramSets` shares the enumeration between hierarchies: a step's validity reads the real
sizes only through the real range lengths (a ReduceScatter must split its range evenly,
AllGather's blocks must be equally long), and on the hierarchy whose levels all have the
quotient's sizes (2, or 1) those lengths are the quotient ranges' own, so its valid programs
include those of every hierarchy with the same quotient. One enumeration per quotient shape,
filtered by walking each program on the real sizes (which drops any the real lengths
forbid), gives every hierarchy's valid programs in the enumerator's order; the walk is
needed for the costs anyway. Programs are spelled per level names.

Every goal's programs are listed so (synth/goals.py): a program of a goal that permutes also
carries the share of the buffer its local `Permute` steps copy (`copied`, walked as lowering
computes it), and a set names its baseline, the goal's flat call, which is appended (priced
by lowering) where the goal's alphabet cannot spell it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from synth.errors import InvalidProgramError
from synth.goals import ALL_REDUCE, Goal
from synth.hierarchy import SynthesisHierarchy
from synth.language import PERMUTE, Program, Step, permute_step
from synth.lowering import lower
from synth.model.engine import ProgramTable, StepCalls, step_calls
from synth.search.enumerator import Enumerator, SearchOptions
from synth.search.walker import StateWalker
from synth.semantics import QUOTIENT_CAP, Semantics


Spelled = tuple[tuple[str, str, object], ...]  # per step: (collective, form, level index), a Permute's level order


@dataclass(frozen=True, eq=False)
class ProgramShape:
    """Programs of one hierarchy shape (level sizes), level names aside."""

    spelled: tuple[Spelled, ...]
    table: ProgramTable
    copied: np.ndarray | None = None  # per program: buffer shares its Permutes copy (None: no Permute)
    flat: int | None = None  # the goal's flat call (the baseline), when listed

    @property
    def baseline(self) -> int | None:
        """The goal's flat call (for the all-reduce the default all-reduce, the one valid
        program of one step, docs/model.md section 8), when listed."""
        return self.flat


def _step(spelled: tuple[str, str, object], names: tuple[str, ...]) -> Step:
    collective, form, level = spelled
    if collective == PERMUTE:
        return permute_step(names[index] for index in level)
    return Step(collective, form, names[level])


def _spelling(step: Step, hierarchy: SynthesisHierarchy) -> tuple[str, str, object]:
    if step.is_permute:
        return (PERMUTE, "", tuple(hierarchy.level_index(name) for name in step.order))
    return (step.collective, step.form, hierarchy.level_index(step.level))


@dataclass(frozen=True, eq=False)
class ProgramSet:
    """Programs of one hierarchy with their step table; the typed programs and their texts
    (for ties and output) are made when first asked for."""

    shape: ProgramShape
    level_names: tuple[str, ...]

    @property
    def table(self) -> ProgramTable:
        return self.shape.table

    @property
    def baseline(self) -> int | None:
        return self.shape.baseline

    def __len__(self) -> int:
        return len(self.shape.spelled)

    def program(self, i: int) -> Program:
        return self.programs[i]

    @cached_property
    def programs(self) -> tuple[Program, ...]:
        names = self.level_names
        return tuple(Program(tuple(_step(step, names) for step in spelled)) for spelled in self.shape.spelled)

    @property
    def copied(self) -> np.ndarray | None:
        return self.shape.copied

    @cached_property
    def texts(self) -> tuple[str, ...]:
        if self.shape.copied is not None:  # Permute steps: spelled by the language
            return tuple(str(program) for program in self.programs)
        names = self.level_names
        return tuple("; ".join(f"{c}({f}({names[l]}))" for c, f, l in spelled) for spelled in self.shape.spelled)

    @cached_property
    def text_rank(self) -> np.ndarray:
        """[program] -> position in text order: the tie-break of every ranking."""
        order = np.empty(len(self), dtype=np.int64)
        order[sorted(range(len(self)), key=self.texts.__getitem__)] = np.arange(len(self))
        return order

    def order(self, times: np.ndarray) -> np.ndarray:
        """Program indices by (time, text)."""
        return np.lexsort((self.text_rank, times))

    def fastest(self, times: np.ndarray) -> int:
        """The index of the smallest time, ties by text."""
        tied = np.flatnonzero(times == times.min())
        return int(tied[np.argmin(self.text_rank[tied])])


def program_set(walker: StateWalker, programs: Iterable[Program], flat: Program | None = None) -> ProgramSet:
    """Given programs (valid for the walker's goal on its hierarchy) as one set; `flat`, the
    goal's flat call, is its baseline where it is among them (else a program of one step of
    the goal's collective: another spelling of it; else it has none)."""
    hierarchy = walker.hierarchy
    programs = list(programs)
    spelled = tuple(tuple(_spelling(step, hierarchy) for step in program.steps) for program in programs)
    walked = [walked_steps(walker, program) for program in programs]
    base = _flat_index(programs, flat, walker.semantics.goal_kind)
    shape = ProgramShape(spelled, ProgramTable.of(steps for steps, _ in walked), _copies(walked), base)
    result = ProgramSet(shape, hierarchy.level_names)
    result.__dict__["programs"] = tuple(programs)  # keep the caller's spellings
    return result


def _flat_index(programs: list[Program], flat: Program | None, goal: Goal) -> int | None:
    if flat is not None and flat in programs:
        return programs.index(flat)
    return next((i for i, program in enumerate(programs)
                 if len(program) == 1 and program.steps[0].collective == goal.collective), None)


def _copies(walked) -> np.ndarray | None:
    """The programs' copied shares, None when none has a Permute (nothing to add)."""
    if not any(permutes for _, (permutes, _) in walked):
        return None
    return np.array([copied for _, (_, copied) in walked], dtype=float)


def walked_steps(walker: StateWalker, program: Program) -> tuple[tuple[StepCalls, ...], tuple[bool, float]]:
    """A valid program's collective steps as the cost model sees them, and (whether it has a
    Permute, the buffer shares its Permutes copy, summed in program order). Walked over the
    quotient states (the search's transitions); a step the goal's alphabet cannot spell (a
    goal's flat call may be one) is lowered instead, which raises InvalidProgramError when the
    program is not valid on the walker's hierarchy."""
    try:
        if not any(step.is_permute for step in program.steps):
            return walker.walk(program), (False, 0.0)
        return _walked_permutes(walker, program)
    except (KeyError, ValueError):
        return _lowered_steps(walker, program)


def _walked_permutes(walker: StateWalker, program: Program) -> tuple[tuple[StepCalls, ...], tuple[bool, float]]:
    """A program with Permutes walked over interned states, as the search walks it."""
    machine = walker.machine
    state, calls, copied = machine.initial, [], 0
    for step in program.steps:
        index = walker.index_of(step)
        if walker.permutes[index]:
            copied += walker.copied(state)
        else:
            calls.append(walker.interned_step(state, index))
        state = machine.apply(state, index)
        if state is None:
            raise ValueError(f"{program} is not a valid program on this hierarchy")
    if not machine.is_goal(state):
        raise ValueError(f"{program} does not reach the goal on this hierarchy")
    return tuple(calls), (True, copied)


def _lowered_steps(walker: StateWalker, program: Program) -> tuple[tuple[StepCalls, ...], tuple[bool, float]]:
    lowered = lower(program, walker.hierarchy, walker.semantics.goal_kind)  # InvalidProgramError if invalid
    permutes = [step.copied for step in lowered.steps if step.places is not None]
    return (tuple(step_calls(step) for step in lowered.steps if step.places is None),
            (bool(permutes), sum(permutes)))


class ProgramSets:
    """Every valid program of a hierarchy up to a length: enumerated once per quotient shape
    and max_len, walked once per level sizes, spelled once per level names (see the module
    docstring), for every placement and request."""

    def __init__(self):
        self._enumerated: dict[tuple, tuple[tuple[tuple[str, str, int], ...], ...]] = {}
        self._shapes: dict[tuple, ProgramShape] = {}
        self._named: dict[tuple, ProgramSet] = {}

    @property
    def shapes(self) -> int:
        """How many enumerations ran."""
        return len(self._enumerated)

    def get(self, hierarchy: SynthesisHierarchy, max_len: int, walker: StateWalker | None = None,
            goal: Goal = ALL_REDUCE) -> ProgramSet:
        """Every valid program of the goal (the walker's, when one is given; a walker is made
        only for a shape not walked yet)."""
        if walker is not None:
            goal = walker.semantics.goal_kind
        key = (goal, hierarchy.sizes, max_len)
        if key not in self._shapes:
            quotient = (goal, tuple(min(size, QUOTIENT_CAP) for size in hierarchy.sizes), max_len)
            if quotient not in self._enumerated:
                self._enumerated[quotient] = _enumerated(hierarchy.level_names, quotient[1], max_len, goal)
            self._shapes[key] = _walked(walker or StateWalker(hierarchy, goal), self._enumerated[quotient])
        named = (hierarchy.level_names, *key)
        if named not in self._named:
            self._named[named] = ProgramSet(self._shapes[key], hierarchy.level_names)
        return self._named[named]


def _enumerated(level_names: tuple[str, ...], sizes: tuple[int, ...], max_len: int, goal: Goal):
    """Every valid program of the goal on the hierarchy of these (quotient) sizes, spelled by
    level index (`Spelled`), in the enumerator's order."""
    index = {name: i for i, name in enumerate(level_names)}

    def spelling(step: Step):
        if step.is_permute:
            return (PERMUTE, "", tuple(index[name] for name in step.order))
        return (step.collective, step.form, index[step.level])

    enumerator = Enumerator(Semantics(level_names, sizes, quotient=True, goal=goal), SearchOptions(max_len=max_len))
    return tuple(tuple(spelling(step) for step in program.steps) for program in enumerator.programs())


def _walked(walker: StateWalker, candidates) -> ProgramShape:
    """The candidates valid on the walker's hierarchy, walked into a step table, the goal's
    flat call appended where the candidates lack it."""
    names = walker.hierarchy.level_names
    goal = walker.semantics.goal_kind
    flat = (goal.collective, "InsideGroup", 0)
    spelled, walked = [], []
    for candidate in candidates:
        try:
            walked.append(walked_steps(walker, Program(tuple(_step(step, names) for step in candidate))))
        except InvalidProgramError:  # the real sizes forbid it
            continue
        spelled.append(candidate)
    base = (spelled.index((flat,)) if (flat,) in spelled else
            next((i for i, program in enumerate(spelled) if len(program) == 1 and program[0][0] == goal.collective),
                 None))
    if base is None:
        base = len(spelled)
        spelled.append((flat,))
        walked.append(walked_steps(walker, goal.flat_call(names[0])))
    return ProgramShape(tuple(spelled), ProgramTable.of(steps for steps, _ in walked), _copies(walked), base)
