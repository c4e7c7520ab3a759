"""NCCL's protocols (src/include/device.h, src/enqueue.cc calcCollChunking,
src/device/prims_*.h): the payload share of each protocol, buffers, steps and
threads; the chunk a channel moves per step and the stages a chunk crosses before a pipeline
streams are synth/model/nccl/chunking.py's (they read the hardware, the call and the tables)."""

from __future__ import annotations

PAYLOAD = {"LL": 0.5, "LL128": 120 / 128, "Simple": 1.0}  # src/include/device.h: LL line 8 B = 4 B data + flag

# Thread counts and the size below which NCCL drops channels (src/include/device.h:64-85,
# src/include/comm.h:37-39; tuning.cc:487-493 multiplies the ring LL threshold by nRanks).
MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}

# Buffers: src/init.cc:606-608 and src/include/device.h:24,69,81-86.
NCCL_STEPS = 8
BUFFER = {"LL": 8 * 512 * NCCL_STEPS * 16, "LL128": 120 * 640 * NCCL_STEPS * 8, "Simple": 1 << 22}
RING_CHUNK_STEPS = NCCL_STEPS // 2  # src/include/collectives.h:18 ALLREDUCE_CHUNKSTEPS (also AG/RS)
LL128_LINE_ELEMS, LL128_DATA_ELEMS = 16, 15  # src/include/device.h NCCL_LL128_LINEELEMS / NCCL_LL128_DATAELEMS (8-byte elements)
NVLS_CHUNK = 128 * 1024  # src/transport/nvls.cc:149 NCCL_NVLS_CHUNKSIZE default

# Pipeline fill of NVLS trees (Simple): before every channel streams, the first chunk
# crosses each stage of its path store-and-forward. A network hop is counted as 6 stages (the
# sending kernel's copy into the FIFO slot, the proxy's post, the wire, the receiving proxy's
# completion poll, the GPUDirect flush, the receiving kernel's copy: src/transport/net.cc
# sendProxyProgress / recvProxyProgress), an NVLink hop or an NVLS multimem pass as one.
NET_HOP_STAGES = 6
INTRA_HOP_STAGES = 1


def log2i(x: int) -> int:
    """NCCL's log2i (src/include/utils.h): floor(log2(x)), 0 for x < 2."""
    return max(int(x).bit_length() - 1, 0)
