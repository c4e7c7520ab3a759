"""The seam between the costing engine and a collective library's model (a backend).

Like astra-sim, which keeps its system layer (collective algorithms, scheduling) apart from
interchangeable network back ends behind one network API, the engine (synth/model/engine.py)
owns what every backend shares: the network and its contention (synth/model/network.py),
the steps of a program, how all reduction groups' calls of a step share links, and the
estimates (synth/model/estimate.py). A backend answers two questions about one call, alone:

* `plans(call)`: the candidate algorithms the library may run for it, each a `Plan`: phases
  of flows between members as fractions of the call's bytes B, a latency per phase, scratch
  memory, and the efficiency of its transfers (its flows occupy links 1/efficiency as long as
  their bytes alone would). This is the call's traffic: the engine maps it onto every
  reduction group's devices and lets all flows of a step share the links.
* `alone_s(call, plans, call_bytes, flow_s)`: its own estimate of each candidate's time when
  the call runs alone, launch excluded, per size (`flow_s[z, c]` is the flow model's estimate:
  the hop latencies plus the drain time of the candidate's flows on an idle network). The
  engine picks, per call and size, the candidate this estimate says is fastest (first on a
  tie), as NCCL's tuner does, and charges a step

      launch + sum over phases (slowest call's phase latency + busiest link's drain time)
             + max over the step's calls (alone_s - flow_s of the chosen candidate)

  so a call alone costs `launch + alone_s`, and sharing links with other calls adds exactly
  the drain time the contention adds. A backend whose `alone_s` returns `flow_s` itself (the
  built-in flow backends of synth/model/algorithms.py) adds nothing beyond the flows.

`launch_s` is charged once per step (once per call on each device). `alone_s` must be a time
(>= 0) and never decrease with the call's bytes: the search's lower bounds rely on both. A
performance model of
NCCL as measured (per-call algorithm and protocol choice, channels, size ramp, transports)
plugs in by implementing `CallModel`: its tuning formulas become `alone_s`, its algorithm's
ring or tree flows (scaled by the protocol's wire overhead through `Plan.efficiency`)
become `plans`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Protocol, runtime_checkable

import numpy as np

from synth.model.algorithms import Layout, Plan, call_layout
from synth.topology import Level


@dataclass(frozen=True)
class CallSite:
    """One call as a backend sees it: the collective, where its members sit and the figures
    of the system's levels as that collective sees them (calibrated per-collective figures
    included). Coordinates are relabelled in order of first appearance per parent unit, so
    every call of the same shape is the same site (the system's units of a level are alike)."""

    collective: str
    coords: tuple[tuple[int, ...], ...]  # [member][system level], members in group order
    levels: tuple[Level, ...]  # the system's levels, outermost first, as `collective` sees them

    @cached_property
    def layout(self) -> Layout:
        """Nodes, hop latencies, outermost and innermost latencies (what algorithms need)."""
        return call_layout(np.array(self.coords, dtype=np.int64).reshape(len(self.coords), -1),
                           [level.latency.value for level in self.levels])

    def __hash__(self) -> int:
        """Hashed once (sites key the plan caches; their levels make a deep hash)."""
        found = self.__dict__.get("_hash")
        if found is None:
            found = self.__dict__["_hash"] = hash((self.collective, self.coords, self.levels))
        return found

    @property
    def size(self) -> int:
        return len(self.coords)

    @cached_property
    def spanned(self) -> tuple[int, ...]:
        """The system levels at which members differ, outermost first."""
        return tuple(l for l in range(len(self.levels)) if len({row[l] for row in self.coords}) > 1)


def canonical_coords(coords: np.ndarray) -> tuple[tuple[int, ...], ...]:
    """Member coordinates with each level's unit indices renumbered, inside each parent, in
    order of first appearance: equal for calls that differ only by which units they use."""
    seen: dict[tuple, dict[int, int]] = {}
    result = []
    for row in coords.tolist():
        prefix: tuple = ()
        for value in row:
            labels = seen.setdefault(prefix, {})
            prefix += (labels.setdefault(value, len(labels)),)
        result.append(prefix)
    return tuple(result)


@runtime_checkable
class CallModel(Protocol):
    """What the costing engine asks of a backend (see the module docstring)."""

    name: str
    launch_s: float

    def plans(self, call: CallSite) -> tuple[Plan, ...]:
        ...

    def alone_s(self, call: CallSite, plans: tuple[Plan, ...], call_bytes: np.ndarray,
                flow_s: np.ndarray) -> np.ndarray:
        ...
