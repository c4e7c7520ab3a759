"""NCCL as it decides and performs: per call, the algorithm, protocol and channels NCCL picks,
and the time the call takes on the hardware, with the links it loads.

Pure: numbers in, numbers out (no topology files, no cost engine); synth/model/nccl_hardware.py
builds its input from a topology, and a cost engine plugs the result in (see `estimate`).

Two halves, kept apart on purpose because NCCL's choice is made on its own model, not on what
the hardware then does:

1. The choice, as NCCL 2.26 makes it (synth/model/nccl_tables.py names every constant):
   * the topology search (src/graph/search.cc ncclTopoCompute) gives each pattern (ring, tree,
     NVLS) a channel count and a per-channel speed from NCCL's speed ladder; `search` below
     replays its passes in closed form over what NCCL's topology sees (links at NCCL's own
     per-link figures, src/graph/topo.h);
   * src/graph/tuning.cc ncclTopoTuneModel turns them into a latency and a bandwidth per
     (collective, algorithm, protocol) (`tuning`), with the LL/LL128 caps, the tree and NVLS
     refinements and the enable rules (LL128 only on NVLink-class paths, NVLS with more than
     two local GPUs, NVLS tree only across nodes, PAT only with one GPU per node);
   * src/enqueue.cc topoGetAlgoInfo picks the (algorithm, protocol) of least estimated time
     (ncclTopoGetAlgoTime: latency + bytes / bandwidth, the tree correction factors, the ring
     plateau) and lowers the channel count for small calls (`choose`).
2. The time on the hardware (`estimate`): NCCL's latency for the chosen pair (NCCL measured
   those per hardware kind), plus the bytes over the bandwidth the algorithm reaches on the
   busiest resource (a GPU's intra-node links, a node's NICs), each at its line rate times the
   efficiency NCCL achieves on it (`Link.efficiency`, with its source), times the protocol's
   payload share (LL carries 4 data bytes in 8, LL128 120 in 128) and within NCCL's measured
   per-channel protocol caps (LL, LL128, and NCCL 2.28's NVLS and NVLS-tree figures); plus,
   for NVLS pipelines, the time the first chunk needs to fill them (`_pipeline_stages`,
   chunks sized as src/enqueue.cc calcCollChunking sizes them). Over TCP sockets a call
   moves at most `sockets per connection x stream bandwidth` per crossing channel, whatever
   the NIC (src/transport/net_socket.cc).

The figures NCCL's source does not have (how fast links really run under NCCL, a per-call
overhead, pipeline stages of a net plugin, and per protocol the share of the modelled rate and
of NCCL's latency a call reaches: `ProtocolFigures`) are the ones `synth calibrate` fits
(synth/calibrate/nccl_fit.py). None of them moves NCCL's choice (`as_nccl_sees`): NCCL picks
from its own tables whatever its calls then achieve, so the switch points between protocols
and algorithms stay NCCL's predictions.

Units: seconds and bytes/s at the interface; NCCL's GB/s and microseconds inside the tuning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

from synth.model import nccl_tables as T

COLLECTIVES = ("AllReduce", "ReduceScatter", "AllGather", "Broadcast", "Reduce")
from synth.model.nccl_names import INTRA_LINK_KINDS, NETWORK_LINK_KINDS, TRANSPORTS  # noqa: E402,F401

INTRA_KINDS = INTRA_LINK_KINDS + ("none",)  # "none": one GPU per node
NET_KINDS = NETWORK_LINK_KINDS
PAYLOAD = {"LL": 0.5, "LL128": 120 / 128, "Simple": 1.0}  # src/include/device.h: LL line 8 B = 4 B data + flag

# Pipeline fill of NVLS trees (Simple): before every channel streams, the first chunk
# crosses each stage of its path store-and-forward. A network hop is counted as 6 stages (the
# sending kernel's copy into the FIFO slot, the proxy's post, the wire, the receiving proxy's
# completion poll, the GPUDirect flush, the receiving kernel's copy: src/transport/net.cc
# sendProxyProgress / recvProxyProgress), an NVLink hop or an NVLS multimem pass as one.
NET_HOP_STAGES = 6
INTRA_HOP_STAGES = 1


@dataclass(frozen=True)
class Link:
    """A kind of link at its line rate (bytes/s per direction: per GPU inside a node, per NIC
    between nodes) and the fraction of it NCCL moves data at, with where that comes from."""

    kind: str
    bandwidth: float
    efficiency: float
    efficiency_source: str

    @property
    def achieved(self) -> float:
        return self.bandwidth * self.efficiency


@dataclass(frozen=True)
class Network:
    """How nodes reach each other: `nics` per node of `link`, NCCL's transport over them.

    `latency` is what a net plugin reports as its latency (NCCL adds it to every inter-node
    step, twice for Simple: tuning.cc:302-304). For the socket transport, each channel's
    connection is `sockets` TCP streams (NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD, one
    when the proxy thread itself sends) and each stream moves at most `stream_bandwidth`."""

    link: Link
    nics: int
    transport: str = "ib"
    gdr: bool = True
    latency_s: float = 0.0
    sockets: int = 1
    stream_bandwidth: float = math.inf
    stream_source: str = ""
    unpack: bool = False  # a net plugin whose receive side unpacks on the GPU (GPUDirect-TCPX/O)
    stages: float | None = None  # store-and-forward stages per network hop (None: NET_HOP_STAGES for NVLS trees)


@dataclass(frozen=True)
class ProtocolFigures:
    """What one protocol (LL, LL128, Simple) achieves on this hardware, relative to the model:
    `bandwidth` multiplies every rate a call of the protocol drains its loads at (links x
    efficiency x payload share, within NCCL's measured per-protocol ceilings), `latency`
    multiplies NCCL's own latency for the (algorithm, protocol) pair (its baseLat plus hops x
    hwLat, so the factor scales with the hops of another node count as NCCL's table does).
    1.0 is NCCL's own figure; `synth calibrate` fits them (synth/calibrate/nccl_fit.py)."""

    protocol: str
    bandwidth: float = 1.0
    latency: float = 1.0

    def __post_init__(self):
        if self.protocol not in PAYLOAD:
            raise ValueError(f"protocol {self.protocol!r}: one of {', '.join(PAYLOAD)}")
        if not (self.bandwidth > 0 and self.latency > 0):
            raise ValueError(f"protocol {self.protocol} figures must be positive")


@dataclass(frozen=True)
class Hardware:
    """A group's hardware as NCCL sees it: the GPU generation (which of NCCL's tables apply),
    the GPUs of a node and their intra-node link, the network between nodes (None: one node),
    the CPU vendor (NCCL's LL limits across nodes depend on it), whether NVLink SHARP (NVLS)
    is there, and a per-call overhead NCCL's own latency model does not have (a launcher
    driving several GPUs from one thread, a GPU time-shared by two processes)."""

    generation: str
    gpus_per_node: int
    intra: Link
    network: Network | None = None
    nvls: bool = False
    cpu: str = "intel"
    overhead_s: float = 0.0
    algorithms: tuple[str, ...] = ()  # NCCL_ALGO: the algorithms NCCL may pick (empty: all)
    protocols: tuple[str, ...] = ()  # NCCL_PROTO
    buffsize: int = T.BUFFER["Simple"]  # NCCL_BUFFSIZE: the Simple protocol's buffer per connection
    protocol_figures: tuple[ProtocolFigures, ...] = ()  # fitted per-protocol factors (none: NCCL's own)
    gpus_per_thread: int = 1  # GPUs one host thread launches each call on (nccl-tests -g N); 1: a process per GPU
    cuda_graphs: bool = False  # calls replayed from CUDA graphs: no per-call host launch

    def protocol(self, protocol: str) -> ProtocolFigures:
        """The figures of one protocol (factors of 1 when none were given)."""
        for figures in self.protocol_figures:
            if figures.protocol == protocol:
                return figures
        return ProtocolFigures(protocol)

    def __post_init__(self):
        if self.generation not in T.GENERATIONS:
            raise ValueError(f"generation {self.generation!r}: one of {', '.join(T.GENERATIONS)}")
        if self.intra.kind not in INTRA_KINDS:
            raise ValueError(f"intra-node link kind {self.intra.kind!r}: one of {', '.join(INTRA_KINDS)}")
        if self.network is not None and self.network.transport not in TRANSPORTS:
            raise ValueError(f"transport {self.network.transport!r}: one of {', '.join(TRANSPORTS)}")


@dataclass(frozen=True)
class Call:
    """One collective call: `ranks_per_node` GPUs on each of `nodes` nodes, `nbytes` = B (the
    input of ReduceScatter, the output of AllGather, the buffer otherwise; nccl-tests' size)."""

    collective: str
    nodes: int
    ranks_per_node: int
    nbytes: float

    def __post_init__(self):
        if self.collective not in COLLECTIVES:
            raise ValueError(f"collective {self.collective!r}: one of {', '.join(COLLECTIVES)}")
        if self.nodes < 1 or self.ranks_per_node < 1:
            raise ValueError("a call needs at least one node and one rank per node")

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass(frozen=True)
class Graph:
    """What NCCL's topology search found for one pattern: channels and per-channel speeds
    (GB/s) inside the node and across nodes, and the path types (PATH_* of topo.h) that decide
    LL128 and the latency class."""

    pattern: str
    channels: int
    bw_intra: float
    bw_inter: float
    type_intra: int
    type_inter: int
    latency_inter_us: float = 0.0


@dataclass(frozen=True)
class Tuning:
    """NCCL's table for one call: per (algorithm, protocol), latency (us) and algorithm
    bandwidth (GB/s), 0 bandwidth meaning disabled; and the channel counts it starts from."""

    entries: tuple[tuple[str, str, float, float, float], ...]  # (algorithm, protocol, latency_us, bandwidth, cap)
    channels: int
    nvls_channels: int
    graphs: tuple[Graph, ...]
    # (algorithm, protocol) -> (latency_us, bandwidth, cap): a dict look-up, since a planner asks
    # for entries millions of times (a linear scan took 9-14% of a plan's CPU)
    table: dict = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self):
        object.__setattr__(self, "table", {(a, p): (latency, bandwidth, cap)
                                           for a, p, latency, bandwidth, cap in reversed(self.entries)})  # the first entry wins, as a scan

    def get(self, algorithm: str, protocol: str) -> tuple[float, float]:
        """(latency us, algorithm bandwidth GB/s) as NCCL prints them (NCCL_DEBUG_SUBSYS=TUNING)."""
        entry = self.table.get((algorithm, protocol))
        return (entry[0], entry[1]) if entry is not None else (0.0, 0.0)

    def cap(self, algorithm: str, protocol: str) -> float:
        """The part of NCCL's bandwidth that is a measured ceiling (LL's llMaxBw, the LL128 and
        tree per-channel maxima, tuning.cc:256-260), as algorithm GB/s; inf where none applies."""
        entry = self.table.get((algorithm, protocol))
        return entry[2] if entry is not None else math.inf


@dataclass(frozen=True)
class Choice:
    algorithm: str
    protocol: str
    channels: int  # what the call runs on (fewer than the communicator's for small calls)
    nccl_time_s: float  # NCCL's own estimate, what it minimised


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


# --- what NCCL's topology sees ------------------------------------------------------------------

PATH_LOC, PATH_NVL, PATH_NVB, PATH_C2C, PATH_PIX, PATH_PXB, PATH_PXN, PATH_PHB, PATH_SYS = range(9)  # topo.h


def nccl_link_ratio(kind: str, generation: str) -> float:
    """What NCCL's topology takes a link of this kind to carry, over its line rate: NVLink at
    SMxx_NVLINK_BW per link (20, 20, 20.6, 40 GB/s) of 25/25/25/50 GB/s; PCIe at
    width x GT/s / 80 (topo.cc:409-476; 12 GB/s for Gen3 x16) of 15.75 GB/s per Gen3 x16; a
    NIC at its port speed (topo.cc:370-372)."""
    if kind in ("nvswitch", "nvlink"):
        return T.NVLINK_BW_PER_LINK[generation] / T.NVLINK_LINE_PER_LINK[generation]
    if kind == "pcie":
        return T.PCI_GEN3_X16_BW / T.PCI_GEN3_X16_LINE
    return 1.0


# The PCIe link between a GPU and its NIC as NCCL's topology sees it (GB/s): Gen3 on V100
# systems, Gen4 on A100, Gen5 on H100 and B200 (x16; topo.cc:476 width*speed/80).
PCI_VIEW = {"volta": 12.0, "ampere": 24.0, "hopper": 48.0, "blackwell": 48.0}


@dataclass(frozen=True)
class _View:
    """NCCL's view of the hardware for one call (GB/s)."""

    ppn: int
    nodes: int
    nics: int
    nic_bw: float
    max_bw: float  # system->maxBw: the fastest GPU->NET path with a network, GPU->GPU without
    total_bw: float  # system->totalBw: a GPU's NVLink total, or its PCI link
    generation: str
    type_intra: int
    type_inter: int


def nics_used(hardware: Hardware, ranks_per_node: int) -> int:
    """NICs a communicator of `ranks_per_node` GPUs per node reaches through its own GPUs'
    PCIe switches (NCCL's rail-local channels): the GPUs' share of the node's NICs, at least one."""
    if hardware.network is None:
        return 0
    share = hardware.network.nics * ranks_per_node / max(hardware.gpus_per_node, 1)
    return max(1, min(hardware.network.nics, math.ceil(share - 1e-9)))


def _view(hardware: Hardware, call: Call) -> _View:
    g = hardware.generation
    ppn = call.ranks_per_node
    intra = hardware.intra
    intra_bw = intra.bandwidth / 1e9 * nccl_link_ratio(intra.kind, g)
    if intra.kind in ("nvswitch", "nvlink"):
        total = intra_bw
        path = intra_bw if intra.kind == "nvswitch" else intra_bw / 3  # a hybrid cube mesh: pairs on 2 of 6 links
        type_intra = PATH_NVL
    else:
        total = path = PCI_VIEW[g] if intra.kind == "none" else intra_bw
        type_intra = PATH_PXB if intra.kind == "pcie" else PATH_PHB
    if ppn == 1:
        type_intra = PATH_LOC
    if call.nodes == 1:
        if ppn == 1:
            return _View(1, 1, 0, 0.0, 5000.0, 5000.0, g, PATH_LOC, PATH_PIX)  # search.cc:43 LOC_BW
        return _View(ppn, 1, 0, 0.0, path, total, g, type_intra, PATH_PIX)
    network = hardware.network
    nic_bw = network.link.bandwidth / 1e9
    if network.link.kind == "loopback":  # lo has no /sys/class/net/lo/speed: NCCL assumes 10 Gbps (net_socket.cc:96-98)
        nic_bw = T.SOCKET_DEFAULT_SPEED_GBPS / 8
    if network.transport == "socket":
        type_inter = PATH_PHB  # sockets move host memory: the NIC is reached through the CPU
        gpu_to_nic = nic_bw
    else:
        type_inter = PATH_PIX if network.gdr else PATH_PHB
        gpu_to_nic = min(nic_bw, PCI_VIEW[g])
    return _View(ppn, call.nodes, nics_used(hardware, ppn), nic_bw, gpu_to_nic, max(total, PCI_VIEW[g]), g,
                 type_intra, type_inter)


# --- the topology search (src/graph/search.cc ncclTopoCompute) ----------------------------------


def _feasible_channels(view: _View, bw_intra: float, bw_inter: float, limit: int) -> int:
    """The most channels (up to `limit`) the search can place at these speeds: every channel
    takes `bw_intra` of each GPU's intra-node links (of `view.total_bw`) except, across nodes,
    on the GPU where it leaves for its NIC, and `bw_inter` of one NIC."""
    channels = limit
    if view.ppn > 1:
        share = 1.0 if view.nodes == 1 else (view.ppn - 1) / view.ppn
        channels = min(channels, int(view.total_bw / (bw_intra * share) + 1e-9))
    if view.nodes > 1:
        channels = min(channels, view.nics * int(view.nic_bw / bw_inter + 1e-9))
    return channels


def search(hardware: Hardware, call: Call, pattern: str) -> Graph | None:
    """ncclTopoCompute for `pattern` ("ring", "tree", "nvls") in closed form: pass 1 walks the
    speed ladder down from the fastest speed the GPU's paths allow and keeps the most
    bandwidth (channels x speed; search.cc:1000-1090), ncclTopoDupChannels doubles fast
    channels (search.cc:898-911), pass 2 raises the speeds the found channels can take
    (rings both, trees the intra-node speed up to twice the network's, NVLS the network's up
    to twice the intra-node's; search.cc:1093-1118). Trees get the ring's channel count
    (init.cc:848-849); NVLS one channel per local GPU. None when the pattern does not apply."""
    view = _view(hardware, call)
    g = view.generation
    if pattern == "nvls" and not _nvls_supported(hardware, call):
        return None
    ladder = T.speeds("inter" if call.nodes > 1 else "intra", g)
    if pattern == "ring":
        low, high = 1, T.RING_MAX_CHANNELS
    elif pattern == "tree":
        low = high = search(hardware, call, "ring").channels
    else:
        high = min(T.NVLS_MAX_ARITY, view.ppn)
        low = high if call.nodes == 1 else 1
    if pattern != "ring" and view.ppn > 1:  # search.cc:1011: trees and NVLS may use all of a GPU's links
        view = _View(view.ppn, view.nodes, view.nics, view.nic_bw, view.max_bw, view.total_bw * view.ppn / (view.ppn - 1),
                     g, view.type_intra, view.type_inter)
    channels, speed = _pass_one(view, ladder, low, high)
    if channels == 0 and pattern == "nvls":
        return None
    if channels == 0:  # search.cc:1126-1133: no path at any speed, "falling back to simple order"
        latency_inter = hardware.network.latency_s * 1e6 if (hardware.network is not None and call.nodes > 1) else 0.0
        return Graph(pattern, 1, 0.1, 0.1, PATH_SYS, PATH_SYS, latency_inter)
    bw_intra = bw_inter = speed
    if pattern != "nvls" and speed >= 25.0 and not (g in ("hopper", "blackwell") and speed < 50.0 and channels > 4):
        doubled = min(2 * channels, high if pattern == "ring" else 2 * channels)
        divide = -(-doubled // channels)
        channels, bw_intra, bw_inter = doubled, speed / divide, speed / divide
    index = next((i for i, s in enumerate(ladder) if s <= bw_inter), len(ladder) - 1)
    while index > 0:
        faster = ladder[index - 1]
        if pattern == "ring":
            if faster > view.max_bw or _feasible_channels(view, faster, faster, channels) < channels:
                break
            bw_intra = bw_inter = faster
        elif pattern == "tree":
            if not bw_intra < 2 * bw_inter or _feasible_channels(view, faster, bw_inter, channels) < channels:
                break
            bw_intra = faster
        else:
            if call.nodes == 1 or not bw_inter < 2 * bw_intra or faster > view.max_bw:
                break
            if _feasible_channels(view, bw_intra, faster, channels) < channels:
                break
            bw_inter = faster
        index -= 1
    latency_inter = hardware.network.latency_s * 1e6 if (hardware.network is not None and call.nodes > 1) else 0.0
    return Graph(pattern, channels, bw_intra, bw_inter, view.type_intra, view.type_inter, latency_inter)


def _pass_one(view: _View, ladder: tuple[float, ...], low: int, high: int) -> tuple[int, float]:
    index = 0
    while index < len(ladder) - 1 and (ladder[index] > view.max_bw or ladder[index] * low > view.total_bw):
        index += 1
    best = (0, 0.0)
    while index < len(ladder):
        speed = ladder[index]
        channels = _feasible_channels(view, speed, speed, high)
        if channels >= low and channels * speed > best[0] * best[1]:
            best = (channels, speed)
            if channels == high or channels * speed >= view.total_bw:
                break  # search.cc:1035-1036: a perfect or full solution ends the search
        if index + 1 < len(ladder) and best[0] and ladder[index + 1] / best[1] <= 0.49:
            break  # search.cc:1082: do not drop below half the speed already found
        index += 1
    return best


def _nvls_supported(hardware: Hardware, call: Call) -> bool:
    """NVLS needs NVSwitch multicast (Hopper or later) and more than two local GPUs
    (src/transport/nvls.cc:157 `gpuCount <= 2` returns without NVLS)."""
    return (hardware.nvls and hardware.intra.kind == "nvswitch" and hardware.generation in ("hopper", "blackwell")
            and call.ranks_per_node > 2)


# --- the tuning model (src/graph/tuning.cc ncclTopoTuneModel, v2.26.2) ---------------------------


def _nsteps(collective: str, ranks: int) -> int:
    if collective == "AllReduce":
        return 2 * (ranks - 1)
    if collective in ("ReduceScatter", "AllGather"):
        return ranks - 1
    return ranks


def communicator_channels(ring: Graph, tree: Graph, hardware: Hardware, call: Call) -> int:
    """comm->nChannels: the fewer of ring and tree channels, doubled by ncclTopoPostset
    (connect.cc:452), doubled again on Hopper+ across nodes with fast rings (connect.cc:465-467)
    and for GPU-unpack net plugins (connect.cc:471-473)."""
    channels = min(T.MAX_CHANNELS, min(ring.channels, tree.channels) * 2)
    if hardware.generation in ("hopper", "blackwell") and call.nodes > 1 and ring.bw_intra > 45.0 and channels < 16:
        channels = min(T.MAX_CHANNELS, 2 * channels)
    if hardware.network is not None and hardware.network.unpack and call.nodes > 1 and channels < 16:
        channels = min(T.MAX_CHANNELS, 2 * channels)
    return channels


def tuning(hardware: Hardware, call: Call) -> Tuning:
    """NCCL's latency and bandwidth per (algorithm, protocol) for this call's collective and
    communicator (tuning.cc:212-443), with every algorithm NCCL would not run at 0 bandwidth.
    NCCL computes it once per communicator; so does this (it does not depend on the size, nor
    on the figures NCCL does not see: `as_nccl_sees`)."""
    return _tuning(as_nccl_sees(hardware), call.collective, call.nodes, call.ranks_per_node)


def as_nccl_sees(hardware: Hardware) -> Hardware:
    """The hardware without the figures NCCL's choice does not use: the efficiencies links
    reach, per-call overhead, pipeline stages and per-protocol factors. NCCL picks from its own
    tables (line rates, its speed ladder, its latencies), so fitting what the hardware achieves
    never moves NCCL's choice; only the time of what it chose."""
    intra = replace(hardware.intra, efficiency=1.0, efficiency_source="")
    network = hardware.network
    if network is not None:
        network = replace(network, link=replace(network.link, efficiency=1.0, efficiency_source=""), stages=None)
    return replace(hardware, intra=intra, network=network, overhead_s=0.0, protocol_figures=(), gpus_per_thread=1,
                   cuda_graphs=False)


def launch_floor_s(hardware: Hardware) -> float:
    """The least time a call takes when calls follow each other: what the host spends launching
    it on every GPU its thread drives (nccl_tables.LAUNCH_US_PER_GPU); none under CUDA graphs."""
    if hardware.cuda_graphs:
        return 0.0
    return max(1, hardware.gpus_per_thread) * T.LAUNCH_US_PER_GPU * 1e-6


@lru_cache(maxsize=4096)
def _tuning(hardware: Hardware, collective: str, nodes: int, ranks_per_node: int) -> Tuning:
    call = Call(collective, nodes, ranks_per_node, 0)
    n = call.ranks
    g = hardware.generation
    ring = search(hardware, call, "ring")
    tree = search(hardware, call, "tree") or ring
    nvls = search(hardware, call, "nvls")
    graphs = {"ring": ring, "tree": tree, "nvls": nvls, "nvls_tree": nvls}
    gi = T.generation_index(g)
    index2 = min(nodes, 3) - 1
    ll_max = (T.LL_MAX_BW[g] if nodes == 1 else T.LL_MAX_BW_BY_CPU[hardware.cpu])[index2]
    per_tree = T.PER_CHANNEL_TREE[g][index2]
    per_ring_ll128 = T.PER_CHANNEL_RING_LL128[g][index2]
    per_tree_ll128 = T.PER_CHANNEL_TREE_LL128[g][index2]
    ppn = n / nodes
    nsteps = _nsteps(call.collective, n)
    unpack = hardware.network is not None and hardware.network.unpack
    entries = []
    for a in ("tree", "ring", "nvls", "nvls_tree", "pat"):
        graph = graphs.get(a, ring)
        for p in T.PROTOCOLS:
            bandwidth, latency, cap = _entry(call, hardware, a, p, graph, ring, ll_max, per_tree, per_ring_ll128,
                                             per_tree_ll128, ppn, nsteps, gi, unpack)
            entries.append((a, p, latency, bandwidth, cap))
    nvls_channels = T.NVLS_CHANNELS.get(g, 0) if nvls is not None else 0
    return Tuning(tuple(entries), communicator_channels(ring, tree, hardware, call), nvls_channels,
                  tuple(x for x in (ring, tree, nvls) if x is not None))


def _entry(call: Call, hardware: Hardware, a: str, p: str, graph: Graph | None, ring: Graph, ll_max: float,
           per_tree: float, per_ring_ll128: float, per_tree_ll128: float, ppn: float, nsteps: int, gi: int,
           unpack: bool) -> tuple[float, float, float]:
    """(algorithm bandwidth GB/s, latency us, measured cap GB/s) of one pair, 0 bandwidth when
    NCCL skips it."""
    coll, n, nodes = call.collective, call.ranks, call.nodes
    if n == 1:
        return (0.0, 0.0, math.inf)
    # Which algorithms each collective runs (tuning.cc:239-248, enqueue.cc:1664-1676).
    if coll in ("Broadcast", "Reduce") and a != "ring":
        return (0.0, 0.0, math.inf)
    if coll in ("ReduceScatter", "AllGather") and a not in ("pat", "ring", "nvls"):
        return (0.0, 0.0, math.inf)
    if coll == "AllReduce" and a == "pat":
        return (0.0, 0.0, math.inf)
    if a in ("nvls", "nvls_tree") and p != "Simple":
        return (0.0, 0.0, math.inf)
    if (hardware.algorithms and a not in hardware.algorithms) or (hardware.protocols and p not in hardware.protocols):
        return (0.0, 0.0, math.inf)  # NCCL_ALGO / NCCL_PROTO (tuning.cc:363-378, 441-442)
    if a == "pat" and (p != "Simple" or nodes != n or unpack):  # tuning.cc:178-185 ncclPatEnable
        return (0.0, 0.0, math.inf)
    if a in ("nvls", "nvls_tree") and graph is None:
        return (0.0, 0.0, math.inf)
    if a == "nvls_tree" and nodes == 1:  # tuning.cc:412
        return (0.0, 0.0, math.inf)
    if a == "nvls" and nodes > 1:  # tuning.cc:414-417: NVLS across nodes needs CollNet
        return (0.0, 0.0, math.inf)
    if a == "nvls" and coll in ("ReduceScatter", "AllGather") and (nodes > 1 or n > T.NVLS_MAX_ARITY):
        return (0.0, 0.0, math.inf)
    if a == "tree" and nodes == 1 and coll != "AllReduce":
        return (0.0, 0.0, math.inf)
    if graph is None:
        graph = ring
    bw = graph.bw_intra if nodes <= 2 else graph.bw_inter  # tuning.cc:250
    if a == "nvls":
        bw = min(graph.bw_intra, graph.bw_inter)  # tuning.cc:251
    if a == "nvls_tree":
        bw = min(graph.bw_intra, graph.bw_inter if nodes <= 2 else graph.bw_inter / 2)  # tuning.cc:252
    bus = graph.channels * bw
    cap = math.inf  # the measured ceilings among the refinements, kept apart from the link budget
    # Refinements (tuning.cc:256-262).
    if a == "ring" and p == "LL":
        bus, cap = min(ll_max, bus * 0.5), ll_max
    if a == "ring" and p == "LL128":
        bus, cap = min(bus * 0.92, graph.channels * per_ring_ll128), graph.channels * per_ring_ll128
    if a == "tree" and coll == "AllReduce":
        bus = min(bus * 0.92, graph.channels * per_tree)  # a budget: measured tree calls exceed it
    if a == "tree" and p == "LL":
        bus, cap = min(bus / 3.8, ll_max), ll_max
    if a == "tree" and p == "LL128":
        share = 7.0 / 9.0 if nodes == 1 else 120.0 / 128.0
        bus = min(bus * share, graph.channels * per_tree_ll128)
        cap = graph.channels * per_tree_ll128
    if a == "nvls_tree":  # NCCL 2.28's measured per-channel NVLS tree maximum (not in 2.26's choice)
        cap = graph.channels * T.PER_CHANNEL_NVLS_TREE[hardware.generation][min(nodes, 3) - 1] or math.inf
    if a == "pat":
        bus *= 0.75
    # Bus to algorithm bandwidth (tuning.cc:290-296).
    if not (a != "ring" and coll in ("AllGather", "ReduceScatter")):
        ratio = n / nsteps if a == "ring" else (5.0 / 6.0 if a in ("nvls", "nvls_tree") else 0.5)
        bus *= ratio
        cap *= n / nsteps if a == "nvls_tree" else ratio  # 2.28 converts NVLS bus bandwidth as rings do
    # LL128 only on NVLink-class paths, one compute capability (tuning.cc:424-440).
    if p == "LL128":
        hopper_plus = gi >= T.generation_index("hopper")
        enabled = (graph.type_inter <= PATH_PXB or (hopper_plus and graph.type_inter <= PATH_PXN))
        enabled = enabled and graph.type_intra <= PATH_NVB
        if not enabled:
            bus = 0.0
    if bus <= 0:
        return (0.0, 0.0, math.inf)
    # Latency (tuning.cc:297-347).
    pi = T.PROTOCOLS.index(p)
    latency = T.BASE_LATENCY[a][pi]
    intra_hw = "nvlink" if graph.type_intra == PATH_NVL else "pci"
    intra_lat = T.HW_LATENCY[intra_hw][a][pi]
    inter_lat = T.HW_LATENCY["net"]["tree" if ppn == 1 else a][pi] + graph.latency_inter_us
    if p == "Simple":
        inter_lat += graph.latency_inter_us
    if a == "ring":
        hw = intra_hw if nodes == 1 else "net"
        lat = T.HW_LATENCY[hw][a][pi]
        if coll in ("Reduce", "Broadcast"):
            latency += nsteps * (T.HW_LATENCY[hw]["tree"][pi] if p == "Simple" else lat)  # different channels
        else:
            overhead = 0.0
            if nodes > 1:
                overhead = T.NET_OVERHEAD[hardware.cpu] * (3 if p == "Simple" else 1)
            intra_lat = max(intra_lat, overhead)
            inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if coll == "AllReduce" else nodes - 1)
            latency += (nsteps - inter_steps) * intra_lat + inter_steps * inter_lat
    elif a == "tree":
        if coll == "AllReduce":
            latency += 2 * ((n // nodes - 1) * intra_lat + _log2i(nodes) * inter_lat)
    elif a == "nvls":
        latency = intra_lat + (inter_lat if nodes > 1 else 0.0)
    elif a == "nvls_tree":
        latency += intra_lat + 2 * _log2i(nodes) * inter_lat
    elif a == "pat":
        latency = 8 + _log2i(nodes) * (inter_lat / 3.5) + n * 2.8
    return (bus, latency, cap)


def _log2i(x: int) -> int:
    return max(int(x).bit_length() - 1, 0)


# --- the choice (src/enqueue.cc) -----------------------------------------------------------------


def nccl_time_us(table: Tuning, hardware: Hardware, call: Call, algorithm: str, protocol: str) -> float:
    """ncclTopoGetAlgoTime (tuning.cc:530-547): latency + bytes / bandwidth, with the tree
    correction for medium sizes and the ring plateau; -1 for a disabled pair."""
    latency, bandwidth = table.get(algorithm, protocol)
    if bandwidth <= 0:
        return -1.0
    nbytes = int(call.nbytes)
    log_size = _log2i(nbytes >> 6) if nbytes >> 6 > 0 else -1
    if algorithm == "tree" and call.collective == "AllReduce" and 0 <= log_size < 23:
        bandwidth *= T.TREE_CORRECTION[protocol][log_size]
    if (algorithm == "ring" and protocol == "Simple" and call.nodes > 1 and call.collective == "AllReduce"
            and nbytes // (table.channels * call.ranks) >= 64):
        latency *= T.RING_PLATEAU["volta" if hardware.generation == "volta" else "other"]
    return latency + nbytes / (1000 * bandwidth)


def choose(hardware: Hardware, call: Call, table: Tuning | None = None) -> Choice:
    """NCCL's pick for the call: the least estimated time over the enabled pairs, in NCCL's
    loop order (the first of equal times), then the channels it runs on (enqueue.cc:1691-1779)."""
    table = table or tuning(hardware, call)
    best = None
    for algorithm in ("tree", "ring", "nvls", "nvls_tree", "pat"):
        for protocol in T.PROTOCOLS:
            time = nccl_time_us(table, hardware, call, algorithm, protocol)
            if time >= 0 and (best is None or time < best[0]):
                best = (time, algorithm, protocol)
    if best is None:
        raise ValueError(f"no NCCL algorithm for {call.collective} over {call.ranks} ranks")
    time, algorithm, protocol = best
    return Choice(algorithm, protocol, _channels_used(table, call, algorithm, protocol), time * 1e-6)


def _channels_used(table: Tuning, call: Call, algorithm: str, protocol: str) -> int:
    """enqueue.cc:1734-1762: NVLS runs on its own channels; rings and trees drop channels while
    the call is smaller than channels x threads x the per-thread threshold."""
    if algorithm in ("nvls", "nvls_tree"):
        return table.nvls_channels
    channels = table.channels
    threads = T.MAX_THREADS[protocol]
    threshold = T.THREAD_THRESHOLD[protocol] * (call.ranks if (algorithm == "ring" and protocol == "LL") else 1)
    while call.nbytes < channels * threads * threshold and channels >= 2:
        channels -= 1
    return channels


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


def _pipeline_stages(hardware: Hardware, call: Call, algorithm: str) -> float:
    """Store-and-forward stages the first chunk crosses before the pipeline streams: an NVLS
    pass is one, a network hop `Network.stages` (NET_HOP_STAGES by default) in each direction
    of each tree level. Rings and chains stream from the first step (every rank starts on its
    own block). For the classic tree NCCL's latency already counts a hop latency per tree level
    (tuning.cc:326-330) and measured InfiniBand trees show no chunk-sized fill, so it has none
    unless a calibration fitted `stages` for the network (a plugin such as GPUDirect-TCPXO
    stages every chunk through bounce buffers)."""
    depth = max(1, math.ceil(math.log2(call.nodes))) if call.nodes > 1 else 0
    fitted = hardware.network.stages if hardware.network is not None else None
    hop = NET_HOP_STAGES if fitted is None else fitted
    if algorithm == "nvls_tree":
        return 2 * INTRA_HOP_STAGES + 2 * depth * hop
    if algorithm == "nvls":
        return 2 * INTRA_HOP_STAGES
    if algorithm == "tree" and fitted is not None:
        return 2 * depth * fitted
    return 0.0


def chunk_bytes(table: Tuning, hardware: Hardware, call: Call, algorithm: str, protocol: str, channels: int) -> int:
    """calcCollChunking (enqueue.cc:1812-1912): the chunk a channel moves per step, which NCCL
    shrinks for smaller calls on NVLS and trees."""
    step = (hardware.buffsize if protocol == "Simple" else T.BUFFER[protocol]) // T.NCCL_STEPS
    chunk = step * (T.RING_CHUNK_STEPS if (protocol == "Simple" and algorithm == "ring") else 1)
    if protocol == "LL":
        chunk //= 2
    nbytes = call.nbytes
    if algorithm == "nvls":
        heads = call.ranks_per_node
        concurrent = channels * heads
        chunk = min(chunk, T.NVLS_CHUNK)
        if call.nodes > 1 and table.get("nvls", "Simple")[1] < 150:
            chunk = min(chunk, 32768)
        if nbytes < 64 * concurrent * chunk and chunk > 65536:
            chunk = 65536
        if nbytes < 8 * concurrent * chunk and chunk > 32768:
            chunk = 32768
        if nbytes < 2 * concurrent * chunk and chunk > 16384:
            chunk = 16384
    elif algorithm == "nvls_tree":
        concurrent = channels * call.ranks_per_node
        chunk = T.NVLS_CHUNK if call.nodes < 4 else min(T.NVLS_CHUNK, 65536)
        for factor, limit in ((32, 262144), (16, 131072), (4, 65536), (1, 32768)):
            if nbytes < factor * concurrent * chunk and chunk > limit:
                chunk = limit
    elif algorithm == "tree" and protocol == "LL128":
        ppn = call.ranks_per_node
        steps = 1 + _log2i(call.nodes) + 0.1 * ppn
        while nbytes // (channels * chunk) < steps * 64 / ppn and chunk > 131072:
            chunk //= 2
        while nbytes // (channels * chunk) < steps * 16 / ppn and chunk > 32768:
            chunk //= 2
    return chunk


def _achieved(hardware: Hardware, call: Call, algorithm: str, protocol: str) -> tuple[float, float, float]:
    """(intra capacity per GPU, network capacity per node, NVLS factor) in bytes/s at which the
    algorithm can drain its loads, before channels and caps."""
    intra = hardware.intra.achieved
    factor = 1.0
    if algorithm in ("nvls", "nvls_tree"):
        factor = T.NVLS_EFFICIENCY.get(hardware.generation, 1.0)
    net = 0.0
    if hardware.network is not None and call.nodes > 1:
        network = hardware.network
        net = nics_used(hardware, call.ranks_per_node) * network.link.achieved
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
    choice = Choice(algorithm, protocol, _channels_used(table, call, algorithm, protocol), time * 1e-6)
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
        stream_cap = _socket_capacity(hardware, call, channels) * figures.bandwidth
    latency_us, nccl_bw = table.get(algorithm, protocol)
    if algorithm == "ring" and protocol == "Simple" and call.nodes > 1 and call.collective == "AllReduce" and \
            int(call.nbytes) // (table.channels * call.ranks) >= 64:
        latency_us *= T.RING_PLATEAU["volta" if hardware.generation == "volta" else "other"]
    latency_us *= figures.latency
    seconds_per_byte = []
    if intra_load > 0:
        seconds_per_byte.append(("intra", intra_load / intra_cap))
    if net_load > 0:
        seconds_per_byte.append(("net", net_load / net_cap))
        if stream_cap > 0:
            seconds_per_byte.append(("streams", net_load / stream_cap))
    cap = _protocol_cap(table, call, algorithm, protocol) * used * figures.bandwidth
    if cap > 0:
        seconds_per_byte.append(("protocol", 1.0 / cap))
    if not seconds_per_byte:
        seconds_per_byte.append(("local", 0.0))
    bottleneck, per_byte = max(seconds_per_byte, key=lambda item: item[1])
    transfer = call.nbytes * per_byte
    fill = 0.0
    stages = _pipeline_stages(hardware, call, algorithm) if protocol == "Simple" else 0
    if stages and per_byte > 0 and channels:
        per_channel = 1.0 / (per_byte * channels)
        # a call smaller than a chunk per channel crosses every stage whole
        chunk = min(chunk_bytes(table, hardware, call, algorithm, protocol, channels), call.nbytes / channels)
        fill = stages * chunk / per_channel
    latency = latency_us * 1e-6 + hardware.overhead_s
    floor = launch_floor_s(hardware)
    if latency + fill + transfer < floor:  # the GPUs wait for the host (a launch floor, not an added latency)
        latency = floor - fill - transfer
    loads = []
    if intra_load > 0:
        loads.append(Load("intra", intra_load * call.nbytes, intra_cap))
    if net_load > 0:
        loads.append(Load("net", net_load * call.nbytes, net_cap))
        if stream_cap > 0:
            loads.append(Load("streams", net_load * call.nbytes, stream_cap))
    return Estimate(call, choice, latency + fill + transfer, latency, fill, transfer, bottleneck, tuple(loads))


def _protocol_cap(table: Tuning, call: Call, algorithm: str, protocol: str) -> float:
    """NCCL's measured per-protocol ceilings as an algorithm bandwidth (bytes/s; 0 for none):
    the call moves no faster whatever its links (tuning.cc:256-260)."""
    cap = table.cap(algorithm, protocol)
    return 0.0 if math.isinf(cap) else cap * 1e9


def _socket_capacity(hardware: Hardware, call: Call, channels: int) -> float:
    """Bytes/s a node's traffic can leave it over TCP: every channel crossing the node boundary
    is one connection of `sockets` streams (net_socket.cc:279-330, 557), each at most
    `stream_bandwidth` when one GPU of the host is in the call, and that shared by the host's
    GPUs in the call otherwise (`host_stream_share`)."""
    network = hardware.network
    return channels * max(1, network.sockets) * network.stream_bandwidth * host_stream_share(call)


def host_stream_share(call: Call) -> float:
    """The share of a TCP stream's rate one connection gets when `ranks_per_node` GPUs of a host
    are in the call. Sockets move host memory (no GPUDirect): every GPU of the call has a proxy
    thread on the host that polls its connections and, on the channels that cross, copies each
    step between the GPU's FIFO and the socket through the host's one TCP stack (and, in a
    VM, its one virtual NIC's queues). The host's per-flow work is shared by all of them, so a
    stream moves 1/ranks_per_node of what it moves with one GPU per host. NVIDIA/nccl#209
    (GCP N1, 8 V100 per VM, 32 Gb/s): one GPU per VM reaches the line (2 x 1, 8 streams per
    connection: 31 Gb/s busbw; 4 x 1, 16 streams: 30.8), 8 GPUs per VM do not (2 x 8, 4
    streams: 14.7 Gb/s; 4 x 8, 12 streams: 22.5), which no per-stream rate alone gives."""
    return 1.0 / max(1, call.ranks_per_node)


def socket_streams(vendor: str, threads: int | None = None, sockets_per_thread: int | None = None) -> int:
    """Streams per connection NCCL's socket transport opens (ncclNetSocketGetNsockNthread):
    NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD, auto-detected by NIC vendor (AWS ENA 2 x 8,
    GCP gVNIC 4 x 1, else none: the proxy thread sends on its one control socket), at most 64."""
    auto_threads, auto_sockets = T.SOCKET_AUTO.get(vendor, T.SOCKET_AUTO["other"])
    threads = auto_threads if threads is None else min(threads, T.SOCKET_MAX_THREADS)
    sockets_per_thread = auto_sockets if sockets_per_thread is None else sockets_per_thread
    if threads * sockets_per_thread > T.SOCKET_MAX_SOCKETS:
        sockets_per_thread = T.SOCKET_MAX_SOCKETS // threads
    return max(1, threads * sockets_per_thread)
