"""The meaning of a program (docs/model.md sections 5 and 7) as a state machine over group members.

A member's state is `None` (empty) or a `Holding(lo, hi, sets, length)`. What each collective
needs and does is read from its record (synth/collectives.py); this module only says how a
record's combine and delivery act on contributor sets.

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
from functools import cached_property
from itertools import product as cartesian
from operator import itemgetter
from typing import NamedTuple

from synth.collectives import Collective, Combine, Delivery, collectives
from synth.errors import InvalidProgramError, UsageError
from synth.language import Program, Step, form_names
from synth.names import product

QUOTIENT_CAP = 2


class StepFailure(Exception):
    """A step's precondition does not hold; the message says which members and why."""


# --- forms: which members talk in one step (docs/model.md section 5) ----------------------------------


def _positions(sizes: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Positions of all members, indexed by member rank (mixed radix, outermost first)."""
    return list(cartesian(*(range(size) for size in sizes)))


def _grouped(sizes, level, key, include) -> tuple[tuple[int, ...], ...]:
    groups: dict[tuple, list[int]] = {}
    for rank, position in enumerate(_positions(sizes)):
        if include(position):
            groups.setdefault(key(position), []).append(rank)
    return tuple(tuple(members) for members in groups.values() if len(members) > 1)


def inside_group(sizes, level):
    """Members agreeing on every level outer than `level`."""
    return _grouped(sizes, level, lambda p: p[:level], lambda p: True), tuple(range(level, len(sizes)))


def parallel(sizes, level):
    """Members agreeing on every level but `level`."""
    return _grouped(sizes, level, lambda p: p[:level] + p[level + 1:], lambda p: True), (level,)


def master(sizes, level):
    """Among members at position 0 on every inner level, those agreeing on the outer levels."""
    return _grouped(sizes, level, lambda p: p[:level], lambda p: not any(p[level + 1:])), (level,)


FORMS = {"InsideGroup": inside_group, "Parallel": parallel, "Master": master}


# --- collectives (docs/model.md section 7), read from their records in synth/collectives.py -------------


class Holding(NamedTuple):
    """What a non-empty member holds: the chunk range [lo, hi); `sets`, for each chunk c the
    members summed into it as a bitmask in bits [c*N, (c+1)*N) (unions and disjointness over
    all chunks are then single integer operations); and the range length in chunks of the real
    hierarchy (the quotient shrinks lo and hi, not this). A NamedTuple is as fast as the plain
    tuple it replaces; an empty member is None."""

    lo: int
    hi: int
    sets: int
    length: int


def _sum(states, real_k, name):
    """Combine.SUM: one non-empty range on every member, nothing counted twice; the union."""
    first = states[0]
    union = total = 0
    for index, state in enumerate(states):
        if state is None:
            raise StepFailure(f"{name} needs every member to hold data, member {index} of the group is empty")
        if state[0] != first[0] or state[1] != first[1]:
            raise StepFailure(
                f"{name} needs one range on every member; member 0 holds [{first[0]},{first[1]}) and member {index} holds [{state[0]},{state[1]})"
            )
        union |= state[2]
        total += state[2].bit_count()
    # Chunks sit in disjoint bit fields, so per-chunk disjointness is one count on the whole.
    if union.bit_count() != total:
        raise StepFailure(f"{name} would count some member's data twice")
    return Holding(first[0], first[1], union, first[3])


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
    return Holding(first[0], states[-1][1], union, first[3] * real_k)


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
    lo, hi, union, length = result
    if (hi - lo) % k or length % real_k:
        raise StepFailure(f"{name} over {real_k} members cannot split a range of {length} chunks evenly")
    block = (hi - lo) // k
    mask = (1 << (block * field)) - 1
    return [
        Holding(lo + i * block, lo + (i + 1) * block, union & (mask << ((lo + i * block) * field)), length // real_k)
        for i in range(k)
    ]


_COMBINE = {Combine.SUM: _sum, Combine.JOIN: _join, Combine.ROOT: _root}
_DELIVER = {Delivery.EVERY: _to_every, Delivery.ROOT: _to_root, Delivery.BLOCKS: _to_blocks}


def operation(record: Collective):
    """The state transformer of one group for a collective: (member states, real group size,
    bit-field width) -> member states; StepFailure when the precondition fails."""
    combine, deliver, name = _COMBINE[record.combine], _DELIVER[record.delivery], record.name

    def apply_to_group(states, real_k, field):
        return deliver(combine(states, real_k, name), len(states), real_k, field, name)

    return apply_to_group


@dataclass(frozen=True)
class Instruction:
    """What a step does, independent of how it is spelled: a collective and its groups.
    Two steps with equal instructions are the same instruction (docs/model.md section 5)."""

    collective: str
    groups: tuple[tuple[int, ...], ...]
    varying_levels: tuple[int, ...]
    real_group_size: int
    record: Collective = field(compare=False, repr=False, default=None)


def _check_alphabet() -> None:
    collectives()  # every grammar collective has a record and every record a grammar name
    for name in form_names():
        if name not in FORMS:
            raise RuntimeError(f"the grammar names form {name!r}, which has no meaning in synth/semantics.py")


# --- the machine ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepTrace:
    step: Step
    before: tuple
    after: tuple


class Semantics:
    """The state machine for one synthesis hierarchy (its level names and sizes)."""

    def __init__(self, level_names: tuple[str, ...], real_sizes: tuple[int, ...], quotient: bool = True):
        _check_alphabet()
        self.level_names = tuple(level_names)
        self.real_sizes = tuple(real_sizes)
        self.quotient = quotient
        self.sizes = tuple(min(size, QUOTIENT_CAP) for size in real_sizes) if quotient else self.real_sizes
        self.member_count = product(self.sizes)
        self.real_member_count = product(self.real_sizes)

    @cached_property
    def full_mask(self) -> int:
        """Every member's bit (computed on use: building a Semantics costs nothing, so a search
        too large to run is refused before anything grows with the hierarchy)."""
        return (1 << self.member_count) - 1

    @cached_property
    def initial(self) -> tuple:
        n = self.member_count
        return tuple(
            Holding(0, n, sum(1 << (chunk * n + rank) for chunk in range(n)), self.real_member_count) for rank in range(n)
        )

    @cached_property
    def goal(self) -> tuple:
        n = self.member_count
        full = Holding(0, n, (1 << (n * n)) - 1, self.real_member_count)
        return (full,) * n

    @cached_property
    def instructions(self) -> dict[Step, Instruction]:
        """Every spelling of the grammar's alphabet on this hierarchy and its instruction."""
        result = {}
        for record in collectives():
            for form in form_names():
                for level, name in enumerate(self.level_names):
                    groups, varying = FORMS[form](self.sizes, level)
                    real_k = product(self.real_sizes[i] for i in varying)
                    result[Step(record.name, form, name)] = Instruction(record.name, tuple(sorted(groups)), varying, real_k, record)
        return result

    @cached_property
    def alphabet(self) -> tuple[tuple[Step, Instruction], ...]:
        """One spelling per distinct instruction (the first in grammar order); instructions whose
        groups all have one member do nothing and are left out."""
        seen, result = set(), []
        for step, instruction in self.instructions.items():
            key = (instruction.collective, instruction.groups)
            if not instruction.groups or key in seen:
                continue
            seen.add(key)
            result.append((step, instruction))
        return tuple(result)

    @cached_property
    def _operations(self) -> dict:
        return {record.name: operation(record) for record in collectives()}

    def instruction_of(self, step: Step) -> Instruction:
        if step.level not in self.level_names:
            known = ", ".join(self.level_names) or "none (the reduction group has one member)"
            raise UsageError(f"unknown level {step.level!r} in step {step}: the synthesis hierarchy's levels are {known}")
        return self.instructions[step]

    def apply(self, state: tuple, instruction: Instruction) -> tuple:
        """The state after one instruction; StepFailure when a precondition fails."""
        if not instruction.groups:
            raise StepFailure("every group of this form has one member, so the step does nothing")
        members = list(state)
        transform = self._operations[instruction.collective]
        for group in instruction.groups:
            results = transform([state[m] for m in group], instruction.real_group_size, self.member_count)
            for member, result in zip(group, results):
                members[member] = result
        new_state = tuple(members)
        if new_state == state:
            raise StepFailure("the step changes nothing (a no-op)")
        return new_state

    def run(self, program: Program) -> list[StepTrace]:
        """Check a program against docs/model.md section 7; InvalidProgramError names the failing step."""
        state, trace = self.initial, []
        for index, step in enumerate(program.steps):
            instruction = self.instruction_of(step)
            if state == self.goal:
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
        if state != self.goal:
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
        first), in the order lowering gives them."""
        calls = self._real_calls.get(step)
        if calls is None:
            self.instruction_of(step)  # an unknown level is a UsageError
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
        factor = instruction.record.span_factor(instruction.real_group_size)
        representative = self.representative
        return tuple(state[representative[members[0]]][3] * factor for members in self.real_calls(step))

    def chunk_sets(self, member) -> list[int]:
        """The contributor bitmask of each chunk a member holds, in range order."""
        lo, hi, sets, _ = member
        n = self.member_count
        return [(sets >> (chunk * n)) & self.full_mask for chunk in range(lo, hi)]

    def describe_shortfall(self, state: tuple) -> str:
        empty = sum(1 for member in state if member is None)
        partial = sum(1 for member in state if member is not None and member[:2] != (0, self.member_count))
        missing = sum(
            1 for member in state if member is not None for sets in self.chunk_sets(member) if sets != self.full_mask
        )
        parts = []
        if empty:
            parts.append(f"{empty} member(s) hold nothing")
        if partial:
            parts.append(f"{partial} member(s) hold only part of the buffer")
        if missing:
            parts.append(f"{missing} held chunk(s) still miss contributions")
        return "; ".join(parts) or "the state differs from the goal"


# --- the same machine over interned member states, for the search -----------------------------

_UNKNOWN = object()


class InternedMachine:
    """`Semantics.apply` over interned states, for the search. A state is a tuple of small ints
    naming member states: a few thousand distinct members make up the hundreds of thousands
    of states a search visits, so states hash and compare as short int tuples. Each group's
    combine is computed once per (combine kind, real group size, member ids), shared by the
    collectives that combine alike (the three sums), and each delivery once per combined
    result, by the same functions `Semantics.apply` uses. Steps are alphabet indices."""

    def __init__(self, semantics: Semantics):
        self.semantics = semantics
        self.members: list[Holding | None] = []  # id -> member state
        self._ids: dict[Holding | None, int] = {}
        self.initial = self.intern(semantics.initial)
        self.goal = self.intern(semantics.goal)
        memos: dict[tuple, dict] = {}
        self._plans = []
        for _, instruction in semantics.alphabet:
            record, real_k = instruction.record, instruction.real_group_size
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

    def _transition(self, record: Collective, memos: tuple[dict, dict], key: tuple[int, ...], real_k: int):
        """One group's member ids after the step, or None when its precondition fails: the
        combined result (an id) memoized by the inputs, the delivery by that id."""
        combined, delivered = memos
        members = self.members
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
