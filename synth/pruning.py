"""Dead-prefix pruning: can the goal still be reached in the steps that remain?

The question is put to Z3 over an abstraction of the state, small enough that many concrete
states share one answer (memoized by abstract state):

* `need`: the fewest doublings any chunk still needs. Every chunk must end up holding all N
  members. One reducing step over groups of k members can at most multiply a chunk's set by
  k (a union of k sets), and copies (AllGather, Broadcast) never enlarge a chunk's best set.
  So the chunk whose best holder has the smallest set, s, needs s * prod(k) >= N over the
  remaining reducing steps; with growth ceil(log2 k) per step this is a sound bound.
* `partial`: some member holds part of the buffer; only AllGather or Broadcast widen a range.
* `empty`: some member holds nothing; only Broadcast fills it.
* The last step cannot be a ReduceScatter or a Reduce (they leave partial or empty members),
  and each must be followed by a step that repairs what it leaves.

Every rule only removes sequences that cannot reach the goal, so pruning keeps completeness.
A collective this module does not know is treated as able to do anything (never pruned on).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import z3

# What each known collective can do to the abstraction (growth is per instruction).
LEAVES_PARTIAL = frozenset({"ReduceScatter"})
LEAVES_EMPTY = frozenset({"Reduce"})
WIDENS_RANGE = frozenset({"AllGather", "Broadcast"})
FILLS_EMPTY = frozenset({"Broadcast"})
KNOWN = frozenset({"AllReduce", "ReduceScatter", "AllGather", "Reduce", "Broadcast"})
REDUCING = frozenset({"AllReduce", "ReduceScatter", "Reduce"})


@dataclass(frozen=True)
class AbstractState:
    need: int  # doublings still needed by the weakest chunk; -1 when a chunk is held by nobody
    partial: bool
    empty: bool


def abstract(state: tuple, member_count: int) -> AbstractState:
    best = [0] * member_count
    partial = empty = False
    for member in state:
        if member is None:
            empty = True
            continue
        lo, hi, sets, _ = member
        if (lo, hi) != (0, member_count):
            partial = True
        full = (1 << member_count) - 1
        for chunk in range(lo, hi):
            count = ((sets >> (chunk * member_count)) & full).bit_count()
            if count > best[chunk]:
                best[chunk] = count
    weakest = min(best)
    if weakest == 0:
        return AbstractState(-1, partial, empty)
    need = 0
    while weakest << need < member_count:
        need += 1
    return AbstractState(need, partial, empty)


def _growth(instruction) -> int:
    return max(instruction.real_group_size - 1, 0).bit_length()  # ceil(log2 k)


class DeadPrefixOracle:
    """Answers which instruction classes can begin a completion, one memoized Z3 formula per abstract state.

    Instructions enter the query only through (collective, growth), so the query ranges over
    those few classes, and its answers are shared by every oracle with the same classes.
    """

    def __init__(self, alphabet, member_count: int, use_quotient_sizes: bool):
        self.member_count = member_count
        # Growth is measured in the instance the state lives in (quotient members or real ones).
        classes = {
            (instruction.collective,
             max(len(instruction.groups[0]) - 1, 0).bit_length() if use_quotient_sizes else _growth(instruction))
            for _, instruction in alphabet
        }
        self.classes = tuple(sorted(classes))
        self.class_of = tuple(
            self.classes.index((instruction.collective,
                                max(len(instruction.groups[0]) - 1, 0).bit_length() if use_quotient_sizes else _growth(instruction)))
            for _, instruction in alphabet
        )
        self.queries = 0
        self._facts: dict[tuple, AbstractState] = {}

    def first_steps(self, state: tuple, remaining: int) -> frozenset[int]:
        """The instruction classes that can begin a completion of `remaining` steps (empty:
        the prefix is dead). Instructions of other classes need not even be applied."""
        facts = self._facts.get(state)
        if facts is None:
            facts = self._facts[state] = abstract(state, self.member_count)
        before = _first_steps.cache_info().misses
        answer = _first_steps(self.classes, facts, remaining)
        self.queries += _first_steps.cache_info().misses - before
        return answer


ALL = frozenset({-1})  # the answer for "already at the goal with no steps left"


@lru_cache(maxsize=None)
def _first_steps(classes: tuple[tuple[str, int], ...], facts: AbstractState, remaining: int) -> frozenset[int]:
    """One Z3 formula per (classes, abstract state, steps left), asked once per first class."""
    if facts.need < 0:
        return frozenset()  # a chunk nobody holds can never come back
    if remaining == 0:
        return ALL if facts.need == 0 and not facts.partial and not facts.empty else frozenset()
    solver = z3.Solver()
    choice = [z3.Int(f"step_{t}") for t in range(remaining)]

    def one_of(t, predicate) -> z3.BoolRef:
        members = [i for i, (kind, _) in enumerate(classes) if predicate(kind)]
        return z3.Or([choice[t] == i for i in members]) if members else z3.BoolVal(False)

    def growth(t) -> z3.ArithRef:
        expression = z3.IntVal(0)
        for i, (kind, amount) in enumerate(classes):
            if kind in REDUCING or kind not in KNOWN:
                expression = z3.If(choice[t] == i, amount, expression)
        return expression

    widens = [one_of(t, lambda kind: kind in WIDENS_RANGE or kind not in KNOWN) for t in range(remaining)]
    fills = [one_of(t, lambda kind: kind in FILLS_EMPTY or kind not in KNOWN) for t in range(remaining)]
    leaves_partial = [one_of(t, lambda kind: kind in LEAVES_PARTIAL) for t in range(remaining)]
    leaves_empty = [one_of(t, lambda kind: kind in LEAVES_EMPTY) for t in range(remaining)]
    for t in range(remaining):
        solver.add(choice[t] >= 0, choice[t] < len(classes))
        solver.add(z3.Implies(leaves_partial[t], z3.Or(widens[t + 1:] or [z3.BoolVal(False)])))
        solver.add(z3.Implies(leaves_empty[t], z3.Or(fills[t + 1:] or [z3.BoolVal(False)])))
    solver.add(z3.Sum([growth(t) for t in range(remaining)]) >= facts.need)
    if facts.partial:
        solver.add(z3.Or(widens))
    if facts.empty:
        solver.add(z3.Or(fills))
    return frozenset(i for i in range(len(classes)) if solver.check(choice[0] == i) == z3.sat)
