"""A lower bound on the time of any correct all-reduce, per (placement, request, size).

Bytes that must cross a cut. Take the units of one system level and a reduction group of N
members that meets q >= 2 of them, m = N/q members in each (groups are products, docs/model.md
section 3, so every unit it meets holds the same number). Treat each unit's members as one
party that combines its own data for free: what is left is an all-reduce of S bytes among q
parties, and any such all-reduce moves at least 2(q-1) * S bytes between parties in total,
q-1 transfers per element to bring every contribution to a first complete sum and one more
into each of the other q-1 parties (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce
algorithms for clusters of workstations", JPDC 69(2), the bound their ring attains). So the
busiest of the q units sends at least

    2(q-1)/q * S = 2(N-m)/N * S    (= 2(N-1)/N * S for m = 1: the classic per-device bound)

and, since every unit of a level has the same links, the average over the level's units of
the bytes all groups send out of them is a bound on the busiest one:

    out >= max( sum over groups of 2(q_g - 1) * S / (units of the level),
                max over units of (groups crossing it) * S )

the second term because each unit a group crosses must send at least S (the others need its
contribution to every element, and cannot get it compressed) and receive as many. 2(N-m)/N
>= 1 whenever 0 < m < N, so the first term is the larger for the uniform groups of docs/model.md
section 3; both are kept so the bound stays sound on any group layout.

Capacity of the cut. A message between two members uses the links of the outermost level
their coordinates differ at, which is never outer than s, the outermost level the group
spans. So everything a group sends out of a unit of level l goes through its devices' links
of levels s..l and through the uplinks of the unit and of every unit inside it that holds
the sender; the unit's exit capacity is the min-cut

    cap(device) = sum over levels s <= j <= l of bandwidth_j   (capped by innermost uplinks)
    cap(unit at level i) = min(uplinks_i, size_{i+1} * cap(unit at level i+1))

counting every device of the unit (members of other groups too: their traffic is in the sum).
Entering is symmetric (same links in the other direction, same bytes), so it gives the same
bound. The time bound is the largest bytes/capacity over the levels, plus one latency of the
outermost level the group spans: at least one message must cross it.

A switch that reduces (NVLink SHARP, NVLS: the topology's `[nccl]` table says `nvls` and the
innermost level's link is an NVSwitch) is a party that computes: a device need only send its
S into it and receive the sum, so at the cut around each device only the second term holds
(S out of every device). NCCL's NVLS all-reduce moves S + S/k through each GPU's port.

The bound is affine in S (every byte count above is a multiple of S), so it is computed once
per context as a line: `time(S) = latency + S * seconds per byte`.

The achievable bound (`achievable_line`) is the same cut with each level's links (and uplinks)
at the rate NCCL reaches on them instead of their line rate: the efficiency the NCCL model
charges on that level (synth/model/nccl/hardware.py level_efficiencies: NCCL's own per-link
figure, e.g. 20 of 25 GB/s per NVLink3 link, or a calibrated one), and NVLS's efficiency where
the switch reduces. The cost model charges those efficiencies, so a program can reach the
achievable bound but not the physical one: the achievable ratio says whether synthesis left
speed behind, the physical ratio what the hardware would allow.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from synth.model.context import CostContext
from synth.topology import Topology


@dataclass(frozen=True)
class LowerBound:
    bytes_per_device: int
    time_s: float
    transfer_s: float
    latency_s: float
    bottleneck: str  # the cut that gives the bound, e.g. "node units: 1.5 S out through 200 GB/s"


@dataclass(frozen=True)
class BoundLine:
    """The lower bound of one context at every size: latency + S * seconds_per_byte."""

    latency_s: float
    seconds_per_byte: float
    bottleneck: str

    def at(self, bytes_per_device: int) -> LowerBound:
        transfer = bytes_per_device * self.seconds_per_byte
        return LowerBound(bytes_per_device, self.latency_s + transfer, transfer, self.latency_s, self.bottleneck)

    def times(self, sizes) -> np.ndarray:
        return self.latency_s + np.asarray(sizes, dtype=np.int64) * self.seconds_per_byte


def exit_capacity(topology: Topology, level: int, spanned: int = 0, rates: tuple[float, ...] | None = None) -> float:
    """Bytes/s that can leave one unit of `level` towards members of groups whose outermost
    spanned level is `spanned` (the min-cut described in the module docstring); `rates`, per
    level, the share of its line rate counted (1: the line rate)."""
    levels = topology.levels
    rates = rates or (1.0,) * len(levels)
    capacity = sum(levels[j].bandwidth.value * rates[j] for j in range(spanned, level + 1))
    for inner in range(len(levels) - 1, level - 1, -1):
        if inner < len(levels) - 1:
            capacity *= levels[inner + 1].size
        uplinks = levels[inner].uplinks
        if uplinks is not None:
            capacity = min(capacity, uplinks.count * uplinks.bandwidth.value * rates[inner])
    return capacity


def reduces_in_switch(topology: Topology) -> bool:
    """Whether the switch joining the innermost level's devices reduces (NVLS, module docstring)."""
    innermost = topology.levels[-1]
    return (topology.nccl is not None and topology.nccl.nvls and innermost.link is not None
            and innermost.link.kind == "nvswitch")


def required_bytes(context: CostContext, level: int) -> float:
    """Bytes per byte of S that must leave the busiest unit of a system level, over all groups."""
    coords = context.network.coords[context.devices]  # [group, member, level]
    sizes = context.topology.sizes[: level + 1]
    unit_ids = np.ravel_multi_index(tuple(np.moveaxis(coords[:, :, : level + 1], -1, 0)), sizes)
    total, crossing = 0.0, np.zeros(int(np.prod(sizes)), dtype=np.int64)
    for row in unit_ids:
        met = np.flatnonzero(np.bincount(row, minlength=len(crossing)))  # units met (np.unique imports numpy.ma)
        if len(met) >= 2:
            total += 2 * (len(met) - 1)
            crossing[met] += 1
    if level == len(context.topology.levels) - 1 and reduces_in_switch(context.topology):
        return float(crossing.max())  # the devices' switch reduces: S in and out of each device
    return max(total / len(crossing), float(crossing.max()))


@lru_cache(maxsize=1024)
def bound_line(context: CostContext) -> BoundLine:
    """The busiest cut's time for the bytes any correct all-reduce moves across it, per byte."""
    return _line(context, None)


@lru_cache(maxsize=1024)
def achievable_line(context: CostContext) -> BoundLine:
    """The bound with every link at the rate NCCL reaches on it (module docstring); the
    physical bound where the topology has no NCCL figures."""
    from synth.model.nccl.hardware import level_efficiencies

    rates = level_efficiencies(context.topology)
    return _line(context, rates)


def _line(context: CostContext, rates: tuple[float, ...] | None) -> BoundLine:
    topology = context.topology
    if context.group_size == 1:
        return BoundLine(0.0, 0.0, "")
    coords = context.network.coords[context.devices[0]]
    spanned = next(l for l in range(coords.shape[1]) if len(set(coords[:, l].tolist())) > 1)
    best, best_level, best_bytes = 0.0, spanned, 0.0
    for level in range(spanned, len(topology.levels)):  # outer units hold whole groups
        needed = required_bytes(context, level)
        seconds = needed / exit_capacity(topology, level, spanned, rates)
        if seconds > best:
            best, best_level, best_bytes = seconds, level, needed
    name = topology.levels[best_level].name
    described = (f"{name} units: {best_bytes:.3g} S out through "
                 f"{exit_capacity(topology, best_level, spanned, rates) / 1e9:.4g} GB/s")
    return BoundLine(topology.levels[spanned].latency.value, best, described)


def achievable_bound(context: CostContext, bytes_per_device: int) -> LowerBound:
    """The achievable bound at one size (each link at the rate NCCL reaches on it)."""
    return achievable_line(context).at(bytes_per_device)


def lower_bound(context: CostContext, bytes_per_device: int) -> LowerBound:
    """The lower bound of docs/model.md section 8's run at one size (see the module docstring)."""
    return bound_line(context).at(bytes_per_device)
