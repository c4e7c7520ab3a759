"""synth probe: the calls it measures, the script it writes, and probe -> run (gloo, 4 local
processes) -> calibrate -> a prediction with an interval, end to end."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from synth.calibrate.confidence import model_error
from synth.calibrate.probe import PROBE_SIZES, probe_calls
from synth.commands.probe_script import nccl_tests_lines, probe_script
from synth.calibrate.uncertainty import NOISE_FLOOR, Z_90, interval, numeric_jacobian, uncertainty
from synth.topology_file import load_topology


def test_the_probe_measures_each_level_alone_then_every_flat_call():
    calls = probe_calls(load_topology("emu-2x2"))
    levels = [(c.collective, c.level, c.ranks, c.ranks_per_unit) for c in calls]
    assert levels[:2] == [("AllReduce", "node", (0, 2), 1), ("AllReduce", "gpu", (0, 1), 1)]
    assert {c.collective for c in calls[2:]} == {"AllReduce", "ReduceScatter", "AllGather", "Broadcast", "AllToAll"}
    assert all(c.ranks == (0, 1, 2, 3) and c.ranks_per_unit == 2 and c.level == "node" for c in calls[2:])


def test_four_sizes_by_default_and_nccl_tests_runs_the_same():
    assert len(PROBE_SIZES) == 4
    lines = nccl_tests_lines(load_topology("hgx-h100-ib-4x8"))
    assert any("--ntasks-per-node 1 ./build/all_reduce_perf -b 8192 -e 2147483648 -f 64" in line for line in lines)


def test_the_command_writes_a_script_and_says_how_to_launch_it(run_cli, tmp_path):
    out = tmp_path / "probe.py"
    code, stdout, _ = run_cli("probe", "--topology", "emu-2x2", "-o", str(out))
    assert code == 0
    assert "torchrun --nnodes 2 --nproc-per-node 2" in stdout and "srun --nodes 2" in stdout
    assert "synth calibrate probe.csv --topology emu-2x2" in stdout
    compile(out.read_text(), str(out), "exec")


@pytest.mark.parametrize("sizes", ["1x,2", "8KiB"])
def test_bad_sizes_are_one_line_usage_errors(run_cli, sizes):
    code, _, stderr = run_cli("probe", "--topology", "emu-2x2", "--sizes", sizes)
    assert code == 2 and "--sizes" in stderr and "Traceback" not in stderr


def test_uncertainty_of_a_line_is_least_squares_own():
    """A straight line in log space: the covariance is s^2 (J^T J)^-1 and p the two figures."""
    sizes = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    noise = np.array([0.1, -0.1, 0.05, -0.02, 0.0])
    jacobian = np.stack([np.ones_like(sizes), sizes], axis=1)
    u = uncertainty(noise, jacobian)
    assert u.pinned == pytest.approx(2.0)
    s = max(math.sqrt(float(noise @ noise) / 3), NOISE_FLOOR)
    expected = s * np.sqrt(np.diag(np.linalg.inv(jacobian.T @ jacobian)))
    assert u.standard_errors == pytest.approx(tuple(expected))
    assert u.sigma == pytest.approx(s * math.sqrt(1 + 2 / 5))
    low, high = interval(1.0, u.sigma)
    assert low == pytest.approx(math.exp(-Z_90 * u.sigma)) and high == pytest.approx(1 / low)
    assert numeric_jacobian(lambda x: jacobian @ x, np.zeros(2)) == pytest.approx(jacobian)


def test_priors_pin_what_the_data_leave_open():
    u = uncertainty(np.zeros(4), np.zeros((4, 1)), np.array([0.5]))
    assert u.pinned == pytest.approx(0.0) and u.standard_errors[0] == pytest.approx(NOISE_FLOOR * 0.5)


@pytest.mark.skipif(sys.platform != "linux", reason="4 local gloo processes under torchrun")
def test_probe_run_calibrate_rank_end_to_end(run_cli, tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "probe.py"
    script.write_text(probe_script(load_topology("emu-2x2"), "gloo"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                          str(script), "--out", "probe.csv", "--iters", "5", "--warmup", "2",
                          "--sizes", "4096,262144,2097152,16777216"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = (tmp_path / "probe.csv").read_text().splitlines()
    assert rows[1] == "collective,level,group_size,bytes,time_s,backend,ranks_per_unit" and len(rows) == 2 + 7 * 4
    code, _, stderr = run_cli("calibrate", str(tmp_path / "probe.csv"), "--topology", "emu-2x2",
                              "-o", str(tmp_path / "calibrated.toml"))
    assert code == 0, stderr
    calibrated = load_topology(str(tmp_path / "calibrated.toml"))
    records = calibrated.calibration
    assert all(r.sigma >= NOISE_FLOOR for r in records if r.collective == "AllReduce")
    # a collective a noisy run leaves unfitted (its times shrink with the size) has no sigma: its RMS stands in
    assert all(r.sigma is None or r.sigma >= NOISE_FLOOR for r in records)
    confidence = model_error(calibrated, "AllReduce", 2, 2, 1 << 20)
    low, high = confidence.interval(1e-3, 1 << 20)
    assert low < 1e-3 < high
    assert "90% interval" in confidence.describe(1 << 20)


def test_held_out_folds_span_the_sizes_and_only_widen():
    from synth.calibrate.uncertainty import size_folds, with_held_out

    folds = size_folds([1, 2, 4, 8, 16, 32, 64, 128, 8])
    assert len(folds) == 4 and set().union(*folds) == {1, 2, 4, 8, 16, 32, 64, 128} and {1, 16} <= folds[0]
    assert size_folds([8, 8]) == ()
    narrow = uncertainty(np.zeros(4), np.ones((4, 1)))
    assert with_held_out(narrow, np.array([0.3, -0.3])).sigma == pytest.approx(0.3)
    assert with_held_out(narrow, np.array([0.0])).sigma == narrow.sigma


def test_an_nccl_fit_writes_its_sigma_and_states_its_spread(run_cli, tmp_path):
    from pathlib import Path

    log = Path(__file__).resolve().parent.parent / "docs" / "examples" / "all_reduce_perf-h100-ib-2x8.txt"
    out = tmp_path / "fitted.toml"
    code, stdout, stderr = run_cli("calibrate", str(log), "--topology", "hgx-h100-ib-4x8", "-o", str(out), "--json")
    assert code == 0, stderr
    import json

    spread = json.loads(stdout)["fits"][0]["uncertainty"]
    assert spread["sigma"] >= NOISE_FLOOR and spread["standard_errors"]
    record = load_topology(str(out)).calibration[0]
    assert record.sigma == pytest.approx(spread["sigma"], rel=1e-4)
