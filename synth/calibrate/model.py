"""The simulator's time for one measured call, as a function of the figures being fitted.

A call of a collective over a group, alone on the network, costs what synth/model/cost.py
charges a step of one call:

    t = launch + sum over phases of latency_p + B / efficiency * sum over phases of makespan_p

minimized over the backend's candidate algorithms (NCCL's ring or tree AllReduce), with the
plans, hop latencies and link loads from the same functions the simulator uses
(collectives.py algorithms, cost.call_layout, network.loads). Fitting level l, its latency
alpha and inverse bandwidth x = 1 / beta enter as follows:

* latency_p is piecewise linear in alpha (alpha-beta: sums of hop latencies along the
  critical ring or chain path, or per tree level), so at any alpha it is s * alpha + r,
  s being how many of the critical path's hops cross level l (`line`);
* makespan_p is max(a_p * x, o_p): a_p the largest load per byte of B on level l's links
  (the devices' level-l links, and the level's uplinks relative to the level's bandwidth, as
  calibration scales them together), o_p the busiest other link's drain time per byte
  (inner levels and their uplinks), so the transfer is q * x + u with q the sum of a_p over
  the phases level l bounds (`line`).

So near any (alpha, x) the model is linear in both, which is what the fit iterates on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from synth.model.algorithms import Algorithm, Backend
from synth.model.cost import call_layout
from synth.model.network import NO_LINK, network_for
from synth.topology import Topology


@dataclass(frozen=True)
class Line:
    """The model near one point, for one measurement: t = constant + alpha_slope * alpha + x_slope * x."""

    constant: float
    alpha_slope: float
    x_slope: float
    choice: tuple  # which algorithm and which pieces are active: equal choices, same line


class CallModel:
    """One group and collective on a topology (as that collective sees it), with level
    `level`'s latency and bandwidth left free."""

    def __init__(self, topology: Topology, backend: Backend, collective: str, ranks: tuple[int, ...], level: int):
        network = network_for(topology)
        self.level = level
        self.launch = backend.launch_s
        self.efficiency = backend.efficiency_of(collective)
        self.coords = network.coords[list(ranks)]
        self.latencies = [lvl.latency.value for lvl in topology.levels]
        # Level l's links, each with its capacity as a multiple of the level's bandwidth: the
        # devices' level-l links (1) and the level's uplinks (count x bandwidth / level bandwidth),
        # which calibration scales with the level (synth/calibrate/calibration.py).
        on_level = np.zeros(len(network.links), dtype=bool)
        on_level[network.inject[:, level]] = True
        on_level[network.eject[:, level]] = True
        relative = np.ones(len(network.links))
        uplinks = np.concatenate([network.up_out[:, level], network.up_in[:, level]])
        uplinks = uplinks[uplinks != NO_LINK]
        on_level[uplinks] = True
        relative[uplinks] = network.capacity[uplinks] / topology.levels[level].bandwidth.value
        fabric = network.fabric[:, level]  # the level's shared interconnect, scaled likewise
        fabric = fabric[fabric != NO_LINK]
        on_level[fabric] = True
        relative[fabric] = network.capacity[fabric] / topology.levels[level].bandwidth.value
        members = np.array(ranks, dtype=np.int64)
        layout = call_layout(self.coords, self.latencies)
        self.algorithms: list[Algorithm] = list(backend.candidates(collective))
        self.phases: list[tuple[tuple[float, float], ...]] = []  # per candidate, per phase: (a_p, o_p)
        self.names: list[str] = []
        for algorithm in self.algorithms:
            plan = algorithm(layout)
            self.names.append(plan.algorithm)
            phases = []
            for phase in plan.phases:
                if not phase.flows:
                    phases.append((0.0, 0.0))
                    continue
                local = np.array([(a, b) for a, b, _ in phase.flows], dtype=np.int64)
                fraction = np.array([f for _, _, f in phase.flows], dtype=float)
                loads = network.loads(members[local[:, 0]], members[local[:, 1]], fraction)
                level_load = float((loads[on_level] / relative[on_level]).max())
                other = float((loads[~on_level] / network.capacity[~on_level]).max(initial=0.0))
                phases.append((level_load, other))
            self.phases.append(tuple(phases))
        self._latency_cache: dict[tuple[int, float], float] = {}

    def latency(self, candidate: int, alpha: float) -> float:
        """Sum of the candidate's phase latencies with level `level` at `alpha` seconds."""
        key = (candidate, alpha)
        if key not in self._latency_cache:
            latencies = list(self.latencies)
            latencies[self.level] = alpha
            plan = self.algorithms[candidate](call_layout(self.coords, latencies))
            self._latency_cache[key] = sum(phase.latency_s for phase in plan.phases)
        return self._latency_cache[key]

    def transfer(self, candidate: int, x: float) -> float:
        """Seconds per byte of B alone on the network with level `level` at 1 / x bytes/s."""
        return sum(max(a * x, o) for a, o in self.phases[candidate])

    def time(self, alpha: float, x: float, nbytes: float) -> tuple[float, int]:
        """(seconds, candidate) as the simulator costs the call: its pick is the fastest."""
        times = [self.latency(c, alpha) + nbytes * self.transfer(c, x) / self.efficiency
                 for c in range(len(self.algorithms))]
        best = min(range(len(times)), key=lambda c: (times[c], c))
        return self.launch + times[best], best

    def line(self, alpha: float, x: float, nbytes: float, level_bound: bool = False) -> Line:
        """The linear model that equals this one near (alpha, x) (exact on the current pieces);
        with `level_bound`, the pieces in which level l's links bound every phase they carry."""
        _, candidate = self.time(alpha, x, nbytes)
        step = max(alpha, 1e-6) * 1e-4
        at = self.latency(candidate, alpha)
        slope = (self.latency(candidate, alpha + step) - at) / step
        q = u = 0.0
        pieces = []
        for a, o in self.phases[candidate]:
            binding = a > 0 and (level_bound or a * x >= o)
            pieces.append(binding)
            q, u = (q + a, u) if binding else (q, u + o)
        scale = nbytes / self.efficiency
        return Line(self.launch + at - slope * alpha + scale * u, slope, scale * q,
                    (candidate, round(slope, 6), tuple(pieces)))

    def algorithm_name(self, candidate: int) -> str:
        return self.names[candidate]
