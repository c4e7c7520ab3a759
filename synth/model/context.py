"""The cost context: what every predicted time is relative to, built and checked once.

A time means one run of a program by every reduction group of one placement and request
(the synthesis hierarchy) on one system (the topology, with its link figures) as one
collective library runs it (the backend), docs/model.md section 8. These three always travel
together; `cost_context` checks them once (the topology has the figures costs need, the
placement is on this topology, the backend is known) so nothing downstream re-validates.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from synth.errors import UsageError
from synth.hierarchy import SynthesisHierarchy, group_devices
from synth.model.algorithms import Backend
from synth.model.backends import resolve_backend
from synth.model.backend import CallModel
from synth.model.network import Network, check_costable, network_for
from synth.topology import Level, Topology


@dataclass(frozen=True)
class CostContext:
    """(hierarchy, topology, backend), checked: build it with `cost_context`."""

    hierarchy: SynthesisHierarchy
    topology: Topology
    backend: CallModel

    def __post_init__(self):
        check_costable(self.topology)
        if tuple(self.hierarchy.placement.level_sizes) != tuple(self.topology.sizes):
            raise UsageError(f"the placement {self.hierarchy.placement.to_text()} is for a system of level sizes "
                             f"{self.hierarchy.placement.level_sizes}, not {self.topology.name} "
                             f"({', '.join(map(str, self.topology.sizes))})")
        if not isinstance(self.backend, CallModel):
            raise UsageError(f"{self.backend!r} is not a backend: give a name or a synth.model.backend.CallModel")

    @property
    def group_size(self) -> int:
        """N: members per reduction group, and the chunks a buffer is cut into."""
        return self.hierarchy.group_size

    @cached_property
    def network(self) -> Network:
        return network_for(self.topology)

    @cached_property
    def devices(self) -> np.ndarray:
        """[group, member rank] -> device rank."""
        return group_devices(self.hierarchy)

    def network_of(self, collective: str) -> Network:
        """The network with the collective's own level figures where the topology has them
        (synth calibrate's per-collective tables): the same links, so link ids agree."""
        return self._per_collective(collective)[0]

    def levels_of(self, collective: str) -> tuple[Level, ...]:
        return self._per_collective(collective)[1]

    def _per_collective(self, collective: str) -> tuple[Network, tuple[Level, ...]]:
        cache = self.__dict__.setdefault("_collectives", {})
        if collective not in cache:
            seen = self.topology.for_collective(collective)
            cache[collective] = (network_for(seen), seen.levels)
        return cache[collective]


def cost_context(hierarchy: SynthesisHierarchy, topology: Topology,
                 backend: str | Backend | CallModel = "nccl") -> CostContext:
    """The checked context; `backend` by name (nccl, gloo) or a backend object."""
    return CostContext(hierarchy, topology, backend if isinstance(backend, CallModel) else resolve_backend(backend))
