"""The proxy thread that drives a GPU's network connections (src/proxy.cc ncclProxyProgress,
src/transport/net.cc sendProxyProgress / recvProxyProgress): one host thread per GPU posts
every network send and receive of every channel that crosses a node boundary at that GPU, one
step at a time.

NCCL's tuning charges this cost for one connection: "Inter-node rings still have to launch
nsteps * net overhead" (src/graph/tuning.cc:316-322; getNetOverhead, tuning.cc:190-195: 1 us
per step on Intel hosts, 2 us on AMD, three times that for a Simple step), so a ring step
across nodes costs at least that much whatever its bytes. The thread does it for every channel
whose ring enters or leaves the node at its GPU, and for every step of every loop of the call
(enqueue.cc calcCollChunking: nLoops = bytes per channel / (ranks x chunk)), so the call takes
at least baseLat + steps x loops x operations per step x the per-step overhead. With one NIC
per GPU the channels' entries and exits spread over the NICs the call reaches: ceil(2 x
channels / NICs) operations per step on the busiest thread.

The classic tree (AllReduce) likewise: every loop of a channel moves one chunk up the tree and
one down (enqueue.cc: ncclPatternTreeUpDown, one chunk per loop, calcCollChunking's tree chunk),
and at a tree node each network peer costs one operation per direction: two per loop across two
nodes (one peer), six beyond (NCCL's double binary tree: an inner node has a parent and two
children; the busiest GPU is an inner node). The NVLS tree's pipeline fill already counts the
proxy's post and poll as stages of a network hop (protocols.NET_HOP_STAGES), so it has no floor
here.

NCCL's own tuning prices less: one nsteps x overhead per call inside the ring's latency
(`nccl_priced_floor_s`), not multiplied by loops nor by the operations per step, and none for
the classic tree; and net.cc posts one request per slice (sliceSteps), two per Simple ring step
(`posts_per_pass`). Pricing the floor as NCCL does was measured one mechanism at a time on the
published logs (results/fidelity, "The proxy floor, one mechanism at a time"): it moves the
1-64 MiB band from 24% to 39% median error (GPUDirect-TCPX all-gathers 2-5x too fast, rings of 24
channels and 8-node trees 10-40% too fast), the loops and the operations per step each
carrying part of it; so the floor stays what the proxy thread does, and NCCL's price is kept
as what NCCL believes (its choice reads its tables, not this floor).

A process that drives several GPUs (nccl-tests -g N) runs one proxy thread per communicator,
N of them (proxy.cc ncclProxyCreate, per comm), and NCCL starts them within the creating
thread's CPU set (graph/topo.cc ncclTopoGetCpuAffinity intersects the GPU's local CPUs with
it). A launcher that binds the process to a few cores (Open MPI's mpirun binds each process
to one core when it starts at most two: RunInfo.cpu_cores) leaves those N busy threads that
core's hardware threads, so each step's host work takes N / CPUs times as long (`cpu_share`).
One process per GPU, or an unbound process, keeps a CPU per proxy thread.

Such a process also has more busy threads than CPUs (its proxy threads and the thread that
launches the calls and polls their streams), so a proxy thread with a step to post can find its
CPU held by another and wait for the scheduler to preempt it: at most a slice (`host_stall_s`),
when it happens, not every call. The model does not say when; a prediction's interval carries
it as an additive upper bound (synth/calibrate/confidence.py, benchmarks/calibration_transfer.py)."""

from __future__ import annotations

import math

from synth.model.nccl.graph import nics_used
from synth.model.nccl.names import PROTOCOLS
from synth.model.nccl.chunking import chunk_bytes
from synth.model.nccl.system import Call, Hardware
from synth.model.nccl.tables import BASE_LATENCY, NET_OVERHEAD, Tuning

RING_COLLECTIVES = ("AllReduce", "ReduceScatter", "AllGather")
# Hardware threads per core that the proxy threads of a bound process run on: 2 on the x86 CPUs
# of the GPU servers the model covers (Intel Xeon Platinum 8480C of DGX H100, Xeon 8380, AMD
# EPYC: 2 threads per core in the vendors' specifications), SMT on as servers ship; Open MPI's
# core binding binds all of the core's hardware threads (mpirun(1), --bind-to core). An
# assumption where a host runs with SMT off.
THREADS_PER_CORE = 2
# The Linux scheduler's slice, what a runnable thread waits at most for a CPU another holds:
# EEVDF's base slice (CFS's minimum granularity before 6.6), 0.75 ms normalized and scaled by
# 1 + log2(min(CPUs, 8)) (kernel/sched/fair.c sysctl_sched_base_slice, SCHED_TUNABLESCALING_LOG):
# 3 ms on a host of 8 CPUs or more
SCHED_SLICE_S = 3e-3
# enqueue.cc: a Simple ring chunk is ALLREDUCE_CHUNKSTEPS (NCCL_STEPS/2 = 4) steps posted in slices
# of ALLREDUCE_SLICESTEPS (NCCL_STEPS/4 = 2); LL and LL128 post one step per slice
POSTS_PER_STEP = {"LL": 1, "LL128": 1, "Simple": 2}


def step_overhead_us(hardware: Hardware, protocol: str) -> float:
    """NCCL's per-step cost of driving a network connection (getNetOverhead, x3 for Simple)."""
    return NET_OVERHEAD[hardware.cpu] * (3 if protocol == "Simple" else 1)


def ring_steps(call: Call) -> int:
    """Steps of one loop of the ring (enqueue.cc: ncclPatternRingTwice 2(n-1), ncclPatternRing n-1)."""
    return 2 * (call.ranks - 1) if call.collective == "AllReduce" else call.ranks - 1


def ring_loops(table: Tuning, hardware: Hardware, call: Call, protocol: str, channels: int) -> int:
    """Loops of the ring each channel runs: its bytes over ranks x chunk (calcCollChunking is
    called per channel since NCCL 2.19: scheduleCollTasksToPlan, enqueue.cc:618-632)."""
    per_channel = call.nbytes / channels
    chunk = chunk_bytes(table, hardware, Call(call.collective, call.nodes, call.ranks_per_node, per_channel), "ring",
                        protocol, 1)
    return max(1, math.ceil(per_channel / (call.ranks * chunk)))


def posts_per_pass(call: Call, protocol: str) -> int:
    """Network requests one connection posts for one pass of the ring: one per slice (net.cc
    sendProxyProgress advances `posted` by sliceSteps per request)."""
    return ring_steps(call) * POSTS_PER_STEP[protocol]


def nccl_priced_floor_s(hardware: Hardware, call: Call, algorithm: str, protocol: str) -> float:
    """What NCCL's tuning charges for the proxy (tuning.cc:316-322): baseLat + nsteps x the
    per-step net overhead, once per call, for a ring across nodes; 0 otherwise (the classic
    tree's latency has no such term). Below NCCL's own ring latency, which holds it."""
    if call.nodes < 2 or hardware.network is None or algorithm != "ring" or call.collective not in RING_COLLECTIVES:
        return 0.0
    busy_us = ring_steps(call) * step_overhead_us(hardware, protocol)
    return (BASE_LATENCY[algorithm][PROTOCOLS.index(protocol)] + busy_us) * 1e-6


def operations_per_step(hardware: Hardware, call: Call, channels: int) -> int:
    """Network sends and receives the busiest proxy thread posts per ring step: every channel
    enters and leaves each node once, spread over the NICs (one per GPU) the call reaches."""
    return max(1, math.ceil(2 * channels / max(1, nics_used(hardware, call.ranks_per_node))))


def tree_loops(table: Tuning, hardware: Hardware, call: Call, protocol: str, channels: int) -> int:
    """Loops of the tree each channel runs: one chunk per loop (ncclPatternTreeUpDown), the chunk
    as calcCollChunking sizes it for the channel's bytes (LL128 shrinks it for smaller calls)."""
    per_channel = call.nbytes / channels
    chunk = chunk_bytes(table, hardware, Call(call.collective, call.nodes, call.ranks_per_node, per_channel), "tree",
                        protocol, 1)
    return max(1, math.ceil(per_channel / chunk))


def tree_operations_per_loop(hardware: Hardware, call: Call, channels: int) -> int:
    """Network operations the busiest proxy thread posts per tree loop: per channel whose tree
    node sits at its GPU, one per network peer and direction (2 across two nodes, 6 beyond)."""
    per_channel = 2 if call.nodes == 2 else 6
    return per_channel * max(1, math.ceil(channels / max(1, nics_used(hardware, call.ranks_per_node))))


def _bound_cpus(hardware: Hardware) -> int | None:
    """The hardware threads a process driving several GPUs was bound to; None where it drives
    one GPU or is not bound (each proxy thread then has a CPU)."""
    if hardware.cpu_cores is None or hardware.gpus_per_thread <= 1:
        return None
    return hardware.cpu_cores * THREADS_PER_CORE


def cpu_share(hardware: Hardware) -> float:
    """Proxy threads per CPU of the process: the GPUs one process drives over the hardware
    threads of the cores its launcher bound it to (module docstring), at least 1."""
    cpus = _bound_cpus(hardware)
    return 1.0 if cpus is None else max(1.0, hardware.gpus_per_thread / cpus)


def oversubscribed(hardware: Hardware) -> bool:
    """Whether a bound process has more busy threads than CPUs: a proxy thread per GPU it
    drives and the thread launching the calls, over its cores' hardware threads."""
    cpus = _bound_cpus(hardware)
    return cpus is not None and hardware.gpus_per_thread + 1 > cpus


def host_stall_s(hardware: Hardware, call: Call) -> float:
    """How much longer than predicted a call may take waiting for its proxy threads' CPU (module
    docstring): a scheduler slice on an oversubscribed process whose call crosses nodes, else 0."""
    if call.nodes < 2 or hardware.network is None or not oversubscribed(hardware):
        return 0.0
    return SCHED_SLICE_S


def proxy_floor_s(table: Tuning, hardware: Hardware, call: Call, algorithm: str, protocol: str, channels: int) -> float:
    """The least time of a call whose network steps one proxy thread posts (module docstring):
    0 where the call does not cross nodes, or for algorithms other than the ring and the tree."""
    if call.nodes < 2 or hardware.network is None or channels < 1:
        return 0.0
    if algorithm == "ring" and call.collective in RING_COLLECTIVES:
        steps = ring_steps(call) * ring_loops(table, hardware, call, protocol, channels)
        operations = steps * operations_per_step(hardware, call, channels)
    elif algorithm == "tree" and call.collective == "AllReduce":
        operations = tree_loops(table, hardware, call, protocol, channels) * tree_operations_per_loop(hardware, call,
                                                                                                     channels)
    else:
        return 0.0
    busy_us = operations * step_overhead_us(hardware, protocol) * cpu_share(hardware)
    return (BASE_LATENCY[algorithm][PROTOCOLS.index(protocol)] + busy_us) * 1e-6
