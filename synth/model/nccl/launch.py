"""The host's share of a call (the launch mode): what the host spends enqueueing a call on the
GPUs one thread drives, which back-to-back calls cannot go under."""

from __future__ import annotations

from synth.model.nccl.system import Hardware

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


def launch_floor_s(hardware: Hardware) -> float:
    """The least time a call takes when calls follow each other: what the host spends launching
    it on every GPU its thread drives (LAUNCH_US_PER_GPU); none under CUDA graphs."""
    if hardware.cuda_graphs:
        return 0.0
    return max(1, hardware.gpus_per_thread) * LAUNCH_US_PER_GPU * 1e-6

