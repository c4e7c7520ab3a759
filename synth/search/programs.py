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
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from synth.hierarchy import SynthesisHierarchy
from synth.language import Program, Step
from synth.model.engine import ProgramTable
from synth.search.enumerator import Enumerator, SearchOptions
from synth.search.walker import StateWalker
from synth.semantics import QUOTIENT_CAP, Semantics


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
