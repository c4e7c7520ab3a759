"""NCCL as measured, as the costing engine's `nccl` backend (the seam of synth/model/backend.py).

The NCCL model (this package; hardware.py reads a topology) says, for one call alone, which
(algorithm, protocol) NCCL picks, on how many channels, and how long the call then takes on
the hardware: NCCL's latency, the size ramp, the efficiency NCCL reaches on each link, TCP
streams over sockets. The engine adds what one call alone cannot say: several reduction
groups' calls at once sharing links. This module joins the two:

* `plans`: one per (algorithm, protocol) pair NCCL's table enables for the call (NCCL's own
  loop order), its flows those of the algorithm: rings and chains, NCCL's double binary tree
  (synth/model/algorithms.py), NVLS as traffic through the NVSwitch at the load NVLS puts on
  each GPU, PAT as a ring's (the same bytes over the network). Its efficiency is the
  protocol's payload share (LL carries 4 data bytes in 8, LL128 120 in 128) times a fitted
  protocol factor (`synth calibrate`), and each flow is weighted by the efficiency NCCL
  reaches on the link it crosses (the NICs between nodes, NVLink or PCIe inside one, NVLS's
  own inside the switch), so its flows hold the links as long as NCCL's transfer does.
* `alone_s`: NCCL's time for the call alone (hardware.estimate_group's) in the column of
  the pair NCCL picks, inf in the others, so the engine takes NCCL's pick. Made non-decreasing
  in the call's bytes (the engine's search bounds need it): NCCL's own time is not (a call
  just under a channel-count threshold runs on fewer channels, up to half as fast as one just
  above it; protocol switches can step down too), so a call of B bytes is charged the least
  time of any call of B bytes or more, `min over B' >= B of T(B')`, computed exactly (below).
  Where NCCL's time already rises with the bytes, and at the sizes NCCL's thresholds start,
  this is NCCL's time itself.
* `headroom_s`: NCCL's transfer time minus the longer of (a) the time its bytes need on its
  intra-node links and NICs at NCCL's rates on every channel and (b) its flows' drain on an
  idle network. Streams over sockets, a protocol's measured ceiling (LL's, LL128's per
  channel) and the fewer channels of a small call hold one call back but not the link: other
  groups' traffic on the same NICs fills that headroom before it delays the call (the NCCL
  model's "at least the sum of bytes over each shared resource's capacity, and at least each
  call's own streams time"). Where the flows need longer than NCCL's own time, because they
  cross links NCCL's view of the system leaves out (a fabric, the uplinks of a level outside
  the node network), the headroom is negative and the flows bind even for a call alone. So a
  step's call costs its fixed part (latency, pipeline fill) plus the longer of NCCL's
  transfer and the shared links' drain of every group's traffic (synth/model/backend.py).

The least time of any call at least as large. Between consecutive sizes where something in
NCCL's decision changes (a power of two: the tree correction's size classes; the ring
plateau's threshold; every channel-count threshold of every pair; every size where NCCL's
pick changes), NCCL's time is non-decreasing: its latency is fixed there, the transfer grows
linearly and the NVLS pipeline fill grows with the chunk. So the least time over all larger
calls is the least of T(B) and of T at every such threshold above B, and the thresholds are
found exactly: NCCL picks on the integer byte count from its own affine estimates, one per
pair within a size class, so a pair that stops being the pick never becomes it again in that
class, and a binary search over integers finds each change.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from synth.model import algorithms as flows
from synth.model.nccl import system as nccl
from synth.model.nccl import p2p, symmetric, tables, timing
from synth.model.nccl.protocols import (BUFFER, LL128_DATA_ELEMS, LL128_LINE_ELEMS, MAX_THREADS, NCCL_STEPS, PAYLOAD,
                                        THREAD_THRESHOLD, log2i)
from synth.model.algorithms import Phase, Plan
from synth.model.backend import CallSite, FlowArrays, PairwiseFlows
from synth.model.nccl.hardware import NcclView, call_for, nccl_view
from synth.topology import Level, NcclSystem, Topology

# Largest call the thresholds cover (bytes); past it NCCL's time only grows (no threshold of
# NCCL's is that large), so the envelope is NCCL's time itself.
LARGEST = 1 << 62


@dataclass(frozen=True)
class Shape:
    """One communicator as NCCL sees it: the hardware (with the overhead and protocol factors of
    the outermost level the call spans), the collective, nodes and GPUs per node."""

    hardware: nccl.Hardware
    collective: str
    nodes: int
    ranks_per_node: int

    def call(self, nbytes: float) -> nccl.Call:
        return nccl.Call(self.collective, self.nodes, self.ranks_per_node, nbytes)

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass(frozen=True, eq=False)
class Envelope:
    """NCCL's time over every call size of one shape, as the least time of any call at least as
    large: the thresholds above which NCCL's time may step down, and the least time at or above
    each (see the module docstring)."""

    shape: Shape
    table: tables.Tuning
    pairs: tuple[tuple[str, str], ...]  # the enabled (algorithm, protocol) pairs, NCCL's loop order
    points: tuple[float, ...]  # ascending
    least_from: tuple[float, ...]  # least_from[j] = min over points[j:] of T
    least_at: tuple[int, ...] = ()  # the index of the point where least_from[j] is reached

    def timed(self, nbytes: float) -> timing.Estimate:
        shape = self.shape
        call = shape.call(float(nbytes))
        return timing.timed(shape.hardware, call, tables.choose(shape.hardware, call, self.table), self.table)

    def least_above(self, nbytes: float) -> float:
        """min over thresholds > nbytes of NCCL's time there (inf when none)."""
        j = bisect.bisect_right(self.points, nbytes)
        return self.least_from[j] if j < len(self.points) else math.inf

    def fastest_above(self, nbytes: float) -> timing.Estimate | None:
        """The call above `nbytes` whose time is `least_above` (None when none)."""
        j = bisect.bisect_right(self.points, nbytes)
        return self.timed(self.points[self.least_at[j]]) if j < len(self.points) else None


@lru_cache(maxsize=512)
def envelope(shape: Shape) -> Envelope:
    table = tables.tuning(shape.hardware, shape.call(0.0))
    pairs = tuple((a, p) for a, p, _, bandwidth, _ in table.entries if bandwidth > 0)
    pairs += symmetric_pairs(shape)
    points = set(float(1 << k) for k in range(63))  # size classes (nbytes >> 6) and a grid
    points.add(float(64 * table.channels * shape.ranks))  # the ring plateau (tuning.cc:539)
    for algorithm, protocol in pairs:  # channels dropped for small calls (enqueue.cc:1734-1762)
        if algorithm in ("nvls", "nvls_tree", "symmetric"):
            continue
        threshold = THREAD_THRESHOLD[protocol] * (shape.ranks if (algorithm, protocol) == ("ring", "LL") else 1)
        for channels in range(2, table.channels + 1):
            points.add(float(channels * MAX_THREADS[protocol] * threshold))
    points.update(_tree_chunk_changes(shape, table, pairs))
    ordered = sorted(b for b in points if 1 <= b <= LARGEST)
    choices: dict[float, tables.Choice] = {}  # NCCL's choice per size, each decided once for this envelope

    def choice_at(nbytes: float) -> tables.Choice:
        found = choices.get(nbytes)
        if found is None:
            found = choices[nbytes] = tables.choose(shape.hardware, shape.call(nbytes), table)
        return found

    points.update(_pick_changes(ordered, choice_at))
    ordered = sorted(b for b in points if 1 <= b <= LARGEST)
    times = [timing.timed(shape.hardware, shape.call(b), choice_at(b), table).time_s for b in ordered]
    least_from = list(times)
    least_at = list(range(len(times)))
    for j in range(len(times) - 2, -1, -1):
        if least_from[j + 1] < least_from[j]:
            least_from[j], least_at[j] = least_from[j + 1], least_at[j + 1]
    return Envelope(shape, table, pairs, tuple(ordered), tuple(least_from), tuple(least_at))


def symmetric_pairs(shape: Shape) -> tuple[tuple[str, str], ...]:
    """("symmetric", kernel) for every symmetric kernel NCCL may pick for this communicator
    (symmetric.py; none unless its buffers are registered, NCCL is 2.27+ and it is one node)."""
    call = shape.call(1.0)
    if not symmetric.applies(shape.hardware, call):
        return ()
    return tuple(("symmetric", kernel) for kernel in symmetric.kernels_for(shape.hardware, call))


def _tree_chunk_changes(shape: Shape, table: tables.Tuning, pairs) -> set[float]:
    """Sizes where the tree's LL128 chunk grows (enqueue.cc:1901-1909, per channel's bytes), so
    its loops and its proxy floor (proxy.py) drop: on every channel count, bytes per channel =
    the shrink rule's bound x each chunk the rule can leave."""
    if ("tree", "LL128") not in pairs or shape.nodes < 2:
        return set()
    ppn = shape.ranks_per_node
    steps = 1 + log2i(shape.nodes) + 0.1 * ppn
    chunk = BUFFER["LL128"] // NCCL_STEPS // LL128_LINE_ELEMS * LL128_DATA_ELEMS
    chunks = []
    while chunk > 16384:
        chunks.append(chunk)
        chunk //= 2
    found = set()
    for bound in (steps * 64 / ppn, steps * 16 / ppn):
        for size in chunks:
            for channels in range(1, table.channels + 1):
                found.add(float(channels * math.ceil(bound) * size))
    return found


def _pick_changes(ordered: list[float], choice_at) -> list[float]:
    """Every integer size, between consecutive thresholds, at which NCCL's pick changes
    (`choice_at(bytes)`: NCCL's choice for a call of that many bytes)."""
    def pick(nbytes: int) -> tuple[str, str]:
        choice = choice_at(float(nbytes))
        return choice.algorithm, choice.protocol

    changes = []
    bounds = [0] + [int(b) for b in ordered] + [LARGEST]
    for low, high in zip(bounds, bounds[1:]):
        last = high - 1
        if last <= low:
            continue
        current = pick(low)
        while pick(last) != current:
            lo, hi = low, last  # pick(lo) == current, pick(hi) != current
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if pick(mid) == current:
                    lo = mid
                else:
                    hi = mid
            changes.append(float(hi))
            low, current = hi, pick(hi)
    return changes


@lru_cache(maxsize=64)
def _view(levels: tuple[Level, ...], system: NcclSystem | None) -> tuple[NcclView, Topology]:
    topology = Topology("call site", "", levels, nccl=system)
    return nccl_view(topology), topology


@lru_cache(maxsize=4096)
def shape_of(site: CallSite) -> Shape:
    """The communicator of a call site (the site's canonical devices on its levels)."""
    view, topology = _view(site.levels, site.nccl)
    coords = np.array(site.coords, dtype=np.int64).reshape(len(site.coords), -1)
    devices = np.ravel_multi_index(tuple(coords.T), topology.sizes)
    hardware, call = call_for(topology, view, devices, site.collective, 0.0)
    return Shape(hardware, site.collective, call.nodes, call.ranks_per_node)


def _builder(collective: str, algorithm: str, protocol: str = ""):
    """The flows of one NCCL algorithm for one collective (synth/model/algorithms.py); a
    symmetric kernel's as the ring's bytes, or NVLS's for the multicast all-reduce."""
    if algorithm == "symmetric":
        algorithm = "nvls" if protocol == "AllReduce_RSxLDMC_AGxSTMC" else "ring"
    if collective == "AllReduce":
        return {"ring": flows.nccl_ring_all_reduce, "tree": flows.nccl_tree_all_reduce,
                "nvls": flows.nccl_nvls_all_reduce, "nvls_tree": flows.nccl_nvls_tree_all_reduce}[algorithm]
    if collective == "ReduceScatter":
        return flows.nccl_ring_reduce_scatter  # ring, NVLS and PAT move the same bytes per GPU
    if collective == "AllGather":
        return flows.nccl_ring_all_gather
    if collective == "Broadcast":
        return flows.nccl_chain_broadcast  # NCCL's Broadcast ring is a pipelined chain from the root
    return flows.nccl_chain_reduce


@dataclass(frozen=True)
class NcclMeasured:
    """The `nccl` backend: NCCL's choice and time per call (synth.model.nccl), contention
    from its plans' flows (see the module docstring)."""

    name: str = "nccl"
    launch_s: float = 0.0  # NCCL's latency already holds the per-call overhead
    launch_source: str = "NCCL's own latency per (algorithm, protocol) includes the call's launch (tuning.cc baseLat)"
    _cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def plans(self, call: CallSite) -> tuple[Plan, ...]:
        if call.size < 2:
            return (Plan("none", (Phase(0.0, ()),)),)
        if call.collective == "AllToAll":  # NCCL's tuner has no all-to-all: grouped send/recv
            return all_to_all_plans(call)
        shape = shape_of(call)
        found = envelope(shape)
        hardware = shape.hardware
        node = _network_nodes(call)
        result = []
        built: dict[tuple, tuple[Phase, ...]] = {}  # protocols of one algorithm move the same flows
        for algorithm, protocol in found.pairs:
            builder = _builder(call.collective, algorithm, protocol)
            intra = hardware.intra.efficiency
            if algorithm in ("nvls", "nvls_tree"):
                intra *= tables.NVLS_EFFICIENCY.get(hardware.generation, 1.0)
            net = hardware.network.link.efficiency if hardware.network is not None else 1.0
            phases = built.get((builder, intra, net))
            if phases is None:
                phases = built[builder, intra, net] = tuple(
                    _at_link_efficiency(phase, node, net, intra) for phase in builder(call.layout).phases)
            # a symmetric kernel's rate is NCCL's fitted one (symmetric.py): no protocol share
            payload = 1.0 if algorithm == "symmetric" else PAYLOAD[protocol] * hardware.protocol(protocol).bandwidth
            result.append(Plan(f"{algorithm}/{protocol}", phases, 0.0, payload))
        return tuple(result)

    def _estimates(self, call: CallSite, call_bytes: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per size: the column of NCCL's pick, the least time of any call as large or larger,
        its fixed part (latency, overhead, pipeline fill) and the time its bytes need on its
        shared links at NCCL's rates (see the module docstring)."""
        key = (call, call_bytes.tobytes())
        found = self._cache.get(key)
        if found is not None:
            return found
        if len(self._cache) > 65536:
            self._cache.clear()
        if call.size < 2:
            zeros = np.zeros(len(call_bytes))
            found = (np.zeros(len(call_bytes), dtype=np.int64), zeros, zeros, zeros)
            self._cache[key] = found
            return found
        curve = envelope(shape_of(call))
        column = {pair: c for c, pair in enumerate(curve.pairs)}
        picks = np.empty(len(call_bytes), dtype=np.int64)
        least = np.empty(len(call_bytes))
        fixed = np.empty(len(call_bytes))
        links = np.empty(len(call_bytes))
        for z, nbytes in enumerate(call_bytes.tolist()):
            estimate = curve.timed(nbytes)
            picks[z] = column[(estimate.choice.algorithm, estimate.choice.protocol)]
            least[z] = min(estimate.time_s, curve.least_above(nbytes))
            parts = estimate
            if least[z] < estimate.time_s:  # charged a larger call's time: that call's fixed part and links
                parts = curve.fastest_above(nbytes)
            fixed[z] = parts.time_s - parts.transfer_s
            links[z] = _links_s(curve, parts)
        found = (picks, least, fixed, links)
        self._cache[key] = found
        return found

    def alone_s(self, call: CallSite, plans: tuple[Plan, ...], call_bytes: np.ndarray,
                flow_s: np.ndarray) -> np.ndarray:
        if call.collective == "AllToAll":  # NCCL's p2p schedule (p2p.py), its pick of protocol
            return all_to_all_alone_s(call, plans, np.asarray(call_bytes, dtype=float), flow_s)
        picks, least, _, _ = self._estimates(call, np.asarray(call_bytes, dtype=float))
        own = np.full(flow_s.shape, np.inf)
        own[np.arange(len(picks)), picks] = least
        return own

    def pair_call(self, call: CallSite, plans: tuple[Plan, ...], values: np.ndarray):
        """An all-to-all whose pairs carry unequal bytes (synth/model/weighted.py), as NCCL
        schedules each member's operations (p2p.member_loads)."""
        hardware, cost = _all_to_all_site(call)
        efficiency = {plan.algorithm.rsplit("/", 1)[-1]: plan.efficiency for plan in plans}
        hop = max(sum(phase.latency_s for phase in plan.phases) for plan in plans)
        return p2p.pair_call(hardware, cost, _network_nodes(call), values, efficiency, hop, ALL_TO_ALL_LAUNCH_S)

    def least_alone_s(self, call: CallSite, call_bytes: np.ndarray) -> float | None:
        """The least `alone_s` gives any candidate at the one size in `call_bytes`: NCCL's pick's
        time (every other column is inf), known from NCCL's envelope without the plans' flows
        (the search's bounds ask it of every call site, most of which are never costed). None
        for an all-to-all, whose time needs its plans' flows."""
        if call.collective == "AllToAll":
            return None
        return float(self._estimates(call, np.asarray(call_bytes, dtype=float))[1].min())

    def headroom_s(self, call: CallSite, plans: tuple[Plan, ...], call_bytes: np.ndarray,
                   flow_s: np.ndarray) -> np.ndarray:
        """NCCL's time alone minus the latest its shared links can let it finish: its fixed part
        (latency, pipeline fill) plus the longer of NCCL's own time on its links at every channel
        and its flows' drain (the flow model's, which also sees links NCCL's view leaves out: a
        fabric, a rack's uplinks). Negative when the flows need longer than NCCL's time."""
        if call.collective == "AllToAll":
            return all_to_all_headroom_s(call, plans, np.asarray(call_bytes, dtype=float), flow_s)
        picks, least, fixed, links = self._estimates(call, np.asarray(call_bytes, dtype=float))
        rows = np.arange(len(picks))
        latency = np.array([sum(phase.latency_s for phase in plan.phases) for plan in plans])
        drain = flow_s[rows, picks] - latency[picks]
        room = np.zeros(flow_s.shape)
        room[rows, picks] = least - fixed - np.maximum(links, drain)
        return room


# NCCL's per-call base latency (as the ring's, tuning.cc baseLat): the all-to-all's send/recv
# group is launched as one kernel.
ALL_TO_ALL_LAUNCH_S = flows.NCCL_LAUNCH_S


def all_to_all_plans(call: CallSite) -> tuple[Plan, ...]:
    """The all-to-all's pairwise send/recv flows, each weighted by the efficiency NCCL reaches
    on the link it crosses (the NICs between nodes, NVLink or PCIe inside one): one plan per
    protocol NCCL's p2p may run (LL, Simple: p2p.py), at the protocol's payload share."""
    hardware, _ = _all_to_all_site(call)
    node = _network_nodes(call)
    intra = hardware.intra.efficiency
    net = hardware.network.link.efficiency if hardware.network is not None else 1.0
    plan = flows.pairwise_all_to_all(call.layout)
    phases = tuple(_at_link_efficiency(phase, node, net, intra) for phase in plan.phases)
    return tuple(Plan(f"{plan.algorithm}/{protocol}", phases, plan.extra_memory,
                      PAYLOAD[protocol] * hardware.protocol(protocol).bandwidth) for protocol in p2p.PROTOCOLS)


@lru_cache(maxsize=1024)
def _all_to_all_site(call: CallSite) -> tuple[nccl.Hardware, p2p.AllToAllCost]:
    """The hardware of an all-to-all site and NCCL's p2p figures for it, its peers by class."""
    view, topology = _view(call.levels, call.nccl)
    coords = np.array(call.coords, dtype=np.int64).reshape(len(call.coords), -1)
    devices = np.ravel_multi_index(tuple(coords.T), topology.sizes)
    hardware, shape = call_for(topology, view, devices, "AllReduce", 0.0)
    channels = tables.tuning(hardware, shape).channels if call.size > 1 else 1
    classes = p2p.peer_classes(coords, view.node_level)
    return hardware, p2p.cached_cost(hardware, shape.nodes, shape.ranks_per_node, channels, classes)


def all_to_all_alone_s(call: CallSite, plans: tuple[Plan, ...], call_bytes: np.ndarray, flow_s: np.ndarray
                       ) -> np.ndarray:
    """The all-to-all alone per size (p2p.AllToAllCost.time_s) in the column of the protocol
    NCCL runs, inf in the other; the least of any call at least as large (the schedule's
    breakpoints, p2p.breakpoints), so it never falls as the bytes grow."""
    return _all_to_all_times(call, plans, call_bytes, flow_s)[0]


def all_to_all_headroom_s(call: CallSite, plans: tuple[Plan, ...], call_bytes: np.ndarray, flow_s: np.ndarray
                          ) -> np.ndarray:
    """Of the all-to-all's time alone, what the proxy, the NIC or the host hold it back beyond
    its fixed part and its flows' drain: other traffic on its links fills that first."""
    return _all_to_all_times(call, plans, call_bytes, flow_s)[1]


_LATER: dict[tuple, list[tuple[float, float]]] = {}  # per site and flow rates: the least (time, fixed) from each breakpoint on


_LAST_TIMES: list = []  # [(arguments, answer)] of the last call: the engine asks the time alone, then the
# headroom, of one call with the same arrays (kept here, so their identities cannot be reused)


def _all_to_all_times(call: CallSite, plans: tuple[Plan, ...], call_bytes: np.ndarray, flow_s: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    if _LAST_TIMES:
        (last_call, last_plans, last_bytes, last_flow, last_bytes_seen, last_flow_seen), (own, room) = _LAST_TIMES[0]
        if (last_call is call and last_plans is plans and last_bytes is call_bytes and last_flow is flow_s
                and np.array_equal(last_bytes, last_bytes_seen) and np.array_equal(last_flow, last_flow_seen)):
            return own.copy(), room.copy()
    own, room = _times(call, plans, call_bytes, flow_s)
    # the values as well as the arrays: a caller may refill an array in place between two calls
    _LAST_TIMES[:] = [((call, plans, call_bytes, flow_s, call_bytes.copy(), flow_s.copy()), (own.copy(), room.copy()))]
    return own, room


def _times(call: CallSite, plans: tuple[Plan, ...], call_bytes: np.ndarray, flow_s: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    hardware, cost = _all_to_all_site(call)
    k = call.size
    latency = np.array([sum(phase.latency_s for phase in plan.phases) for plan in plans])
    hop = float(latency.max())
    per_byte = np.zeros(len(plans))
    if len(call_bytes) and call_bytes.max() > 0:
        z = int(np.argmax(call_bytes))
        per_byte = (flow_s[z] - latency) / call_bytes[z]
    column = {plan.algorithm.rsplit("/", 1)[-1]: c for c, plan in enumerate(plans)}

    def at(peer_bytes: int) -> tuple[float, float, int]:
        c = column[p2p.protocol_for(cost.comm, peer_bytes)]
        drain = float(per_byte[c]) * peer_bytes * k
        return (*cost.parts(hardware, peer_bytes, drain, hop, ALL_TO_ALL_LAUNCH_S), c)

    points = p2p.breakpoints(cost.comm)
    key = (call, per_byte.tobytes(), hop, p2p.step_overhead_s(hardware, "LL"))
    later = _LATER.get(key)
    if later is None:
        if len(_LATER) > 4096:
            _LATER.clear()
        later = [at(point)[:2] for point in points]
        for j in range(len(later) - 2, -1, -1):
            later[j] = min(later[j], later[j + 1])
        _LATER[key] = later
    own = np.full(flow_s.shape, np.inf)
    room = np.zeros(flow_s.shape)
    for z, nbytes in enumerate(call_bytes.tolist()):
        peer_bytes = math.ceil(nbytes / k)
        time, fixed, c = at(peer_bytes)
        j = bisect.bisect_right(points, peer_bytes)
        if j < len(points) and later[j][0] < time:
            time, fixed = later[j]
        own[z, c] = time
        room[z, c] = max(0.0, time - fixed - (flow_s[z, c] - latency[c]))
    return own, room


def _network_nodes(call: CallSite) -> np.ndarray | None:
    """[member]: the node each member sits in as NCCL sees it (its coordinates down to the
    network level); two members in different nodes talk at the NICs' efficiency. None when
    NCCL's view has no network (every member in one node)."""
    view, _ = _view(call.levels, call.nccl)
    if view.node_level is None:
        return None
    coords = np.array(call.coords, dtype=np.int64).reshape(len(call.coords), -1)[:, :view.node_level + 1]
    # one integer per node prefix, in the prefixes' lexicographic order (a row-wise unique is slow)
    keys = np.ravel_multi_index(tuple(coords.T), tuple(int(size) for size in coords.max(axis=0) + 1))
    return np.unique(keys, return_inverse=True)[1].reshape(-1)


def _at_link_efficiency(phase: Phase, node: np.ndarray | None, net: float, intra: float) -> Phase:
    """The phase with each flow's fraction divided by the efficiency NCCL reaches on the link it
    crosses: the NICs' between nodes (`node` differs), the intra-node link's inside one."""
    if not phase.flows:
        return Phase(phase.latency_s, ())
    given = phase.flows
    if isinstance(given, PairwiseFlows):
        return Phase(phase.latency_s, given.divided(None if node is None else tuple(node.tolist()), net, intra))
    if isinstance(given, FlowArrays):
        src, dst, fraction = given.src, given.dst, given.fraction
    else:
        src = np.array([a for a, _, _ in given], dtype=np.int64)
        dst = np.array([b for _, b, _ in given], dtype=np.int64)
        fraction = np.array([f for _, _, f in given], dtype=float)
    divisor = np.full(len(src), intra, dtype=float) if node is None else np.where(node[src] != node[dst], net, intra)
    # as arrays (they read as the same flows): the engine prices arrays, and a tuple of
    # thousands of flows cost more to build, hash and convert back than the pricing
    return Phase(phase.latency_s, FlowArrays(src, dst, fraction / divisor))


def _links_s(curve: Envelope, estimate: timing.Estimate) -> float:
    """What the call's bytes need on its shared links (each GPU's intra-node links, each node's
    NICs) at NCCL's rates on every channel of the communicator: the least its links allow,
    whatever holds the call itself back (streams, a protocol's ceiling, fewer channels)."""
    if estimate.transfer_s <= 0:
        return 0.0
    algorithm = estimate.choice.algorithm
    full = curve.table.nvls_channels if algorithm in ("nvls", "nvls_tree") else curve.table.channels
    used = estimate.choice.channels / full if full and algorithm != "symmetric" else 1.0
    return max((load.bytes * used / load.capacity for load in estimate.loads
                if load.resource in ("intra", "net") and load.capacity > 0), default=0.0)


NCCL_MEASURED = NcclMeasured()
