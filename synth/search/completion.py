"""What any completion of a search state must still cost: an admissible bound for the top-K search.

The best-first search of synth/search/best_first.py keys a prefix by its time plus a lower bound
on what any valid completion adds. This module computes that bound exactly over a small
abstraction of the quotient state (synth/semantics.py), for one size:

    a = (lo, short, hi, need, empty)

* `lo`, `hi`: at most the shortest and at least the longest range, in real chunks, that a
  non-empty member holds; `short`: at least the shortest (so the shortest lies in
  [lo, short]);
* `need`: doublings still needed. Every contributor set a chunk will ever have is a disjoint
  union of sets members hold now (only sums make sets, by disjoint unions; everything else
  moves them), so the whole set of chunk c takes at least m(c) of today's sets, m(c) the
  fewest that partition all members; one sum over groups of k merges at most k sets into
  one, so reaching m(c) pieces takes sums whose ceil(log2 k) add up to ceil(log2 m(c)).
  `need` is the most over chunks; a chunk whose sets cannot partition all members can never
  be summed whole (the state is dead). A chunk here is a block of the goal: where blocks
  move (synth/goals.py), the block a chunk's tag names, whose sets move with it. Goals that
  sum nothing (all-gather, all-to-all, broadcast) need no doublings: `need` is 0, and a
  block held by nobody is lost for good (dead);
* `empty`: some member surely holds nothing.

An alphabet step acts on the abstraction as its collective's record says (what it combines,
where it delivers, synth/collectives.py), through its real group size k, its growth
g = ceil(log2 k) in the instance the state lives in, and whether it leaves members idle:

* a sum lowers `need` by g (to 0 at least); a ReduceScatter divides every range it takes by
  k: lo / k, and short becomes at most hi / k (some member it takes had at most hi); with no
  idle member short and hi divide by k too; a Reduce empties its non-roots (the shortest
  range left is at most hi);
* a join needs k * lo <= N (its output is at most the buffer) and multiplies the ranges it
  takes by k: short * k, hi * k (at most N), and lo * k when no member is idle;
* a root copy (Broadcast) may fill every empty member; a copied range lies in [lo, hi];
* a sum or a join needs every member of its groups to hold data: with no idle member, a
  state with an empty member cannot take it.

Its cost is at least launch plus its costliest call alone at the span every call has at
least: `lo` chunks, or `k * lo` for a join, whose calls span their output (CostEngine.
least_step_s). An AllToAll keeps every range's length and needs every member it takes to
hold data; a Permute keeps lengths too, and its bound is 0 (a copy costs at least nothing;
the search charges its copy exactly when it takes it).

Which step can reach the goal (FINISHING, per goal; each condition is implied by the same
condition on the concrete state before a step that reaches the goal):

* all-reduce, every member ends with the whole buffer, complete: an AllReduce when every
  member already holds the whole range (short = N), none is empty and need <= g; an
  AllGather when the ranges it takes are 1/k of the buffer and the rest whole (short * k >=
  N), none is empty and need = 0; a Broadcast from roots holding the goal (hi = N, need = 0);
* reduce-scatter, each member ends with one real chunk: only a ReduceScatter (a sum or a
  copy gives the members of a group one same block; a Permute never changes which block a
  member holds), over groups of k with every member it takes holding k chunks (lo <= k <=
  hi), none empty, need <= g; its calls span k chunks;
* all-gather: an AllGather or a Broadcast as for all-reduce, or a last Permute (cost 0)
  when every member holds the whole buffer;
* all-to-all: an AllToAll or a last Permute, every member holding the whole buffer;
* broadcast: a Broadcast from roots holding the whole buffer;
* reduce, member 0 ends with the whole buffer summed: an AllReduce or a Reduce over ranges
  that reach the whole buffer (hi = N) with need <= g, or an AllGather whose output does
  (hi * k >= N) with need = 0.

A finishing collective's calls span the whole buffer (its roots, or a join's outputs, hold
it; k chunks for a reduce-scatter's last step), so it costs at least its time at that span.

`bound(a, L)` is the least total cost of an abstract path of at most L steps that ends with a
finishing step (infinite when there is none: the prefix cannot finish in L steps).

Admissible. Say R(a, s) when a.lo <= lo(s) <= a.short, a.hi >= hi(s), a.need <= need(s),
and a.empty only if s has an empty member; R(alpha(s), s) holds. If R(a, s) and a valid step
takes s to s' at time t, then (i) the abstract step is allowed (each refusal above is implied
by the same fact about s) and t is at least its cost (every call spans at least lo(s) >= a.lo
chunks, or k * a.lo for a join, and a call alone never gets faster with more bytes:
synth/model/backend.py); (ii) if s' is the goal, the finishing conditions hold for a (each is
implied by the same condition on s) and t is at least the cost at N chunks; (iii) otherwise
R(T(a), s') for the abstract successor T(a): a ReduceScatter gives each member it takes
1/k of its range and an idle member keeps its own, a join multiplies the ranges it takes by
k, a copied range lies within [lo, hi], a Reduce keeps its roots' ranges and empties its
non-roots, `need` falls by at most g per sum (a set after the sum is a union of at most k
sets from before, so a partition by the new sets gives one by the old with at most k times
as many pieces, and ceil is subadditive) and never by other collectives, and an empty member
stays empty unless a root copy fills it. By induction on L, every completion of s in at most
L steps costs at least `bound(alpha(s), L)`. The costs bound both a step's lockstep time and
one group's own chain time of it, so the bound serves either estimate
(synth/model/estimate.py).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import NamedTuple

from synth.collectives import Combine, Delivery
from synth.goals import GATHERED, ROOT_EVERYWHERE, SUM_AT_ROOT, SUM_BLOCKS, SUM_EVERYWHERE, TRANSPOSED
from synth.model.engine import CostEngine
from synth.search.pruning import block_pieces, fewest_partition, instruction_class
from synth.semantics import InternedMachine, Semantics

INFINITY = math.inf
new = tuple.__new__  # an Abstract without NamedTuple's Python-level __new__: the bound makes tens of thousands



class Abstract(NamedTuple):
    """One abstract state (see the module docstring). A NamedTuple: it keys every memo of
    the bound, so it hashes and compares as the plain tuple it is."""

    lo: int  # at most the shortest range, in real chunks, a non-empty member holds
    short: int  # at least the shortest
    hi: int  # at least the longest
    need: int  # doublings still needed
    empty: bool  # some member surely holds nothing


class UnknownStepKindError(TypeError):
    """The bound was asked about a step it has no rule for (a collective's combine and
    delivery, or a goal, not in the module docstring): a defect to fix here, never a bound
    silently too high."""


# (combine, delivery) pairs the abstraction has a rule for.
KNOWN_KINDS = frozenset({(Combine.SUM, Delivery.EVERY), (Combine.SUM, Delivery.BLOCKS), (Combine.SUM, Delivery.ROOT),
                         (Combine.JOIN, Delivery.EVERY), (Combine.ROOT, Delivery.EVERY),
                         (Combine.EXCHANGE, Delivery.TRANSPOSE)})

_UNSET = object()


class StateAbstraction:
    """The abstraction of interned states (tuples of member ids of an InternedMachine),
    computed once per state from facts kept per member id."""

    def __init__(self, semantics: Semantics, machine: InternedMachine):
        self.semantics = semantics
        self.machine = machine
        self.full = semantics.real_member_count
        self._every = (1 << semantics.member_count) - 1
        self._lengths: list[int] = []  # member id -> real range length (0: empty)
        self._pieces: list[tuple[int, ...] | None] = []  # member id -> contributor set per chunk (0: not held)
        self._needs: dict[frozenset[int], int] = {}
        self._covers: dict[frozenset[int], int | None] = {}
        self._abstract: dict[tuple[int, ...], Abstract | None] = {}

    def _learn_members(self) -> None:
        n = self.semantics.member_count
        for member in self.machine.members[len(self._lengths):]:
            if member is None:
                self._lengths.append(0)
                self._pieces.append(None)
                continue
            self._lengths.append(member[3])
            self._pieces.append(block_pieces(member, n))

    def need(self, distinct: frozenset[int]) -> int:
        """Doublings still needed (see the module docstring) from the member ids present; -1
        when some block's sets cannot partition all members (goals that sum) or some block is
        held by nobody (the others: nothing is summed, every block must survive)."""
        found = self._needs.get(distinct)
        if found is None:
            pieces = [self._pieces[i] for i in distinct if self._pieces[i] is not None]
            found = 0
            sums = self.semantics.goal_kind.sums
            for family in set(map(frozenset, zip(*pieces))):  # per block, the sets held (0: not held)
                if not sums:
                    if not family - {0}:
                        found = -1
                        break
                    continue
                fewest = self._cover(family)
                if fewest is None:
                    found = -1
                    break
                found = max(found, (fewest - 1).bit_length())
            if not pieces:
                found = -1
            self._needs[distinct] = found
        return found

    def _cover(self, family: frozenset[int]) -> int | None:
        """The fewest sets of `family` (0 stands for members not holding the chunk) that
        partition all members, or None."""
        found = self._covers.get(family, _UNSET)
        if found is _UNSET:
            found = self._covers[family] = fewest_partition(tuple(sorted(family - {0})), self._every, {})
        return found

    def of(self, state: tuple[int, ...]) -> Abstract | None:
        """The abstraction of a state; None when it can never reach the goal."""
        found = self._abstract.get(state, _UNSET)
        if found is not _UNSET:
            return found
        if len(self._lengths) < len(self.machine.members):
            self._learn_members()
        need = self.need(frozenset(state))
        if need < 0:
            found = None
        else:
            lengths = [self._lengths[member] for member in state]
            held = [length for length in lengths if length]
            shortest = min(held)
            found = Abstract(shortest, shortest, max(held), need, len(held) < len(lengths))
        self._abstract[state] = found
        return found


@dataclass(frozen=True)
class StepKind:
    """What the abstraction knows of an alphabet step (steps of one kind act alike on it)."""

    combine: Combine | None  # None: a Permute (no collective)
    delivery: Delivery | None
    k: int  # real group size
    growth: int  # ceil(log2) of the group size in the instance the state lives in
    idle: bool  # some member takes no part

    @property
    def permute(self) -> bool:
        return self.combine is None


# --- which step can reach each goal, and the span its calls then have (module docstring) -----------


def _ends_all_reduce(kind: StepKind, a: Abstract, full: int) -> int | None:
    lo, short, hi, need, empty = a
    if kind.combine is Combine.SUM and kind.delivery is Delivery.EVERY:
        return full if short == full and not empty and need <= kind.growth else None
    if kind.combine is Combine.JOIN:
        return full if short * kind.k >= full and not empty and need == 0 else None
    if kind.combine is Combine.ROOT:
        return full if hi == full and need == 0 else None
    return None


def _ends_reduce_scatter(kind: StepKind, a: Abstract, full: int) -> int | None:
    lo, short, hi, need, empty = a
    if kind.combine is Combine.SUM and kind.delivery is Delivery.BLOCKS:
        return kind.k if not empty and lo <= kind.k <= hi and need <= kind.growth else None
    return None


def _ends_all_gather(kind: StepKind, a: Abstract, full: int) -> int | None:
    lo, short, hi, need, empty = a
    if kind.permute:
        return 0 if short == full and not empty and need == 0 else None
    if kind.combine is Combine.JOIN:
        return full if short * kind.k >= full and not empty and need == 0 else None
    if kind.combine is Combine.ROOT:
        return full if hi == full and need == 0 else None
    return None


def _ends_all_to_all(kind: StepKind, a: Abstract, full: int) -> int | None:
    lo, short, hi, need, empty = a
    if kind.permute:
        return 0 if short == full and not empty else None
    if kind.combine is Combine.EXCHANGE:
        return full if short == full and not empty else None
    return None


def _ends_broadcast(kind: StepKind, a: Abstract, full: int) -> int | None:
    if kind.combine is Combine.ROOT:
        return full if a.hi == full and a.need == 0 else None
    return None


def _ends_reduce(kind: StepKind, a: Abstract, full: int) -> int | None:
    lo, short, hi, need, empty = a
    if kind.combine is Combine.SUM and kind.delivery in (Delivery.EVERY, Delivery.ROOT):
        return full if hi == full and need <= kind.growth else None
    if kind.combine is Combine.JOIN:
        return full if hi * kind.k >= full and need == 0 else None
    return None


# What a goal must leave (Goal.end) -> (step kind, abstract state, N) -> the span of a step of that
# kind that can reach it from the state, or None. A goal whose end is missing here (the routed
# goals') is refused (UnknownStepKindError).
FINISHING = {SUM_EVERYWHERE: _ends_all_reduce, SUM_BLOCKS: _ends_reduce_scatter, GATHERED: _ends_all_gather,
             TRANSPOSED: _ends_all_to_all, ROOT_EVERYWHERE: _ends_broadcast, SUM_AT_ROOT: _ends_reduce}


# semantics -> {(abstract state, kind id): the kind's move from it, costs aside}: a move does not
# depend on the size, and searches at many sizes over one hierarchy ask the same moves
_MOVES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class CompletionBound:
    """`bound(a, L)` for one hierarchy and size (see the module docstring), and `edge`, the
    same bound for completions that begin with one given alphabet step."""

    def __init__(self, semantics: Semantics, calls, engine: CostEngine, size: int):
        self._full = semantics.real_member_count
        self.size = int(size)
        self._engine = engine
        every = (1 << semantics.member_count) - 1
        kinds: dict[StepKind, int] = {}
        self._kind_of: list[int] = []  # alphabet index -> kind id
        self._calls: list[tuple[str, tuple]] = []
        self._sites: dict[int, tuple] = {}
        self._goal = semantics.goal_kind
        if self._goal.end not in FINISHING:
            raise UnknownStepKindError(f"the completion bound has no finishing rule for the goal {self._goal}")
        self._finishing = FINISHING[self._goal.end]
        self._permutes: set[int] = set()
        for index, (step, instruction) in enumerate(semantics.alphabet):
            if instruction.is_permute:
                kind = StepKind(None, None, 1, 0, False)
                self._permutes.add(index)
                self._kind_of.append(kinds.setdefault(kind, len(kinds)))
                self._calls.append(("Permute", ()))
                continue
            record = instruction.record
            if (record.combine, record.delivery) not in KNOWN_KINDS:
                raise UnknownStepKindError(f"the completion bound has no rule for the step {step} "
                                           f"({record.combine.value} combine, {record.delivery.value} delivery)")
            busy = 0
            for group in instruction.groups:
                for member in group:
                    busy |= 1 << member
            kind = StepKind(record.combine, record.delivery, instruction.real_group_size,
                            instruction_class(instruction, semantics.quotient).growth, busy != every)
            self._kind_of.append(kinds.setdefault(kind, len(kinds)))
            self._calls.append((record.name, calls[index]))
        self._kinds = tuple(kinds)
        self._members = tuple(tuple(i for i, k in enumerate(self._kind_of) if k == kind) for kind in range(len(kinds)))
        self._step_costs: dict[tuple[int, int], float] = {}
        self._kind_costs: list[dict[int, float]] = [{} for _ in self._kinds]  # per kind: chunks -> least cost
        self._movers = tuple(self._mover(kind) for kind in self._kinds)
        moves = _MOVES.get(semantics)  # kinds are numbered in alphabet order: the same for every size
        if moves is None or moves[0] != self._kinds:
            moves = _MOVES[semantics] = (self._kinds, {})
        self._raw_moves: dict[tuple[Abstract, int], tuple | None] = moves[1]
        self._moves_from: dict[Abstract, list] = {}
        self._bounds: dict[tuple[Abstract, int], float] = {}
        self._edges: dict[tuple[Abstract, int, int], float] = {}
        self._order: tuple[tuple[float, int], ...] | None = None

    # --- costs ------------------------------------------------------------------------------------

    def step_cost(self, index: int, chunks: int) -> float:
        """A lower bound on alphabet step `index` when every call spans at least `chunks`:
        launch plus its costliest call alone (CostEngine.least_step_s), asked of one call per
        distinct call site (calls at alike sites cost alike, as the engine itself assumes)."""
        key = (index, chunks)
        found = self._step_costs.get(key)
        if found is None and index in self._permutes:  # a local copy: at least nothing
            found = self._step_costs[key] = 0.0
        if found is None:
            collective, calls = self._calls[index]
            sites = self._sites.get(index)
            if sites is None:
                sites = self._sites[index] = self._engine.sites(collective, tuple(calls))
            found = self._step_costs[key] = self._engine.least_step_s(collective, sites,
                                                                       min(chunks, self._full) * self.size)
        return found

    def _kind_cost(self, kind: int, chunks: int) -> float:
        """The least of `step_cost` over the alphabet steps of one kind."""
        found = self._kind_costs[kind].get(chunks)
        if found is None:
            found = self._kind_costs[kind][chunks] = min(self.step_cost(index, chunks) for index in self._members[kind])
        return found

    # --- the abstraction's steps -------------------------------------------------------------------

    def _mover(self, kind: StepKind):
        """The abstract step of one kind, as a function of the state: (span every call has at
        least, successor, span of a finishing step or None), or None when a step of this kind
        cannot be taken from it (see the module docstring). The kind's branch is chosen once:
        the search asks tens of thousands of (state, kind) moves."""
        full, finishing = self._full, self._finishing
        k, combine, delivery, growth = kind.k, kind.combine, kind.delivery, kind.growth
        blocked_when_empty = not kind.idle  # a step every member takes part in needs them all to hold data
        if combine is None:  # a Permute: ranges keep their lengths, nothing is summed
            return lambda a: (0, a, finishing(kind, a, full))
        if combine is Combine.SUM:  # `need` falls by the growth; the ranges as the delivery leaves them
            if delivery is Delivery.EVERY:
                def successor(lo, short, hi, left, empty):
                    return lo, short, hi, left, empty
            elif delivery is Delivery.BLOCKS and blocked_when_empty:
                def successor(lo, short, hi, left, empty):
                    return max(lo // k, 1), max(short // k, 1), max(hi // k, 1), left, empty
            elif delivery is Delivery.BLOCKS:  # idle members keep their own ranges
                def successor(lo, short, hi, left, empty):
                    return max(lo // k, 1), min(short, max(hi // k, 1)), hi, left, empty
            elif delivery is Delivery.ROOT:  # the non-roots are emptied
                def successor(lo, short, hi, left, empty):
                    return lo, hi, hi, left, True
            else:
                raise UnknownStepKindError(f"no rule for a sum with {delivery.value} delivery")

            def move(a):
                lo, short, hi, need, empty = a
                if empty and blocked_when_empty:
                    return None
                left = need - growth
                after = successor(lo, short, hi, left if left > 0 else 0, empty)
                return lo, new(Abstract, after), finishing(kind, a, full)
            return move
        if combine is Combine.JOIN:
            def move(a):
                lo, short, hi, need, empty = a
                if (empty and blocked_when_empty) or lo * k > full:
                    return None
                after = (lo if not blocked_when_empty else lo * k, min(full, short * k), min(full, hi * k), need, empty)
                return lo * k, new(Abstract, after), finishing(kind, a, full)
            return move
        if combine is Combine.EXCHANGE:  # every member keeps its range's length; blocks move
            def move(a):
                if a[4] and blocked_when_empty:
                    return None
                return a[0], a, finishing(kind, a, full)
            return move
        if combine is Combine.ROOT and delivery is Delivery.EVERY:
            return lambda a: (a[0], new(Abstract, (a[0], a[2], a[2], a[3], False)), finishing(kind, a, full))
        raise UnknownStepKindError(f"no rule for a step of {combine.value} combine, {delivery.value} delivery")

    def _moved(self, a: Abstract, kind_id: int):
        """A kind's move from a as (least cost, least cost when it finishes, successor or None
        when it leaves a as it is), or None when it cannot be taken."""
        key = (a, kind_id)
        move = self._raw_moves.get(key, _UNSET)
        if move is _UNSET:
            move = self._movers[kind_id](a)
            if move is not None and move[1] == a:  # a move that leaves a as it is
                move = (move[0], None, move[2])
            self._raw_moves[key] = move
        if move is None:
            return None
        span, after, finishing = move
        costs = self._kind_costs[kind_id]
        cost = costs.get(span)
        if cost is None:
            cost = self._kind_cost(kind_id, span)
        if finishing is None:
            finish = INFINITY
        else:
            finish = costs.get(finishing)
            if finish is None:
                finish = self._kind_cost(kind_id, finishing)
            if cost > finish:
                finish = cost
        return cost, finish, after

    def bound(self, a: Abstract, left: int) -> float:
        """The least an abstract path of at most `left` steps from `a` to the goal costs.

        Kinds are tried by their least cost from any state (at one chunk), stopping at the
        first that cannot beat the best found. Moves that leave `a` as it is are skipped: a
        path through one costs at least a path of fewer steps from `a`, and the bound never
        grows with `left`."""
        key = (a, left)
        found = self._bounds.get(key)
        if found is not None:
            return found
        best = INFINITY
        if left > 0:
            order = self._order
            if order is None:
                order = self._order = tuple(sorted((self._kind_cost(kind, 1), kind) for kind in range(len(self._kinds))))
            moves = self._moves_from.get(a)
            if moves is None:
                moves = self._moves_from[a] = [_UNSET] * len(self._kinds)
            for least, kind in order:
                if least >= best:
                    break
                move = moves[kind]
                if move is _UNSET:
                    move = moves[kind] = self._moved(a, kind)
                if move is None:
                    continue
                cost, finish, after = move
                if finish < best:
                    best = finish
                if after is not None and left > 1 and cost < best:
                    total = cost + self.bound(after, left - 1)
                    if total < best:
                        best = total
        self._bounds[key] = best
        return best

    def edge(self, a: Abstract, index: int, left: int) -> float:
        """The least any completion of at most `left` steps that begins with alphabet step
        `index` costs, from a state abstracted as `a` (infinite: no such completion)."""
        key = (a, index, left)
        found = self._edges.get(key)
        if found is not None:
            return found
        best = INFINITY
        move = self._movers[self._kind_of[index]](a) if left > 0 else None
        if move is not None:
            span, after, finishing = move
            cost = self.step_cost(index, span)
            if finishing is not None:
                best = max(cost, self.step_cost(index, finishing))
            if left > 1:  # an abstract no-op still takes the concrete step: the rest has left - 1
                best = min(best, cost + self.bound(after, left - 1))
        self._edges[key] = best
        return best


__all__ = ["Abstract", "CompletionBound", "KNOWN_KINDS", "StateAbstraction", "StepKind", "UnknownStepKindError"]
