"""The state walker: programs stepped over the quotient state graph of one hierarchy.

A program's steps become `StepCalls` (synth/model/engine.py) by walking it over the quotient
state graph (synth/semantics.py), whose members carry the real range lengths: the calls of a
step are its groups in the real hierarchy (`Semantics.real_calls`) and each call spans the
chunks the semantics reads from the state before the step (`Semantics.call_spans`: the
root's range, or a join's output). The full ranking walks every program this way; the
best-first search (synth/search/best_first.py) walks interned states and bounds their
completions through the same walker, so both see the same transitions and calls.
"""

from __future__ import annotations

from functools import cached_property
from operator import itemgetter

from synth.goals import ALL_REDUCE, Goal
from synth.hierarchy import SynthesisHierarchy
from synth.language import Program, Step
from synth.model.engine import StepCalls
from synth.search.completion import StateAbstraction
from synth.search.enumerator import Enumerator, SearchOptions
from synth.semantics import InternedMachine, Semantics, StepFailure


class StateWalker:
    """Steps of programs of one goal over the quotient state graph of one hierarchy, with
    memoized transitions and `StepCalls` (shared by the full ranking and the search); the
    search walks interned states (`machine`, `interned_step`, `copied`) and bounds their
    completions (`abstraction`). A Permute calls nothing: it is a local copy (`copied`)."""

    def __init__(self, hierarchy: SynthesisHierarchy, goal: Goal | str = ALL_REDUCE):
        self.hierarchy = hierarchy
        self.semantics = Semantics(hierarchy.level_names, hierarchy.sizes, quotient=True, goal=goal)
        self.alphabet = self.semantics.alphabet
        self.goal = self.semantics.goal
        # Each alphabet entry's calls in the real hierarchy (the semantics' `real_calls`).
        self.calls = [self.semantics.real_calls(step) for step, _ in self.alphabet]
        self._spelled = {step: i for i, (step, _) in enumerate(self.alphabet)}
        self._index = {(instruction.collective, instruction.groups): i
                       for i, (_, instruction) in enumerate(self.alphabet)}
        self._transitions: dict[tuple[tuple, int], tuple | None] = {}
        self._steps: dict[tuple[int, tuple[int, ...]], StepCalls] = {}
        self._interned: dict[tuple[int, tuple[int, ...]], StepCalls] = {}
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
        return self.step_of(index, self.semantics.call_spans(state, self.alphabet[index][0]))

    def walk(self, program: Program) -> tuple[StepCalls, ...]:
        """The steps of a valid program; ValueError when it is not valid on this hierarchy."""
        state, result = self.semantics.initial, []
        for step in program.steps:
            index = self.index_of(step)
            result.append(self.step(state, index))
            state = self.advance(state, index)
            if state is None:
                raise ValueError(f"{program} is not a valid program on this hierarchy")
        if not self.semantics.is_goal(state):  # reduce-scatter and reduce have many goal states
            raise ValueError(f"{program} does not reach the goal on this hierarchy")
        return tuple(result)

    # --- the search's view: interned states (synth/semantics.py InternedMachine) -------------------

    @cached_property
    def machine(self) -> InternedMachine:
        """The semantics over interned states (tuples of member ids), for the top-K search."""
        return InternedMachine(self.semantics)

    @cached_property
    def abstraction(self) -> StateAbstraction:
        """What the search's completion bound knows of an interned state (synth/search/completion.py)."""
        return StateAbstraction(self.semantics, self.machine)

    @cached_property
    def _call_roots(self) -> tuple[tuple[tuple[int, ...], int], ...]:
        """Per alphabet entry: the state member standing for each call's root, and the span
        factor (what `Semantics.call_spans` reads)."""
        representative = self.semantics.representative
        result = []
        for (step, instruction), calls in zip(self.alphabet, self.calls):
            if instruction.is_permute:
                result.append(((), 0))
                continue
            factor = instruction.record.span_factor(instruction.real_group_size)
            result.append((tuple(representative[members[0]] for members in calls), factor))
        return tuple(result)

    @cached_property
    def _distinct_roots(self) -> tuple[tuple[tuple[int, ...], itemgetter | None], ...]:
        """Per alphabet entry: the distinct state members standing for its calls' roots, and
        a getter from their spans to every call's span in call order (a step of thousands of
        calls has a few distinct roots in the quotient)."""
        result = []
        for roots, _ in self._call_roots:
            distinct = tuple(dict.fromkeys(roots))
            position = {root: i for i, root in enumerate(distinct)}
            result.append((distinct, itemgetter(*[position[root] for root in roots]) if len(roots) > 1 else None))
        return tuple(result)

    @cached_property
    def permutes(self) -> tuple[bool, ...]:
        """Per alphabet entry: whether it is a Permute (no calls; costed by `copied`)."""
        return tuple(instruction.is_permute for _, instruction in self.alphabet)

    def copied(self, state: tuple[int, ...]) -> float:
        """The share of the buffer a Permute from this interned state copies on the busiest
        device: its longest range over the real member count, as lowering computes it
        (synth/lowering.py), so the search and the full ranking charge the same copy."""
        members = self.machine.members
        return max((members[member][3] for member in state if members[member] is not None),
                   default=0) / self.semantics.real_member_count

    def interned_step(self, state: tuple[int, ...], index: int) -> StepCalls:
        """`step` for an interned state: the same calls and spans, read from the member table."""
        distinct, spread = self._distinct_roots[index]
        factor = self._call_roots[index][1]
        members = self.machine.members
        spans = tuple([members[state[root]][3] * factor for root in distinct])
        key = (index, spans)  # the distinct roots' spans fix every call's
        found = self._interned.get(key)
        if found is None:
            chunks = spread(spans) if spread is not None else spans
            found = self._interned[key] = self.step_of(index, chunks)
        return found

    def step_of(self, index: int, chunks: tuple[int, ...]) -> StepCalls:
        """Alphabet entry `index` with its calls spanning `chunks` (one per call), kept once."""
        key = (index, chunks)
        found = self._steps.get(key)
        if found is None:
            found = self._steps[key] = StepCalls(self.alphabet[index][1].collective, self.calls[index], chunks)
        return found
