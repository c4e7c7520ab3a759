"""Where a measured group sits on a topology: its level and its devices.

A `Span` of u units of level L with p ranks each becomes the first p devices (in rank
order) of units 0..u-1 of L inside the first unit of every outer level. Any other choice
of units gives the same costs, since every unit of a level has the same links. Without a
level, a group on one host spans the innermost level (one rank per device) and a group on
several hosts the level above it (one host per unit).
"""

from __future__ import annotations

import numpy as np

from synth.calibrate.measurements import Measurement, Span
from synth.errors import UsageError
from synth.names import product
from synth.topology import Topology


def span_level(span: Span, topology: Topology, where: str) -> int:
    """The index of the level the group spans, checked against the topology."""
    names = topology.level_names
    if span.level is not None:
        if span.level not in names:
            raise UsageError(f"{where}: level {span.level!r} is not a level of topology {topology.name} "
                             f"({', '.join(names)})")
        return names.index(span.level)
    if span.hosts == 1:
        return len(names) - 1
    if len(names) < 2:
        raise UsageError(f"{where}: the group is on {span.hosts} hosts but topology {topology.name} has one level "
                         f"({names[0]}); give a topology with a level per host", inputs=("topology",))
    return len(names) - 2


def devices(measurement: Measurement, topology: Topology) -> tuple[int, tuple[int, ...]]:
    """(level index, device ranks) of the measured group on the topology."""
    span, where = measurement.span, measurement.where
    index = span_level(span, topology, where)
    level = topology.levels[index]
    per_unit_devices = product(topology.sizes[index + 1:])
    if span.units > level.size or span.per_unit > per_unit_devices:
        inside = f", {per_unit_devices} device(s) each" if index < len(topology.levels) - 1 else ""
        raise UsageError(f"{where}: a group of {span.describe()} does not fit level {level.name} of topology "
                         f"{topology.name} ({level.size} units{inside}); give the level or a topology that fits",
                         inputs=("level", "topology"))
    if span.units < 2:
        raise UsageError(f"{where}: a group of {span.describe()} inside one unit of {level.name} does not span it")
    ranks = [unit * per_unit_devices + member for unit in range(span.units) for member in range(span.per_unit)]
    return index, tuple(ranks)


def spanned_levels(topology: Topology, ranks: tuple[int, ...]) -> tuple[int, ...]:
    """Levels at which some two members differ: the levels whose links the group uses."""
    coords = np.stack(np.unravel_index(np.array(ranks), topology.sizes), axis=1)
    return tuple(l for l in range(len(topology.sizes)) if len(set(coords[:, l].tolist())) > 1)
