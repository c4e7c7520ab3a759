"""An NCCL all-to-all whose pairs carry unequal bytes (synth/model/weighted.py): each member's
operations laid out by NCCL's point-to-point rules from their own bytes (synth/model/nccl/p2p.py,
`member_loads`), its time from its own parts, posts and proxy seconds (`member_times_s`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from synth.model.backend import CallSite, Plan
from synth.model.nccl import p2p
from synth.model.nccl.backend import ALL_TO_ALL_LAUNCH_S, _all_to_all_site, _network_nodes
from synth.model.nccl.system import Hardware


@dataclass(frozen=True, eq=False)
class NcclPairCall:
    """One call's members as NCCL schedules them, waiting for the step's drain."""

    weighed: np.ndarray  # [member] bytes over its protocol's rate share of a pair keyed by the member
    hardware: Hardware
    cost: p2p.AllToAllCost
    loads: p2p.MemberLoads
    hop_s: float

    def times_s(self, drain_s: float) -> np.ndarray:
        return p2p.member_times_s(self.cost, self.hardware, self.loads, drain_s, self.hop_s, ALL_TO_ALL_LAUNCH_S)


def pair_call(site: CallSite, plans: tuple[Plan, ...], values: np.ndarray) -> NcclPairCall:
    """The call at `site` whose pairs keyed by member i carry `values[i]` bytes."""
    hardware, cost = _all_to_all_site(site)
    efficiency = {plan.algorithm.rsplit("/", 1)[-1]: plan.efficiency for plan in plans}
    hop = max(sum(phase.latency_s for phase in plan.phases) for plan in plans)
    values = np.asarray(values, dtype=float)
    weighed = p2p.op_figures(cost.comm, hardware, values, False, efficiency).weighed
    loads = p2p.member_loads(cost.comm, hardware, values, _network_nodes(site), efficiency)
    return NcclPairCall(weighed, hardware, cost, loads, hop)
