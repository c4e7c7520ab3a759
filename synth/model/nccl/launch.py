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
# the source's median 5.6). A measured figure, not NCCL's: NCCL's tuning has no host term. It is
# a fit on those three logs, and it is the host's (its CPU, driver and CUDA version), not the
# GPU's: a cluster's own is the topology figure `[nccl] launch_per_gpu` (Hardware.launch_s_per_gpu),
# which `synth calibrate` fits on a run that drives several GPUs from one thread; this is its
# default where none is given.
LAUNCH_US_PER_GPU = 5.6
LAUNCH_SOURCE = ("fit: the median small-call floor per GPU of three nccl-tests -g N logs (an A100 node 4.9 us, a V100 "
                 "node 6.0, two DGX H100 5.6); a host figure, not NCCL's")


def launch_s_per_gpu(hardware: Hardware) -> float:
    """Host time per GPU a thread launches a call on: the hardware's figure, else the default."""
    if hardware.launch_s_per_gpu is not None:
        return hardware.launch_s_per_gpu
    return LAUNCH_US_PER_GPU * 1e-6


def launch_floor_s(hardware: Hardware) -> float:
    """The least time a call takes when calls follow each other: what the host spends launching
    it on every GPU its thread drives (launch_s_per_gpu); none under CUDA graphs."""
    if hardware.cuda_graphs:
        return 0.0
    return max(1, hardware.gpus_per_thread) * launch_s_per_gpu(hardware)

