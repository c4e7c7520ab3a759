"""Dead-prefix pruning: can the goal still be reached in the steps that remain?

The question is put to Z3 over an abstraction of the state, small enough that many concrete
states share one answer (memoized by abstract state):

* `need`: the fewest doublings any chunk still needs. Every chunk must end up holding all N
  members. One reducing step over groups of k members can at most multiply a chunk's set by
  k (a union of k sets), and other collectives never enlarge a chunk's best set. So the
  chunk whose best holder has the smallest set, s, needs s * prod(k) >= N over the remaining
  reducing steps; with growth ceil(log2 k) per step this is a sound bound.
  For goals that sum (all-reduce, reduce-scatter, reduce) a second bound on doublings holds
  and `need` is the larger: every contributor set a block will ever have is a disjoint union
  of sets held for that block now (only sums make sets, by disjoint unions; everything else
  moves or copies them, and a block's sets move with it), so the block's whole set takes at
  least m(b) of today's sets, m(b) the fewest that partition all members, and one sum over
  groups of k merges at most k sets into one: ceil(log2 m(b)) doublings at least (ceil is
  subadditive). A block whose sets cannot partition all members can never be summed whole:
  the state is dead (`need` -1). This is what cuts the states where copies (a Broadcast, or
  an AllReduce's duplicates) would have to be summed again.
* `partial`: some member holds part of the buffer; only a collective that widens a range
  repairs it.
* `empty`: some member holds nothing; only one that fills empty members repairs it.
* `misplaced` (reduce-scatter): some member holds no chunk of its own block; only a step
  that widens (a join or a root copy) brings a member a block it did not hold.
* `overlap` (reduce-scatter): some block's data is held twice. Its goal holds each block
  once, on its own member, so the excess sum over members of |set| - |union of the sets| of a
  block must fall to 0. A sum (its sets are disjoint) or a Permute keeps each block's excess,
  a step that delivers to every member (AllReduce, AllGather, Broadcast, groups of two or
  more) raises it, and only a root copy, which overwrites members' data, can lower it; but a
  root copy delivers to every member too. So an overlap, or a copying step, must be followed
  by a root copy, which must be followed by another: no completion, for any length.
* A step that always leaves partial (or empty) members must be followed by one that widens
  (or fills), so neither can be last.

What each collective may do is read from its record (synth/collectives.py); instructions
enter the query only through those facts and their growth, so the query ranges over a few
classes. Every rule only removes sequences that cannot reach the goal, so pruning keeps
completeness.

The abstraction is computed once per state from per-member chunk counts cached by member
(a step changes a few members and most states share most of their members), not by walking
every chunk of every member again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache, reduce
from operator import itemgetter, or_
from typing import NamedTuple

from synth.collectives import Combine, Delivery
from synth.goals import ALL_REDUCE, SUM_BLOCKS, Goal


@dataclass(frozen=True)
class AbstractState:
    need: int  # doublings still needed by the weakest chunk; -1 when a chunk is held by nobody
    partial: bool
    empty: bool
    # Goals that end on one block per member (reduce-scatter): halvings the longest and the
    # shortest range still need (only a block-delivering step splits a range; a root copy may
    # replace a range by another one, never by one shorter than the shortest).
    split: int = 0
    split_min: int = 0
    # Reduce-scatter: some member holds no chunk of its own block. Only a step that widens (a
    # join or a root copy) brings a member a block it does not hold: a sum keeps the blocks,
    # a block delivery keeps one of them, a Permute reorders them.
    misplaced: bool = False
    # Reduce-scatter: some block's data is held twice (two members' sets for it overlap).
    overlap: bool = False


class InstructionClass(NamedTuple):
    """What the oracle knows of an instruction (its record's pruning facts and its growth).
    A NamedTuple: classes are sorted and read by position inside the Z3 formula."""

    reduces: bool
    leaves_partial: bool
    leaves_empty: bool
    widens: bool
    fills_empty: bool
    growth: int
    copies: bool = False  # leaves two or more members with the same data (delivers to every member)
    drops: bool = False  # overwrites a member's data (a root copy): the only step that loses data


def chunk_counts(member, member_count: int) -> tuple[int, ...]:
    """For each chunk of the buffer, how many members are summed into it on this member (0
    outside its range)."""
    lo, hi, sets = member[0], member[1], member[2]
    full = (1 << member_count) - 1
    return ((0,) * lo + tuple(((sets >> (chunk * member_count)) & full).bit_count() for chunk in range(lo, hi))
            + (0,) * (member_count - hi))


def doublings(weakest: int, member_count: int) -> int:
    """The fewest doublings that take `weakest` contributors to at least `member_count`."""
    need = 0
    while weakest << need < member_count:
        need += 1
    return need


def block_pieces(member, member_count: int) -> tuple[int, ...]:
    """For each block of the goal (a chunk's tag where blocks move, else its place), the
    contributor set this member holds for it (0: not held)."""
    lo, hi, sets, tags = member[0], member[1], member[2], member[4]
    every = (1 << member_count) - 1
    pieces = [0] * member_count
    for chunk in range(lo, hi):
        pieces[chunk if tags is None else tags[chunk - lo]] = (sets >> (chunk * member_count)) & every
    return tuple(pieces)


def fewest_partition(family: tuple[int, ...], uncovered: int, memo: dict) -> int | None:
    """The fewest sets of `family` (bitmasks) that partition `uncovered`, or None: the lowest
    uncovered member first, with each set holding it that fits."""
    if not uncovered:
        return 0
    found = memo.get(uncovered, _UNSET)
    if found is not _UNSET:
        return found
    lowest = uncovered & -uncovered
    best = None
    for piece in family:
        if piece & lowest and not piece & ~uncovered:
            rest = fewest_partition(family, uncovered & ~piece, memo)
            if rest is not None and (best is None or rest + 1 < best):
                best = rest + 1
    memo[uncovered] = best
    return best


def partition_need(pieces, member_count: int, covers: dict | None = None) -> int:
    """Doublings every block still needs by the partition argument (module docstring), from
    the members' `block_pieces`; -1 when some block's sets cannot partition all members.
    `covers` memoizes the fewest partition per family of sets."""
    covers = {} if covers is None else covers
    every = (1 << member_count) - 1
    need = 0
    for family in set(map(frozenset, zip(*pieces))):
        fewest = covers.get(family, _UNSET)
        if fewest is _UNSET:
            fewest = covers[family] = fewest_partition(tuple(sorted(family - {0})), every, {})
        if fewest is None:
            return -1
        need = max(need, (fewest - 1).bit_length())
    return need


_UNSET = object()


def abstract(state: tuple, member_count: int, goal: Goal = ALL_REDUCE) -> AbstractState:
    """The abstraction of one state, from scratch (the oracle caches per member instead)."""
    counts = [chunk_counts(member, member_count) for member in set(state) if member is not None]
    empty = None in state
    partial = any(member is not None and (member[0] or member[1] != member_count) for member in state)
    weakest = min(map(max, zip(*counts))) if counts else 0
    need = -1 if weakest == 0 else doublings(weakest if goal.sums else member_count, member_count)
    if need >= 0 and goal.sums:
        held = [block_pieces(member, member_count) for member in set(state) if member is not None]
        by_partition = partition_need(held, member_count)
        need = -1 if by_partition < 0 else max(need, by_partition)
    split = split_min = 0
    misplaced = False
    if goal.end == SUM_BLOCKS:
        halvings = [(member[1] - member[0] - 1).bit_length() for member in set(state) if member is not None]
        split, split_min = max(halvings, default=0), min(halvings, default=0)
        misplaced = any(member is None or rank not in member[4] for rank, member in enumerate(state))
        held = [block_pieces(member, member_count) for member in state if member is not None]
        overlap = any(sum(piece.bit_count() for piece in family) != reduce(or_, family, 0).bit_count()
                      for family in zip(*held))
        return AbstractState(need, partial, empty, split, split_min, misplaced, overlap)
    return AbstractState(need, partial, empty, split, split_min, misplaced)


def instruction_class(instruction, use_quotient_sizes: bool) -> InstructionClass:
    """What the oracle knows of an instruction. Growth is measured in the instance the state
    lives in (quotient members or real ones), as `need` is. A Permute sums nothing and leaves
    every range as long as it was (it moves a whole buffer or one block)."""
    if instruction.is_permute:
        return InstructionClass(False, False, False, False, False, 0)
    k = len(instruction.groups[0]) if use_quotient_sizes else instruction.real_group_size
    record = instruction.record
    return InstructionClass(*record.pruning_facts, record.growth(k), record.delivery is Delivery.EVERY,
                            record.combine is Combine.ROOT)


class DeadPrefixOracle:
    """Answers which instruction classes can begin a completion, one memoized Z3 formula per
    abstract state; the answers are shared by every oracle with the same classes. States are
    tuples of member ids into `members` (synth.semantics.InternedMachine's table)."""

    def __init__(self, alphabet, member_count: int, use_quotient_sizes: bool, members: list, goal: Goal = ALL_REDUCE):
        self.member_count = member_count
        self.goal = goal
        # What the goal's final state asks: every chunk summed over all N members (else held
        # by someone: contributor sets never need to grow), no partial member, no empty one.
        target = member_count if goal.sums else 1
        self.single = goal.end == SUM_BLOCKS
        self.ends = (goal.ends_whole, goal.ends_full, self.single)
        found = [instruction_class(instruction, use_quotient_sizes) for _, instruction in alphabet]
        self.classes = tuple(sorted(set(found)))
        self.class_of = tuple(self.classes.index(found_class) for found_class in found)
        self.queries = 0
        self.members = members
        self.all_chunks = (1 << member_count) - 1
        # ceil(T / 2^t) for t = 0 .. ceil(log2 T), T the target: at the last, one contributor is enough.
        self.thresholds = tuple(-(-target >> t) for t in range((target - 1).bit_length() + 1))
        # For a count of c contributors, the first t with ceil(T / 2^t) <= c.
        self._first_reached = [next((t for t, threshold in enumerate(self.thresholds) if count >= threshold), None)
                               for count in range(member_count + 1)]
        self._covers: list[tuple[int, ...] | None] = []  # member id -> per need t, chunks with >= ceil(N/2^t)
        self._partial: list[bool] = []  # member id -> holds part of the buffer
        self._pieces: list[tuple[int, ...] | None] = []  # member id -> block_pieces (goals that sum)
        self._partitions: dict[frozenset[int], int | None] = {}  # family of sets -> fewest partition
        self._own: list[frozenset[int]] = []  # member id -> the blocks it holds (reduce-scatter)
        self._placed: dict[tuple[AbstractState, bool, bool], AbstractState] = {}
        self._facts: dict[frozenset, AbstractState] = {}
        self._answers: dict[tuple[AbstractState, int], frozenset[int]] = {}

    def _learn_members(self) -> None:
        n = self.member_count
        for member in self.members[len(self._covers):]:
            if member is None:
                self._covers.append(None)
                self._partial.append(False)
                self._pieces.append(None)
                self._own.append(frozenset())
                continue
            self._own.append(frozenset(member[4]) if member[4] is not None else frozenset())
            self._pieces.append(block_pieces(member, n) if self.goal.sums else None)
            # Bucket each chunk by the first t whose threshold it reaches, then accumulate.
            buckets = [0] * len(self.thresholds)
            for chunk, count in enumerate(chunk_counts(member, n)):
                if count:
                    buckets[self._first_reached[count]] |= 1 << chunk
            covers, covered = [], 0
            for bucket in buckets:
                covered |= bucket
                covers.append(covered)
            self._covers.append(tuple(covers))
            self._partial.append(member[0] != 0 or member[1] != n)

    def facts(self, state: tuple[int, ...]) -> AbstractState:
        """The abstraction of a state; it depends only on which members occur, so it is memoized
        by that set. `need` is the first t at which the members' chunks holding at least
        ceil(N / 2^t) contributors cover the buffer (the weakest chunk's best set, in doublings),
        raised for goals that sum by the partition bound."""
        distinct = frozenset(state)
        facts = self._facts.get(distinct)
        if facts is None:
            if len(self._covers) < len(self.members):
                self._learn_members()
            covers = [self._covers[i] for i in distinct]
            empty = None in covers
            if empty:
                covers = [cover for cover in covers if cover is not None]
            partial = any(map(self._partial.__getitem__, distinct))
            need = -1
            for t in range(len(self.thresholds)):
                if reduce(or_, map(itemgetter(t), covers), 0) == self.all_chunks:
                    need = t
                    break
            if need >= 0 and self.goal.sums:
                pieces = [self._pieces[i] for i in distinct if self._pieces[i] is not None]
                by_partition = partition_need(pieces, self.member_count, self._partitions)
                need = -1 if by_partition < 0 else max(need, by_partition)
            split = split_min = 0
            overlap = False
            if self.single:
                halvings = [(self.members[i][1] - self.members[i][0] - 1).bit_length() for i in distinct
                            if self.members[i] is not None]
                split, split_min = max(halvings, default=0), min(halvings, default=0)
                pieces = [self._pieces[i] for i in distinct if self._pieces[i] is not None]
                overlap = any(sum(piece.bit_count() for piece in family) != reduce(or_, family, 0).bit_count()
                              for family in zip(*pieces))
            facts = self._facts[distinct] = AbstractState(need, partial, empty, split, split_min, False, overlap)
        if self.single and facts.need >= 0:
            # What depends on where members are, not only on which occur: a member without its
            # own block, and one member state held by two members (the same data twice).
            if len(self._own) < len(self.members):
                self._learn_members()
            own = self._own
            misplaced = any(rank not in own[member] for rank, member in enumerate(state))
            twice = not facts.overlap and len(distinct) < len(state) and _held_twice(state, self.members)
            if misplaced or twice:
                key = (facts, misplaced, twice)
                found = self._placed.get(key)
                if found is None:
                    found = self._placed[key] = replace(facts, misplaced=misplaced, overlap=facts.overlap or twice)
                return found
        return facts

    def answer(self, facts: AbstractState, remaining: int) -> frozenset[int]:
        """The instruction classes that can begin a completion of `remaining` steps from an
        abstract state (empty: the prefix is dead). Instructions of other classes need not
        even be applied."""
        key = (facts, remaining)
        answer = self._answers.get(key)
        if answer is None:
            before = _first_steps.cache_info().misses
            answer = self._answers[key] = _first_steps(self.classes, facts, remaining, self.ends)
            self.queries += _first_steps.cache_info().misses - before
        return answer


def _held_twice(state: tuple[int, ...], members: list) -> bool:
    """Whether two members hold the same (non-empty) member state."""
    seen = set()
    for member in state:
        if member in seen and members[member] is not None:
            return True
        seen.add(member)
    return False


ALL = frozenset({-1})  # the answer for "already at the goal with no steps left"


@cache
def _first_steps(classes: tuple[InstructionClass, ...], facts: AbstractState, remaining: int,
                 ends: tuple[bool, ...] = (True, True, False)) -> frozenset[int]:
    """Which classes can begin a completion: the Z3 formula of (classes, steps left, what the
    goal's end state asks: (no partial member, no empty member)), with this abstract state as
    assumptions, asked once whether any completion exists and then once per first class."""
    whole, full, single = (tuple(ends) + (False,))[:3]
    if facts.need < 0:
        return frozenset()  # a chunk nobody holds can never come back
    if remaining == 0:
        done = (facts.need == 0 and not (whole and facts.partial) and not (full and facts.empty)
                and not (single and (facts.split or facts.misplaced or facts.overlap)))
        return ALL if done else frozenset()
    import z3  # on the first query: importing the search costs nothing

    # Z3 catches Ctrl-C itself by default and answers "unknown", which a search would take for
    # "no completion": leave SIGINT to Python, so Ctrl-C raises as soon as the call returns.
    z3.set_param("ctrl_c", False)

    formula = _formula(classes, remaining, ends)
    assumptions = [formula.need == facts.need,
                   formula.partial if facts.partial else z3.Not(formula.partial),
                   formula.empty if facts.empty else z3.Not(formula.empty),
                   formula.split == facts.split, formula.split_min == facts.split_min,
                   formula.misplaced if facts.misplaced else z3.Not(formula.misplaced),
                   formula.overlap if facts.overlap else z3.Not(formula.overlap)]
    if formula.solver.check(*assumptions) != z3.sat:
        return frozenset()
    return frozenset(i for i in range(len(classes))
                     if formula.solver.check(*assumptions, formula.first == i) == z3.sat)


@dataclass(frozen=True)
class _Formula:
    solver: object
    first: object  # the class of the first step
    need: object  # the abstract state, as free variables the queries fix by assumption
    partial: object
    empty: object
    split: object
    split_min: object
    misplaced: object
    overlap: object


@cache
def _formula(classes: tuple[InstructionClass, ...], remaining: int,
             ends: tuple[bool, ...] = (True, True, False)) -> _Formula:
    """One Z3 solver per (classes, steps left, goal's ends), built once: a sequence of
    `remaining` classes whose growth covers `need`, where each step that leaves partial (empty)
    members is followed by one that widens (fills), and a widening (filling) step comes when
    the state is partial (has empty members). A goal whose end state may hold partial (empty)
    members (reduce-scatter, reduce) drops the rules about partial (empty) members."""
    import z3

    whole, full, single = (tuple(ends) + (False,))[:3]

    solver = z3.Solver()
    choice = [z3.Int(f"step_{t}") for t in range(remaining)]
    need, partial, empty, split = z3.Int("need"), z3.Bool("partial"), z3.Bool("empty"), z3.Int("split")
    split_min, misplaced, overlap = z3.Int("split_min"), z3.Bool("misplaced"), z3.Bool("overlap")

    def one_of(t, fact: int):
        members = [i for i, found in enumerate(classes) if found[fact]]
        return z3.Or([choice[t] == i for i in members]) if members else z3.BoolVal(False)

    def growth(t, fact: int = 0):
        """The doublings step t brings (fact[5]) when its class has `fact` (0: any growth; 1: a
        step that leaves a partial range, i.e. a halving)."""
        expression = z3.IntVal(0)
        for i, found in enumerate(classes):
            if found[fact] and found[5]:
                expression = z3.If(choice[t] == i, found[5], expression)
        return expression

    leaves_partial = [one_of(t, 1) for t in range(remaining)]
    leaves_empty = [one_of(t, 2) for t in range(remaining)]
    widens = [one_of(t, 3) for t in range(remaining)]
    fills = [one_of(t, 4) for t in range(remaining)]
    for t in range(remaining):
        solver.add(choice[t] >= 0, choice[t] < len(classes))
        if whole:
            solver.add(z3.Implies(leaves_partial[t], z3.Or(widens[t + 1:] or [z3.BoolVal(False)])))
        if full:
            solver.add(z3.Implies(leaves_empty[t], z3.Or(fills[t + 1:] or [z3.BoolVal(False)])))
    solver.add(z3.Sum([growth(t) for t in range(remaining)]) >= need)
    if whole:
        solver.add(z3.Implies(partial, z3.Or(widens)))
    if full:
        solver.add(z3.Implies(empty, z3.Or(fills)))
    if single:  # halvings come from block-delivering steps (their growth), or a root copy replaces the range

        total = z3.Sum([growth(t, 1) for t in range(remaining)])
        solver.add(total >= split_min, z3.Or(total >= split, z3.Or(fills)))
        solver.add(z3.Implies(misplaced, z3.Or(widens)))
        drops = [one_of(t, 7) for t in range(remaining)]  # 7: InstructionClass.drops
        solver.add(z3.Implies(overlap, z3.Or(drops)))
        for t in range(remaining):
            solver.add(z3.Implies(one_of(t, 6), z3.Or(drops[t + 1:] or [z3.BoolVal(False)])))  # 6: copies
    return _Formula(solver, choice[0], need, partial, empty, split, split_min, misplaced, overlap)
