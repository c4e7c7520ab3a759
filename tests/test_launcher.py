"""The cores a launcher binds each process to, read off an nccl-tests log's command line
(synth/calibrate/launcher.py): Open MPI's documented defaults (a core per process for at most two
processes, a package beyond) and its --bind-to / --map-by :PE= options."""

from __future__ import annotations

from dataclasses import replace

import pytest

from synth.calibrate.launcher import bound_cores
from synth.calibrate.nccl_text import parse_nccl_text
from synth.errors import UsageError
from synth.model.nccl.hardware import nccl_view
from synth.topology_file import load_topology, render_topology, topology_from_text

DGX = "cnh@dgx-06:~/nccl-tests$ mpirun -x LD_LIBRARY_PATH --hostfile myhosts -n 2  ./build/all_reduce_perf -b 8 -g 4 -n 30"


@pytest.mark.parametrize("command, processes, cores", [
    (DGX, 2, 1),  # two processes: a core each; nccl-tests' own `-n 30` is not the launcher's
    ("mpirun -np 16 -N 8 --hostfile h -x LD_LIBRARY_PATH ./build/all_reduce_perf -g 1", 16, None),  # a package each
    ("mpirun -np 16 --bind-to core -x A ./build/all_reduce_perf", 16, 1),
    ("mpirun -np 2 --bind-to none -x A ./build/all_reduce_perf", 2, None),
    ("mpirun -np 2 --map-by ppr:1:node:PE=8 -x A ./build/all_reduce_perf", 2, 8),
    ("/opt/openmpi/bin/mpirun -x A ./build/all_reduce_perf -g 8", 2, 1),  # processes from the rank lines
    ("srun -n 2 ./build/all_reduce_perf -g 8", 2, None),  # not Open MPI: not read
    ("mpirun -n 2 ./build/all_reduce_perf -g 8", 2, None),  # no Open MPI option: could be MPICH, unbound
    (None, 2, None),
])
def test_open_mpi_binding(command, processes, cores):
    assert bound_cores(command, processes) == cores


LOG = f"""{DGX}
# nThread 1 nGpus 2 minBytes 8 maxBytes 8 step: 2(factor) warmup iters: 5 iters: 30 agg iters: 1 validation: 1 graph: 0
#  Rank  0 Group  0 Pid 11 on     dgx-06 device  0 [0x1b] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid 11 on     dgx-06 device  1 [0x43] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid 22 on     dgx-07 device  0 [0x1b] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid 22 on     dgx-07 device  1 [0x43] NVIDIA H100 80GB HBM3
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    16.03    0.00    0.00      0    15.73    0.00    0.00      0
"""


def test_a_log_gives_its_run_the_cores_and_the_gpus_per_process():
    (m,) = parse_nccl_text(LOG, "all_reduce_perf.txt", None)
    assert (m.run.gpus_per_process, m.run.cpu_cores) == (2, 1)
    continued = LOG.replace("--hostfile myhosts -n 2 ", "--hostfile myhosts \\\n    --bind-to none -n 2 ")
    (m,) = parse_nccl_text(continued, "all_reduce_perf.txt", None)
    assert m.run.cpu_cores is None  # the option on a continuation line counts


def test_a_topology_file_states_the_cores_and_a_bad_count_is_refused():
    base = load_topology("dgx-h100-x2")
    topology = replace(base, nccl=replace(base.nccl, gpus_per_thread=8, cpu_cores=1))
    again = topology_from_text(render_topology(topology), "test.toml")
    assert again.nccl.cpu_cores == 1
    assert nccl_view(again).hardware.cpu_cores == 1
    assert "cpu_cores" not in render_topology(base)
    with pytest.raises(UsageError, match="cpu_cores"):
        topology_from_text(render_topology(topology).replace("cpu_cores = 1", "cpu_cores = 0"), "test.toml")


def test_a_calibrated_prediction_on_an_oversubscribed_launch_states_the_stall_in_its_interval():
    from synth.calibrate.confidence import model_error_for_group
    from synth.topology import CalibrationRecord

    base = load_topology("dgx-h100-x2")
    record = CalibrationRecord("AllReduce", "node", 2, 8, 8, 2 ** 30, 20, 0.05, 0.1, "run.txt", "nccl", (), 0.05)
    calibrated = replace(base, calibration=(record,))
    ranks = list(range(16))
    plain = model_error_for_group(calibrated, ranks, "AllReduce", 2 ** 20)
    assert plain.stall_s == 0.0
    bound = replace(calibrated, nccl=replace(base.nccl, gpus_per_thread=8, cpu_cores=1))
    sure = model_error_for_group(bound, ranks, "AllReduce", 2 ** 20)
    assert sure.stall_s == pytest.approx(3e-3)
    low, high = sure.interval(100e-6, 2 ** 20)
    plain_low, plain_high = plain.interval(100e-6, 2 ** 20)
    assert (low, high) == pytest.approx((plain_low, plain_high + 3e-3))
    assert "3 ms waiting for the host's CPUs" in sure.describe(2 ** 20)
