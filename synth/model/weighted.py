"""All-to-all steps whose pairs carry unequal bytes: a skewed routing's dispatch and combine
(docs/model.md section 8, "Dispatch and combine").

A step is one all-to-all call per group of its form, every reduction group's calls at once
(as the engine costs any step). Pair (x, y) of a call carries `PairBytes.values` of its
receiver y (dispatch) or of its sender x (combine): what a routing's expected fan-out gives
(synth/model/fanout.py). Priced per class, never per pair:

* the flows' drain: every pair's flow at once through the links (synth/model/network.py), a
  flow weighing its bytes over the efficiency of the link it crosses and of the protocol it
  runs on; a link's load summed per prefix of the members that fix the bytes
  (`keyed_loads`, O(members x levels^2)), the makespan the busiest link's;
* each member's time from its own operations with that drain (the backend's `pair_call`:
  NCCL's point-to-point schedule, synth/model/nccl/p2p.py), the step ending when its
  slowest member does (a grouped send/recv completes when all its peers have). A backend
  without one (gloo) takes its launch, the call's hop latency and the drain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from synth.model.backend import PairwiseFlows


@dataclass(frozen=True, eq=False)
class PairBytes:
    """[member] the bytes a pair keyed by the member carries: its receiver's when
    `by_receiver`, else its sender's."""

    values: np.ndarray
    by_receiver: bool

    def between(self, src, dst) -> np.ndarray:
        """The bytes of the pairs src[i] -> dst[i] (member ranks)."""
        return self.values[np.asarray(dst if self.by_receiver else src)]

    def scaled(self, factor: float) -> PairBytes:
        return PairBytes(self.values * factor, self.by_receiver)


@dataclass(frozen=True)
class FlowCall:
    """A call priced by its flows alone (a backend without a point-to-point schedule)."""

    weighed: np.ndarray  # [member] bytes over the plan's efficiency of a pair keyed by the member
    hop_s: float

    def times_s(self, drain_s: float) -> np.ndarray:
        return np.full(len(self.weighed), self.hop_s + drain_s)


def flow_call(plans, values: np.ndarray) -> FlowCall:
    plan = plans[0]
    return FlowCall(np.asarray(values, dtype=float) / plan.efficiency, sum(phase.latency_s for phase in plan.phases))


def node_split(network, devices: np.ndarray, flows) -> tuple[int, float, float]:
    """(the level from which two members of the call share a node as the flows' `node` says,
    the divisor across nodes, within one): the flows' link efficiencies by the level at which
    two members first differ. The depth when every member shares one node."""
    if not isinstance(flows, PairwiseFlows) or flows.node is None:
        inter = intra = flows.intra if isinstance(flows, PairwiseFlows) else 1.0
        return network.depth, inter, intra
    node = np.asarray(flows.node, dtype=np.int64)
    count = len(np.unique(node))
    coords = network.coords[devices]
    for split in range(network.depth + 1):
        units = np.unique(coords[:, :split], axis=0, return_inverse=True)[1].reshape(-1)
        if len(np.unique(units)) == count and len(np.unique(units * (len(node) + 1) + node)) == count:
            return split, flows.inter, flows.intra
    raise ValueError("an all-to-all's nodes are not units of the hierarchy")


def keyed_loads(network, sets: np.ndarray, weight: np.ndarray, by_receiver: bool) -> np.ndarray:
    """Bytes on every link of the flows between every ordered pair of distinct members of each
    row of `sets` ([set, member] devices), the flow x -> y first differing at level d weighing
    `weight[set, y, d]` (`by_receiver`) or `weight[set, x, d]`: `Network.loads` over those pairs,
    summed per prefix instead. At the keyed end a link carries its count of peers of that
    level times the weight; at the other end, the weights of the members sharing its prefix
    down to the level, less those sharing one level more."""
    sets = np.asarray(sets, dtype=np.int64)
    count, k = sets.shape
    depth = network.depth
    if k < 2:
        return np.zeros(len(network.links))
    strides = [int(np.prod(network.sizes[p:], dtype=np.int64)) for p in range(depth + 1)]
    row = np.arange(count, dtype=np.int64)[:, None] * (network.device_count + 1)
    inverse, same = [], []
    for stride in strides:
        _, found, counts = np.unique(row + sets // stride, return_inverse=True, return_counts=True)
        found = found.reshape(sets.shape)
        inverse.append(found)
        same.append(counts[found])
    keyed = np.zeros((count, k, depth))
    other = np.zeros((count, k, depth))
    for level in range(depth):
        keyed[..., level] = (same[level] - same[level + 1]) * weight[..., level]
        outer = np.bincount(inverse[level].ravel(), weights=weight[..., level].ravel())[inverse[level]]
        inner = np.bincount(inverse[level + 1].ravel(), weights=weight[..., level].ravel())[inverse[level + 1]]
        other[..., level] = np.maximum(outer - inner, 0.0)
    sent, received = (other, keyed) if by_receiver else (keyed, other)
    total = np.zeros(len(network.links))

    def add(links: np.ndarray, load: np.ndarray) -> None:
        nonlocal total
        total = total + np.bincount(links.ravel(), weights=load.ravel(), minlength=len(network.links))

    for level in range(depth):
        add(network.inject[sets, level], sent[..., level])
        add(network.eject[sets, level], received[..., level])
    for uplink in network.uplink_levels:  # flows first differing at or above it leave the unit
        add(network.up_out[sets, uplink], sent[..., :uplink + 1].sum(axis=-1))
        add(network.up_in[sets, uplink], received[..., :uplink + 1].sum(axis=-1))
    for fabric in network.fabric_levels:  # flows turning at its switch
        add(network.fabric[sets, fabric], sent[..., fabric])
    return total


def weighted_step_s(engine, calls: tuple[tuple[int, ...], ...], pairs: PairBytes) -> float:
    """The step's time: every call an all-to-all whose pairs carry `pairs` (module docstring)."""
    if not calls or max(len(members) for members in calls) < 2 or not pairs.values.any():
        return 0.0
    backend = engine.backend
    network = engine.context.network_of("AllToAll")
    make = getattr(backend, "pair_call", None)
    priced, by_size, splits = [], {}, {}
    for members in calls:
        call = engine.call("AllToAll", members)
        ranks = np.asarray(members, dtype=np.int64)
        values = pairs.values[ranks]
        figures = make(call.site, call.plans, values) if make is not None else flow_call(call.plans, values)
        priced.append(figures)
        if call.site_id not in splits:
            splits[call.site_id] = node_split(network, engine.devices[0, ranks], call.plans[0].phases[0].flows)
        split, inter, intra = splits[call.site_id]
        divisor = np.where(np.arange(network.depth) < split, inter, intra)
        sets, weights = by_size.setdefault(len(members), ([], []))
        sets.append(engine.devices[:, ranks])
        weights.append(np.broadcast_to(figures.weighed[None, :, None] / divisor[None, None, :],
                                       (len(engine.devices), len(members), network.depth)))
    loads = np.zeros(len(network.links))
    for sets, weights in by_size.values():
        loads = loads + keyed_loads(network, np.concatenate(sets), np.concatenate(weights), pairs.by_receiver)
    drain = float((loads / network.capacity).max())
    return backend.launch_s + max(float(figures.times_s(drain).max()) for figures in priced)
