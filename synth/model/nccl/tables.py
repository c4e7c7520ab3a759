"""NCCL's tuning model and its choice (src/graph/tuning.cc ncclTopoTuneModel and
ncclTopoGetAlgoTime, src/enqueue.cc topoGetAlgoInfo): per (algorithm, protocol) a latency and a
bandwidth from NCCL's tables, and the pair of least estimated time with the channels it runs on.
Every table names its file and lines (NCCL 2.26.2 unless said)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

from synth.errors import UsageError
from synth.model.nccl import symmetric
from synth.model.nccl.graph import (NVLS_MAX_ARITY, PATH_NVB, PATH_NVL, PATH_PXB, PATH_PXN, Graph,
                                    communicator_channels, nvls_channels, search, with_ctas)
from synth.model.nccl.names import PROTOCOLS, generation_index
from synth.model.nccl.protocols import MAX_THREADS, THREAD_THRESHOLD, log2i
from synth.model.nccl.system import Call, Hardware
from synth.model.nccl.versions import at_least

# src/graph/tuning.cc:120-123, baseLat[algorithm][protocol], us.
BASE_LATENCY = {
    "tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4),
    "collnet_direct": (0.0, 0.0, 0.0), "collnet_chain": (0.0, 0.0, 0.0),
    "nvls": (0.0, 0.0, 0.0), "nvls_tree": (0.0, 0.0, 0.0),
    "pat": (0.0, 0.0, 0.0),  # 2.26 sets PAT's latency whole at tuning.cc:343 (8 us base)
}

# src/graph/tuning.cc:129-142, hwLat[NVLINK|PCI|NET][algorithm][protocol], us.
HW_LATENCY = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "collnet_direct": (0.0, 0.0, 3.7),
               "collnet_chain": (0.0, 0.0, 2.8), "nvls": (0.0, 0.0, 25.0), "nvls_tree": (0.0, 0.0, 25.0),
               "pat": (0.0, 0.0, 0.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "collnet_direct": (0.0, 0.0, 3.7),
            "collnet_chain": (0.0, 0.0, 2.8), "nvls": (0.0, 0.0, 0.0), "nvls_tree": (0.0, 0.0, 0.0),
            "pat": (0.0, 0.0, 0.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "collnet_direct": (0.0, 0.0, 31.0),
            "collnet_chain": (0.0, 0.0, 30.0), "nvls": (0.0, 0.0, 18.0), "nvls_tree": (0.0, 0.0, 14.0),
            "pat": (0.0, 0.0, 0.0)},
}

# src/graph/tuning.cc:151-156, llMaxBws[index1][index2]: index1 is the GPU generation on one
# node and the CPU vendor across nodes (0 Intel, 1 AMD), index2 = min(nodes, 3) - 1.
LL_MAX_BW = {
    "volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0), "hopper": (141.0, 45.0, 35.0),
    "blackwell": (2 * 141.0, 2 * 45.0, 2 * 35.0),
}
LL_MAX_BW_BY_CPU = {"intel": LL_MAX_BW["volta"], "amd": LL_MAX_BW["ampere"]}  # rows 0 and 1 when nodes > 1

# src/graph/tuning.cc:158-175, per-channel caps [generation][index2], GB/s.
PER_CHANNEL_RING_LL128 = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
                          "hopper": (36.7, 36.7, 36.7), "blackwell": (2 * 36.7, 2 * 36.7, 2 * 36.7)}
PER_CHANNEL_TREE_LL128 = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
                          "hopper": (36.7, 36.7, 29.0), "blackwell": (2 * 36.7, 2 * 36.7, 2 * 29.0)}
PER_CHANNEL_TREE = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),
                    "hopper": (38.7, 41.4, 36.0), "blackwell": (2 * 38.7, 2 * 41.4, 2 * 36.0)}

# src/graph/tuning.cc:190-195, getNetOverhead: us per network step (x3 for Simple, tuning.cc:320).
NET_OVERHEAD = {"intel": 1.0, "amd": 2.0}

# src/graph/tuning.cc:524-528, treeCorrectionFactor[protocol][log2(bytes >> 6)], 64 B to 256 MB.
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}
RING_PLATEAU = {"volta": 1.9, "other": 1.4}  # tuning.cc:539-542, ring/Simple latency across nodes

# Two NVLS figures NCCL 2.28.3 added to its model (commit f1308997, src/graph/tuning.cc:134-139
# nvlsEfficiency and :193-198 perChMaxNVLSTreeBws), i.e. what NVIDIA measured NVLS to reach:
# NVLS moves data at 0.85 (Hopper) / 0.74 (Blackwell) of its NVLink bound, and an NVLS tree
# channel carries at most 57.7 / 45.5 GB/s of bus bandwidth on Hopper across 2 / more nodes.
NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}
PER_CHANNEL_NVLS_TREE = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),
                         "hopper": (0.0, 57.7, 45.5), "blackwell": (0.0, 96.0, 80.0)}
NVLS_SOURCE_VERSION = "2.28.3"

# NCCL retuned Blackwell's per-channel caps from 2.28 (src/graph/tuning.cc tunerConstants, the
# Blackwell rows of perChMaxRingLL128Bws, perChMaxTreeLL128Bws, perChMaxTreeBws and
# perChMaxNVLSTreeBws); Hopper's and older rows read the same from v2.26.2 to v2.30.7. A release
# is priced as its last patch read here: (ring LL128, tree LL128, tree, NVLS tree) per index2.
_BLACKWELL_2_28 = ((2 * 36.7, 34.6, 2 * 36.7), (55.6, 31.67, 20.0), (70.0, 42.8, 24.0),
                   (0.0, 96.0, 43.8))  # v2.28.9-1 tuning.cc:175-197 (2.28.3: ring LL128 N2 73.4, NVLS tree N4 43.1)
_BLACKWELL_2_29 = ((40.0, 40.0, 40.0),) + _BLACKWELL_2_28[1:]  # v2.29.7-1 tuning.cc:176-198 (2.29.2: 34.5-34.6)
_BLACKWELL_2_30 = _BLACKWELL_2_29[:3] + ((0.0, 96.0, 80.0),)  # v2.30.7-1 tuning.cc:184-210 (2.31, 2.32 assumed)
BLACKWELL_CAPS_BY_VERSION = (((2, 30), _BLACKWELL_2_30), ((2, 29), _BLACKWELL_2_29), ((2, 28), _BLACKWELL_2_28))


def per_channel_caps(generation: str, version: str) -> tuple[tuple[float, float, float], ...]:
    """NCCL's per-channel caps (ring LL128, tree LL128, tree, NVLS tree; each per index2) of
    `generation` under NCCL `version`: the 2.26 tables, except Blackwell from 2.28 (retuned)."""
    if generation == "blackwell":
        for since, caps in BLACKWELL_CAPS_BY_VERSION:
            if at_least(version, since):
                return caps
    return (PER_CHANNEL_RING_LL128[generation], PER_CHANNEL_TREE_LL128[generation], PER_CHANNEL_TREE[generation],
            PER_CHANNEL_NVLS_TREE[generation])


# NCCL's loop over algorithms when it picks (enqueue.cc topoGetAlgoInfo): the first of equal times wins.
ALGORITHM_ORDER = ("tree", "ring", "nvls", "nvls_tree", "pat")


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
    # the pairs `choose` weighs, (algorithm, protocol, latency_us, bandwidth) in NCCL's loop
    # order, disabled ones left out: a planner's envelopes call `choose` tens of thousands of times
    enabled: tuple = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self):
        object.__setattr__(self, "table", {(a, p): (latency, bandwidth, cap)
                                           for a, p, latency, bandwidth, cap in reversed(self.entries)})  # the first entry wins, as a scan
        object.__setattr__(self, "enabled", tuple((a, p, *self.get(a, p)) for a in ALGORITHM_ORDER for p in PROTOCOLS
                                                  if self.get(a, p)[1] > 0))

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



# --- the tuning model (src/graph/tuning.cc ncclTopoTuneModel, v2.26.2) ---------------------------


def _nsteps(collective: str, ranks: int) -> int:
    if collective == "AllReduce":
        return 2 * (ranks - 1)
    if collective in ("ReduceScatter", "AllGather"):
        return ranks - 1
    return ranks



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
                   cuda_graphs=False, cpu_cores=None)



@lru_cache(maxsize=4096)
def _tuning(hardware: Hardware, collective: str, nodes: int, ranks_per_node: int) -> Tuning:
    call = Call(collective, nodes, ranks_per_node, 0)
    n = call.ranks
    g = hardware.generation
    ring = search(hardware, call, "ring")
    tree = search(hardware, call, "tree") or ring
    nvls = search(hardware, call, "nvls")
    graphs = {"ring": ring, "tree": tree, "nvls": nvls, "nvls_tree": nvls}
    gi = generation_index(g)
    index2 = min(nodes, 3) - 1
    ll_max = (LL_MAX_BW[g] if nodes == 1 else LL_MAX_BW_BY_CPU[hardware.cpu])[index2]
    ring_ll128_caps, tree_ll128_caps, tree_caps, _ = per_channel_caps(g, hardware.version)
    per_tree = tree_caps[index2]
    per_ring_ll128 = ring_ll128_caps[index2]
    per_tree_ll128 = tree_ll128_caps[index2]
    ppn = n / nodes
    nsteps = _nsteps(call.collective, n)
    unpack = hardware.network is not None and hardware.network.unpack
    entries = []
    for a in ("tree", "ring", "nvls", "nvls_tree", "pat"):
        graph = graphs.get(a, ring)
        for p in PROTOCOLS:
            bandwidth, latency, cap = _entry(call, hardware, a, p, graph, ring, ll_max, per_tree, per_ring_ll128,
                                             per_tree_ll128, ppn, nsteps, gi, unpack)
            entries.append((a, p, latency, bandwidth, cap))
    nvls_count = with_ctas(nvls_channels(hardware, call), hardware) if nvls is not None else 0
    return Tuning(tuple(entries), communicator_channels(ring, tree, hardware, call), nvls_count,
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
    if a == "nvls" and coll in ("ReduceScatter", "AllGather") and (nodes > 1 or n > NVLS_MAX_ARITY):
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
        cap = graph.channels * per_channel_caps(hardware.generation, hardware.version)[3][min(nodes, 3) - 1] or math.inf
    if a == "pat":
        bus *= 0.75
    # Bus to algorithm bandwidth (tuning.cc:290-296).
    if not (a != "ring" and coll in ("AllGather", "ReduceScatter")):
        ratio = n / nsteps if a == "ring" else (5.0 / 6.0 if a in ("nvls", "nvls_tree") else 0.5)
        bus *= ratio
        cap *= n / nsteps if a == "nvls_tree" else ratio  # 2.28 converts NVLS bus bandwidth as rings do
    # LL128 only on NVLink-class paths, one compute capability (tuning.cc:424-440).
    if p == "LL128":
        hopper_plus = gi >= generation_index("hopper")
        enabled = (graph.type_inter <= PATH_PXB or (hopper_plus and graph.type_inter <= PATH_PXN))
        enabled = enabled and graph.type_intra <= PATH_NVB
        if not enabled:
            bus = 0.0
    if bus <= 0:
        return (0.0, 0.0, math.inf)
    # Latency (tuning.cc:297-347).
    pi = PROTOCOLS.index(p)
    latency = BASE_LATENCY[a][pi]
    intra_hw = "nvlink" if graph.type_intra == PATH_NVL else "pci"
    intra_lat = HW_LATENCY[intra_hw][a][pi]
    inter_lat = HW_LATENCY["net"]["tree" if ppn == 1 else a][pi] + graph.latency_inter_us
    if p == "Simple":
        inter_lat += graph.latency_inter_us
    if a == "ring":
        hw = intra_hw if nodes == 1 else "net"
        lat = HW_LATENCY[hw][a][pi]
        if coll in ("Reduce", "Broadcast"):
            latency += nsteps * (HW_LATENCY[hw]["tree"][pi] if p == "Simple" else lat)  # different channels
        else:
            overhead = 0.0
            if nodes > 1:
                overhead = NET_OVERHEAD[hardware.cpu] * (3 if p == "Simple" else 1)
            intra_lat = max(intra_lat, overhead)
            inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if coll == "AllReduce" else nodes - 1)
            latency += (nsteps - inter_steps) * intra_lat + inter_steps * inter_lat
    elif a == "tree":
        if coll == "AllReduce":
            latency += 2 * ((n // nodes - 1) * intra_lat + log2i(nodes) * inter_lat)
    elif a == "nvls":
        latency = intra_lat + (inter_lat if nodes > 1 else 0.0)
    elif a == "nvls_tree":
        latency += intra_lat + 2 * log2i(nodes) * inter_lat
    elif a == "pat":
        latency = 8 + log2i(nodes) * (inter_lat / 3.5) + n * 2.8
    return (bus, latency, cap)



# --- the choice (src/enqueue.cc) -----------------------------------------------------------------


def nccl_time_us(table: Tuning, hardware: Hardware, call: Call, algorithm: str, protocol: str) -> float:
    """ncclTopoGetAlgoTime (tuning.cc:530-547): latency + bytes / bandwidth, with the tree
    correction for medium sizes and the ring plateau; -1 for a disabled pair."""
    latency, bandwidth = table.get(algorithm, protocol)
    if bandwidth <= 0:
        return -1.0
    return _pair_time_us(latency, bandwidth, algorithm, protocol, *_size_terms(table, hardware, call))


def _size_terms(table: Tuning, hardware: Hardware, call: Call) -> tuple[int, int, float]:
    """What ncclTopoGetAlgoTime reads of the call's size, the same for every pair: the bytes,
    the tree correction's size class (-1 outside the table or for other collectives) and the
    ring plateau's factor (1 where it does not apply)."""
    nbytes = int(call.nbytes)
    log_size = _tree_size_class(call)
    plateau = 1.0
    if call.nodes > 1 and call.collective == "AllReduce" and nbytes // (table.channels * call.ranks) >= 64:
        plateau = RING_PLATEAU["volta" if hardware.generation == "volta" else "other"]
    return nbytes, log_size, plateau


def tree_correction(call: Call, algorithm: str, protocol: str) -> float:
    """The share of its bandwidth NCCL expects a tree AllReduce of this size to reach
    (ncclTopoGetAlgoTime, tuning.cc:522-538: "Trees are not perfectly sticking to the model for
    medium sizes", NVIDIA's measured treeCorrectionFactor, 0.4-1.0 from 64 B to 256 MB); 1 for
    other algorithms and collectives. NCCL scales its own bandwidth by it; the time on the
    hardware scales NCCL's measured ceilings of the tree (LL's llMaxBw, the LL128 tree's
    per-channel maximum: `Tuning.cap`) by it, as it takes the ring plateau (RING_PLATEAU) from
    the same function, and leaves the links' and sockets' rates, which NCCL's table does not
    price, alone."""
    if algorithm != "tree":
        return 1.0
    log_size = _tree_size_class(call)
    return TREE_CORRECTION[protocol][log_size] if log_size >= 0 else 1.0


def _tree_size_class(call: Call) -> int:
    """The tree correction's size class of the call: log2i(bytes >> 6), -1 outside the
    table (64 B to 256 MB) or for collectives other than AllReduce."""
    nbytes = int(call.nbytes)
    log_size = log2i(nbytes >> 6) if nbytes >> 6 > 0 else -1
    return log_size if call.collective == "AllReduce" and 0 <= log_size < len(TREE_CORRECTION["Simple"]) else -1


def _pair_time_us(latency: float, bandwidth: float, algorithm: str, protocol: str, nbytes: int, log_size: int,
                  plateau: float) -> float:
    if algorithm == "tree" and log_size >= 0:
        bandwidth *= TREE_CORRECTION[protocol][log_size]
    if algorithm == "ring" and protocol == "Simple" and plateau != 1.0:
        latency *= plateau
    return latency + nbytes / (1000 * bandwidth)


def choose(hardware: Hardware, call: Call, table: Tuning | None = None) -> Choice:
    """NCCL's pick for the call: the least estimated time over the enabled pairs, in NCCL's
    loop order (the first of equal times), then the channels it runs on (enqueue.cc:1691-1779);
    from 2.27 on, with registered symmetric buffers inside one node, the symmetric kernel NCCL
    always takes then (symmetric.py), as ("symmetric", kernel, blocks)."""
    found = symmetric.pick(hardware, call) if hardware.symmetric else None  # a planner calls this millions of times
    if found is not None:
        return Choice("symmetric", found.kernel, found.blocks, found.time_us * 1e-6)
    table = table or tuning(hardware, call)
    terms = _size_terms(table, hardware, call)
    best = None
    for algorithm, protocol, latency, bandwidth in table.enabled:
        time = _pair_time_us(latency, bandwidth, algorithm, protocol, *terms)
        if time >= 0 and (best is None or time < best[0]):
            best = (time, algorithm, protocol)
    if best is None:
        allowed = ", ".join(hardware.algorithms) if hardware.algorithms else "all"
        raise UsageError(f"no NCCL algorithm for {call.collective} over {call.ranks} ranks (algorithms allowed: "
                         f"{allowed}; NVLS {'on' if hardware.nvls else 'off'}); allow another algorithm in the "
                         f"topology's [nccl] table", inputs=("topology",))
    time, algorithm, protocol = best
    return Choice(algorithm, protocol, channels_used(table, call, algorithm, protocol), time * 1e-6)


def channels_used(table: Tuning, call: Call, algorithm: str, protocol: str) -> int:
    """enqueue.cc:1734-1762: NVLS runs on its own channels; rings and trees drop channels while
    the call is smaller than channels x threads x the per-thread threshold."""
    if algorithm in ("nvls", "nvls_tree"):
        return table.nvls_channels
    channels = table.channels
    threads = MAX_THREADS[protocol]
    threshold = THREAD_THRESHOLD[protocol] * (call.ranks if (algorithm == "ring" and protocol == "LL") else 1)
    while call.nbytes < channels * threads * threshold and channels >= 2:
        channels -= 1
    return channels

