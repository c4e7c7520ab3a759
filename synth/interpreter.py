"""A reference interpreter: runs a program on real numbers over every device of the system.

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

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from synth.collectives import RECORDS, Collective, Combine, Delivery, collective
from synth.errors import InvalidProgramError, UsageError
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

    def snapshot(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.lo.copy(), self.hi.copy(), self.data.copy()

    def same_as(self, snapshot) -> bool:
        lo, hi, data = snapshot
        return np.array_equal(self.lo, lo) and np.array_equal(self.hi, hi) and np.array_equal(self.data, data)


def run_reference(program: Program, hierarchy: SynthesisHierarchy, chunk_elems: int = 3, seed: int = 0) -> ReferenceResult:
    """Run `program` on every device with real data; InvalidProgramError when a step's
    precondition fails, a step changes nothing, the goal is reached before the last step, or
    a final buffer differs from the direct sum over its reduction group."""
    if chunk_elems < 1:
        raise UsageError(f"chunk_elems {chunk_elems}: give at least one element per chunk")
    members = np.asarray(hierarchy.groups, dtype=np.int64)  # (R, N): global rank by member rank
    group_count, n = members.shape
    devices = hierarchy.placement.device_count
    rng = np.random.default_rng(seed)
    initial = rng.integers(-VALUE_BOUND, VALUE_BOUND, size=(devices, n, chunk_elems), dtype=np.int64)
    # The direct sum over each reduction group, laid out per device.
    expected = np.empty_like(initial)
    expected[members] = initial[members].sum(axis=1)[:, None]

    machine = _Machine(np.zeros(devices, dtype=np.int64), np.full(devices, n, dtype=np.int64), initial.copy())
    for index, step in enumerate(program.steps):
        if index > 0 and _at_goal(machine, expected, n):
            raise InvalidProgramError(
                f"step {index + 1} {step}: the goal was already reached after step {index}; drop the remaining steps", index
            )
        before = machine.snapshot()
        try:
            _apply(machine, step, hierarchy, members)
        except _Failure as failure:
            raise InvalidProgramError(f"step {index + 1} {step} is invalid: {failure}", index) from None
        if machine.same_as(before):
            raise InvalidProgramError(f"step {index + 1} {step} is invalid: the step changes nothing (a no-op)", index)

    _check_final(machine, expected, members, n, len(program.steps))
    error = int(np.abs(machine.data - expected).max()) if machine.data.size else 0
    return ReferenceResult(ok=True, max_abs_error=error, devices=devices, groups=group_count)


def _at_goal(machine: _Machine, expected: np.ndarray, n: int) -> bool:
    return bool((machine.lo == 0).all() and (machine.hi == n).all() and np.array_equal(machine.data, expected))


def _check_final(machine: _Machine, expected: np.ndarray, members: np.ndarray, n: int, steps: int) -> None:
    """Every device must hold [0, N) equal to the direct sum; name the first one that does not."""
    group_of = np.empty(machine.lo.shape[0], dtype=np.int64)
    group_of[members] = np.arange(members.shape[0])[:, None]
    member_of = np.empty_like(group_of)
    member_of[members] = np.arange(members.shape[1])[None, :]

    def where(rank: int) -> str:
        return f"device {rank} (member {member_of[rank]} of reduction group {group_of[rank]})"

    short = np.nonzero((machine.lo != 0) | (machine.hi != n))[0]
    if short.size:
        rank = int(short[0])
        held = "nothing" if machine.lo[rank] == machine.hi[rank] else f"chunks [{machine.lo[rank]},{machine.hi[rank]})"
        raise InvalidProgramError(
            f"the program ends before the goal: {where(rank)} holds {held}, not [0,{n}) ({short.size} device(s) short)", steps
        )
    wrong = np.nonzero((machine.data != expected).any(axis=2))
    if wrong[0].size:
        rank, chunk = int(wrong[0][0]), int(wrong[1][0])
        raise InvalidProgramError(
            f"the program ends with a wrong sum: {where(rank)} chunk {chunk} holds {machine.data[rank, chunk].tolist()}, "
            f"the direct sum over its reduction group is {expected[rank, chunk].tolist()} "
            f"({wrong[0].size} wrong chunk(s) in all; some member's data was counted twice or lost)",
            steps,
        )


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
    for groups in buckets:
        # (R, S, k) global ranks -> one row per (reduction group, step group).
        ranks = members[:, groups].reshape(-1, groups.shape[1])
        run_collective(machine, ranks, record)


def run_collective(machine: _Machine, ranks: np.ndarray, record: Collective) -> None:
    """One collective on every row of `ranks` (root first): its record's combine, then its delivery."""
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
