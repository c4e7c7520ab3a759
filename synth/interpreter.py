"""A reference interpreter: runs a program on real numbers over every device of the system.

Each goal (synth/goals.py) starts from its own inputs and is compared with what the one flat
collective would leave: the sum over the group (all-reduce), block r of it on member r
(reduce-scatter), every member's block in member order (all-gather), member i's block j as
block i of member j (all-to-all), member 0's buffer (broadcast), the sum on member 0
(reduce). A Permute step reorders every member's buffer with numpy's transpose of the buffer
viewed as one axis per level, independently of the semantics' place arithmetic.

semantics.py decides validity on contributor sets of a few members; this module checks the
same programs the way hardware would see them, so a bug in the set bookkeeping, in the
quotient, or in the mapping from hierarchy positions to global ranks shows up as a wrong sum.
Every device holds N chunks (N = reduction group size) of random int64 elements; each step
of docs/model.md section 7 is applied to the arrays of all reduction groups at once, and the final
buffers are compared with the direct sum over each reduction group.

What each collective needs and does comes from its record (synth/collectives.py): its
combine and its delivery, implemented here on arrays independently of semantics.py. Only
ranges and data are tracked, never contributor sets. Preconditions on ranges (equal
ranges, empty members, contiguous AllGather blocks, even splits), no-op steps and a goal
reached early are detected from ranges and data; counting some member twice cannot be seen
in one step, but it leaves a wrong sum that the final comparison catches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from synth.collectives import RECORDS, Collective, Combine, Delivery, collective
from synth.errors import InvalidProgramError, UsageError
from synth.goals import (ALL_REDUCE, GATHERED, OWN_BLOCK, ROOT_EVERYWHERE, ROOT_ONLY, SUM_AT_ROOT, SUM_BLOCKS,
                         SUM_EVERYWHERE, TRANSPOSED, Goal, parse_goal)
from synth.language import Program, Step
from synth.semantics import FORMS

if TYPE_CHECKING:
    from synth.hierarchy import SynthesisHierarchy

# Inputs stay small enough that a few steps of sums over hundreds of members (even counted
# twice) never overflow int64, and wide enough that two different sums never coincide.
VALUE_BOUND = 1 << 20


@dataclass(frozen=True)
class ReferenceResult:
    """What a reference run checked: every device of every reduction group matched."""

    ok: bool
    max_abs_error: int
    devices: int
    groups: int


class _Failure(Exception):
    """A step's precondition fails; the message names the members at fault."""


@dataclass(frozen=True)
class _Machine:
    """The state of every device: held range [lo, hi) (lo == hi when empty) and its data,
    zero outside the held range so sums and joins are plain additions. The arrays are
    updated in place; the fields never change."""

    lo: np.ndarray  # (D,)
    hi: np.ndarray  # (D,)
    data: np.ndarray  # (D, N, E)
    order: list = field(default_factory=lambda: [()])  # [the buffers' level order], changed by Permute
    cuts_along_levels: bool = False  # goals whose blocks move: cuts and joins follow level digits

    def snapshot(self) -> tuple:
        return self.lo.copy(), self.hi.copy(), self.data.copy(), tuple(self.order[0])

    def same_as(self, snapshot) -> bool:
        lo, hi, data, order = snapshot
        return (np.array_equal(self.lo, lo) and np.array_equal(self.hi, hi) and np.array_equal(self.data, data)
                and tuple(self.order[0]) == order)


def run_reference(program: Program, hierarchy: SynthesisHierarchy, chunk_elems: int = 3, seed: int = 0,
                  goal: Goal | str = ALL_REDUCE) -> ReferenceResult:
    """Run `program` on every device with real data; InvalidProgramError when a step's
    precondition fails, a step changes nothing, the goal is reached before the last step, or
    a final buffer differs from what the goal's flat collective leaves."""
    if chunk_elems < 1:
        raise UsageError(f"chunk_elems {chunk_elems}: give at least one element per chunk")
    goal = parse_goal(goal)
    members = np.asarray(hierarchy.groups, dtype=np.int64)  # (R, N): global rank by member rank
    group_count, n = members.shape
    devices = hierarchy.placement.device_count
    rng = np.random.default_rng(seed)
    inputs = rng.integers(-VALUE_BOUND, VALUE_BOUND, size=(devices, n, chunk_elems), dtype=np.int64)
    canonical = tuple(i for i, size in enumerate(hierarchy.sizes) if size > 1)
    lo, hi, data = _inputs(goal, inputs, members, n)
    machine = _Machine(lo, hi, data, [canonical], goal.permutes)
    check = _Goal(goal, inputs, members, hierarchy.sizes, canonical)
    for index, step in enumerate(program.steps):
        if index > 0 and check.failure(machine, index) is None:
            raise InvalidProgramError(
                f"step {index + 1} {step}: the goal was already reached after step {index}; drop the remaining steps", index
            )
        if step.is_permute and index and program.steps[index - 1].is_permute:
            raise InvalidProgramError(f"step {index + 1} {step}: two Permute steps in a row are one Permute", index)
        before = machine.snapshot()
        try:
            if step.is_permute:
                _permute(machine, step, hierarchy)
            else:
                _apply(machine, step, hierarchy, members)
        except _Failure as failure:
            raise InvalidProgramError(f"step {index + 1} {step} is invalid: {failure}", index) from None
        if machine.same_as(before):
            raise InvalidProgramError(f"step {index + 1} {step} is invalid: the step changes nothing (a no-op)", index)

    failure = check.failure(machine, len(program.steps))
    if failure is not None:
        raise failure
    return ReferenceResult(ok=True, max_abs_error=0, devices=devices, groups=group_count)


def _inputs(goal: Goal, inputs: np.ndarray, members: np.ndarray, n: int):
    """Each device's held range and data before the first step."""
    devices = inputs.shape[0]
    lo, hi, data = np.zeros(devices, dtype=np.int64), np.full(devices, n, dtype=np.int64), inputs.copy()
    if goal.start == OWN_BLOCK:  # member r holds only its own block, at place r
        member_of = np.empty(devices, dtype=np.int64)
        member_of[members] = np.arange(n)[None, :]
        lo, hi = member_of.copy(), member_of + 1
        keep = np.arange(n)[None, :] == member_of[:, None]
        data = inputs * keep[..., None]
    elif goal.start == ROOT_ONLY:  # only the root has data
        others = members[:, 1:].ravel()
        lo[others], hi[others], data[others] = 0, 0, 0
    return lo, hi, data


class _Goal:
    """What the goal's flat collective leaves on every device (`expected`, on the devices
    `checked`), and why a machine state differs from it."""

    def __init__(self, goal: Goal, inputs: np.ndarray, members: np.ndarray, sizes, canonical):
        self.goal, self.members, self.sizes, self.canonical = goal, members, tuple(sizes), canonical
        devices, n = inputs.shape[0], members.shape[1]
        self.n = n
        group_of = np.empty(devices, dtype=np.int64)
        group_of[members] = np.arange(members.shape[0])[:, None]
        member_of = np.empty_like(group_of)
        member_of[members] = np.arange(n)[None, :]
        self.group_of, self.member_of = group_of, member_of
        sums = inputs[members].sum(axis=1)  # (R, N, E)
        expected = np.empty_like(inputs)
        checked = np.ones(devices, dtype=bool)
        end = goal.end
        if end in (SUM_EVERYWHERE, SUM_BLOCKS):
            expected[members] = sums[:, None]
        elif end == SUM_AT_ROOT:
            expected[members] = sums[:, None]
            checked[:] = False
            checked[members[:, 0]] = True
        elif end == GATHERED:  # place p of every member: member p's block p
            own = inputs[members, np.arange(n)[None, :]]  # (R, N, E)
            expected[members] = own[:, None]
        elif end == TRANSPOSED:  # member j, place i: member i's block j
            expected[members] = np.swapaxes(inputs[members], 1, 2)
        elif end == ROOT_EVERYWHERE:
            expected[members] = inputs[members[:, :1]]
        self.expected, self.checked = expected, checked

    def where(self, rank: int) -> str:
        return f"device {rank} (member {self.member_of[rank]} of reduction group {self.group_of[rank]})"

    def failure(self, machine: _Machine, steps: int) -> InvalidProgramError | None:
        """None at the goal; else the error naming the first device that differs."""
        n, checked = self.n, self.checked
        order = tuple(machine.order[0])
        if self.goal.end == SUM_BLOCKS:
            return self._reduce_scatter_failure(machine, order, steps)
        short = np.nonzero(((machine.lo != 0) | (machine.hi != n)) & checked)[0]
        if short.size:
            rank = int(short[0])
            held = "nothing" if machine.lo[rank] == machine.hi[rank] else f"chunks [{machine.lo[rank]},{machine.hi[rank]})"
            return InvalidProgramError(
                f"the program ends before the goal: {self.where(rank)} holds {held}, not [0,{n}) ({short.size} device(s) short)",
                steps)
        if order != self.canonical:
            return InvalidProgramError("the program ends before the goal: the buffers are left permuted", steps)
        wrong = np.nonzero((machine.data != self.expected).any(axis=2) & checked[:, None])
        if wrong[0].size:
            rank, chunk = int(wrong[0][0]), int(wrong[1][0])
            what = "sum" if self.goal.sums else self.goal.title
            return InvalidProgramError(
                f"the program ends with a wrong {what}: {self.where(rank)} chunk {chunk} holds "
                f"{machine.data[rank, chunk].tolist()}, the {self.goal.title} over its reduction group gives "
                f"{self.expected[rank, chunk].tolist()} ({wrong[0].size} wrong chunk(s) in all; some member's data was "
                f"counted twice, lost or put in the wrong place)", steps)
        return None

    def _reduce_scatter_failure(self, machine: _Machine, order, steps: int) -> InvalidProgramError | None:
        block_at = _blocks_at(self.sizes, order)  # place -> block
        for rank in range(machine.lo.shape[0]):
            lo, hi = int(machine.lo[rank]), int(machine.hi[rank])
            member = int(self.member_of[rank])
            if hi - lo != 1:
                return InvalidProgramError(
                    f"the program ends before the goal: {self.where(rank)} holds {hi - lo} chunks, not its one block", steps)
            if block_at[lo] != member:
                return InvalidProgramError(
                    f"the program ends with blocks in the wrong order: {self.where(rank)} holds block {block_at[lo]} of "
                    f"the sum, not block {member}", steps)
            if not np.array_equal(machine.data[rank, lo], self.expected[rank, member]):
                return InvalidProgramError(
                    f"the program ends with a wrong sum: {self.where(rank)} block {member} holds "
                    f"{machine.data[rank, lo].tolist()}, the sum over its reduction group is "
                    f"{self.expected[rank, member].tolist()} (some member's data was counted twice or lost)", steps)
        return None


def _blocks_at(sizes, order) -> np.ndarray:
    """For a buffer laid out in level order `order`, the block (hierarchy-order index) at each place."""
    spanned = [i for i, size in enumerate(sizes) if size > 1]
    blocks = np.arange(int(np.prod(sizes, dtype=np.int64))).reshape([sizes[i] for i in spanned])
    return np.transpose(blocks, [spanned.index(level) for level in order]).ravel()


def _permute(machine: _Machine, step: Step, hierarchy: SynthesisHierarchy) -> None:
    """Every device's buffer reordered into the step's level order: a whole buffer by
    transposing it viewed as one axis per level, a single block moved to its new place."""
    names = step.order
    spanned = [i for i, size in enumerate(hierarchy.sizes) if size > 1]
    if sorted(names) != sorted(hierarchy.level_names[i] for i in spanned):
        raise UsageError(f"{step} must name each level of more than one member once")
    after = tuple(hierarchy.level_names.index(name) for name in names)
    before = tuple(machine.order[0])
    n = machine.data.shape[1]
    # The new place of each old place: where its block sits in the new layout.
    old_blocks, new_blocks = _blocks_at(hierarchy.sizes, before), _blocks_at(hierarchy.sizes, after)
    place_of_block = np.empty(n, dtype=np.int64)
    place_of_block[new_blocks] = np.arange(n)
    new_place = place_of_block[old_blocks]
    length = machine.hi - machine.lo
    bad = (length != 0) & (length != 1) & (length != n)
    if bad.any():
        rank = int(np.nonzero(bad)[0][0])
        raise _Failure(f"Permute reorders a whole buffer or places one block, and device {rank} holds "
                       f"[{machine.lo[rank]},{machine.hi[rank]})")
    reordered = np.empty_like(machine.data)
    reordered[:, new_place] = machine.data
    machine.data[...] = reordered
    single = length == 1
    machine.lo[single] = new_place[machine.lo[single]]
    machine.hi[single] = machine.lo[single] + 1
    machine.order[0] = after


def _step_groups(step: Step, hierarchy: SynthesisHierarchy) -> list[np.ndarray]:
    """The step's groups as member ranks, one (S, k) array per group size k >= 2."""
    if step.form not in FORMS:
        raise UsageError(f"unknown form {step.form!r} in step {step}: the forms are {', '.join(FORMS)}")
    if step.level not in hierarchy.level_names:
        known = ", ".join(hierarchy.level_names) or "none (the reduction group has one member)"
        raise UsageError(f"unknown level {step.level!r} in step {step}: the synthesis hierarchy's levels are {known}")
    groups, _ = FORMS[step.form](hierarchy.sizes, hierarchy.level_index(step.level))
    by_size: dict[int, list[tuple[int, ...]]] = {}
    for group in groups:
        if len(group) > 1:
            by_size.setdefault(len(group), []).append(tuple(group))
    return [np.asarray(same, dtype=np.int64) for _, same in sorted(by_size.items())]


def _apply(machine: _Machine, step: Step, hierarchy: SynthesisHierarchy, members: np.ndarray) -> None:
    if step.collective not in RECORDS:
        raise UsageError(f"unknown collective {step.collective!r} in step {step}: the collectives are {', '.join(RECORDS)}")
    buckets = _step_groups(step, hierarchy)
    if not buckets:
        raise _Failure("every group of this form has one member, so the step does nothing")
    record = collective(step.collective)
    join = record.combine is Combine.JOIN
    cuts = join or record.delivery is Delivery.BLOCKS or record.combine is Combine.EXCHANGE
    for groups in buckets:
        # (R, S, k) global ranks -> one row per (reduction group, step group).
        ranks = members[:, groups].reshape(-1, groups.shape[1])
        if machine.cuts_along_levels and cuts:
            _check_levels(machine, ranks, step, hierarchy, join, record.name)
        run_collective(machine, ranks, record)


def _check_levels(machine: _Machine, ranks: np.ndarray, step: Step, hierarchy: SynthesisHierarchy, join: bool,
                  name: str) -> None:
    """Where blocks move, a cut (or a join) follows the digits of the step's levels: the
    range, read in the buffers' level order, must be one value of its leading digits and
    every value of the rest, and the step's levels must be the first of the rest."""
    level = hierarchy.level_index(step.level)
    sizes = hierarchy.sizes
    if step.form == "InsideGroup":
        varying = tuple(i for i in range(level, len(sizes)) if sizes[i] > 1)
    else:
        varying = (level,) if sizes[level] > 1 else ()
    order = tuple(machine.order[0])
    for row in ranks:
        lo = int(machine.lo[row[0]])
        hi = int(machine.hi[row[-1]] if join else machine.hi[row[0]])
        if hi <= lo or (machine.lo[row] == machine.hi[row]).any():
            continue  # the collective's own precondition refuses it
        length, suffix, j = hi - lo, 1, len(order)
        while suffix < length and j > 0:
            j -= 1
            suffix *= sizes[order[j]]
        if suffix != length or lo % length or order[j:j + len(varying)] != varying:
            raise _Failure(f"{name} would cut the buffer across its level digits: devices {row.tolist()} span "
                           f"[{lo},{hi})")


def run_collective(machine: _Machine, ranks: np.ndarray, record: Collective) -> None:
    """One collective on every row of `ranks` (root first): its record's combine, then its delivery."""
    if record.combine is Combine.EXCHANGE:
        _exchange(machine, ranks, record.name)
        return
    data, lo, hi = _COMBINE[record.combine](machine, ranks, record.name)
    _DELIVER[record.delivery](machine, ranks, data, lo, hi, record.name)


def _describe(ranks: np.ndarray, machine: _Machine, row: int) -> str:
    held = ", ".join(
        f"{rank}:" + ("empty" if machine.lo[rank] == machine.hi[rank] else f"[{machine.lo[rank]},{machine.hi[rank]})")
        for rank in ranks[row].tolist()
    )
    return f"group of devices {ranks[row].tolist()} holds {held}"


def _first(bad: np.ndarray) -> int:
    return int(np.nonzero(bad)[0][0])


def _require_nonempty(machine: _Machine, ranks: np.ndarray, name: str) -> None:
    empty = (machine.lo[ranks] == machine.hi[ranks]).any(axis=1)
    if empty.any():
        raise _Failure(f"{name} needs data on every member, but a member is empty: {_describe(ranks, machine, _first(empty))}")


# --- combine: the result of each row, (B, N, E) data zero outside [lo, hi), and lo, hi (B,) ------


def _sum(machine: _Machine, ranks: np.ndarray, name: str):
    """One range on every member; the sum (counting twice shows up in the final comparison)."""
    _require_nonempty(machine, ranks, name)
    lo, hi = machine.lo[ranks], machine.hi[ranks]
    differ = ((lo != lo[:, :1]) | (hi != hi[:, :1])).any(axis=1)
    if differ.any():
        raise _Failure(f"{name} needs one range on every member: {_describe(ranks, machine, _first(differ))}")
    return machine.data[ranks].sum(axis=1), lo[:, 0], hi[:, 0]


def _join(machine: _Machine, ranks: np.ndarray, name: str):
    """Equal lengths, each block starting where the previous member's ends; the joined range."""
    _require_nonempty(machine, ranks, name)
    lo, hi = machine.lo[ranks], machine.hi[ranks]
    unequal = ((hi - lo) != (hi - lo)[:, :1]).any(axis=1)
    if unequal.any():
        raise _Failure(f"{name} needs equal range lengths on every member: {_describe(ranks, machine, _first(unequal))}")
    gap = (lo[:, 1:] != hi[:, :-1]).any(axis=1)
    if gap.any():
        raise _Failure(
            f"{name} needs each member's range to start where the previous member's ends: {_describe(ranks, machine, _first(gap))}"
        )
    # Zero outside held ranges and the blocks are disjoint, so the join is a sum.
    return machine.data[ranks].sum(axis=1), lo[:, 0], hi[:, -1]


def _root(machine: _Machine, ranks: np.ndarray, name: str):
    root = ranks[:, 0]
    empty = machine.lo[root] == machine.hi[root]
    if empty.any():
        raise _Failure(f"{name} needs data on its root (the group's first member): {_describe(ranks, machine, _first(empty))}")
    return machine.data[root].copy(), machine.lo[root].copy(), machine.hi[root].copy()


# --- delivery: who holds what of the result ----------------------------------------------------------


def _to_every(machine: _Machine, ranks: np.ndarray, data, lo, hi, name: str) -> None:
    machine.data[ranks] = data[:, None]
    machine.lo[ranks] = lo[:, None]
    machine.hi[ranks] = hi[:, None]


def _to_root(machine: _Machine, ranks: np.ndarray, data, lo, hi, name: str) -> None:
    root, others = ranks[:, 0], ranks[:, 1:]
    machine.data[root] = data
    machine.lo[root], machine.hi[root] = lo, hi
    machine.data[others] = 0
    machine.lo[others] = 0
    machine.hi[others] = 0


def _to_blocks(machine: _Machine, ranks: np.ndarray, data, lo, hi, name: str) -> None:
    k = ranks.shape[1]
    uneven = (hi - lo) % k != 0
    if uneven.any():
        row = _first(uneven)
        raise _Failure(f"{name} over {k} members cannot split a range of {hi[row] - lo[row]} chunks evenly: {_describe(ranks, machine, row)}")
    block = (hi - lo) // k
    new_lo = lo[:, None] + np.arange(k)[None, :] * block[:, None]  # (B, k)
    new_hi = new_lo + block[:, None]
    chunks = np.arange(machine.data.shape[1])
    keep = (chunks >= new_lo[..., None]) & (chunks < new_hi[..., None])  # (B, k, N)
    machine.data[ranks] = data[:, None] * keep[..., None]
    machine.lo[ranks], machine.hi[ranks] = new_lo, new_hi


_COMBINE = {Combine.SUM: _sum, Combine.JOIN: _join, Combine.ROOT: _root}
_DELIVER = {Delivery.EVERY: _to_every, Delivery.ROOT: _to_root, Delivery.BLOCKS: _to_blocks}


def _exchange(machine: _Machine, ranks: np.ndarray, name: str) -> None:
    """AllToAll: one range on every member, cut into k blocks; block j of member i becomes
    block i of member j."""
    _require_nonempty(machine, ranks, name)
    lo, hi = machine.lo[ranks], machine.hi[ranks]
    differ = ((lo != lo[:, :1]) | (hi != hi[:, :1])).any(axis=1)
    if differ.any():
        raise _Failure(f"{name} needs one range on every member: {_describe(ranks, machine, _first(differ))}")
    k = ranks.shape[1]
    uneven = (hi[:, 0] - lo[:, 0]) % k != 0
    if uneven.any():
        row = _first(uneven)
        raise _Failure(f"{name} over {k} members cannot split a range of {hi[row, 0] - lo[row, 0]} chunks evenly: "
                       f"{_describe(ranks, machine, row)}")
    for row in range(ranks.shape[0]):
        start, stop = int(lo[row, 0]), int(hi[row, 0])
        block = (stop - start) // k
        held = machine.data[ranks[row], start:stop].reshape(k, k, block, -1)  # (member, block, chunk, element)
        machine.data[ranks[row], start:stop] = np.swapaxes(held, 0, 1).reshape(k, stop - start, -1)
