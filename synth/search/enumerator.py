"""The enumerator: every valid program up to a length, one per distinct instruction sequence.

Syntax-guided: programs grow one step at a time over the grammar's alphabet of instructions
(deduplicated by group sets, docs/model.md section 5). Pruning rules, each switchable for the ablation
benchmark:

* invalid steps and no-op steps end a branch (by docs/model.md section 7 no extension is valid);
* dead prefixes: a Z3 query over an abstract state says the goal is out of reach in the
  steps that remain (synth/search/pruning.py);
* shared suffixes: the number of valid completions of (state, steps left) is memoized, so a
  prefix that reaches an already-seen state reuses its suffixes instead of re-exploring them.

States are interned (synth.semantics.InternedMachine): tuples of member ids, with every
group's transition memoized. Before anything is built, the search's size is estimated
(synth/search/budget.py) and one that cannot finish in the budget is refused with the
longest length that does (SearchTooLargeError).

Programs come out shortest first, then in alphabet order, from a generator, so a caller can
stop early.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from synth.errors import SearchTooLargeError, UsageError
from synth.goals import ALL_REDUCE
from synth.language import Program
from synth.search.budget import DEFAULT_BUDGET_S, check_budget, search_depth
from synth.search.pruning import DeadPrefixOracle
from synth.semantics import InternedMachine, Semantics

if TYPE_CHECKING:
    from synth.hierarchy import SynthesisHierarchy

# Beyond this, the number of programs is astronomically large on any real hierarchy.
MAX_PROGRAM_LENGTH = 12


@dataclass(frozen=True)
class SearchOptions:
    max_len: int = 5
    prune_dead: bool = True
    share_suffixes: bool = True
    quotient: bool = True
    # Refuse a search estimated above this many seconds (synth/search/budget.py); None: never.
    budget_s: float | None = DEFAULT_BUDGET_S


@dataclass
class SearchStats:
    """What the search did: for the ablation table and progress display."""

    expanded: int = 0  # (state, steps left) pairs whose successors were computed
    steps_applied: int = 0  # instruction applications tried
    pruned_dead: int = 0  # (state, steps left) pairs cut by the dead-prefix oracle
    z3_queries: int = 0
    programs: int = 0


def semantics_for(hierarchy: SynthesisHierarchy, quotient: bool = True, goal=ALL_REDUCE) -> Semantics:
    return Semantics(hierarchy.level_names, hierarchy.sizes, quotient=quotient, goal=goal)


def check_search(semantics: Semantics, options: SearchOptions) -> None:
    """Refuse a search that makes no sense or cannot finish, before starting it (UsageError,
    SearchTooLargeError with the length that fits); the messages describe values only."""
    if options.max_len < 1:
        raise UsageError(f"a program length of {options.max_len} steps: give at least 1")
    if options.max_len > MAX_PROGRAM_LENGTH:
        raise SearchTooLargeError(
            f"programs of up to {options.max_len} steps cannot be enumerated: their number grows exponentially "
            f"with the length; at most {MAX_PROGRAM_LENGTH} steps",
            depth=search_depth(semantics.real_sizes), max_len=options.max_len, largest_length=MAX_PROGRAM_LENGTH,
            expansions=0, seconds=float("inf"),
        )
    if semantics.quotient:
        check_budget([(semantics.level_names, semantics.real_sizes)], options.max_len, options.budget_s,
                     semantics.goal_kind)


class Enumerator:
    """Enumerates valid programs over one synthesis hierarchy."""

    def __init__(self, semantics: Semantics, options: SearchOptions = SearchOptions(),
                 on_progress: Callable[[SearchStats], None] | None = None):
        check_search(semantics, options)
        self.semantics = semantics
        self.options = options
        self.alphabet = semantics.alphabet
        self.stats = SearchStats()
        self.on_progress = on_progress
        self.machine = InternedMachine(semantics)
        self.oracle = (DeadPrefixOracle(self.alphabet, semantics.member_count, semantics.quotient, self.machine.members,
                                        semantics.goal_kind)
                       if options.prune_dead else None)
        # Every state reached gets a small id, hashed once; memos below are keyed by it.
        self._states: list[tuple[int, ...]] = []
        self._state_ids: dict[tuple[tuple[int, ...], bool], int] = {}
        self._next: list[dict[int, int | None] | None] = []  # id -> {alphabet index: next id or None}
        self._facts: list = []  # id -> abstract state (oracle)
        self._counts: list[dict[int, int]] = [{} for _ in range(options.max_len + 1)]  # steps left -> {id: count}
        self._allowed_indices: dict[frozenset[int] | None, tuple[int, ...]] = {}
        self._goals: list[bool | None] = []  # id -> whether it is a goal state
        self._permuted: list[bool] = []  # id -> reached by a Permute
        self._is_permute = tuple(instruction.is_permute for _, instruction in self.alphabet)
        self._can_end = tuple(_can_end(semantics, instruction) for _, instruction in self.alphabet)
        self._last_indices: dict[frozenset[int] | None, tuple[int, ...]] = {}
        self._initial = self._state_id(self.machine.initial)

    def _state_id(self, state: tuple[int, ...], permuted: bool = False) -> int:
        """The id of a search node: a state, and whether the step into it was a Permute (no
        Permute may follow one: docs/model.md section 7)."""
        key = (state, permuted)
        found = self._state_ids.get(key)
        if found is None:
            found = self._state_ids[key] = len(self._states)
            self._states.append(state)
            self._permuted.append(permuted)
            self._next.append(None)
            self._facts.append(None)
            self._goals.append(self.machine.is_goal(state))
        return found

    def _allowed(self, sid: int, remaining: int) -> frozenset[int] | None:
        """The instruction classes worth trying (None: all, without dead-prefix pruning)."""
        if self.oracle is None:
            return None
        facts = self._facts[sid]
        if facts is None:
            facts = self._facts[sid] = self.oracle.facts(self._states[sid])
        return self.oracle.answer(facts, remaining)

    def _successors(self, sid: int, allowed: frozenset[int] | None, remaining: int = 2) -> list[tuple[int, int]]:
        """(alphabet index, next state id) of the valid steps worth taking with `remaining`
        steps left (the last step only among those that can end a program)."""
        known = self._next[sid] if self.options.share_suffixes else None
        if known is None:
            known = {}
            if self.options.share_suffixes:
                self._next[sid] = known
        result = []
        apply, state = self.machine.apply, self._states[sid]
        permuted, is_permute = self._permuted[sid], self._is_permute
        for index in (self._indices(allowed) if remaining > 1 else self._final_indices(allowed)):
            next_id = known.get(index, _UNSEEN)
            if next_id is _UNSEEN:
                self.stats.steps_applied += 1
                after = None if permuted and is_permute[index] else apply(state, index)
                next_id = known[index] = None if after is None else self._state_id(after, is_permute[index])
            if next_id is not None:
                result.append((index, next_id))
        return result

    def _indices(self, allowed: frozenset[int] | None) -> tuple[int, ...]:
        """The alphabet indices whose instruction class is allowed (all without an oracle)."""
        indices = self._allowed_indices.get(allowed)
        if indices is None:
            indices = self._allowed_indices[allowed] = tuple(
                index for index in range(len(self.alphabet)) if allowed is None or self.oracle.class_of[index] in allowed
            )
        return indices

    def _finishing(self, sid: int, allowed: frozenset[int] | None) -> int:
        """How many last steps take a state to the goal: each is applied and its result only
        compared with the goal, not kept as a search node (most of them are not the goal)."""
        apply, is_goal, state = self.machine.apply, self.machine.is_goal, self._states[sid]
        permuted, is_permute = self._permuted[sid], self._is_permute
        total = 0
        for index in self._final_indices(allowed):
            self.stats.steps_applied += 1
            if permuted and is_permute[index]:
                continue
            after = apply(state, index)
            if after is not None and is_goal(after):
                total += 1
        return total

    def _final_indices(self, allowed: frozenset[int] | None) -> tuple[int, ...]:
        """`_indices` less the steps that can never end a program (see `_can_end`)."""
        indices = self._last_indices.get(allowed)
        if indices is None:
            can_end = self._can_end
            indices = self._last_indices[allowed] = tuple(index for index in self._indices(allowed) if can_end[index])
        return indices

    def count(self, state: tuple, remaining: int) -> int:
        """How many programs of exactly `remaining` more steps from `state` (member states, as
        `Semantics.apply` gives them) first reach the goal at their end."""
        while len(self._counts) <= remaining:
            self._counts.append({})
        return self._count(self._state_id(self.machine.intern(state)), remaining)

    def _count(self, sid: int, remaining: int) -> int:
        if self._goals[sid]:
            return 1 if remaining == 0 else 0
        if remaining == 0:
            return 0
        memo = self._counts[remaining]
        if self.options.share_suffixes:
            known = memo.get(sid)
            if known is not None:
                return known
        allowed = self._allowed(sid, remaining)
        if allowed is not None and not allowed:
            self.stats.pruned_dead += 1
            total = 0
        else:
            self.stats.expanded += 1
            if self.on_progress is not None and self.stats.expanded % 2000 == 0:
                self.on_progress(self.stats)
            total = (self._finishing(sid, allowed) if remaining == 1 else
                     sum(self._count(next_id, remaining - 1) for _, next_id in self._successors(sid, allowed, remaining)))
        if self.oracle is not None:
            self.stats.z3_queries = self.oracle.queries
        if self.options.share_suffixes:
            memo[sid] = total
        return total

    def _paths(self, sid: int, remaining: int, prefix: list[int]) -> Iterator[list[int]]:
        if remaining == 0:
            if self._goals[sid]:
                yield list(prefix)
            return
        if self._goals[sid]:
            return
        for index, next_id in self._successors(sid, self._allowed(sid, remaining), remaining):
            if self._count(next_id, remaining - 1) == 0:
                continue
            prefix.append(index)
            yield from self._paths(next_id, remaining - 1, prefix)
            prefix.pop()

    def programs(self) -> Iterator[Program]:
        """Every valid program up to `max_len` steps, shortest first."""
        for length in range(1, self.options.max_len + 1):
            if self._count(self._initial, length) == 0:
                continue
            for path in self._paths(self._initial, length, []):
                self.stats.programs += 1
                yield Program(tuple(self.alphabet[i][0] for i in path))

    def total(self) -> int:
        """The number of valid programs up to `max_len`, without listing them."""
        return sum(self._count(self._initial, length) for length in range(1, self.options.max_len + 1))


_UNSEEN = object()


def _can_end(semantics: Semantics, instruction) -> bool:
    """Whether a step can be the last of a program. Every collective can; a Permute only into
    the hierarchy's order, where the goal has one goal state (its members are in that order,
    docs/model.md section 7): a Permute into another order leaves every holding member in it.
    A reduce-scatter is reached by its blocks' tags, lengths and sums, which a Permute never
    changes (a single block moves with its sums), so a state one Permute away from its goal is
    already the goal, and no program goes on from a goal."""
    if not instruction.is_permute:
        return True
    return semantics.goal is not None and instruction.order == semantics.canonical_order


def enumerate_programs(hierarchy: SynthesisHierarchy, max_len: int = 5, **options) -> Iterator[Program]:
    """Generator over every valid program for a hierarchy (see Enumerator)."""
    semantics = semantics_for(hierarchy, options.pop("quotient", True), options.pop("goal", ALL_REDUCE))
    return Enumerator(semantics, SearchOptions(max_len=max_len, **options)).programs()


def brute_force_programs(semantics: Semantics, max_len: int) -> list[Program]:
    """Every sequence over the alphabet, checked one by one: the completeness oracle."""
    from itertools import product as sequences

    from synth.errors import InvalidProgramError

    found = []
    steps = [step for step, _ in semantics.alphabet]
    for length in range(1, max_len + 1):
        for sequence in sequences(steps, repeat=length):
            program = Program(tuple(sequence))
            try:
                semantics.run(program)
            except InvalidProgramError:
                continue
            found.append(program)
    return found
