"""How NCCL cuts a call into chunks (src/enqueue.cc calcCollChunking) and the stages the first
chunk crosses before a pipeline streams: the protocols' constants (synth/model/nccl/protocols.py)
applied to the hardware, the call and the tuning tables."""

from __future__ import annotations

import math

from synth.model.nccl.protocols import (BUFFER, INTRA_HOP_STAGES, LL128_DATA_ELEMS, LL128_LINE_ELEMS, NCCL_STEPS,
                                        NET_HOP_STAGES, NVLS_CHUNK, RING_CHUNK_STEPS, log2i)
from synth.model.nccl.system import Call, Hardware
from synth.model.nccl.tables import Tuning


def pipeline_stages(hardware: Hardware, call: Call, algorithm: str) -> float:
    """Store-and-forward stages the first chunk crosses before the pipeline streams: an NVLS
    pass is one, a network hop `Network.stages` (NET_HOP_STAGES by default) in each direction
    of each tree level. Rings and chains stream from the first step (every rank starts on its
    own block). For the classic tree NCCL's latency already counts a hop latency per tree level
    (tuning.cc:326-330) and measured InfiniBand trees show no Simple-chunk-sized fill, so a
    Simple tree has none unless a calibration fitted `stages` for the network (a plugin such as
    GPUDirect-TCPXO stages every chunk through bounce buffers); an LL128 tree fills over the
    steps NCCL counts for it (`ll128_tree_stages`)."""
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


def ll128_tree_stages(call: Call) -> float:
    """Stages an LL128 tree's first chunk crosses before the tree streams: calcCollChunking's
    nstepsLL128 = 1 + log2i(nodes) + 0.1 x GPUs per node (enqueue.cc, v2.26.2: the steps NCCL
    counts for an LL128 tree chunk when it shrinks the chunk so that every channel runs at
    least nstepsLL128 x 16 / ppn of them), less the one the transfer already counts: a
    pipeline of s stages moves k chunks in k + s - 1 stage times. The chunks are small (18 KB
    where NCCL shrinks them), so this fill, unlike a Simple tree's, is a few microseconds per
    level; NCCL's latency counts only the hop latencies (tuning.cc:326-330)."""
    return log2i(call.nodes) + 0.1 * call.ranks_per_node


def chunk_bytes(table: Tuning, hardware: Hardware, call: Call, algorithm: str, protocol: str, channels: int) -> int:
    """calcCollChunking (enqueue.cc:1812-1912): the chunk a channel moves per step, which NCCL
    shrinks for smaller calls on NVLS and trees."""
    step = (hardware.buffsize if protocol == "Simple" else BUFFER[protocol]) // NCCL_STEPS
    chunk = step * (RING_CHUNK_STEPS if (protocol == "Simple" and algorithm == "ring") else 1)
    if protocol == "LL":
        chunk //= 2
    if protocol == "LL128":  # enqueue.cc:1864: a 128-byte line carries 120 bytes of data
        chunk = chunk // LL128_LINE_ELEMS * LL128_DATA_ELEMS
    nbytes = call.nbytes
    if algorithm == "nvls":
        heads = call.ranks_per_node
        concurrent = channels * heads
        chunk = min(chunk, NVLS_CHUNK)
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
        chunk = NVLS_CHUNK if call.nodes < 4 else min(NVLS_CHUNK, 65536)
        for factor, limit in ((32, 262144), (16, 131072), (4, 65536), (1, 32768)):
            if nbytes < factor * concurrent * chunk and chunk > limit:
                chunk = limit
    elif algorithm == "tree" and protocol == "LL128":
        ppn = call.ranks_per_node
        steps = 1 + log2i(call.nodes) + 0.1 * ppn
        while nbytes // (channels * chunk) < steps * 64 / ppn and chunk > 131072:
            chunk //= 2
        while nbytes // (channels * chunk) < steps * 16 / ppn and chunk > 32768:
            chunk //= 2
    return chunk

