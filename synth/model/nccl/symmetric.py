"""NCCL 2.27's symmetric-memory kernels: when they run, which one NCCL picks and its time, as
NCCL's own model says (transcribed from NCCL v2.27.3 src/symmetric.cc and src/enqueue.cc).

When (src/enqueue.cc:342-372, src/init.cc:1250): a communicator whose ranks are all in one
node as NCCL sees it (nNodes == 1: one host, or one multi-node NVLink domain) with every peer
reached directly over P2P, a group holding a single collective (AllReduce, ReduceScatter or
AllGather; sums of floating types for the first two: ncclSymImplemented), and send and
receive buffers both registered as symmetric windows (ncclCommWindowRegister with
NCCL_WIN_COLL_SYMMETRIC). NCCL then always runs a symmetric kernel ("for now just always
use symmetric if available", enqueue.cc:358-360), not its ring/tree/NVLS table.

Which (ncclSymPickKernel, symmetric.cc:224-291): per kernel of the collective, a time from
`model` at the fewest blocks within 2.5% of the time at the most (queryModel), and the
kernel of least time x (1 + 2.5% per block). Multicast kernels (…MC) need NVLS; LL kernels
stop at 2 GiB of bus bytes.

From 2.28 (v2.28.3 src/sym_kernels.cc, src/scheduler/symmetric_sched.cc) the same model and
constants pick the kernel, of a group's symmetric calls batched together (several per group,
LL kernels then excluded; a single call is what is priced here), and each call's element
count is first rounded up to whole 1 KiB cells (NCCL_SYM_KERNEL_CELL_SIZE,
src/include/sym_kernels.h:17), so the model sees its bytes in whole KiB.

From 2.29 a communicator spanning several NVLink domains has kernels of its own for
ReduceScatter and AllGather (gin.py), picked by the same rule among themselves.

This is NCCL's estimate, which NVIDIA fitted to its kernels (its constants per architecture
are in the source); the time charged is that estimate, floored by the host's launch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from synth.model.nccl import gin
from synth.model.nccl.system import Call, Hardware
from synth.model.nccl.versions import CELLS_SINCE, SYMMETRIC_SINCE, version_tuple
CELL_BYTES = 1024  # v2.28.3 src/include/sym_kernels.h:17 NCCL_SYM_KERNEL_CELL_SIZE
MAX_BLOCKS = 64  # src/include/symmetric.h:8 ncclSymMaxBlocks
LL_BUS_FACTOR = 9  # symmetric.cc:106: "2X the bytes, plus some processing, plus no unrolling"
SM_PENALTY = 0.025  # symmetric.cc:270: 2.5% more time per SM
GBPS = (1 << 30) / 1e6  # symmetric.cc:173, bytes per microsecond of one GiB/s

# symmetric.cc:7-19, in NCCL's enum order (the pick's tie order)
KERNELS = {
    "AllReduce": ("AllReduce_AGxLL_R", "AllReduce_AGxLLMC_R", "AllReduce_RSxLD_AGxST", "AllReduce_RSxLDMC_AGxSTMC"),
    "AllGather": ("AllGather_LL", "AllGather_LLMC", "AllGather_ST", "AllGather_STMC"),
    "ReduceScatter": ("ReduceScatter_LL", "ReduceScatter_LD", "ReduceScatter_LDMC"),
}
ALL_KERNELS = tuple(kernel for kernels in KERNELS.values() for kernel in kernels)


@dataclass(frozen=True)
class SymmetricPick:
    kernel: str
    blocks: int
    time_us: float  # NCCL's estimate
    base_us: float  # its fixed part (baseLat)


def applies(hardware: Hardware, call: Call) -> bool:
    """Whether NCCL runs this call on a symmetric kernel (module docstring): version 2.27 or
    later, registered symmetric buffers, one node as NCCL sees it, a collective with kernels;
    from 2.29 also across NVLink domains (gin.py)."""
    if not hardware.symmetric or call.ranks < 2:
        return False
    if call.nodes > 1:
        return gin.applies(hardware, call)
    return (version_tuple(hardware.version) >= SYMMETRIC_SINCE and call.collective in KERNELS
            and hardware.intra.kind in ("nvswitch", "nvlink"))


def _softmin(x: float, ceiling: float, softness: float) -> float:
    return ceiling - softness * math.log1p((math.exp(ceiling / softness) - 1) * math.exp(-x / softness))


def _softplus(x: float, softness: float) -> float:
    z = x / softness
    return x if z >= 100.0 else softness * math.log1p(math.exp(z))


def _model(bus_bytes: float, base_latency: float, blocks: int, sm_bw: float, multiplier: float, peak: float) -> float:
    """symmetric.cc:97-100: time in us."""
    bandwidth = _softmin(blocks * sm_bw * multiplier, peak, sm_bw)
    return base_latency + _softplus(bus_bytes / bandwidth - 1, 1)


def _query(kernel: str, nbytes: int, ranks: int, blackwell: bool, min_blocks: int, max_blocks: int
           ) -> tuple[float, int, float]:
    """symmetric.cc:105-191 queryModel: (time us, blocks, base latency us)."""
    multiplier = 1.0
    nvls_blocks = -(-(32 if blackwell else 16) // ranks)
    most = MAX_BLOCKS
    is_ll = "LL" in kernel.split("_", 1)[1]
    if is_ll:
        bus = ranks * nbytes * LL_BUS_FACTOR
        if "LLMC" in kernel:
            multiplier = 1.1
    elif kernel == "AllReduce_RSxLD_AGxST":
        bus = 2 * nbytes * (ranks - 1) / ranks
    elif kernel == "AllReduce_RSxLDMC_AGxSTMC":
        bus, multiplier, most = nbytes / ranks + nbytes, ranks, nvls_blocks
    elif kernel in ("AllGather_ST", "ReduceScatter_LD"):
        bus = (ranks - 1) * nbytes
    else:  # AllGather_STMC, ReduceScatter_LDMC
        bus, multiplier, most = (ranks - 1) * nbytes, 0.55 * ranks, nvls_blocks
    most = min(most, max_blocks)
    is_ag, is_ar = kernel.startswith("AllGather"), kernel.startswith("AllReduce")
    if not blackwell:  # cudaArch < 1000
        base = 4.5 if is_ll else 7.8
        sm_bw = (65 if is_ar else 44) * GBPS
        peak = (480 if kernel == "AllReduce_RSxLDMC_AGxSTMC" else 320) * GBPS
    else:
        base = (8.5 if is_ag else 11.0) if is_ll else (19.5 if is_ar else 13.0)
        sm_bw = 55 * GBPS
        peak = (1000 if kernel == "AllReduce_RSxLDMC_AGxSTMC" else 600) * GBPS
    time, blocks = _model(bus, base, most, sm_bw, multiplier, peak), most
    for count in range(min_blocks, most):
        candidate = _model(bus, base, count, sm_bw, multiplier, peak)
        if candidate <= 1.025 * time:
            return candidate, count, base
    return time, blocks, base


def kernels_for(hardware: Hardware, call: Call) -> tuple[str, ...]:
    """The kernels NCCL considers for the call (symmetric.cc:224-262): multicast ones only with
    NVLS (bf16/fp16/fp32 sums, which the model prices), LL ones below 2 GiB of bus bytes; across
    NVLink domains, the hierarchical ones (gin.py)."""
    if call.nodes > 1:
        return gin.kernels_for(hardware, call)
    found = []
    nvls = hardware.nvls and hardware.intra.kind == "nvswitch" and hardware.generation in ("hopper", "blackwell") \
        and call.ranks_per_node > 2
    bus = (1 if call.collective == "AllReduce" else call.ranks) * _per_rank_bytes(call)
    for kernel in KERNELS[call.collective]:
        if "MC" in kernel and not nvls:
            continue
        if "LL" in kernel.split("_", 1)[1] and bus >= (2 << 30):
            continue
        found.append(kernel)
    return tuple(found) if bus < 32 * (2 << 30) else ()


def _per_rank_bytes(call: Call) -> int:
    """NCCL's nBytes = count x type size: the buffer for AllReduce, one rank's part for
    ReduceScatter and AllGather (nccl-tests' size is the whole)."""
    nbytes = int(call.nbytes)
    return nbytes if call.collective == "AllReduce" else nbytes // call.ranks


def pick(hardware: Hardware, call: Call) -> SymmetricPick | None:
    """NCCL's symmetric kernel for the call, or None when none applies."""
    if not applies(hardware, call):
        return None
    nbytes = _per_rank_bytes(call)
    if version_tuple(hardware.version) >= CELLS_SINCE:
        nbytes = -(-nbytes // CELL_BYTES) * CELL_BYTES
    blackwell = hardware.generation == "blackwell"
    min_blocks = hardware.min_ctas or 1
    max_blocks = hardware.max_ctas or MAX_BLOCKS
    best = None
    for kernel in kernels_for(hardware, call):
        if call.nodes > 1:
            time, blocks, base = gin.query(kernel, hardware, call, nbytes)
        else:
            time, blocks, base = _query(kernel, nbytes, call.ranks, blackwell, min_blocks, max_blocks)
        if best is None or time * (1 + SM_PENALTY * blocks) < best.time_us * (1 + SM_PENALTY * best.blocks):
            best = SymmetricPick(kernel, blocks, time, base)
    return best
