"""Programs as the cost model sees them: for each step, its calls and the chunks each spans.

A program's steps become `StepCalls` (synth/model/engine.py) by walking it over the quotient
state graph of its hierarchy (synth/semantics.py), whose members carry the real range
lengths: the calls of a step are its groups in the real hierarchy (`Semantics.real_calls`)
and each call spans the chunks the semantics reads from the state before the step
(`Semantics.call_spans`: the root's range, or a join's output). That is cheaper than
lowering every program and gives the same calls (tests check both).

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
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from synth.analysis.completion import StateAbstraction
from synth.hierarchy import SynthesisHierarchy
from synth.language import Program, Step
from synth.model.engine import ProgramTable, StepCalls
from synth.search import Enumerator, SearchOptions
from synth.semantics import QUOTIENT_CAP, InternedMachine, Semantics, StepFailure


class StateWalker:
    """Steps of programs over the quotient state graph of one hierarchy, with memoized
    transitions and `StepCalls` (shared by the full ranking and the search); the search walks
    interned states (`machine`, `interned_step`) and bounds their completions (`abstraction`)."""

    def __init__(self, hierarchy: SynthesisHierarchy):
        self.hierarchy = hierarchy
        self.semantics = Semantics(hierarchy.level_names, hierarchy.sizes, quotient=True)
        self.alphabet = self.semantics.alphabet
        self.goal = self.semantics.goal
        # Each alphabet entry's calls in the real hierarchy (the semantics' `real_calls`).
        self.calls = [self.semantics.real_calls(step) for step, _ in self.alphabet]
        self._spelled = {step: i for i, (step, _) in enumerate(self.alphabet)}
        self._index = {(instruction.collective, instruction.groups): i
                       for i, (_, instruction) in enumerate(self.alphabet)}
        self._transitions: dict[tuple[tuple, int], tuple | None] = {}
        self._steps: dict[tuple[int, tuple[int, ...]], StepCalls] = {}
        self._enumerators: dict[int, Enumerator] = {}

    def enumerator(self, max_len: int) -> Enumerator:
        if max_len not in self._enumerators:
            self._enumerators[max_len] = Enumerator(self.semantics, SearchOptions(max_len=max_len))
        return self._enumerators[max_len]

    def index_of(self, step: Step) -> int:
        """The alphabet entry of a step, whichever of its equal spellings (docs/model.md section 5) it uses."""
        index = self._spelled.get(step)
        if index is None:
            instruction = self.semantics.instruction_of(step)
            index = self._index[(instruction.collective, instruction.groups)]
        return index

    def advance(self, state: tuple, index: int) -> tuple | None:
        """The next state, or None when the step is invalid or a no-op (no valid program goes on)."""
        key = (state, index)
        if key not in self._transitions:
            try:
                self._transitions[key] = self.semantics.apply(state, self.alphabet[index][1])
            except StepFailure:
                self._transitions[key] = None
        return self._transitions[key]

    def step(self, state: tuple, index: int) -> StepCalls:
        """Alphabet entry `index` taken from `state`, as the cost model sees it."""
        chunks = self.semantics.call_spans(state, self.alphabet[index][0])
        key = (index, chunks)
        found = self._steps.get(key)
        if found is None:
            found = self._steps[key] = StepCalls(self.alphabet[index][1].collective, self.calls[index], chunks)
        return found

    def walk(self, program: Program) -> tuple[StepCalls, ...]:
        """The steps of a valid program; ValueError when it is not valid on this hierarchy."""
        state, result = self.semantics.initial, []
        for step in program.steps:
            index = self.index_of(step)
            result.append(self.step(state, index))
            state = self.advance(state, index)
            if state is None:
                raise ValueError(f"{program} is not a valid program on this hierarchy")
        if state != self.goal:
            raise ValueError(f"{program} does not reach the goal on this hierarchy")
        return tuple(result)

    # --- the search's view: interned states (synth/semantics.py InternedMachine) -------------------

    @cached_property
    def machine(self) -> InternedMachine:
        """The semantics over interned states (tuples of member ids), for the top-K search."""
        return InternedMachine(self.semantics)

    @cached_property
    def abstraction(self) -> StateAbstraction:
        """What the search's completion bound knows of an interned state (synth/analysis/completion.py)."""
        return StateAbstraction(self.semantics, self.machine)

    @cached_property
    def _call_roots(self) -> tuple[tuple[tuple[int, ...], int], ...]:
        """Per alphabet entry: the state member standing for each call's root, and the span
        factor (what `Semantics.call_spans` reads)."""
        representative = self.semantics.representative
        result = []
        for (step, instruction), calls in zip(self.alphabet, self.calls):
            factor = instruction.record.span_factor(instruction.real_group_size)
            result.append((tuple(representative[members[0]] for members in calls), factor))
        return tuple(result)

    def interned_step(self, state: tuple[int, ...], index: int) -> StepCalls:
        """`step` for an interned state: the same calls and spans, read from the member table."""
        roots, factor = self._call_roots[index]
        members = self.machine.members
        key = (index, tuple(members[state[root]][3] * factor for root in roots))
        found = self._steps.get(key)
        if found is None:
            found = self._steps[key] = StepCalls(self.alphabet[index][1].collective, self.calls[index], key[1])
        return found


@dataclass(frozen=True, eq=False)
class ProgramShape:
    """Programs of one hierarchy shape (level sizes), level names aside."""

    spelled: tuple[tuple[tuple[str, str, int], ...], ...]  # per program: (collective, form, level index) per step
    table: ProgramTable

    @cached_property
    def baseline(self) -> int | None:
        """The default all-reduce (the one valid program of one step: an AllReduce over the
        whole group, docs/model.md section 8), when listed."""
        return next((i for i, program in enumerate(self.spelled) if len(program) == 1), None)


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
        return tuple(Program(tuple(Step(c, f, names[l]) for c, f, l in spelled)) for spelled in self.shape.spelled)

    @cached_property
    def texts(self) -> tuple[str, ...]:
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


def program_set(walker: StateWalker, programs: Iterable[Program]) -> ProgramSet:
    """Given programs (valid on the walker's hierarchy) as one set."""
    hierarchy = walker.hierarchy
    programs = list(programs)
    spelled = tuple(tuple((s.collective, s.form, hierarchy.level_index(s.level)) for s in p.steps) for p in programs)
    table = ProgramTable.of(walker.walk(program) for program in programs)
    result = ProgramSet(ProgramShape(spelled, table), hierarchy.level_names)
    result.__dict__["programs"] = tuple(programs)  # keep the caller's spellings
    return result


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

    def get(self, hierarchy: SynthesisHierarchy, max_len: int, walker: StateWalker | None = None) -> ProgramSet:
        key = (hierarchy.sizes, max_len)
        if key not in self._shapes:
            quotient = (tuple(min(size, QUOTIENT_CAP) for size in hierarchy.sizes), max_len)
            if quotient not in self._enumerated:
                self._enumerated[quotient] = _enumerated(hierarchy.level_names, quotient[0], max_len)
            self._shapes[key] = _walked(walker or StateWalker(hierarchy), self._enumerated[quotient])
        named = (hierarchy.level_names, *key)
        if named not in self._named:
            self._named[named] = ProgramSet(self._shapes[key], hierarchy.level_names)
        return self._named[named]


def _enumerated(level_names: tuple[str, ...], sizes: tuple[int, ...], max_len: int):
    """Every valid program on the hierarchy of these (quotient) sizes, as (collective, form,
    level index) per step, in the enumerator's order."""
    index = {name: i for i, name in enumerate(level_names)}
    enumerator = Enumerator(Semantics(level_names, sizes, quotient=True), SearchOptions(max_len=max_len))
    return tuple(tuple((s.collective, s.form, index[s.level]) for s in program.steps)
                 for program in enumerator.programs())


def _walked(walker: StateWalker, candidates) -> ProgramShape:
    """The candidates valid on the walker's hierarchy, walked into a step table."""
    names = walker.hierarchy.level_names
    spelled, rows = [], []
    for candidate in candidates:
        try:
            rows.append(walker.walk(Program(tuple(Step(c, f, names[l]) for c, f, l in candidate))))
        except ValueError:
            continue
        spelled.append(candidate)
    return ProgramShape(tuple(spelled), ProgramTable.of(rows))
