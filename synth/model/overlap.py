"""A program's time when its steps need not run in lockstep: a second estimate beside the
simulator's sum of step times (cost.py), for what the emulated cluster showed.

The lockstep sum charges each step the time all groups' calls of that step take together,
then adds the steps. Real ranks do not wait for each other between steps: a call starts as
soon as its own members are done with the previous step, and a benchmark runs iterations
back to back. With several reduction groups, one group's intra-node step then runs while
another's inter-node step holds the uplink, and the time per run tends to the larger of

* the busiest link's load over the whole program (every step of every group) over its
  capacity: no overlap can beat it; and
* one group's own chain: its steps in order, each costed for its calls alone (with the
  backend's launch cost and hop latencies), since a group's steps do depend on each other.

`pipelined_cost` is that maximum. It is about the lockstep sum (less the hop latencies, when
the link bound wins) when one step loads every link the program uses, and below it when steps load
different links: e.g. on emu-2x4 with two data groups per node pair, AllReduce(gpu);
AllReduce(Master(node)); Broadcast(gpu) runs in 36 ms where the lockstep sum says 60 ms and
the uplink alone needs 34 ms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from synth.lowering import LoweredProgram
from synth.model.cost import Simulator


@dataclass(frozen=True)
class OverlapCost:
    time_s: float  # max(busiest link over the program, one group's chain)
    link_bound_s: float
    chain_s: float
    busiest_link: str


def pipelined_cost(simulator: Simulator, lowered: LoweredProgram, bytes_per_device: int) -> OverlapCost:
    network = simulator.network
    total = np.zeros(len(network.links))
    chain = 0.0
    groups = len(simulator.devices)
    for lowered_step in lowered.steps:
        calls = sorted(lowered_step.calls, key=lambda call: call.members)
        members = tuple(call.members for call in calls)
        chunks = tuple(call.chunks for call in calls)
        collective = lowered_step.step.collective
        choices = simulator._choices(collective, members, chunks, bytes_per_device)
        efficiency = simulator.backend.efficiency_of(collective)
        step_network = simulator._network_of(collective)
        phases: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]] = {}
        latency = 0.0
        for call_members, call_chunks, choice in zip(members, chunks, choices):
            compiled = simulator._compile(collective, call_members)[choice]
            call_bytes = call_chunks * bytes_per_device / simulator.group_size / efficiency
            for index, (src, dst, fraction) in enumerate(compiled.flows):
                per_group = len(src) // groups
                phases.setdefault(index, []).append((src, dst, fraction * call_bytes, src[:per_group],
                                                     dst[:per_group], fraction[:per_group] * call_bytes))
            latency = max(latency, sum(compiled.latencies))
        chain += simulator.backend.launch_s + latency
        for flows in phases.values():
            src, dst, nbytes, src0, dst0, nbytes0 = (np.concatenate(parts) for parts in zip(*flows))
            # capacities differ per collective (calibrated tables): count the load in link-seconds
            total += step_network.loads(src, dst, nbytes) / step_network.capacity
            chain += step_network.makespan(src0, dst0, nbytes0)[0]
    busiest = int(np.argmax(total))
    bound = float(total[busiest])
    return OverlapCost(max(bound, chain), bound, chain, network.link_name(busiest))
