"""The time of NCCL's choice on the hardware: NCCL's latency for the chosen pair, the per-call
overhead and launch floor, the pipeline fill, and the bytes over the bandwidth the algorithm
reaches on its busiest resource, with the loads a contention model shares."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from synth.model.nccl.launch import launch_floor_s
from synth.model.nccl.chunking import chunk_bytes, ll128_tree_stages, pipeline_stages
from synth.model.nccl.protocols import PAYLOAD
from synth.model.nccl.proxy import proxy_floor_s
from synth.model.nccl.fabric_share import fabric_share
from synth.model.nccl.graph import nics_used
from synth.model.nccl.system import Call, Hardware
from synth.model.nccl.transports import call_floor_s, socket_capacity
from synth.model.nccl.tables import (NVLS_EFFICIENCY, RING_PLATEAU, Choice, Tuning, channels_used, choose,
                                     nccl_time_us, tree_correction, tuning)

@dataclass(frozen=True)
class Load:
    """Bytes a call puts on one resource, and how fast that resource drains them for this call
    (`capacity`, bytes/s). "intra": each GPU's intra-node links (bytes per GPU), shared by every
    call on that GPU; "net": each node's NICs (bytes per node), shared by every call leaving the
    node; "streams": the call's own TCP streams over sockets (bytes per node), not shared: many
    concurrent calls open many streams, one call is held to its own (net_socket.cc)."""

    resource: str
    bytes: float
    capacity: float

    @property
    def seconds(self) -> float:
        return self.bytes / self.capacity if self.capacity > 0 else 0.0


@dataclass(frozen=True)
class Estimate:
    """One call as NCCL runs it: the choice, the time alone on the hardware and its parts,
    the bandwidths (nccl-tests' algbw and busbw), the resource that bounds the transfer, and
    the loads for a contention model."""

    call: Call
    choice: Choice
    time_s: float
    latency_s: float
    fill_s: float
    transfer_s: float
    bottleneck: str
    loads: tuple[Load, ...] = field(default=())

    @property
    def algbw(self) -> float:
        return self.call.nbytes / self.time_s if self.time_s > 0 else math.inf

    @property
    def busbw(self) -> float:
        return self.algbw * bus_factor(self.call.collective, self.call.ranks)


def bus_factor(collective: str, ranks: int) -> float:
    """nccl-tests' busbw / algbw (doc/PERFORMANCE.md): the one definition, the collective's
    record (synth/collectives.py)."""
    from synth.collectives import RECORDS

    return RECORDS[collective].bus_factor(ranks)



# --- the time on the hardware --------------------------------------------------------------------


def _loads(call: Call, algorithm: str) -> tuple[float, float]:
    """Bytes per byte of B that the algorithm moves out of each GPU over intra-node links and
    out of each node over its NICs (each direction alike):
    ring AllReduce 2(n-1)/n both (each channel crosses a node boundary once per node);
    ring ReduceScatter/AllGather (n-1)/n; Broadcast/Reduce chains B;
    tree: a chain in the node (B up and B down through middle GPUs) and NCCL's double binary
    tree over nodes (B per node across two nodes; an inner node of one tree and a leaf of the
    other moves 2B beyond);
    NVLS (multimem reduce then multicast): B + B/ppn through each GPU's NVSwitch port;
    PAT (one GPU per node): (n-1)/n over the network."""
    n, ppn, nodes = call.ranks, call.ranks_per_node, call.nodes
    coll = call.collective
    if algorithm == "ring":
        share = 2 * (n - 1) / n if coll == "AllReduce" else ((n - 1) / n if coll in ("ReduceScatter", "AllGather")
                                                              else 1.0)
        return (share if ppn > 1 else 0.0, share if nodes > 1 else 0.0)
    if algorithm == "tree":
        intra = 0.0 if ppn == 1 else (1.0 if ppn == 2 else 2.0)
        return (intra, 0.0 if nodes == 1 else (1.0 if nodes == 2 else 2.0))
    if algorithm in ("nvls", "nvls_tree"):
        intra = 1.0 + 1.0 / ppn if coll == "AllReduce" else (ppn - 1) / ppn
        return (intra, 0.0 if nodes == 1 else (1.0 if nodes == 2 else 2.0))
    return (0.0, (n - 1) / n)  # pat




def _achieved(hardware: Hardware, call: Call, algorithm: str, protocol: str) -> tuple[float, float, float]:
    """(intra capacity per GPU, network capacity per node, NVLS factor) in bytes/s at which the
    algorithm can drain its loads, before channels and caps."""
    intra = hardware.intra.achieved
    factor = 1.0
    if algorithm in ("nvls", "nvls_tree"):
        factor = NVLS_EFFICIENCY.get(hardware.generation, 1.0)
    net = 0.0
    if hardware.network is not None and call.nodes > 1:
        network = hardware.network
        net = nics_used(hardware, call.ranks_per_node) * network.link.achieved * fabric_share(hardware, call)
    return intra * factor, net, factor


def estimate(hardware: Hardware, call: Call) -> Estimate:
    """The call as NCCL runs it, alone on the hardware: NCCL's choice, and its time =
    NCCL's latency for the choice + per-call overhead + pipeline fill + B / the bandwidth the
    algorithm reaches on its busiest resource (see the module docstring).

    For a cost engine: `time_s` is the call alone; `loads` are the bytes it puts on each GPU's
    intra-node links and each node's NICs with the rate it drains them at, so concurrent calls
    sharing a node's NICs take at least sum(bytes) / capacity (the busiest resource's share),
    and `latency_s + fill_s` is what does not shrink with sharing."""
    if call.ranks == 1 or call.nbytes <= 0:
        return Estimate(call, Choice("none", "none", 0, 0.0), 0.0, 0.0, 0.0, 0.0, "")
    table = tuning(hardware, call)
    choice = choose(hardware, call, table)
    return _time(hardware, call, table, choice)


def estimate_for(hardware: Hardware, call: Call, algorithm: str, protocol: str) -> Estimate:
    """The time of one (algorithm, protocol) whatever NCCL would pick (NCCL_ALGO/NCCL_PROTO)."""
    table = tuning(hardware, call)
    if table.get(algorithm, protocol)[1] <= 0:
        raise ValueError(f"NCCL does not run {algorithm}/{protocol} for {call.collective} on this hardware")
    time = nccl_time_us(table, hardware, call, algorithm, protocol)
    choice = Choice(algorithm, protocol, channels_used(table, call, algorithm, protocol), time * 1e-6)
    return _time(hardware, call, table, choice)


def timed(hardware: Hardware, call: Call, choice: Choice, table: Tuning | None = None) -> Estimate:
    """The time of a given choice (NCCL's pick for this call, from `choose` or an earlier
    `estimate`) on the hardware: what a fit evaluates many times, since the fitted figures
    never change the choice nor NCCL's table (`as_nccl_sees`), which may be passed in."""
    if call.ranks == 1 or call.nbytes <= 0:
        return Estimate(call, Choice("none", "none", 0, 0.0), 0.0, 0.0, 0.0, 0.0, "")
    return _time(hardware, call, table or tuning(hardware, call), choice)


def _time(hardware: Hardware, call: Call, table: Tuning, choice: Choice) -> Estimate:
    algorithm, protocol, channels = choice.algorithm, choice.protocol, choice.channels
    if algorithm == "symmetric":
        return _symmetric_time(hardware, call, choice)
    full = table.nvls_channels if algorithm in ("nvls", "nvls_tree") else table.channels
    used = channels / full if full else 1.0
    intra_load, net_load = _loads(call, algorithm)
    intra_cap, net_cap, _ = _achieved(hardware, call, algorithm, protocol)
    figures = hardware.protocol(protocol)
    payload = PAYLOAD[protocol] * figures.bandwidth
    intra_cap *= payload * used
    net_cap *= payload * used
    stream_cap = 0.0
    if hardware.network is not None and call.nodes > 1 and hardware.network.transport == "socket":
        stream_cap = socket_capacity(hardware, call, channels) * figures.bandwidth
    latency_us, nccl_bw = table.get(algorithm, protocol)
    if algorithm == "ring" and protocol == "Simple" and call.nodes > 1 and call.collective == "AllReduce" and \
            int(call.nbytes) // (table.channels * call.ranks) >= 64:
        latency_us *= RING_PLATEAU["volta" if hardware.generation == "volta" else "other"]
    latency_us *= figures.latency
    seconds_per_byte = []
    if intra_load > 0:
        seconds_per_byte.append(("intra", intra_load / intra_cap))
    if net_load > 0:
        seconds_per_byte.append(("net", net_load / net_cap))
        if stream_cap > 0:
            seconds_per_byte.append(("streams", net_load / stream_cap))
    # a tree reaches NCCL's measured ceilings only at its size's share (tables.tree_correction)
    cap = _protocol_cap(table, call, algorithm, protocol) * used * figures.bandwidth * tree_correction(call, algorithm,
                                                                                                      protocol)
    if cap > 0:
        seconds_per_byte.append(("protocol", 1.0 / cap))
    if not seconds_per_byte:
        seconds_per_byte.append(("local", 0.0))
    bottleneck, per_byte = max(seconds_per_byte, key=lambda item: item[1])
    transfer = call.nbytes * per_byte
    fill = 0.0
    stages = pipeline_stages(hardware, call, algorithm) if protocol == "Simple" else 0
    if algorithm == "tree" and protocol == "LL128":
        stages = ll128_tree_stages(call)
    if stages and per_byte > 0 and channels:
        per_channel = 1.0 / (per_byte * channels)
        # a call smaller than a chunk per channel crosses every stage whole
        chunk = min(chunk_bytes(table, hardware, call, algorithm, protocol, channels), call.nbytes / channels)
        fill = stages * chunk / per_channel
    latency = latency_us * 1e-6 + hardware.overhead_s
    # the GPUs wait for the host: the thread launching the call (launch.py) and the proxy thread
    # posting its network steps (proxy.py); and a call across nodes takes at least the network's
    # per-call floor (transports.call_floor_s); floors, not added latencies
    floor = max(launch_floor_s(hardware),
                proxy_floor_s(table, hardware, call, algorithm, protocol, channels) * figures.latency + hardware.overhead_s,
                call_floor_s(hardware, call))
    total = latency + fill + transfer
    if total < floor:
        latency, total = floor - fill - transfer, floor
    loads = []
    if intra_load > 0:
        loads.append(Load("intra", intra_load * call.nbytes, intra_cap))
    if net_load > 0:
        loads.append(Load("net", net_load * call.nbytes, net_cap))
        if stream_cap > 0:
            loads.append(Load("streams", net_load * call.nbytes, stream_cap))
    return Estimate(call, choice, total, latency, fill, transfer, bottleneck, tuple(loads))


def _protocol_cap(table: Tuning, call: Call, algorithm: str, protocol: str) -> float:
    """NCCL's measured per-protocol ceilings as an algorithm bandwidth (bytes/s; 0 for none):
    the call moves no faster whatever its links (tuning.cc:256-260)."""
    cap = table.cap(algorithm, protocol)
    return 0.0 if math.isinf(cap) else cap * 1e9




def _symmetric_time(hardware: Hardware, call: Call, choice: Choice) -> Estimate:
    """A symmetric kernel's time (symmetric.py): NCCL's own estimate for it, which NVIDIA fitted
    to the kernels, plus the per-call overhead, floored by the host's launch. Its load on each
    GPU's links is a ring's bytes (each GPU sends and receives (n-1)/n of B per pass) at the
    intra-node rate, so concurrent calls sharing the links are charged as other calls are."""
    from synth.model.nccl import symmetric

    found = symmetric.pick(hardware, call)
    if found is None or found.kernel != choice.protocol:
        raise ValueError(f"NCCL does not run the symmetric kernel {choice.protocol} for this call")
    n = call.ranks
    share = 2 * (n - 1) / n if call.collective == "AllReduce" else (n - 1) / n
    latency = found.base_us * 1e-6 + hardware.overhead_s
    transfer = (found.time_us - found.base_us) * 1e-6
    total = max(latency + transfer, launch_floor_s(hardware))
    loads = (Load("intra", share * call.nbytes, hardware.intra.achieved),)
    if call.nodes > 1 and hardware.network is not None:  # a hierarchical kernel (gin.py): each node's rail traffic
        loads += (Load("net", (call.nodes - 1) / call.nodes * call.nbytes,
                       nics_used(hardware, call.ranks_per_node) * hardware.network.link.achieved),)
    return Estimate(call, choice, total, total - transfer, 0.0, transfer, "symmetric", loads)
