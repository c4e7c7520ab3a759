"""The per-call host floor of the NCCL model (synth/model/nccl/launch.py launch_floor_s): NCCL launches
a call's kernel on every GPU the calling thread drives, one communicator after another
(src/group.cc groupLaunch -> src/enqueue.cc ncclLaunchKernel), so back-to-back calls take at
least that host time; the cases below are worked out by hand from NCCL 2.26.2's latency table
(src/graph/tuning.cc:120-142) and the measured per-GPU launch figure."""

from __future__ import annotations

from dataclasses import replace

import pytest

from synth.calibrate.measurements import Measurement, RunInfo, Span
from synth.calibrate.nccl_fit import calibrate_nccl, launch_of
from synth.model import nccl
from synth.model.nccl import launch as T
from synth.model.nccl import Call, Hardware, Link, estimate
from synth.model.nccl.hardware import estimate_group, nccl_view, with_launch
from synth.topology_file import load_topology

GB = 1e9
DGX_A100 = Hardware("ampere", 8, Link("nvswitch", 300 * GB, 0.8, "topo.h SM80_NVLINK_BW"))


def test_one_process_per_gpu_is_ncclS_own_latency():
    """8 B over 8 A100 on one node: ring/LL, baseLat 6.6 + 14 steps x hwLat NVLink ring LL 0.6
    = 15.0 us; one launch (5.6 us) hides under it."""
    e = estimate(DGX_A100, Call("AllReduce", 1, 8, 8))
    assert (e.choice.algorithm, e.choice.protocol) == ("ring", "LL")
    assert e.time_s == pytest.approx(15.0e-6, rel=1e-3)


def test_one_thread_driving_eight_gpus_waits_for_eight_launches():
    """nccl-tests -g 8: the same call cannot go faster than 8 launches, 8 x 5.6 = 44.8 us (a
    floor, not an added latency: 15.0 us of NCCL's latency does not add to it)."""
    hardware = replace(DGX_A100, gpus_per_thread=8)
    e = estimate(hardware, Call("AllReduce", 1, 8, 8))
    assert e.time_s == pytest.approx(8 * T.LAUNCH_US_PER_GPU * 1e-6)
    assert nccl.launch_floor_s(hardware) == pytest.approx(44.8e-6)
    # a call longer than the floor is untouched
    large = Call("AllReduce", 1, 8, 2 ** 30)
    assert estimate(hardware, large).time_s == estimate(DGX_A100, large).time_s


def test_cuda_graphs_have_no_host_floor_and_the_choice_never_moves():
    """Under CUDA graphs the launches are replayed (no per-call floor); the launch mode is not
    in NCCL's tables (as_nccl_sees drops it), so NCCL's choice is the same either way."""
    graphs = replace(DGX_A100, gpus_per_thread=8, cuda_graphs=True)
    call = Call("AllReduce", 1, 8, 8)
    assert estimate(graphs, call).time_s == pytest.approx(15.0e-6, rel=1e-3)
    assert nccl.tuning(graphs, call) == nccl.tuning(DGX_A100, call)


def test_a_topology_states_the_launch_mode_and_a_run_gives_it():
    topology = load_topology("dgx-a100")
    assert nccl_view(topology).hardware.gpus_per_thread == 1
    launched = with_launch(topology, 8)
    assert nccl_view(launched).hardware.gpus_per_thread == 8
    e = estimate_group(launched, list(range(8)), "AllReduce", 8)
    assert e.time_s == pytest.approx(44.8e-6)


def test_calibrate_fits_as_the_run_was_launched_and_writes_the_hardware():
    """A -g 8 run whose small calls sit on the 8-launch floor: the fit needs no overhead for
    them, and the calibrated topology keeps the base's launch mode (one process per GPU)."""
    base = load_topology("dgx-a100")
    run = RunInfo(gpus_per_process=8)
    measurements = [Measurement("AllReduce", size, 45e-6, Span(None, 8, 1, 1), "run.txt", i, "nccl", run)
                    for i, size in enumerate((8, 64, 512, 4096))]
    assert launch_of(measurements) == (8, False, None)
    fitted = calibrate_nccl(measurements, base)
    (level,) = fitted.fits
    assert (level.overhead_s or 0.0) < 1e-6
    assert fitted.topology.nccl.gpus_per_thread == 1
