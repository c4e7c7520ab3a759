"""Reduction groups (docs/model.md section 3) and synthesis hierarchies (docs/model.md section 4).

A request reduces over a set R of axes; devices agreeing on every other axis form one
reduction group. A synthesis hierarchy names the levels a program is written over and gives
each group member a position per level; its rank in the group is the mixed-radix number of
its position, outermost first.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from synth.errors import UsageError
from synth.names import echo, product
from synth.placement import Placement

HIERARCHY_KINDS = ("merged", "split", "system")


@dataclass(frozen=True)
class HierarchyLevel:
    """A level of a synthesis hierarchy: its name in program text, its size (members per
    parent), the system level it lives in, and the reduced axes whose digits make it up."""

    name: str
    size: int
    system_level: int
    axes: tuple[int, ...]


def parse_reduce(text: str, placement_axes: tuple[str, ...]) -> tuple[str, ...]:
    """`data` or `data,model` into axis names in axis order, each known and named once."""
    known = ", ".join(placement_axes)
    parts = [part.strip() for part in str(text).split(",")]
    if not any(parts):
        raise UsageError(f"{echo(text)} names no axis: give one or more of {known}, joined by commas")
    if not all(parts):
        raise UsageError(f"{echo(text)} has an empty axis name: give one or more of {known}, joined by commas "
                         f"(e.g. {','.join(placement_axes[:2])})")
    for name in parts:
        if name not in placement_axes:
            raise UsageError(f"unknown axis {echo(name)}; the axes are {known}")
    if len(set(parts)) != len(parts):
        raise UsageError(f"{echo(text)} names an axis twice")
    return tuple(name for name in placement_axes if name in parts)


@dataclass(frozen=True)
class SynthesisHierarchy:
    """The hierarchy a program is written over, for one placement and one request."""

    placement: Placement
    reduce_axes: tuple[str, ...]
    kind: str
    levels: tuple[HierarchyLevel, ...]

    @property
    def level_names(self) -> tuple[str, ...]:
        return tuple(level.name for level in self.levels)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(level.size for level in self.levels)

    @property
    def group_size(self) -> int:
        """N, the number of members of each reduction group."""
        return product(self.sizes)

    def level_index(self, name: str) -> int:
        for index, level in enumerate(self.levels):
            if level.name == name:
                return index
        known = ", ".join(self.level_names) or "none: the reduction group has one member"
        raise UsageError(f"unknown level {echo(name)} in the {self.kind} hierarchy; its levels are {known}")

    @cached_property
    def positions(self) -> np.ndarray:
        """`positions[rank, i]`: the device's position p_i at hierarchy level i."""
        digits = self.placement.digits
        result = np.zeros((self.placement.device_count, len(self.levels)), dtype=np.int64)
        for i, level in enumerate(self.levels):
            radices = [self.placement.matrix[a][level.system_level] for a in level.axes]
            result[:, i] = np.ravel_multi_index(tuple(digits[:, a, level.system_level] for a in level.axes), radices)
        return result

    @cached_property
    def member_ranks(self) -> np.ndarray:
        """`member_ranks[rank]`: the device's rank inside its reduction group."""
        if not self.levels:
            return np.zeros(self.placement.device_count, dtype=np.int64)
        return np.ravel_multi_index(tuple(self.positions.T), self.sizes)

    @cached_property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        """Each reduction group as global ranks, indexed by member rank; groups in the order
        of the other axes' coordinates (row-major)."""
        result = []
        for group in self.placement.groups_over(self.reduce_axes):
            ordered = [0] * len(group)
            for rank in group:
                ordered[int(self.member_ranks[rank])] = rank
            result.append(tuple(ordered))
        return tuple(result)


def group_devices(hierarchy: SynthesisHierarchy) -> np.ndarray:
    """`hierarchy.groups` as a [group, member rank] array of device ranks, computed from the
    placement's digits without keeping its per-device tables (`Placement.digits`, `positions`,
    `member_ranks`) or a Python integer per device: a cost context of 131,072 devices kept
    those for the whole search, about 18 MB each. A device's group is its row-major index
    over the other axes (`Placement.groups_over`' order), its member rank `member_ranks`'."""
    placement = hierarchy.placement
    matrix, level_sizes = placement.matrix, placement.level_sizes
    ranks = np.arange(placement.device_count, dtype=np.int64)
    axes = len(placement.axis_sizes)
    coords = np.unravel_index(ranks, level_sizes) if level_sizes else (np.zeros_like(ranks),)
    digits = [[None] * len(level_sizes) for _ in range(axes)]  # [axis][level] -> each device's digit
    for level in range(len(level_sizes)):
        split = np.unravel_index(coords[level], [matrix[a][level] for a in range(axes)])
        for a in range(axes):
            digits[a][level] = split[a]

    def axis_coordinate(a: int) -> np.ndarray:
        return np.ravel_multi_index(tuple(digits[a]), matrix[a]) if level_sizes else np.zeros_like(ranks)

    inside = {placement.axis_index(name) for name in hierarchy.reduce_axes}
    outside = [a for a in range(axes) if a not in inside]
    group = (np.ravel_multi_index(tuple(axis_coordinate(a) for a in outside), [placement.axis_sizes[a] for a in outside])
             if outside else np.zeros_like(ranks))
    if hierarchy.levels:
        positions = [np.ravel_multi_index(tuple(digits[a][level.system_level] for a in level.axes),
                                          [matrix[a][level.system_level] for a in level.axes])
                     for level in hierarchy.levels]
        member = np.ravel_multi_index(tuple(positions), hierarchy.sizes)
    else:
        member = np.zeros_like(ranks)
    devices = np.empty((placement.device_count // hierarchy.group_size, hierarchy.group_size), dtype=np.int64)
    devices[group, member] = ranks
    return devices


def build_hierarchy(placement: Placement, reduce_axes: tuple[str, ...], kind: str = "merged") -> SynthesisHierarchy:
    """docs/model.md section 4: `merged` (default), `split` or `system`."""
    if kind not in HIERARCHY_KINDS:
        raise UsageError(f"unknown hierarchy {kind!r}: choose one of {', '.join(HIERARCHY_KINDS)}")
    reduced = tuple(placement.axis_index(name) for name in reduce_axes)
    if not reduced:
        raise UsageError("a reduction request needs at least one axis")
    matrix, levels = placement.matrix, []
    for l, level_name in enumerate(placement.level_names):
        factor = product(matrix[a][l] for a in reduced)
        if kind == "merged" and factor > 1:
            levels.append(HierarchyLevel(level_name, factor, l, reduced))
        elif kind == "system":
            # Every system level, restricted to the group: a level the group does not span has
            # size 1 and adds no distinct instruction; names stay those of the system.
            levels.append(HierarchyLevel(level_name, factor, l, reduced))
        elif kind == "split":
            for a in reduced:
                if matrix[a][l] > 1:
                    levels.append(HierarchyLevel(f"{level_name}.{placement.axis_names[a]}", matrix[a][l], l, (a,)))
    return SynthesisHierarchy(placement, tuple(placement.axis_names[a] for a in reduced), kind, tuple(levels))
