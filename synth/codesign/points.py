"""The grid's points, expanded lazily: a grid of millions of points is never held in memory."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from synth.codesign.grid import NCCL_AXES, Grid


@dataclass(frozen=True)
class Point:
    """One (system, model, planner choices) of the grid: `values` are (axis name, value) pairs in
    the grid's axis order; `index` its place in the grid's order (the last axis fastest)."""

    index: int
    values: tuple[tuple[str, object], ...]

    @property
    def key(self) -> str:
        """What identifies the point across runs (resume): its values, not its index, so that a
        grid given another axis order or a value more still finds its finished points."""
        return ";".join(f"{name}={value!r}" for name, value in sorted(self.values))

    def get(self, name: str, default=None):
        return next((value for axis, value in self.values if axis == name), default)

    def system_values(self) -> tuple[tuple[str, object], ...]:
        """The values that make the system (base topology, device, NCCL settings, level figures)."""
        return tuple((name, value) for name, value in self.values
                     if name in ("topology", "device", *NCCL_AXES) or "." in name and not name.startswith("plan."))


def points(grid: Grid, start: int = 0) -> Iterator[Point]:
    """The grid's points in order from `start`, one at a time."""
    names = [axis.name for axis in grid.axes]
    product = itertools.product(*(axis.values for axis in grid.axes))
    for index, values in enumerate(itertools.islice(product, start, None), start):
        yield Point(index, tuple(zip(names, values)))


def chunks(items: Iterator, size: int) -> Iterator[tuple]:
    """Consecutive items in tuples of `size` (the last may be shorter): one task per chunk, so that
    neighbouring points (the same system) land on the same worker and its memo."""
    iterator = iter(items)
    while True:
        chunk = tuple(itertools.islice(iterator, size))
        if not chunk:
            return
        yield chunk
