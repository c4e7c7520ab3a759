"""The smallest system on which a collective over some axes costs what it costs on the whole one.

A collective over axes R of a placement runs in every reduction group at once; on a system of
uniform levels the groups differ only by which units they use, so its cost depends only on
`f_l`, the product of R's factors at each level l (synth/plan/costs.py keys its memo by it).
Planning for 131,072 GPUs should therefore not build the network, the groups and the
per-device arrays of 131,072 devices: the same cost is that of a smaller system.

Let `l*` be the outermost level the groups span (`f_l* > 1`) and `n` NCCL's node level
(synth.model.nccl.hardware: levels up to it are between nodes, the ones inside it make the
node). Levels outside `l*` that are not inside a node are cut to size 1, and `l*` itself, when
it is not inside a node, to `f_l*`. What the cost model looks at is unchanged:

* no flow of the collective differs at a level outside `l*` (every group stays in one unit
  there), so those levels' uplinks and fabrics carried nothing, and cutting them to one unit
  leaves each remaining unit with the same groups;
* the system's switch joining the units of `l*` inside one parent saw `s_l* / f_l*` alike
  bands of groups, disjoint in those units; one band is left and each unit's uplinks carry
  the same flows. A level with a fabric (one link that sums over the bands) is not cut:
  scaling its capacity would keep the busiest link's drain time but not what one group's
  calls alone see (the chain of the pipelined estimate, a backend's time of a call alone),
  and no capacity is ever scaled. For the same reason levels inside `l*` are not cut either:
  the uplinks of a unit at level k carry the flows of every band inside it;
* so every link keeps its load and its capacity; levels inside a node keep their size
  (NCCL's GPUs per node), level indices and names are kept (a cut level has size 1);
* the groups keep their member order (one axis with R's factors per level, outermost digit
  first, as R's merged hierarchy numbers members), so programs and their text are the same.

tests/test_plan_equivalent.py checks every cost the planner asks against the whole system.
"""

from __future__ import annotations

import dataclasses
import math
from functools import lru_cache

from synth.model.nccl.hardware import nccl_view
from synth.names import product
from synth.placement import Placement
from synth.plan.folding import DigitGroup
from synth.topology import Topology

REDUCED = "r"  # the collective's axis on the equivalent system
OTHERS = "o"  # everything else, as one axis


@dataclasses.dataclass(frozen=True)
class Equivalent:
    """A system and placement on which the collective over `axes` costs the same."""

    topology: Topology
    placement: Placement
    axes: tuple[str, ...] = (REDUCED,)

    @property
    def device_count(self) -> int:
        return self.topology.device_count


def span(placement: Placement, axes: tuple[str, ...] | DigitGroup) -> tuple[int, ...]:
    """The groups' span per system level: the product of the axes' factors at each level (a
    folded expert group's own, synth/plan/folding.py)."""
    if isinstance(axes, DigitGroup):
        return axes.span(placement)
    rows = [placement.matrix[placement.axis_index(name)] for name in axes]
    return tuple(map(math.prod, zip(*rows))) if rows else (1,) * len(placement.level_sizes)


@lru_cache(maxsize=64)
def _node_level(topology: Topology) -> int:
    """NCCL's node level, -1 when the system is one node (nothing may be cut then)."""
    level = nccl_view(topology).node_level
    return -1 if level is None else level


def equivalent_sizes(topology: Topology, factors: tuple[int, ...]) -> tuple[int, ...]:
    """The level sizes of the equivalent system (module docstring)."""
    sizes = list(topology.sizes)
    spanned = next((l for l, f in enumerate(factors) if f > 1), len(factors))
    node = _node_level(topology)
    for level in range(min(spanned, node + 1)):
        sizes[level] = 1
    if spanned <= node and topology.levels[spanned].fabric is None:
        sizes[spanned] = factors[spanned]
    return tuple(sizes)


@lru_cache(maxsize=256)
def equivalent(topology: Topology, factors: tuple[int, ...]) -> Equivalent:
    """The equivalent system for a collective whose groups span `factors` units per level."""
    sizes = equivalent_sizes(topology, factors)
    levels = tuple(dataclasses.replace(level, size=size) for level, size in zip(topology.levels, sizes))
    reduced = dataclasses.replace(topology, levels=levels)
    others = tuple(size // factor for size, factor in zip(sizes, factors))
    placement = Placement(reduced.level_names, sizes, (OTHERS, REDUCED), (product(others), product(factors)),
                          (others, tuple(factors)))
    return Equivalent(reduced, placement)
