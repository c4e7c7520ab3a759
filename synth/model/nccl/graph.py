"""What NCCL's topology sees and what its topology search finds (src/graph/topo.h, topo.cc,
search.cc ncclTopoCompute, connect.cc): per pattern (ring, tree, NVLS) the channels and the
per-channel speeds, and the communicator's channel count."""

from __future__ import annotations

import math
from dataclasses import dataclass

from synth.model.nccl.system import Call, Hardware
from synth.model.nccl.transports import SOCKET_DEFAULT_SPEED_GBPS
from synth.model.nccl.versions import at_least

# src/graph/search.cc:913-924: the per-channel speeds the topology search tries, GB/s, fastest
# first; "intra" for one node, "inter" when a network is in the graph.
SPEEDS = {
    ("intra", "volta"): (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    ("inter", "volta"): (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2,
                         0.24, 0.12),
    ("intra", "hopper"): (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    ("inter", "hopper"): (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24,
                          0.12),
    ("intra", "blackwell"): (90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 19.0),
    ("inter", "blackwell"): (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2,
                             0.24, 0.12),
}
SPEEDS[("intra", "ampere")] = SPEEDS[("intra", "volta")]
SPEEDS[("inter", "ampere")] = SPEEDS[("inter", "volta")]

# src/graph/topo.h:13-29: what NCCL's topology takes one link to carry, GB/s per direction.
NVLINK_BW_PER_LINK = {"volta": 20.0, "ampere": 20.0, "hopper": 20.6, "blackwell": 40.0}  # SM70/80/90/100_NVLINK_BW
PCI_GEN3_X16_BW = 12.0  # PCI_BW
# NVLink line rate per link and direction: 25 GB/s for NVLink 2, 3 and 4 (V100, A100, H100
# datasheets: 300/600/900 GB/s over 6/12/18 links, both directions), 50 GB/s for NVLink 5
# (B200 datasheet: 1.8 TB/s over 18 links).
NVLINK_LINE_PER_LINK = {"volta": 25.0, "ampere": 25.0, "hopper": 25.0, "blackwell": 50.0}
PCI_GEN3_X16_LINE = 15.75  # PCIe 3.0: 8 GT/s x 16 lanes x 128/130 / 8 bits

MAX_CHANNELS = 64  # src/include/device.h:62 MAXCHANNELS
RING_MAX_CHANNELS = MAX_CHANNELS // 2  # src/init.cc:841 ringGraph->maxChannels = MAXCHANNELS/2
NVLS_CHANNELS = {"hopper": 16, "blackwell": 32}  # src/transport/nvls.cc:144-145 NVLS_NCHANNELS_SM90/SM100
NVLS_CHANNELS_ONE_NODE_SINCE = (2, 27)  # v2.27.3 src/transport/nvls.cc:149 NVLS_NCHANNELS_SM100_NVL
NVLS_CHANNELS_ONE_NODE = {"blackwell": 24}
NVLS_CHUNK = 128 * 1024  # src/transport/nvls.cc:149 NCCL_NVLS_CHUNKSIZE default
NVLS_MAX_ARITY = 32  # src/include/device.h:181



def speeds(kind: str, generation: str) -> tuple[float, ...]:
    return SPEEDS[(kind, generation)]


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



# --- what NCCL's topology sees ------------------------------------------------------------------

PATH_LOC, PATH_NVL, PATH_NVB, PATH_C2C, PATH_PIX, PATH_PXB, PATH_PXN, PATH_PHB, PATH_SYS = range(9)  # topo.h


def nccl_link_ratio(kind: str, generation: str) -> float:
    """What NCCL's topology takes a link of this kind to carry, over its line rate: NVLink at
    SMxx_NVLINK_BW per link (20, 20, 20.6, 40 GB/s) of 25/25/25/50 GB/s; PCIe at
    width x GT/s / 80 (topo.cc:409-476; 12 GB/s for Gen3 x16) of 15.75 GB/s per Gen3 x16; a
    NIC at its port speed (topo.cc:370-372)."""
    if kind in ("nvswitch", "nvlink"):
        return NVLINK_BW_PER_LINK[generation] / NVLINK_LINE_PER_LINK[generation]
    if kind == "pcie":
        return PCI_GEN3_X16_BW / PCI_GEN3_X16_LINE
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
        nic_bw = SOCKET_DEFAULT_SPEED_GBPS / 8
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
    ladder = speeds("inter" if call.nodes > 1 else "intra", g)
    if pattern == "ring":
        low, high = 1, RING_MAX_CHANNELS
    elif pattern == "tree":
        low = high = search(hardware, call, "ring").channels
    else:
        high = min(NVLS_MAX_ARITY, view.ppn)
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


def communicator_channels(ring: Graph, tree: Graph, hardware: Hardware, call: Call) -> int:
    """comm->nChannels: the fewer of ring and tree channels, doubled by ncclTopoPostset
    (connect.cc:452), doubled again on Hopper+ across nodes with fast rings (connect.cc:465-467)
    and for GPU-unpack net plugins (connect.cc:471-473), then bounded by NCCL_MAX_CTAS and
    NCCL_MIN_CTAS (`with_ctas`)."""
    channels = min(MAX_CHANNELS, min(ring.channels, tree.channels) * 2)
    if hardware.generation in ("hopper", "blackwell") and call.nodes > 1 and ring.bw_intra > 45.0 and channels < 16:
        channels = min(MAX_CHANNELS, 2 * channels)
    if hardware.network is not None and hardware.network.unpack and call.nodes > 1 and channels < 16:
        channels = min(MAX_CHANNELS, 2 * channels)
    return with_ctas(channels, hardware)


def nvls_channels(hardware: Hardware, call: Call) -> int:
    """comm->nvlsChannels before NCCL_MIN/MAX_CTAS: 16 on Hopper, 32 on Blackwell; from NCCL
    2.27 on, 24 on Blackwell when the communicator is one node or one multi-node NVLink domain
    (v2.27.3 src/transport/nvls.cc:176-190: "use a reduced number of channels for single
    node/MNNVL domain on Blackwell")."""
    if call.nodes == 1 and at_least(hardware.version, NVLS_CHANNELS_ONE_NODE_SINCE) and hardware.generation in NVLS_CHANNELS_ONE_NODE:
        return NVLS_CHANNELS_ONE_NODE[hardware.generation]
    return NVLS_CHANNELS.get(hardware.generation, 0)


def with_ctas(channels: int, hardware: Hardware) -> int:
    """NCCL_MAX_CTAS then NCCL_MIN_CTAS on a channel count (connect.cc:480-484: keep the first
    maxCTAs channels, then duplicate them up to minCTAs; nvls.cc:178 bounds the NVLS channels
    alike), within MAXCHANNELS."""
    if hardware.max_ctas is not None:
        channels = min(channels, hardware.max_ctas)
    if hardware.min_ctas is not None:
        channels = max(channels, hardware.min_ctas)
    return min(MAX_CHANNELS, channels)
