"""The meaning of a program (docs/model.md sections 5 and 7) as a state machine over group members.

A member's state is `None` (empty) or a `Holding(lo, hi, sets, length, tags, order)`. What each
collective needs and does is read from its record (synth/collectives.py); this module only
says how a record's combine and delivery act on contributor sets and block tags. What the
program must compute is its goal (synth/goals.py): the start state, the goal states, and the
steps its programs are built of.

The same machine runs in two modes:

* explicit (the test oracle): one member per reduction-group member, N chunks.
* quotient (the search's state): every level of size >= 2 is shrunk to size 2. A member's
  state depends on its position only through which of its digits are zero (roots and
  masters are the zero positions; a ReduceScatter block follows the member's own digit), so
  the size-2 instance has one member per zero-pattern and decides validity exactly as the
  real one; `length` keeps the real range length for costs. Its size is 2^k for k levels,
  whatever the device count. Tests check it against the explicit mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from itertools import combinations, permutations
from itertools import product as cartesian
from operator import itemgetter
from typing import NamedTuple

from synth.collectives import Collective, Combine, Delivery, collectives
from synth.errors import InvalidProgramError, UsageError
from synth.goals import (ADDRESSED, ALL_REDUCE, GATHERED, OWN_BLOCK, ROOT_EVERYWHERE, ROOT_ONLY, SUM_AT_ROOT,
                         SUM_BLOCKS, SUM_EVERYWHERE, TRANSPOSED, Goal, parse_goal)
from synth.language import PERMUTE, Program, Step, form_names, permute_step
from synth.names import product

QUOTIENT_CAP = 2


class StepFailure(Exception):
    """A step's precondition does not hold; the message says which members and why."""


# --- forms: which members talk in one step (docs/model.md section 5) ----------------------------------


def _positions(sizes: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Positions of all members, indexed by member rank (mixed radix, outermost first)."""
    return list(cartesian(*(range(size) for size in sizes)))


@lru_cache(maxsize=1024)
def _form_groups(form: str, sizes: tuple[int, ...], level: int) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """A form's groups on a hierarchy of these sizes: asked for the same shape by every
    lowering, walk and interpretation (at 4096 members a grouping costs a millisecond)."""
    return _FORM_RULES[form](sizes, level)


def _grouped(sizes, key_levels: tuple[int, ...], idle_unless_zero: tuple[int, ...] = ()) -> tuple[tuple[int, ...], ...]:
    """Members (ranks in mixed radix over `sizes`) that agree on the levels `key_levels`, each
    group in rank order, groups in order of their first member, groups of one left out;
    members not at position 0 on every level of `idle_unless_zero` take no part. One sort
    over all members (a loop over 4,096 members per form cost every search ~60 ms)."""
    import numpy as np

    count = product(sizes)
    positions = np.stack(np.unravel_index(np.arange(count), sizes), axis=1) if count else np.zeros((0, len(sizes)))
    ranks = np.arange(count)
    if idle_unless_zero:
        ranks = ranks[~positions[:, list(idle_unless_zero)].any(axis=1)]
    if key_levels:
        keys = np.ravel_multi_index(tuple(positions[ranks][:, list(key_levels)].T),
                                    tuple(sizes[level] for level in key_levels))
    else:
        keys = np.zeros(len(ranks), dtype=np.int64)
    order = np.argsort(keys, kind="stable")  # a group's members stay in rank order
    members = ranks[order].tolist()
    bounds = [0, *(np.flatnonzero(np.diff(keys[order])) + 1).tolist(), len(members)]
    groups = [tuple(members[start:stop]) for start, stop in zip(bounds, bounds[1:]) if stop - start > 1]
    return tuple(sorted(groups))  # disjoint groups: by their first members


def inside_group(sizes, level):
    """Members agreeing on every level outer than `level`."""
    return _grouped(sizes, tuple(range(level))), tuple(range(level, len(sizes)))


def parallel(sizes, level):
    """Members agreeing on every level but `level`."""
    return _grouped(sizes, tuple(l for l in range(len(sizes)) if l != level)), (level,)


def master(sizes, level):
    """Among members at position 0 on every inner level, those agreeing on the outer levels."""
    return _grouped(sizes, tuple(range(level)), tuple(range(level + 1, len(sizes)))), (level,)


_FORM_RULES = {"InsideGroup": inside_group, "Parallel": parallel, "Master": master}
FORMS = {name: (lambda sizes, level, name=name: _form_groups(name, tuple(sizes), level)) for name in _FORM_RULES}


# --- collectives (docs/model.md section 7), read from their records in synth/collectives.py -------------


class Holding(NamedTuple):
    """What a non-empty member holds: the chunk range [lo, hi); `sets`, for each chunk c the
    members summed into it as a bitmask in bits [c*N, (c+1)*N) (unions and disjointness over
    all chunks are then single integer operations); and the range length in chunks of the real
    hierarchy (the quotient shrinks lo and hi, not this). A NamedTuple is as fast as the plain
    tuple it replaces; an empty member is None.

    Goals whose blocks move (reduce-scatter, all-gather, all-to-all: their programs may
    permute a buffer, and all-to-all moves blocks between places) also keep `tags`, for each
    chunk of the range the block it is (the goal's block index: for all-to-all the member it
    must reach), and `order`, the buffer's layout: the hierarchy levels (their indices) whose
    digits make up a chunk's place, outermost first. Other goals keep None in both: every
    chunk sits at its own place."""

    lo: int
    hi: int
    sets: int
    length: int
    tags: tuple[int, ...] | None = None
    order: tuple[int, ...] | None = None


def _check_same_range(first, index, state, name) -> None:
    """Member `index` holds data, over the same range as member 0 (`first`)."""
    if state is None:
        raise StepFailure(f"{name} needs every member to hold data, member {index} of the group is empty")
    if state[0] != first[0] or state[1] != first[1]:
        raise StepFailure(
            f"{name} needs one range on every member; member 0 holds [{first[0]},{first[1]}) and member {index} holds [{state[0]},{state[1]})"
        )


def _sum(states, real_k, name):
    """Combine.SUM: one non-empty range on every member, nothing counted twice; the union."""
    first = states[0]
    union = total = 0
    for index, state in enumerate(states):
        _check_same_range(first, index, state, name)
        if state[4] != first[4]:
            raise StepFailure(
                f"{name} would sum different blocks: members 0 and {index} hold blocks {_tags_text(first[4])} and "
                f"{_tags_text(state[4])} at the same places"
            )
        union |= state[2]
        total += state[2].bit_count()
    # Chunks sit in disjoint bit fields, so per-chunk disjointness is one count on the whole.
    if union.bit_count() != total:
        raise StepFailure(f"{name} would count some member's data twice")
    return Holding(first[0], first[1], union, first[3], first[4], first[5])


def _tags_text(tags) -> str:
    return "(" + ",".join(map(str, tags)) + ")" if tags is not None else "(in place)"


def _join(states, real_k, name):
    """Combine.JOIN: equal non-empty blocks, each starting where the previous member's ends."""
    for index, state in enumerate(states):
        if state is None:
            raise StepFailure(f"{name} needs every member to hold data, member {index} of the group is empty")
    first = states[0]
    union = first[2]
    for index in range(1, len(states)):
        previous, state = states[index - 1], states[index]
        if state[3] != first[3] or state[1] - state[0] != first[1] - first[0]:
            raise StepFailure(f"{name} needs equal range lengths on every member")
        if state[0] != previous[1]:
            raise StepFailure(
                f"{name} needs member {index}'s range to start where member {index - 1}'s ends; they hold [{previous[0]},{previous[1]}) and [{state[0]},{state[1]})"
            )
        union |= state[2]
    tags = None if first[4] is None else tuple(tag for state in states for tag in state[4])
    return Holding(first[0], states[-1][1], union, first[3] * real_k, tags, first[5])


def _root(states, real_k, name):
    """Combine.ROOT: the root's data, which must exist."""
    if states[0] is None:
        raise StepFailure(f"{name} needs data on its root (the group's first member), which is empty")
    return states[0]


def _to_every(result, k, real_k, field, name):
    return [result] * k


def _to_root(result, k, real_k, field, name):
    return [result] + [None] * (k - 1)


def _to_blocks(result, k, real_k, field, name):
    lo, hi, union, length, tags, order = result
    if (hi - lo) % k or length % real_k:
        raise StepFailure(f"{name} over {real_k} members cannot split a range of {length} chunks evenly")
    block = (hi - lo) // k
    mask = (1 << (block * field)) - 1
    return [
        Holding(lo + i * block, lo + (i + 1) * block, union & (mask << ((lo + i * block) * field)), length // real_k,
                None if tags is None else tags[i * block:(i + 1) * block], order)
        for i in range(k)
    ]


def _exchange(states, real_k, field, name):
    """Combine.EXCHANGE with Delivery.TRANSPOSE (AllToAll): one non-empty range on every member,
    split evenly into k blocks; member j receives block j of member i as its block i."""
    first = states[0]
    for index, state in enumerate(states):
        _check_same_range(first, index, state, name)
    k = len(states)
    lo, hi, length = first[0], first[1], first[3]
    if (hi - lo) % k or length % real_k:
        raise StepFailure(f"{name} over {real_k} members cannot split a range of {length} chunks evenly")
    block = (hi - lo) // k
    mask = (1 << (block * field)) - 1
    result = []
    for j in range(k):
        sets, tags = 0, [] if first[4] is not None else None
        for i, state in enumerate(states):
            sets |= ((state[2] >> ((lo + j * block) * field)) & mask) << ((lo + i * block) * field)
            if tags is not None:
                tags.extend(state[4][j * block:(j + 1) * block])
        result.append(Holding(lo, hi, sets, length, None if tags is None else tuple(tags), first[5]))
    return result


_COMBINE = {Combine.SUM: _sum, Combine.JOIN: _join, Combine.ROOT: _root}
_DELIVER = {Delivery.EVERY: _to_every, Delivery.ROOT: _to_root, Delivery.BLOCKS: _to_blocks}
# Collectives that act on the group as a whole rather than combining into one result.
_WHOLE_GROUP = {Combine.EXCHANGE: _exchange}


def operation(record: Collective):
    """The state transformer of one group for a collective: (member states, real group size,
    bit-field width) -> member states; StepFailure when the precondition fails."""
    whole = _WHOLE_GROUP.get(record.combine)
    if whole is not None:
        name = record.name
        return lambda states, real_k, field: whole(states, real_k, field, name)
    combine, deliver, name = _COMBINE[record.combine], _DELIVER[record.delivery], record.name

    def apply_to_group(states, real_k, field):
        return deliver(combine(states, real_k, name), len(states), real_k, field, name)

    return apply_to_group


# --- cuts along level digits (goals whose blocks move) ---------------------------------------------


def range_levels(lo: int, hi: int, order: tuple[int, ...], sizes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The levels whose digits vary inside the range [lo, hi) of a buffer laid out in level
    order `order` (radices `sizes`), outermost first: the range is one value of the leading
    digits and every value of the rest. None when it is not such a range."""
    length, suffix, j = hi - lo, 1, len(order)
    while suffix < length and j > 0:
        j -= 1
        suffix *= sizes[order[j]]
    if suffix != length or lo % length:
        return None
    return order[j:]


def _check_cut(states, varying, sizes, join, level_names, name) -> None:
    """A ReduceScatter or AllToAll cuts its range into the group's blocks, and an AllGather
    joins blocks into one range, along the digits of the step's levels: the range's leading
    varying levels must be the step's levels, in hierarchy order (member i's block is the one
    whose digits are member i's). Otherwise the blocks would mix levels and no level order
    could describe the buffer afterwards."""
    if any(state is None for state in states):
        return  # the collective's own precondition refuses it
    if join and any(states[i][0] != states[i - 1][1] for i in range(1, len(states))):
        return  # as above: the blocks do not follow each other
    lo, hi = (states[0][0], states[-1][1]) if join else (states[0][0], states[0][1])
    order = states[0][5]
    levels = range_levels(lo, hi, order, sizes) if hi > lo else None
    if levels is None or levels[:len(varying)] != varying:
        wanted = ",".join(level_names[level] for level in varying)
        held = "no level boundary" if levels is None else "levels (" + ",".join(level_names[l] for l in levels) + ")"
        raise StepFailure(
            f"{name} over ({wanted}) would cut the buffer across its level digits (the blocks would end in the wrong "
            f"order): the range [{lo},{hi}) spans {held} in the buffers' level order; a Permute can put ({wanted}) first"
        )


# --- Permute: a local reordering of every member's blocks (docs/model.md section 7) -------------------


def place_map(sizes: tuple[int, ...], before: tuple[int, ...], after: tuple[int, ...]) -> tuple[int, ...]:
    """For each place of a buffer laid out in level order `before`, its place in order `after`:
    a place is the mixed-radix number of the levels' digits in the layout's order (radices the
    levels' sizes), outermost first, so the chunk of digits d goes from place(d, before) to
    place(d, after)."""
    result = []
    for digits in cartesian(*(range(sizes[level]) for level in before)):
        by_level = dict(zip(before, digits))
        place = 0
        for level in after:
            place = place * sizes[level] + by_level[level]
        result.append(place)
    return tuple(result)


def _permute(member, places, after_order, field, whole_length):
    """One member's buffer reordered by `places` (old place -> new place). A whole buffer is
    reordered; a single block (an all-gather's input) is put at its new place. Anything else
    would not stay one contiguous range."""
    if member is None:
        return None
    lo, hi, sets, length, tags, _ = member
    if length != 1 and length != whole_length:
        raise StepFailure(
            f"Permute reorders a whole buffer or places one block, and a member holds {length} of {whole_length} chunks"
        )
    mask = (1 << field) - 1
    if hi - lo == 1:
        place = places[lo]
        return Holding(place, place + 1, ((sets >> (lo * field)) & mask) << (place * field), length, tags, after_order)
    if lo == 0 and field % 8 == 0 and hi == len(places):  # the fields are whole bytes: move them as bytes
        width = field // 8
        take_bytes, take_tags = _movers(places, width)
        new_sets = int.from_bytes(bytes(take_bytes(sets.to_bytes(hi * width, "little"))), "little")
        return Holding(lo, hi, new_sets, length, take_tags(tags), after_order)
    new_sets, new_tags = 0, [0] * (hi - lo)
    for place in range(lo, hi):
        new_sets |= ((sets >> (place * field)) & mask) << (places[place] * field)
        new_tags[places[place]] = tags[place]
    return Holding(lo, hi, new_sets, length, tuple(new_tags), after_order)


_new = tuple.__new__  # a Holding without NamedTuple's Python-level __new__


@lru_cache(maxsize=4096)
def _sources(places: tuple[int, ...]) -> tuple[int, ...]:
    """New place -> the old place whose chunk lands there (the inverse of `places`)."""
    sources = [0] * len(places)
    for old, new in enumerate(places):
        sources[new] = old
    return tuple(sources)


@lru_cache(maxsize=4096)
def _movers(places: tuple[int, ...], width: int) -> tuple[itemgetter, itemgetter]:
    """For a whole buffer of at least two places reordered by `places` (old place -> new
    place), fields `width` bytes each: getters that pick, in new order, the bytes of the
    packed contributor sets and the tags (a Permute is taken once per new member a search
    meets: all-to-all searches take tens of thousands)."""
    sources = _sources(places)
    return (itemgetter(*[old * width + byte for old in sources for byte in range(width)]),
            itemgetter(*sources))


@dataclass(frozen=True)
class Instruction:
    """What a step does, independent of how it is spelled: a collective and its groups, or a
    Permute and the level order it makes. Two steps with equal instructions are the same
    instruction (docs/model.md section 5)."""

    collective: str
    groups: tuple[tuple[int, ...], ...]
    varying_levels: tuple[int, ...]
    real_group_size: int
    record: Collective = field(compare=False, repr=False, default=None)
    order: tuple[int, ...] = ()  # a Permute's level order (level indices, outermost first)

    @property
    def is_permute(self) -> bool:
        return self.collective == PERMUTE


def _check_alphabet() -> None:
    collectives()  # every grammar collective has a record and every record a grammar name
    for name in form_names():
        if name not in FORMS:
            raise RuntimeError(f"the grammar names form {name!r}, which has no meaning in synth/semantics.py")


# Beyond this many levels of more than one member, the search's Permute steps are the orders
# one swap away from the hierarchy's (all k! orders would outgrow the alphabet).
EVERY_ORDER_DEPTH = 4


# --- the machine ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepTrace:
    step: Step
    before: tuple
    after: tuple


class Semantics:
    """The state machine for one synthesis hierarchy (its level names and sizes) and one goal."""

    def __init__(self, level_names: tuple[str, ...], real_sizes: tuple[int, ...], quotient: bool = True,
                 goal: Goal | str = ALL_REDUCE):
        _check_alphabet()
        self.level_names = tuple(level_names)
        self.real_sizes = tuple(real_sizes)
        self.quotient = quotient
        self.goal_kind = parse_goal(goal)
        self.sizes = tuple(min(size, QUOTIENT_CAP) for size in real_sizes) if quotient else self.real_sizes
        self.member_count = product(self.sizes)
        self.real_member_count = product(self.real_sizes)
        # The levels a chunk's place is made of (levels of one member add no digit), in
        # hierarchy order: the layout every buffer starts and ends in.
        self.canonical_order = tuple(i for i, size in enumerate(self.real_sizes) if size > 1)
        self.tracks_blocks = self.goal_kind.permutes

    @cached_property
    def full_mask(self) -> int:
        """Every member's bit (computed on use: building a Semantics costs nothing, so a search
        too large to run is refused before anything grows with the hierarchy)."""
        return (1 << self.member_count) - 1

    def _layout(self) -> tuple:
        """(tags, order) of a whole buffer in the hierarchy's order, or (None, None)."""
        if not self.tracks_blocks:
            return None, None
        return tuple(range(self.member_count)), self.canonical_order

    @cached_property
    def initial(self) -> tuple:
        """Each member's input (docs/model.md section 7, per goal)."""
        n, real_n = self.member_count, self.real_member_count
        tags, order = self._layout()
        if self.goal_kind.start == OWN_BLOCK:  # member r's own block, at place r
            return tuple(Holding(r, r + 1, 1 << (r * n + r), 1, (r,), order) for r in range(n))
        if self.goal_kind.start == ADDRESSED:  # member r's buffer, block j bound for member j
            return tuple(Holding(0, n, sum(1 << (chunk * n + r) for chunk in range(n)), real_n, tags, order)
                         for r in range(n))
        if self.goal_kind.start == ROOT_ONLY:  # only the root has data
            root = Holding(0, n, sum(1 << (chunk * n) for chunk in range(n)), real_n, tags, order)
            return (root,) + (None,) * (n - 1)
        return tuple(
            Holding(0, n, sum(1 << (chunk * n + rank) for chunk in range(n)), real_n, tags, order) for rank in range(n)
        )

    @cached_property
    def goal(self) -> tuple | None:
        """The goal state, for goals that have exactly one (all but reduce-scatter, whose
        blocks may end at any place, and reduce, whose non-roots may end in any state)."""
        n, real_n = self.member_count, self.real_member_count
        tags, order = self._layout()
        own = sum(1 << (chunk * n + chunk) for chunk in range(n))
        end = self.goal_kind.end
        if end == SUM_EVERYWHERE:
            return (Holding(0, n, (1 << (n * n)) - 1, real_n, tags, order),) * n
        if end == GATHERED:
            return (Holding(0, n, own, real_n, tags, order),) * n
        if end == TRANSPOSED:
            return tuple(Holding(0, n, own, real_n, (r,) * n, order) for r in range(n))
        if end == ROOT_EVERYWHERE:
            return (Holding(0, n, sum(1 << (chunk * n) for chunk in range(n)), real_n, tags, order),) * n
        return None

    def is_goal(self, state: tuple) -> bool:
        """Whether a state is a goal state of the request's goal."""
        goal = self.goal
        if goal is not None:
            return state == goal
        n, full = self.member_count, self.full_mask
        if self.goal_kind.end == SUM_AT_ROOT:
            root = state[0]
            return root is not None and root[:4] == (0, n, (1 << (n * n)) - 1, self.real_member_count)
        for rank, member in enumerate(state):  # reduce-scatter: block r of the sum on member r
            if member is None or member[3] != 1 or member[4] != (rank,) or member[2] != full << (member[0] * n):
                return False
        return True

    @cached_property
    def instructions(self) -> dict[Step, Instruction]:
        """Every spelling of the grammar's collectives on this hierarchy and its instruction
        (Permute spellings are read by `instruction_of`)."""
        result = {}
        for record in collectives():
            for form in form_names():
                for level, name in enumerate(self.level_names):
                    groups, varying = FORMS[form](self.sizes, level)
                    real_k = product(self.real_sizes[i] for i in varying)
                    result[Step(record.name, form, name)] = Instruction(record.name, tuple(sorted(groups)), varying, real_k, record)
        return result

    def permute_orders(self) -> list[tuple[int, ...]]:
        """The level orders the search's Permute steps make: every order of the levels of more
        than one member, or beyond EVERY_ORDER_DEPTH of them the orders one swap away from the
        hierarchy's. The hierarchy's own order comes first."""
        canonical = self.canonical_order
        if len(canonical) < 2:
            return []
        if len(canonical) <= EVERY_ORDER_DEPTH:
            return list(permutations(canonical))
        swapped = [canonical]
        for i, j in combinations(range(len(canonical)), 2):
            order = list(canonical)
            order[i], order[j] = order[j], order[i]
            swapped.append(tuple(order))
        return swapped

    @cached_property
    def alphabet(self) -> tuple[tuple[Step, Instruction], ...]:
        """One spelling per distinct instruction of the goal's alphabet (the first in grammar
        order), then its Permute steps; instructions whose groups all have one member do
        nothing and are left out."""
        seen, result = set(), []
        allowed = set(self.goal_kind.alphabet)
        for step, instruction in self.instructions.items():
            key = (instruction.collective, instruction.groups)
            if not instruction.groups or key in seen or instruction.collective not in allowed:
                continue
            seen.add(key)
            result.append((step, instruction))
        if self.goal_kind.permutes:
            for order in self.permute_orders():
                step = permute_step(self.level_names[level] for level in order)
                result.append((step, self.instruction_of(step)))
        return tuple(result)

    @cached_property
    def _operations(self) -> dict:
        return {record.name: operation(record) for record in collectives()}

    @cached_property
    def _transforms(self) -> dict:
        return {}

    def transform(self, instruction: Instruction):
        """The group transformer of a collective instruction: its record's operation, with
        the cut along level digits checked first where the goal moves blocks (_check_cut)."""
        key = (instruction.collective, instruction.varying_levels)
        found = self._transforms.get(key)
        if found is None:
            base = self._operations[instruction.collective]
            record = instruction.record
            join = record.combine is Combine.JOIN
            cuts = record.delivery is Delivery.BLOCKS or record.combine is Combine.EXCHANGE or join
            if self.tracks_blocks and cuts:
                varying = tuple(level for level in instruction.varying_levels if self.sizes[level] > 1)
                sizes, names, label = self.sizes, self.level_names, record.name

                def found(states, real_k, field):
                    _check_cut(states, varying, sizes, join, names, label)
                    return base(states, real_k, field)
            else:
                found = base
            self._transforms[key] = found
        return found

    def instruction_of(self, step: Step) -> Instruction:
        if step.is_permute:
            return self._permute_instruction(step)
        if step.level not in self.level_names:
            known = ", ".join(self.level_names) or "none (the reduction group has one member)"
            raise UsageError(f"unknown level {step.level!r} in step {step}: the synthesis hierarchy's levels are {known}")
        return self.instructions[step]

    def _permute_instruction(self, step: Step) -> Instruction:
        names = step.order
        wanted = [self.level_names[i] for i in self.canonical_order]
        for name in names:
            if name not in self.level_names:
                known = ", ".join(self.level_names) or "none (the reduction group has one member)"
                raise UsageError(f"unknown level {name!r} in step {step}: the synthesis hierarchy's levels are {known}")
        if sorted(names) != sorted(wanted):
            raise UsageError(f"{step} must name each level of more than one member once, in the order wanted: "
                             f"{', '.join(wanted) or 'none'}")
        order = tuple(self.level_names.index(name) for name in names)
        return Instruction(PERMUTE, (), (), 1, None, order)

    @cached_property
    def _place_maps(self) -> dict:
        return {}

    def places(self, before: tuple[int, ...], after: tuple[int, ...]) -> tuple[int, ...]:
        """Old place -> new place of a Permute from layout `before` to `after` (place_map)."""
        key = (before, after)
        found = self._place_maps.get(key)
        if found is None:
            found = self._place_maps[key] = place_map(self.sizes, before, after)
        return found

    def permute_member(self, member, order: tuple[int, ...]):
        """One member after a Permute into `order`; StepFailure when it holds neither a whole
        buffer nor one block. A whole buffer of byte-wide fields (what all-to-all searches
        permute by the tens of thousands) takes `_permute`'s byte path through getters kept
        per pair of layouts."""
        if member is None:
            return None
        n = self.member_count
        if member[0] == 0 and member[1] == n > 1 and member[3] == self.real_member_count and n % 8 == 0:
            key = (member[5], order)
            found = self._whole_movers.get(key)
            if found is None:
                places = self.places(member[5], order)
                found = self._whole_movers[key] = _movers(places, n // 8) if len(places) == n else ()
            if found:
                take_bytes, take_tags = found
                raw = member[2].to_bytes(n * n // 8, "little")
                return _new(Holding, (0, n, int.from_bytes(bytes(take_bytes(raw)), "little"), member[3],
                                      take_tags(member[4]), order))
        places = self.places(member[5], order)
        return _permute(member, places, order, n, self.real_member_count)

    @cached_property
    def _whole_movers(self) -> dict:
        return {}

    def apply(self, state: tuple, instruction: Instruction) -> tuple:
        """The state after one instruction; StepFailure when a precondition fails."""
        if instruction.is_permute:
            new_state = tuple(self.permute_member(member, instruction.order) for member in state)
            if new_state == state:
                raise StepFailure("the buffers are already in that order (a no-op)")
            return new_state
        if not instruction.groups:
            raise StepFailure("every group of this form has one member, so the step does nothing")
        members = list(state)
        transform = self.transform(instruction)
        for group in instruction.groups:
            results = transform([state[m] for m in group], instruction.real_group_size, self.member_count)
            for member, result in zip(group, results):
                members[member] = result
        new_state = tuple(members)
        if new_state == state:
            raise StepFailure("the step changes nothing (a no-op)")
        return new_state

    def _check_in_alphabet(self, index: int, step: Step) -> None:
        goal = self.goal_kind
        if step.is_permute and not goal.permutes:
            raise InvalidProgramError(
                f"step {index + 1} {step}: {goal.title} programs have no Permute step (their blocks never move)", index)
        if not step.is_permute and step.collective not in goal.alphabet:
            raise InvalidProgramError(
                f"step {index + 1} {step}: {step.collective} takes no part in {goal.title} programs; their steps are "
                f"{', '.join(goal.alphabet)}" + (" and Permute" if goal.permutes else ""), index)

    def run(self, program: Program) -> list[StepTrace]:
        """Check a program against docs/model.md section 7; InvalidProgramError names the failing step."""
        state, trace = self.initial, []
        for index, step in enumerate(program.steps):
            instruction = self.instruction_of(step)
            self._check_in_alphabet(index, step)
            if step.is_permute and index and program.steps[index - 1].is_permute:
                raise InvalidProgramError(
                    f"step {index + 1} {step}: two Permute steps in a row are one Permute, into the second's order",
                    index)
            if self.is_goal(state):
                raise InvalidProgramError(
                    f"step {index + 1} {step}: the goal was already reached after step {index}; drop the remaining steps",
                    index,
                )
            try:
                new_state = self.apply(state, instruction)
            except StepFailure as failure:
                raise InvalidProgramError(f"step {index + 1} {step} is invalid: {failure}", index) from None
            trace.append(StepTrace(step, state, new_state))
            state = new_state
        if not self.is_goal(state):
            raise InvalidProgramError(
                f"the program ends before the goal: {self.describe_shortfall(state)}", len(program.steps)
            )
        return trace

    # --- the real calls a step makes, read from a state (for costs and lowering) -------------

    @cached_property
    def representative(self) -> tuple[int, ...]:
        """For each real member rank, the state's member that stands for it: itself in the
        explicit machine, the member with the same zero digits in the quotient."""
        capped = self.sizes
        result = []
        for position in _positions(self.real_sizes):
            index = 0
            for digit, size in zip(position, capped):
                index = index * size + min(digit, size - 1)
            result.append(index)
        return tuple(result)

    def real_calls(self, step: Step) -> tuple[tuple[int, ...], ...]:
        """The groups `step` calls in the real hierarchy, sorted member-rank tuples (root
        first), in the order lowering gives them; none for a Permute (a local step)."""
        calls = self._real_calls.get(step)
        if calls is None:
            self.instruction_of(step)  # an unknown level is a UsageError
            if step.is_permute:
                calls = self._real_calls[step] = ()
                return calls
            groups, _ = FORMS[step.form](self.real_sizes, self.level_names.index(step.level))
            calls = self._real_calls[step] = tuple(sorted(groups))
        return calls

    @cached_property
    def _real_calls(self) -> dict[Step, tuple[tuple[int, ...], ...]]:
        return {}

    def call_spans(self, state: tuple, step: Step) -> tuple[int, ...]:
        """The chunks each call of `step` spans in the real hierarchy (calls as `real_calls`
        orders them), read from the state before the step: the root's range, or for a join
        the joined output. Calls of one step may differ (members of different classes can
        hold ranges of different lengths), so each is read from its own root."""
        instruction = self.instruction_of(step)
        if instruction.is_permute:
            return ()
        factor = instruction.record.span_factor(instruction.real_group_size)
        representative = self.representative
        return tuple(state[representative[members[0]]][3] * factor for members in self.real_calls(step))

    def chunk_sets(self, member) -> list[int]:
        """The contributor bitmask of each chunk a member holds, in range order."""
        lo, hi, sets = member[0], member[1], member[2]
        n = self.member_count
        return [(sets >> (chunk * n)) & self.full_mask for chunk in range(lo, hi)]

    def describe_shortfall(self, state: tuple) -> str:
        """Why a final state is not the goal, in the goal's words."""
        end = self.goal_kind.end
        if end == SUM_BLOCKS:
            return self._reduce_scatter_shortfall(state)
        if end in (GATHERED, TRANSPOSED):
            return self._placement_shortfall(state)
        empty = sum(1 for member in state if member is None)
        partial = sum(1 for member in state if member is not None and member[:2] != (0, self.member_count))
        wanted = self.goal[0][2] if self.goal is not None else (1 << (self.member_count ** 2)) - 1
        missing = sum(
            1 for member in state if member is not None for chunk, sets in zip(range(member[0], member[1]), self.chunk_sets(member))
            if sets != (wanted >> (chunk * self.member_count)) & self.full_mask
        )
        parts = []
        if end == SUM_AT_ROOT:
            return "member 0 does not hold every block summed over the group"
        if empty:
            parts.append(f"{empty} member(s) hold nothing")
        if partial:
            parts.append(f"{partial} member(s) hold only part of the buffer")
        if missing:
            parts.append(f"{missing} held chunk(s) still miss contributions")
        return "; ".join(parts) or "the state differs from the goal"

    def _reduce_scatter_shortfall(self, state: tuple) -> str:
        for rank, member in enumerate(state):
            if member is None:
                return f"member {rank} holds nothing"
            if member[3] != 1:
                return f"member {rank} holds {member[3]} chunks, not one block"
            if member[2] != self.full_mask << (member[0] * self.member_count):
                return f"member {rank}'s block still misses contributions"
            if member[4] != (rank,):
                return (f"member {rank} ends with block {member[4][0]} of the sum, not block {rank}: the blocks are in "
                        f"the wrong order (reduce_scatter_tensor gives member r block r; a Permute of the input can "
                        f"lay the blocks out for this order)")
        return "the state differs from the goal"

    def _placement_shortfall(self, state: tuple) -> str:
        n, goal = self.member_count, self.goal
        for rank, (member, wanted) in enumerate(zip(state, goal)):
            if member is None:
                return f"member {rank} holds nothing"
            if member[:2] != (0, n):
                return f"member {rank} holds only part of the buffer"
            if member[5] != wanted[5]:
                order = ",".join(self.level_names[i] for i in member[5])
                return f"the buffers are left in level order ({order}): a final Permute puts them back in place"
            if member != wanted:
                return (f"member {rank} holds blocks in the wrong places or from the wrong members (the blocks are in "
                        f"the wrong order)")
        return "the state differs from the goal"


# --- the same machine over interned member states, for the search -----------------------------

_UNKNOWN = object()


class InternedMachine:
    """`Semantics.apply` over interned states, for the search. A state is a tuple of small ints
    naming member states: a few thousand distinct members make up the hundreds of thousands
    of states a search visits, so states hash and compare as short int tuples. Each group's
    combine is computed once per (combine kind, real group size, member ids), shared by the
    collectives that combine alike (the three sums), and each delivery once per combined
    result, by the same functions `Semantics.apply` uses; an AllToAll once per group of
    member ids, a Permute once per member id. Steps are alphabet indices."""

    def __init__(self, semantics: Semantics):
        self.semantics = semantics
        self.members: list[Holding | None] = []  # id -> member state
        self._ids: dict[Holding | None, int] = {}
        self.initial = self.intern(semantics.initial)
        # The one goal state where the goal has one (`is_goal` decides in every case).
        self.goal = None if semantics.goal is None else self.intern(semantics.goal)
        self._goals: dict[tuple[int, ...], bool] = {}
        memos: dict[tuple, dict] = {}
        self._plans = []
        for _, instruction in semantics.alphabet:
            if instruction.is_permute:
                self._plans.append((None, memos.setdefault(("permute", instruction.order), {}), None, instruction,
                                    None, None, None))
                continue
            record, real_k = instruction.record, instruction.real_group_size
            if semantics.tracks_blocks:
                # Results depend on the step's levels too (the cut along level digits): one
                # memo per instruction's (collective, levels), whole groups at once.
                whole = semantics.transform(instruction)
                memo = memos.setdefault((record.name, instruction.varying_levels, real_k), {})
                combined, delivered = whole, None
            else:
                memo = memos.setdefault((record.combine, record.delivery, real_k), {})
                combined = memos.setdefault((record.combine, real_k), {})
                delivered = memos.setdefault((record.delivery, real_k), {})
            getters = tuple(itemgetter(*group) for group in instruction.groups)
            # The new state is the groups' results, then the idle members, put back in member order.
            busy = [m for group in instruction.groups for m in group]
            idle = tuple(sorted(set(range(len(self.initial))) - set(busy)))
            position = {m: i for i, m in enumerate(busy + list(idle))}
            order = itemgetter(*(position[m] for m in range(len(self.initial))))
            self._plans.append((getters, memo, (combined, delivered), record, real_k, idle, order))
        self._suspects: list[itemgetter | None] = [None] * len(self._plans)

    def is_goal(self, state: tuple[int, ...]) -> bool:
        if self.goal is not None:
            return state == self.goal
        found = self._goals.get(state)
        if found is None:
            found = self._goals[state] = self.semantics.is_goal(self.expand(state))
        return found

    def member_id(self, member: Holding | None) -> int:
        found = self._ids.get(member)
        if found is None:
            found = self._ids[member] = len(self.members)
            self.members.append(member)
        return found

    def intern(self, state: tuple) -> tuple[int, ...]:
        return tuple(self.member_id(member) for member in state)

    def expand(self, state: tuple[int, ...]) -> tuple:
        return tuple(self.members[i] for i in state)

    def apply(self, state: tuple[int, ...], index: int) -> tuple[int, ...] | None:
        """The state after alphabet instruction `index`; None when it is invalid or a no-op.
        The group that failed last time for this instruction is tried first: neighbouring
        states of a search fail at the same place, and then nothing else is looked at."""
        getters, memo, combined, record, real_k, idle, order = self._plans[index]
        if getters is None:
            return self._permute(state, memo, record)
        suspect = self._suspects[index]
        if suspect is not None and memo.get(suspect(state), _UNKNOWN) is None:
            return None
        results = []
        for getter in getters:
            key = getter(state)
            result = memo.get(key, _UNKNOWN)
            if result is _UNKNOWN:
                result = memo[key] = self._transition(record, combined, key, real_k)
            if result is None:
                self._suspects[index] = getter
                return None
            results.extend(result)
        for member in idle:
            results.append(state[member])
        after = order(results)
        return None if after == state else after

    def _permute(self, state: tuple[int, ...], memo: dict, instruction: Instruction) -> tuple[int, ...] | None:
        """A Permute on every member, each member's result memoized by its id."""
        after = []
        for member in state:
            found = memo.get(member, _UNKNOWN)
            if found is _UNKNOWN:
                try:
                    found = self.member_id(self.semantics.permute_member(self.members[member], instruction.order))
                except StepFailure:
                    found = None
                memo[member] = found
            if found is None:
                return None
            after.append(found)
        after = tuple(after)
        return None if after == state else after

    def _transition(self, record: Collective, memos: tuple[dict, dict], key: tuple[int, ...], real_k: int):
        """One group's member ids after the step, or None when its precondition fails: the
        combined result (an id) memoized by the inputs, the delivery by that id."""
        combined, delivered = memos
        members = self.members
        if delivered is None:  # a whole-group transformer (goals whose blocks move)
            try:
                holdings = combined([members[i] for i in key], real_k, self.semantics.member_count)
            except StepFailure:
                return None
            return tuple(self.member_id(member) for member in holdings)
        whole = _WHOLE_GROUP.get(record.combine)
        if whole is not None:
            try:
                holdings = whole([members[i] for i in key], real_k, self.semantics.member_count, record.name)
            except StepFailure:
                return None
            return tuple(self.member_id(member) for member in holdings)
        result = combined.get(key, _UNKNOWN)
        if result is _UNKNOWN:
            try:
                result = self.member_id(_COMBINE[record.combine]([members[i] for i in key], real_k, record.name))
            except StepFailure:
                result = None
            combined[key] = result
        if result is None:
            return None
        k = len(key)
        after = delivered.get((result, k), _UNKNOWN)
        if after is _UNKNOWN:
            try:
                holdings = _DELIVER[record.delivery](members[result], k, real_k, self.semantics.member_count, record.name)
                after = tuple(self.member_id(member) for member in holdings)
            except StepFailure:
                after = None
            delivered[(result, k)] = after
        return after
