"""What any completion of a search state must still cost: an admissible bound for the top-K search.

The best-first search of synth/analysis/rank.py keys a prefix by its time plus a lower bound
on what any valid completion adds. This module computes that bound exactly over a small
abstraction of the quotient state (synth/semantics.py), for one size:

    a = (lo, hi, need, empty, aligned)

* `lo`, `hi`: the shortest and longest range (in real chunks) a non-empty member holds;
* `need`: doublings the weakest chunk's best holder still needs (synth/pruning.py);
* `empty`: some member holds nothing;
* `aligned`: the levels (of quotient size 2) along which no contributor set has spread yet:
  every contributor of every chunk a member holds has the member's own digit at that level.
  Members exchange data only inside a step's groups, whose members agree on every level the
  form does not vary, so a level stays aligned until some step varies it; the goal's sets
  are full, aligned nowhere. So every aligned level must be varied by some later step.

Each alphabet step acts on the abstraction as its collective's record says (what it combines,
where it delivers, synth/collectives.py), with its group size k (real), its growth g (in the
instance the state lives in), the levels V it varies and whether it leaves members idle:

    a sum:       need - g; aligned minus V; a ReduceScatter divides lo by k (and hi, when
                 no member is idle); a Reduce empties the non-roots;
    a join:      needs k * lo <= N; lo times k when no member is idle, hi times k (at most N);
    a root copy: may fill every empty member (empty := False);
    sums and joins need every member of their groups to hold data: with no idle member, a
    state with an empty member cannot take them.

and costs at least `launch + max over its calls of the call alone` at the span its calls have
at least: `lo` chunks (a join: k * lo; the chunks a call spans are its root's range, a join's
its output). A step reaches the goal only when every member ends holding the whole buffer,
complete: an AllReduce from a state where every member holds the whole range (hi = N, no
empty member, need <= g, every aligned level in V), an AllGather whose output is the whole
range (k * hi >= N, no empty member, need = 0, aligned levels in V), a Broadcast from roots
holding the goal (hi = N, need = 0, nothing aligned); a ReduceScatter or a Reduce never does.
A finishing step's calls all span the whole buffer (their roots, or a join's outputs, hold
it), so it costs at least its time at N chunks.

`bound(a, L)` is the least total cost of an abstract path of at most L steps that ends with a
finishing step (infinite when there is none: the prefix cannot finish in L steps).

Admissible: let R(a, s) say a.lo <= lo(s), a.hi >= hi(s), a.need <= need(s), a.empty
implies empty(s) and a.aligned is a subset of aligned(s). R(alpha(s), s) holds. If R(a, s) and
a valid step takes s to s' at time t, then (i) t >= the abstract step's cost (every call of
the step spans at least lo(s) >= a.lo chunks, or k * a.lo for a join, and a call's time alone
never decreases with its bytes: synth/model/backend.py); (ii) if s' is the goal, the step's
finishing conditions hold for a (each is implied by the same condition on s, as listed
above) and t >= its cost at N chunks; (iii) otherwise R(T(a), s') for the abstract successor
T(a) (the rules above only ever move the bounds outward: a ReduceScatter gives every member
at least lo(s)/k chunks, an idle member keeps its range, a copy stays within [lo, hi], need
falls by at most g per sum (a union of k disjoint sets is at most k times the largest) and
never by other collectives, an empty member stays empty unless a root copy fills it, a level
not varied stays aligned). By induction on L every completion of s in at most L steps costs
at least `bound(alpha(s), L)`. Costs are lower bounds of both the lockstep time of a step and
one group's own chain time of it (CostEngine.least_step_s), so the bound serves either
estimate (synth/model/estimate.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

from synth.collectives import Combine, Delivery
from synth.model.engine import CostEngine
from synth.pruning import instruction_class
from synth.semantics import InternedMachine, Semantics

INFINITY = math.inf

# One abstract state: (lo, hi, need, empty, aligned levels as a bitmask).
Abstract = tuple[int, int, int, bool, int]


@dataclass(frozen=True)
class StepKind:
    """What the abstraction knows of an alphabet step (steps of one kind act alike on it)."""

    combine: Combine
    delivery: Delivery
    k: int  # real group size
    growth: int  # doublings of the best contributor set one step can add (instance sizes)
    varies: int  # bitmask of the levels the form varies
    idle: bool  # some member takes no part


class StateAbstraction:
    """The abstraction of interned states (tuples of member ids of an InternedMachine),
    computed once per state from facts cached per member."""

    def __init__(self, semantics: Semantics, machine: InternedMachine):
        self.semantics = semantics
        self.machine = machine
        self.full = semantics.real_member_count
        n = semantics.member_count
        positions = _positions(semantics.sizes)
        # Levels of (instance) size 2: the ones a contributor set can spread along.
        self.levels = sum(1 << level for level, size in enumerate(semantics.sizes) if size > 1)
        # For each member rank, the levels where its digit is not zero.
        self._ones = tuple(sum(1 << level for level, digit in enumerate(position) if digit) for position in positions)
        self._members: list[tuple[int, int, int] | None] = []  # member id -> (length, seen ones, seen zeros)
        self._pieces: list[tuple[int, ...] | None] = []  # member id -> contributor set per chunk (0: not held)
        self._needs: dict[frozenset[int], int] = {}
        self._covers: dict[frozenset[int], int | None] = {}
        self._abstract: dict[tuple[int, ...], Abstract | None] = {}
        self.goal = machine.goal

    def _learn_members(self) -> None:
        n, levels, ones = self.semantics.member_count, self.levels, self._ones
        every = (1 << n) - 1
        for member in self.machine.members[len(self._members):]:
            if member is None:
                self._members.append(None)
                self._pieces.append(None)
                continue
            lo, hi, sets, length = member
            pieces = tuple((sets >> (chunk * n)) & every if lo <= chunk < hi else 0 for chunk in range(n))
            contributors = 0
            for piece in pieces:
                contributors |= piece
            seen_ones = seen_zeros = 0
            rank = 0
            while contributors:
                if contributors & 1:
                    seen_ones |= ones[rank]
                    seen_zeros |= levels & ~ones[rank]
                contributors >>= 1
                rank += 1
            self._members.append((length, seen_ones, seen_zeros))
            self._pieces.append(pieces)

    def need(self, distinct: frozenset[int]) -> int:
        """Doublings still needed, from the members present (member ids): for each chunk, the
        fewest contributor sets held now that partition all members (every set a chunk will
        ever have is a disjoint union of sets held now, and one sum over groups of k merges
        at most k of them into one), in doublings, the most over chunks; -1 when some chunk's
        sets cannot partition all members (the state can never reach the goal)."""
        found = self._needs.get(distinct)
        if found is None:
            pieces = [self._pieces[i] for i in distinct if self._pieces[i] is not None]
            found = 0
            for chunk in range(self.semantics.member_count):
                family = frozenset(member[chunk] for member in pieces if member[chunk])
                fewest = self._cover(family)
                if fewest is None:
                    found = -1
                    break
                found = max(found, (fewest - 1).bit_length())
            self._needs[distinct] = found
        return found

    def _cover(self, family: frozenset[int]) -> int | None:
        """The fewest sets of `family` that partition all members, or None."""
        found = self._covers.get(family, _UNSET)
        if found is _UNSET:
            every = (1 << self.semantics.member_count) - 1
            found = self._covers[family] = _fewest(tuple(sorted(family)), every, {})
        return found

    def of(self, state: tuple[int, ...]) -> Abstract | None:
        """The abstraction of a state; None when it can never reach the goal (some chunk's
        sets cannot be summed into the whole)."""
        found = self._abstract.get(state, _UNSET)
        if found is not _UNSET:
            return found
        if len(self._members) < len(self.machine.members):
            self._learn_members()
        need = self.need(frozenset(state))
        if need < 0:
            self._abstract[state] = None
            return None
        lo, hi, misaligned, empty = self.full, 0, 0, False
        members, ones = self._members, self._ones
        for rank, member_id in enumerate(state):
            member = members[member_id]
            if member is None:
                empty = True
                continue
            length, seen_ones, seen_zeros = member
            if length < lo:
                lo = length
            if length > hi:
                hi = length
            own = ones[rank]
            misaligned |= (seen_ones & ~own) | (seen_zeros & own)
        found = self._abstract[state] = (lo, hi, need, empty, self.levels & ~misaligned)
        return found


def _fewest(family: tuple[int, ...], uncovered: int, memo: dict) -> int | None:
    """The fewest sets of `family` (bitmasks) that partition `uncovered`, or None: cover the
    lowest uncovered member first, with each set holding it that fits."""
    if not uncovered:
        return 0
    found = memo.get(uncovered, _UNSET)
    if found is not _UNSET:
        return found
    lowest = uncovered & -uncovered
    best = None
    for piece in family:
        if piece & lowest and not piece & ~uncovered:
            rest = _fewest(family, uncovered & ~piece, memo)
            if rest is not None and (best is None or rest + 1 < best):
                best = rest + 1
    memo[uncovered] = best
    return best


_UNSET = object()


def _positions(sizes: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every member rank's digits, outermost level first (the semantics' mixed radix)."""
    return list(product(*(range(size) for size in sizes)))


class CompletionBound:
    """`bound(a, L)` for one hierarchy and size (see the module docstring), and `edge`, the
    same bound for completions that begin with one given alphabet step."""

    def __init__(self, semantics: Semantics, calls, engine: CostEngine, size: int):
        self._full = semantics.real_member_count
        self.size = int(size)
        self._engine = engine
        every = (1 << semantics.member_count) - 1
        levels = sum(1 << level for level, s in enumerate(semantics.sizes) if s > 1)
        kinds: dict[StepKind, int] = {}
        self._kind_of: list[int] = []  # alphabet index -> kind id
        self._calls = []
        for index, (_, instruction) in enumerate(semantics.alphabet):
            record = instruction.record
            busy = 0
            for group in instruction.groups:
                for member in group:
                    busy |= 1 << member
            varies = sum(1 << level for level in instruction.varying_levels) & levels
            kind = StepKind(record.combine, record.delivery, instruction.real_group_size,
                            instruction_class(instruction, semantics.quotient)[5], varies, busy != every)
            self._kind_of.append(kinds.setdefault(kind, len(kinds)))
            self._calls.append((record.name, calls[index]))
        self._kinds = tuple(kinds)
        self._members = tuple(tuple(i for i, k in enumerate(self._kind_of) if k == kind) for kind in range(len(kinds)))
        self._step_costs: dict[tuple[int, int], float] = {}
        self._kind_costs: dict[tuple[int, int], float] = {}
        self._moves_from: dict[Abstract, list] = {}
        self._bounds: dict[tuple[Abstract, int], float] = {}
        self._edges: dict[tuple[Abstract, int, int], float] = {}

    # --- costs ------------------------------------------------------------------------------------

    def step_cost(self, index: int, chunks: int) -> float:
        """A lower bound on alphabet step `index` when every call spans at least `chunks`:
        launch plus its costliest call alone (CostEngine.least_step_s), one call per distinct
        call site (calls at alike sites cost alike)."""
        key = (index, chunks)
        found = self._step_costs.get(key)
        if found is None:
            collective, calls = self._calls[index]
            if not isinstance(calls, _Sites):
                sites: dict[int, tuple[int, ...]] = {}
                for members in calls:
                    sites.setdefault(self._engine.call(collective, members).site_id, members)
                calls = _Sites(sites.values())
                self._calls[index] = (collective, calls)
            found = self._step_costs[key] = self._engine.least_step_s(collective, tuple(calls),
                                                                       min(chunks, self._full) * self.size)
        return found

    def _kind_cost(self, kind: int, chunks: int) -> float:
        """The least of `step_cost` over the alphabet steps of one kind."""
        key = (kind, chunks)
        found = self._kind_costs.get(key)
        if found is None:
            found = self._kind_costs[key] = min(self.step_cost(index, chunks) for index in self._members[kind])
        return found

    # --- the abstraction's steps -------------------------------------------------------------------

    def _move(self, kind: StepKind, a: Abstract):
        """(span the calls have at least, successor, span of a finishing step or None), or None
        when a step of this kind cannot be taken from a (see the module docstring)."""
        lo, hi, need, empty, aligned = a
        full = self._full
        k = kind.k
        rest = aligned & ~kind.varies
        combine = kind.combine
        if combine is Combine.SUM:
            if empty and not kind.idle:
                return None
            left = need - kind.growth
            left = left if left > 0 else 0
            delivery = kind.delivery
            if delivery is Delivery.EVERY:
                finishing = full if hi == full and not empty and need <= kind.growth and not rest else None
                return lo, (lo, hi, left, empty, rest), finishing
            if delivery is Delivery.BLOCKS:
                return lo, (max(lo // k, 1), hi if kind.idle else max(hi // k, 1), left, empty, rest), None
            return lo, (lo, hi, left, True, rest), None
        if combine is Combine.JOIN:
            if (empty and not kind.idle) or lo * k > full:
                return None
            widest = min(full, hi * k)
            finishing = full if widest == full and not empty and need == 0 and not rest else None
            return lo * k, (lo if kind.idle else lo * k, widest, need, empty, rest), finishing
        finishing = full if hi == full and need == 0 and not aligned else None
        return lo, (lo, hi, need, False, rest), finishing

    def _order(self) -> tuple[tuple[float, int], ...]:
        """Each kind's least cost from any state (at one chunk), cheapest first."""
        found = self.__dict__.get("_kind_order")
        if found is None:
            found = self.__dict__["_kind_order"] = tuple(sorted(
                (self._kind_cost(kind_id, 1), kind_id) for kind_id in range(len(self._kinds))))
        return found

    def _moves(self, a: Abstract) -> list:
        """The moves from a, one per kind in `_order`, computed when first asked for: (least
        cost, least cost when it finishes, successor or None when it leaves a as it is), or
        None when the kind cannot be taken."""
        found = self._moves_from.get(a)
        if found is None:
            found = self._moves_from[a] = [_UNSET] * len(self._kinds)
        return found

    def _moved(self, a: Abstract, kind_id: int):
        kind = self._kinds[kind_id]
        move = self._move(kind, a)
        if move is None:
            return None
        span, after, finishing = move
        cost = self._kind_cost(kind_id, span)
        finish = INFINITY if finishing is None else max(cost, self._kind_cost(kind_id, finishing))
        return cost, finish, None if after == a else after

    def bound(self, a: Abstract, left: int) -> float:
        """The least an abstract path of at most `left` steps from `a` to the goal costs.

        Kinds are tried by their least cost from any state, stopping at the first that cannot
        beat the best found. Moves that leave `a` as it is are skipped: a path through one
        costs at least a path of fewer steps from `a`, and the bound never grows with `left`."""
        key = (a, left)
        found = self._bounds.get(key)
        if found is not None:
            return found
        best = INFINITY
        if left > 0:
            moves = self._moves(a)
            for least, kind_id in self._order():
                if least >= best:
                    break
                move = moves[kind_id]
                if move is _UNSET:
                    move = moves[kind_id] = self._moved(a, kind_id)
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
        move = self._move(self._kinds[self._kind_of[index]], a) if left > 0 else None
        if move is not None:
            span, after, finishing = move
            cost = self.step_cost(index, span)
            if finishing is not None:
                best = max(cost, self.step_cost(index, finishing))
            if left > 1:  # an abstract no-op still takes the concrete step: the rest has left - 1
                best = min(best, cost + self.bound(after, left - 1))
        self._edges[key] = best
        return best


class _Sites(tuple):
    """One call per distinct call site of a step."""


__all__ = ["Abstract", "CompletionBound", "StateAbstraction", "StepKind"]
