"""NCCL 2.29's hierarchical symmetric kernels: a ReduceScatter or AllGather whose communicator
spans several NVLink domains (nodes as NCCL sees them), with registered symmetric buffers, runs
on a kernel that moves data inside each domain by load/store (LSA) and between domains over
GPU-initiated networking (GIN) along rails (the ranks of the same local index), and NCCL's own
model of that kernel picks it and its blocks (transcribed from v2.29.7 and v2.30.7
src/sym_kernels.cc queryModel_gin and ncclSymkMask; symmetric.py picks among them as among the
one-domain kernels).

When (sym_kernels.cc ncclSymkMask, ncclSymkAvailable; init.cc symmetricSupport): the LSA team
(ranks per node) is smaller than the communicator, every GPU of a domain reaches every other
directly over NVLink, the network supports GIN, and the collective is a ReduceScatter (sum of
floating types, as priced here) or AllGather with both buffers registered. Multicast variants
(…LDMC, …STMC) need NVLS and more than two ranks per domain. Assumed here, as NCCL's GIN runs
on its InfiniBand/RoCE transport (GDAKI or the proxy backend): GIN is there over `ib`, not over
sockets or another net plugin.

Its figures are NCCL's own: the NVLink rate NVLS reaches (360 GB/s Hopper, 720 Blackwell), the
network rate as the slowest NIC's (comm->minNetBw, the line rate NCCL's topology reads), a GIN
latency of NCCL's ring/Simple network hop (14 us, tuning.cc hwLatencies), and per-SM rates
NVIDIA measured. NCCL's AllGather estimate comes out in seconds where its others are in
microseconds (a units slip in queryModel_gin); it never competes with another kernel, so the
pick is unchanged, and the time charged here is in microseconds. As for the one-domain kernels
(symmetric.py), the time charged is NCCL's estimate, floored by the host's launch.
"""

from __future__ import annotations

import math

from synth.model.nccl import versions
from synth.model.nccl.system import Call, Hardware

MAX_BLOCKS = 64  # src/include/sym_kernels.h ncclSymkMaxBlocks
NVLINK_GBPS = {"hopper": 360.0, "blackwell": 720.0}  # sym_kernels.cc nvlinkBws (NVLS max bws)
GIN_LATENCY_US = 14.0  # tuning.cc hwLatencies[NET][RING][SIMPLE], getGinLat
RAIL_RING_CHUNK = 1 << 20  # sym_kernels.h ncclSymkAllGather_RailRing_ChunkSize
# getSmBw_ReduceScatter_RailA2A, bytes/s per SM, (LD, LDMC) per (Blackwell, earlier)
SM_BW = {(2, 29): {True: (5.0e9, 2.25e9), False: (14.5e9, 9.85e9)},
         (2, 30): {True: (26.6e9, 8.44e9), False: (13.7e9, 4.22e9)}}
RS_CHUNK = {(2, 29): 64 << 10, (2, 30): 128 << 10}  # v2.29.7 constant; v2.30.7 ncclSymkRsGinDefaultChunkBytes

KERNELS = {
    "ReduceScatter": ("ReduceScatter_RailA2A_LsaLD", "ReduceScatter_RailA2A_LsaLDMC"),
    "AllGather": ("AllGather_RailRing_LsaSTMC",),
}


def applies(hardware: Hardware, call: Call) -> bool:
    """Whether a registered call runs on a hierarchical symmetric kernel (module docstring)."""
    return (versions.at_least(hardware.version, versions.HIERARCHICAL_SINCE) and call.nodes > 1
            and call.collective in KERNELS and hardware.network is not None and hardware.network.transport == "ib"
            and hardware.intra.kind in ("nvswitch", "nvlink") and hardware.generation in NVLINK_GBPS
            and bool(kernels_for(hardware, call)))


def _multimem(hardware: Hardware, call: Call) -> bool:
    """symkState.hasLsaMultimem: NVLS and more than two ranks in the LSA team."""
    return hardware.nvls and hardware.intra.kind == "nvswitch" and call.ranks_per_node > 2


def kernels_for(hardware: Hardware, call: Call) -> tuple[str, ...]:
    multimem = _multimem(hardware, call)
    return tuple(kernel for kernel in KERNELS.get(call.collective, ()) if multimem or not kernel.endswith("MC"))


def _era(hardware: Hardware) -> tuple[int, int]:
    return versions.HIERARCHICAL_RETUNED_SINCE if versions.at_least(hardware.version,
                                                                    versions.HIERARCHICAL_RETUNED_SINCE) \
        else versions.HIERARCHICAL_SINCE


def _multipliers(call: Call, ldmc: bool) -> tuple[float, float, float]:
    """getBusMul_ReduceScatter_RailA2A: times the data crosses the SMs, NVLink and the network."""
    lsa, rail = call.ranks_per_node, call.nodes
    lsa_mul = max((lsa if ldmc else lsa - 1) * rail, (lsa - 1) * rail)
    gin_mul = rail - 1
    sm_mul = (0 if lsa == 1 else (1 if ldmc else lsa) * (rail - 1)) + (1 if ldmc else lsa) + (rail - 1)
    return sm_mul, lsa_mul, gin_mul


def _per(bandwidth: float, multiplier: float) -> float:
    """bandwidth / multiplier, inf for a widget the data never crosses (one rank per domain: C's x/0)."""
    return bandwidth / multiplier if multiplier > 0 else math.inf


def _saturating_blocks(hardware: Hardware, call: Call, ldmc: bool, lsa_bw: float, gin_bw: float) -> int:
    """calcSatBlocks_ReduceScatter_RailA2A: the blocks whose SMs keep up with NVLink and the network."""
    sm_bw = SM_BW[_era(hardware)][hardware.generation == "blackwell"][1 if ldmc else 0]
    sm_mul, lsa_mul, gin_mul = _multipliers(call, ldmc)
    return math.ceil(min(float(1 << 30), min(_per(lsa_bw, lsa_mul), _per(gin_bw, gin_mul)) / (sm_bw / sm_mul)))


def query(kernel: str, hardware: Hardware, call: Call, nbytes: int) -> tuple[float, int, float]:
    """queryModel_gin: (time us, blocks, fixed part us) for `nbytes` per rank."""
    lsa_bw = NVLINK_GBPS[hardware.generation] * 1e9
    gin_bw = hardware.network.link.bandwidth  # minNetBw: one NIC's rate as NCCL's topology reads it
    gin_lat = GIN_LATENCY_US * 1e-6
    min_blocks = hardware.min_ctas or 1
    max_blocks = min(hardware.max_ctas or MAX_BLOCKS, MAX_BLOCKS)
    if kernel == "AllGather_RailRing_LsaSTMC":
        heads = max(1, hardware.network.nics)  # nvlsResources->nHeads, assumed one per NIC
        max_blocks = min(max_blocks, -(-(32 if hardware.generation == "blackwell" else 16) // heads))
        needed = -(-nbytes // RAIL_RING_CHUNK)
        steps = needed * (call.nodes - 1)
        transfer = max(nbytes * call.ranks / lsa_bw, nbytes * (call.nodes - 1) / gin_bw)
        blocks = max(min_blocks, min(max_blocks, needed))
        return (steps * gin_lat + transfer) * 1e6, blocks, steps * gin_lat * 1e6
    ldmc = kernel.endswith("LDMC")
    inbox = max(_saturating_blocks(hardware, call, flag, lsa_bw, gin_bw) for flag in (False, True))
    inbox = min(MAX_BLOCKS, min(max(inbox, min_blocks), hardware.max_ctas or MAX_BLOCKS))  # maxGinInboxBlocks
    max_blocks = min(max_blocks, inbox, _saturating_blocks(hardware, call, ldmc, lsa_bw, gin_bw))
    chunk = RS_CHUNK[_era(hardware)]
    sm_bw = SM_BW[_era(hardware)][hardware.generation == "blackwell"][1 if ldmc else 0]
    sm_mul, lsa_mul, gin_mul = _multipliers(call, ldmc)
    blocks = max(min_blocks, min(max_blocks, -(-nbytes // chunk)))
    rate = min(blocks * sm_bw / sm_mul, _per(lsa_bw, lsa_mul), _per(gin_bw, gin_mul))
    fill = min(nbytes, chunk * blocks) * (lsa_mul / lsa_bw + gin_mul / gin_bw)
    return (nbytes / rate + fill + gin_lat) * 1e6, blocks, gin_lat * 1e6
