"""Link contention between overlapped communication and the communication on the critical path.

An overlapped collective (the data-parallel gradient reduction behind backward, the sharded
optimizer's weight all-gather behind the next forward, ZeRO-3's per-layer gathers and
scatters behind compute, the interleaved schedule's pipeline transfers behind the next chunk)
is hidden from the step only as far as compute is concerned: while it
runs, it also occupies links, and a critical-path collective (tensor-parallel, context-parallel
or expert-parallel) that crosses the same links gets less bandwidth and takes longer.

Which links a collective uses follows from its groups' span per system level (synth/topology.py's
Level: a message crosses the links of the outermost level at which its endpoints differ, so a
collective whose groups span `f_l > 1` units at level l moves data over level l's links, and
over no level where `f_l = 1`). The critical-path collective is paced by its slowest spanned
level (the least bandwidth per device); it shares that level with the background collective
when the background's groups span it too. While the background runs it takes the share

    u = min(1, B_bytes / (B_seconds x C_l))

of the level's per-device capacity `C_l` (the level's bandwidth, or its uplinks' shared by the
devices below them when less), `B_bytes` being what the background moves per device (a
reduce-scatter or all-gather of S bytes over n members moves S (n-1)/n, an all-reduce twice
that) in its own time `B_seconds`: a background paced by a slower level elsewhere takes little
of this one. The foreground then runs at `1 - u` of its bandwidth, never less than half (the
two share a saturated link equally: NCCL's channels are served alike), so a foreground of `t`
seconds, overlapping a background that is busy a fraction `busy` of the window, takes

    extra = t x busy x min(u / (1 - u), 1)

more. Only the bandwidth-bound time is stretched in reality; the whole call is stretched here
(an upper bound for small calls). The background's own delay (it gets less bandwidth too) is
not added: it is hidden unless the background was already close to exposed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from synth.placement import Placement


@dataclass(frozen=True)
class Background:
    """An overlapped collective: its groups' axes, bytes moved per device, its busy seconds and
    the fraction of the foreground's window it is busy."""

    axes: tuple[str, ...]
    bytes_moved: float
    seconds: float
    busy: float


def moved_bytes(size: float, members: int, all_reduce: bool = False) -> float:
    """Bytes one device sends in a ring reduce-scatter or all-gather of `size` (twice with all-reduce)."""
    if members <= 1:
        return 0.0
    return size * (members - 1) / members * (2 if all_reduce else 1)


def level_capacity(topology, level: int) -> float:
    """Bytes/s per device, one direction, on `level`'s links (its uplinks shared by the devices below them
    when they are narrower), or inf when the topology states no figure."""
    spec = topology.levels[level]
    capacity = spec.bandwidth.value if spec.bandwidth is not None else math.inf
    if spec.uplinks is not None:
        below = math.prod(topology.sizes[level + 1:])
        capacity = min(capacity, spec.uplinks.count * spec.uplinks.bandwidth.value / below)
    return capacity


def shared_share(costs, placement: Placement, foreground_axes: tuple[str, ...], background: Background) -> float:
    """`u` (module docstring): the share of the foreground's slowest level the background takes
    while it runs; 0 when the background's groups do not span that level."""
    if background.seconds <= 0 or background.bytes_moved <= 0:
        return 0.0
    topology = costs.topology
    fg = costs.factors(placement, foreground_axes)
    spanned = [level for level, factor in enumerate(fg) if factor > 1]
    if not spanned:
        return 0.0
    slowest = min(spanned, key=lambda level: level_capacity(topology, level))
    if costs.factors(placement, background.axes)[slowest] <= 1:
        return 0.0
    capacity = level_capacity(topology, slowest)
    if math.isinf(capacity):
        return 0.0
    return min(1.0, background.bytes_moved / (background.seconds * capacity))


def stretch(seconds: float, share: float, busy: float) -> float:
    """The extra seconds of a foreground of `seconds` sharing its link (module docstring)."""
    if seconds <= 0 or share <= 0 or busy <= 0:
        return 0.0
    factor = 1.0 if share >= 0.5 else share / (1 - share)
    return seconds * min(1.0, busy) * factor


def extra_seconds(costs, placement: Placement, foreground: dict[tuple[str, ...], float],
                  background: Background) -> float:
    """The critical-path collectives' extra seconds (by their axes, or folded expert groups:
    synth/plan/folding.py) while `background` runs."""
    return sum(stretch(seconds, shared_share(costs, placement, axes, background), background.busy)
               for axes, seconds in foreground.items()
               if seconds > 0 and (not isinstance(axes, tuple) or all(axis in placement.axis_names for axis in axes)))
