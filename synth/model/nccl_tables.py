"""NCCL's own constants, transcribed from its source so the NCCL model (synth/model/nccl.py)
decides as NCCL decides. Version: NCCL 2.26.2 (tag v2.26.2-1), the version the published
InfiniBand logs this project is checked against ran. Every table names its file and lines.

Units are NCCL's: bandwidths in GB/s (1e9 bytes/s), latencies in microseconds.
"""

from __future__ import annotations

NCCL_VERSION = "2.26.2"

from synth.model.nccl_names import ALGORITHMS, GENERATIONS, PROTOCOLS  # noqa: F401 - NCCL's names, defined once

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
NVLS_CHUNK = 128 * 1024  # src/transport/nvls.cc:149 NCCL_NVLS_CHUNKSIZE default
NVLS_MAX_ARITY = 32  # src/include/device.h:181

# Thread counts and the size below which NCCL drops channels (src/include/device.h:64-85,
# src/include/comm.h:37-39; tuning.cc:487-493 multiplies the ring LL threshold by nRanks).
MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}

# Buffers: src/init.cc:606-608 and src/include/device.h:24,69,81-86.
NCCL_STEPS = 8
BUFFER = {"LL": 8 * 512 * NCCL_STEPS * 16, "LL128": 120 * 640 * NCCL_STEPS * 8, "Simple": 1 << 22}
RING_CHUNK_STEPS = NCCL_STEPS // 2  # src/include/collectives.h:18 ALLREDUCE_CHUNKSTEPS (also AG/RS)

# src/transport/net_socket.cc:124-130, 279-330: socket transport defaults.
SOCKET_MAX_SOCKETS = 64
SOCKET_MAX_THREADS = 16
SOCKET_AUTO = {"aws": (2, 8), "gcp": (4, 1), "other": (0, 1)}  # (threads, sockets per thread) by NIC vendor
SOCKET_MIN_TASK = 64 * 1024  # MIN_CHUNKSIZE: a request is split over the sockets in tasks of at least this
SOCKET_DEFAULT_SPEED_GBPS = 10.0  # net_socket.cc:96-98: no /sys/class/net/<dev>/speed (loopback): 10 Gbps

# Two NVLS figures NCCL 2.28.3 added to its model (commit f1308997, src/graph/tuning.cc:134-139
# nvlsEfficiency and :193-198 perChMaxNVLSTreeBws), i.e. what NVIDIA measured NVLS to reach:
# NVLS moves data at 0.85 (Hopper) / 0.74 (Blackwell) of its NVLink bound, and an NVLS tree
# channel carries at most 57.7 / 45.5 GB/s of bus bandwidth on Hopper across 2 / more nodes.
NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}
PER_CHANNEL_NVLS_TREE = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),
                         "hopper": (0.0, 57.7, 45.5), "blackwell": (0.0, 96.0, 80.0)}
NVLS_SOURCE_VERSION = "2.28.3"

# The host's share of a call (launch mode). NCCL enqueues every call on the host: ncclGroupEnd
# (src/group.cc groupLaunch) prepares each communicator's plan and launches its kernel
# (src/enqueue.cc ncclLaunchPrepare, ncclLaunchKernel -> cuLaunchKernelEx) one communicator
# after another, on the thread that made the calls. nccl-tests times back-to-back calls, so a
# call takes at least what the host spends on it: the launches of every GPU that thread drives.
# One process per GPU (torchrun, Megatron, mpirun -np <GPUs>) launches one kernel per call,
# which hides under NCCL's own latency; nccl-tests -g N (one thread, N GPUs) launches N. CUDA
# graphs replay captured launches (one cuGraphLaunch for many calls): no per-call host floor.
# Host time per GPU launched, us: the flat floor of small calls over GPUs per thread, median
# over three sources that ran -g N (8 B to 4 KiB): an A100 SXM4 node (-g 8, 39 us: 4.9 us per GPU),
# a V100 SXM2 node (-g 8, 48-49 us: 6.0), two DGX H100 (-g 4, 24.8 us: 6.2; -g 8, 40 us: 5.0;
# the source's median 5.6). A measured figure, not NCCL's: NCCL's tuning has no host term.
LAUNCH_US_PER_GPU = 5.6


def generation_index(generation: str) -> int:
    return GENERATIONS.index(generation)


def speeds(kind: str, generation: str) -> tuple[float, ...]:
    return SPEEDS[(kind, generation)]
