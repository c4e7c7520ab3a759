"""The proxy thread that drives a GPU's network connections (src/proxy.cc ncclProxyProgress,
src/transport/net.cc sendProxyProgress / recvProxyProgress), as NCCL prices it.

The proxy posts one network request per slice of a channel's connection: net.cc advances a
sub-operation's `posted`/`transmitted` by `args->sliceSteps` per isend or irecv, so a chunk of
`chunkSteps` steps is chunkSteps / sliceSteps posts (Simple ring: ALLREDUCE_CHUNKSTEPS 4 over
ALLREDUCE_SLICESTEPS 2, two posts a step; LL and LL128: one, enqueue.cc). Those posts run on the
host while the GPU moves earlier slices, so for a call of many loops they overlap its transfer
(the bandwidth term covers them); what a call cannot go under is the one pass through its ring's
steps, each posted before it can move. NCCL's tuning charges exactly that, once per call and
inside the ring's latency: "Inter-node rings still have to launch nsteps * net overhead"
(src/graph/tuning.cc:316-322; getNetOverhead, tuning.cc:190-195: 1 us per step on Intel hosts, 2
us on AMD, three times that for a Simple step, whose two posts and flush cost more). So the floor
is baseLat + nsteps x the per-step overhead: not multiplied by the ring's loops, nor by the
channels a proxy thread serves (each channel's posts are its own requests, progressed together),
and not charged to the classic tree, whose latency in NCCL's tuning has no such term (its
network steps are the tree's log2(nodes) hops, tuning.cc:323-327). The NVLS tree's pipeline fill
counts the proxy's post and poll as stages of a network hop (protocols.NET_HOP_STAGES)."""

from __future__ import annotations

from synth.model.nccl.names import PROTOCOLS
from synth.model.nccl.system import Call, Hardware
from synth.model.nccl.tables import BASE_LATENCY, NET_OVERHEAD, Tuning

RING_COLLECTIVES = ("AllReduce", "ReduceScatter", "AllGather")
# enqueue.cc: a Simple ring chunk is ALLREDUCE_CHUNKSTEPS (NCCL_STEPS/2 = 4) steps posted in slices
# of ALLREDUCE_SLICESTEPS (NCCL_STEPS/4 = 2); LL and LL128 post one step per slice
POSTS_PER_STEP = {"LL": 1, "LL128": 1, "Simple": 2}


def step_overhead_us(hardware: Hardware, protocol: str) -> float:
    """NCCL's per-step cost of driving a network connection (getNetOverhead, x3 for Simple)."""
    return NET_OVERHEAD[hardware.cpu] * (3 if protocol == "Simple" else 1)


def ring_steps(call: Call) -> int:
    """Steps of one pass of the ring (tuning.cc nsteps: 2(n-1) for AllReduce, n-1 otherwise)."""
    return 2 * (call.ranks - 1) if call.collective == "AllReduce" else call.ranks - 1


def posts_per_pass(call: Call, protocol: str) -> int:
    """Network requests one connection posts for one pass of the ring: one per slice (net.cc)."""
    return ring_steps(call) * POSTS_PER_STEP[protocol]


def proxy_floor_s(table: Tuning, hardware: Hardware, call: Call, algorithm: str, protocol: str, channels: int) -> float:
    """The least time of a ring call across nodes whose steps a proxy thread posts: baseLat +
    nsteps x NCCL's per-step net overhead, once per call (module docstring); 0 inside a node and
    for every algorithm but the ring (`table` and `channels` do not change it: kept for callers)."""
    if call.nodes < 2 or hardware.network is None or channels < 1:
        return 0.0
    if algorithm != "ring" or call.collective not in RING_COLLECTIVES:
        return 0.0
    busy_us = ring_steps(call) * step_overhead_us(hardware, protocol)
    return (BASE_LATENCY[algorithm][PROTOCOLS.index(protocol)] + busy_us) * 1e-6
