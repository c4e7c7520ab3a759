"""Rank-level plans: what every global rank calls at every step, shared by all exporters.

`synth.lowering` writes a program once, in member ranks of one reduction group. Runnable code
needs the opposite view: for each global rank, which communicator it joins, as which rank
inside it, and which part of its buffer it passes. This module makes that view once so the
torch script, the C file and the JSON plan cannot disagree; offsets, counts and roots come
from the lowering unchanged (nothing here re-derives the semantics).

A communicator set is the set of groups one step calls at once, over every reduction group:
an NCCL split of the world communicator with color = group index and key = member index
(so the root, the first member, is rank 0 inside its communicator). Steps with equal sets
share one set, across every program of a plan, so a batch builds each communicator once;
each program also names the set of its reduction groups, which checks and baselines use.
"""

from __future__ import annotations

from dataclasses import dataclass

from synth.collectives import collective
from synth.errors import ExportTooLargeError, UsageError
from synth.goals import ALL_REDUCE, Goal, parse_goal
from synth.hierarchy import SynthesisHierarchy
from synth.language import Program
from synth.lowering import lower
from synth.names import check_name

ITEMSIZE = 4  # float32, the type every export uses (as nccl-tests' default)
DTYPE = "float32"


@dataclass(frozen=True)
class CommunicatorSet:
    """Disjoint groups of global ranks, each ordered root first; ranks in no group are idle."""

    groups: tuple[tuple[int, ...], ...]

    def color(self, rank: int) -> int | None:
        for index, group in enumerate(self.groups):
            if rank in group:
                return index
        return None

    def colors(self, world_size: int) -> tuple[int | None, ...]:
        result: list[int | None] = [None] * world_size
        for index, group in enumerate(self.groups):
            for rank in group:
                result[rank] = index
        return tuple(result)

    def keys(self, world_size: int) -> tuple[int | None, ...]:
        result: list[int | None] = [None] * world_size
        for group in self.groups:
            for key, rank in enumerate(group):
                result[rank] = key
        return tuple(result)


@dataclass(frozen=True)
class RankCall:
    """One rank's call in one step: its group (color), its rank in it (key), the chunk range
    [lo, hi) the call spans (GroupCall's meaning) and the root's key for Reduce/Broadcast."""

    color: int
    key: int
    size: int
    lo: int
    hi: int
    root: int | None


@dataclass(frozen=True)
class Buffers:
    """A call's in-place pointers as NCCL takes them, in elements from the buffer start."""

    offset: int
    count: int
    send_offset: int
    send_count: int
    recv_offset: int
    recv_count: int


def call_buffers(name: str, call: RankCall, chunk_count: int) -> Buffers:
    """Element offsets and counts of one call (NCCL's in-place layout): a collective that
    delivers blocks receives block `key` of the range (ReduceScatter), one that joins sends
    block `key` of it (AllGather), the others act on the whole range."""
    record = collective(name)
    offset, count = call.lo * chunk_count, (call.hi - call.lo) * chunk_count
    block = count // call.size
    send = (offset + call.key * block, block) if record.block_of_input() else (offset, count)
    receive = (offset + call.key * block, block) if record.block_of_output() else (offset, count)
    return Buffers(offset, count, *send, *receive)


@dataclass(frozen=True)
class PlanStep:
    text: str
    collective: str
    communicator: int  # -1 for a Permute (no communicator)
    calls: tuple[RankCall | None, ...]  # indexed by global rank; None: idle in this step
    # A Permute: every rank moves the chunk at place p of its buffer to place places[p].
    places: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ProgramPlan:
    label: str
    text: str  # canonical printed form
    chunks: int  # N, the reduction group size
    reduction: int  # communicator set of the reduction groups (check and baseline)
    steps: tuple[PlanStep, ...]
    goal: Goal = ALL_REDUCE  # the collective the program computes (synth/goals.py)
    # reduce-scatter: the place where block r (the member's own) ends; None: in place
    final_places: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Plan:
    world_size: int
    communicators: tuple[CommunicatorSet, ...]
    programs: tuple[ProgramPlan, ...]


@dataclass(frozen=True)
class PlanEntry:
    """A program to plan, with the hierarchy it is written over and a label for reports."""

    hierarchy: SynthesisHierarchy
    program: Program
    label: str = ""
    goal: Goal = ALL_REDUCE  # a name is parsed here, where a caller builds the entry

    def __post_init__(self):
        object.__setattr__(self, "goal", parse_goal(self.goal))


def check_hierarchy_names(hierarchy: SynthesisHierarchy) -> None:
    """Names reach generated files: refuse anything but identifiers, whoever built the objects."""
    placement = hierarchy.placement
    for name in placement.level_names:
        check_name(name, "level")
    for name in placement.axis_names:
        check_name(name, "axis")
    for level in hierarchy.levels:
        for part in level.name.split("."):
            check_name(part, "hierarchy level")


# Rank-steps (devices x steps, over every program written) a torch script or NCCL C file may
# list: each is a row of the file. 131,072 devices x 2 steps took 16-20 s and wrote 10 MB
# (2 loaded cores); 2^20 devices ran past 90 s. Twice that, for about half a minute.
MAX_RANK_STEPS = 1 << 19
RANK_STEP_BYTES = 37  # what one rank-step adds to a torch script (measured as above)


def check_export_size(device_count: int, programs, what: str) -> None:
    """Refuse, before any per-rank work, an export listing more rank-steps than MAX_RANK_STEPS:
    a script for a million devices would take minutes to build without a word. `programs`
    None: not yet chosen (a ranking would pick them), counted as one step, the fewest."""
    steps = 1 if programs is None else sum(len(program) for program in programs)
    rank_steps = device_count * steps
    if rank_steps > MAX_RANK_STEPS:
        size = rank_steps * RANK_STEP_BYTES / (1 << 20)
        least = "at least " if programs is None else ""
        raise ExportTooLargeError(
            f"{what} for {device_count:,} devices lists every rank at each of {least}{steps} step(s): {rank_steps:,} "
            f"rank-steps (about {size:,.0f} MiB, minutes to build; at most {MAX_RANK_STEPS:,}): export for fewer "
            f"devices (at most {max(1, MAX_RANK_STEPS // max(steps, 1)):,} for these programs) or fewer programs")


def build_plan(entries) -> Plan:
    """Lower every entry (InvalidProgramError if one is not valid) and map it to global ranks,
    interning equal communicator sets across all programs of the plan."""
    entries = list(entries)
    if not entries:
        raise UsageError("nothing to export: give at least one program")
    world_size = entries[0].hierarchy.placement.device_count
    interned: dict[tuple, int] = {}
    communicators: list[CommunicatorSet] = []

    def intern(groups) -> int:
        key = tuple(sorted(tuple(group) for group in groups))
        if key not in interned:
            interned[key] = len(communicators)
            communicators.append(CommunicatorSet(key))
        return interned[key]

    programs = []
    for entry in entries:
        hierarchy = entry.hierarchy
        check_hierarchy_names(hierarchy)
        if hierarchy.placement.device_count != world_size:
            raise UsageError(
                f"one plan runs on one world: {entry.label or entry.program} needs "
                f"{hierarchy.placement.device_count} devices, the first entry {world_size}"
            )
        if hierarchy.group_size < 2:
            raise UsageError(f"reducing over {','.join(hierarchy.reduce_axes)} involves one device per group: there is nothing to run")
        lowered = lower(entry.program, hierarchy, entry.goal)
        reduction = intern(hierarchy.groups)
        steps = []
        for lowered_step in lowered.steps:
            if lowered_step.places is not None:
                steps.append(PlanStep(str(lowered_step.step), lowered_step.collective, -1, (None,) * world_size,
                                      lowered_step.places))
                continue
            groups, calls = [], [None] * world_size
            for reduction_group in hierarchy.groups:
                for call in lowered_step.calls:
                    ranks = tuple(int(reduction_group[m]) for m in call.members)
                    groups.append(ranks)
                    root = 0 if collective(lowered_step.collective).rooted else None
                    for key, rank in enumerate(ranks):
                        calls[rank] = (ranks, key, call.lo, call.hi, root)
            index = intern(groups)
            comm = communicators[index]
            color = {group: position for position, group in enumerate(comm.groups)}  # not .index: W^2/g
            rank_calls = []
            for value in calls:
                if value is None:
                    rank_calls.append(None)
                    continue
                ranks, key, lo, hi, root = value
                rank_calls.append(RankCall(color[ranks], key, len(ranks), lo, hi, root))
            steps.append(PlanStep(str(lowered_step.step), lowered_step.collective, index, tuple(rank_calls)))
        programs.append(ProgramPlan(entry.label, str(entry.program), hierarchy.group_size, reduction, tuple(steps),
                                    lowered.goal, lowered.final_places))
    return Plan(world_size, tuple(communicators), tuple(programs))


def buffer_count(nbytes: int, chunks: int) -> int:
    """Elements per device: the smallest multiple of `chunks` elements holding `nbytes` (so
    every chunk is whole elements), at least one element per chunk."""
    per_chunk = max(1, -(-nbytes // (ITEMSIZE * chunks)))
    return per_chunk * chunks
