"""What a probe may fit depends on how the run was launched: no per-call overhead on calls across
nodes over NCCL's InfiniBand launched one GPU per process (NCCL's tables hold those costs; a
sweep keeps it), and
the transfer study measures the 1-64 MiB structure term per launch class, so a run whose proxy
threads share one thread's CPU does not widen the intervals of runs that have none."""

from __future__ import annotations

from dataclasses import replace

import pytest

from synth.calibrate.measurements import Measurement, RunInfo, Span
from synth.calibrate.nccl_fit import SWEEP_PRIORS, calibrate_nccl
from synth.calibrate.probe import PROBE_SIZES
from synth.model.nccl.hardware import estimate_group
from synth.topology_file import load_topology


def _probe(topology, slow: float, gpus_per_process: int = 1) -> list[Measurement]:
    devices = list(range(16))
    span = Span(topology.levels[0].name, 2, 8, 2)
    return [Measurement("AllReduce", size, estimate_group(topology, devices, "AllReduce", size).time_s * slow,
                        span, "probe.txt", line, "nccl", RunInfo(gpus_per_process=gpus_per_process))
            for line, size in enumerate(PROBE_SIZES, 1)]


def test_a_probe_fits_no_overhead_on_infiniband_runs_of_one_gpu_per_process():
    base = load_topology("hgx-h100-ib-4x8")
    fit = calibrate_nccl(_probe(base, 1.3), base)
    assert fit.topology.levels[0].overhead is None
    assert "overhead" not in {kind for level in fit.fits for kind, _ in level.figures}
    sweep = calibrate_nccl(_probe(base, 1.3), base, priors=SWEEP_PRIORS)
    assert "overhead" in {kind for level in sweep.fits for kind, _ in level.figures}


def test_an_overhead_is_still_fitted_where_one_thread_drives_several_gpus():
    base = replace(load_topology("hgx-h100-ib-4x8"), nccl=replace(load_topology("hgx-h100-ib-4x8").nccl,
                                                                    gpus_per_thread=8))
    fit = calibrate_nccl(_probe(base, 1.0, gpus_per_process=8), base)
    assert "overhead" in {kind for level in fit.fits for kind, _ in level.figures}


def _row(log: str, nbytes: int, predicted: float, same: bool, shared: bool) -> dict:
    return {"log": log, "bytes": nbytes, "measured_s": 1.0, "predicted_s": predicted, "same_log": same,
            "shared_host": shared, "sigma_fit": 0.01, "low_fit_s": predicted, "high_fit_s": predicted}


def test_the_mid_size_structure_term_is_measured_per_launch_class():
    """Source S (one process per GPU) is judged with terms from T's rows of its class (5% off),
    not from D's (a thread driving 8 GPUs across hosts, 3x off); D with D-class rows where the
    others have enough, else all of them."""
    from benchmarks.calibration_transfer import _term_key, select, shared_host

    mib = 2 ** 20

    def fold(source: str, predicted: float, shared: bool) -> dict:
        rows = [_row(f"{source}-a.txt", 8 * mib, predicted, same, shared) for same in (True, False) for _ in range(25)]
        return {"probe_log": f"{source}-a.txt", "source": source, "rows": rows}

    runs = {1.0: [fold("S", 1.0, False), fold("T", 1.05, False), fold("D", 3.0, True)]}
    _, choices = select(runs)
    assert choices["S"]["structure_sigma"][_term_key("1-64 MiB", False, False)] < 0.1
    assert choices["S"]["structure_sigma"][_term_key("1-64 MiB", False, True)] > 0.5  # D's class, from D alone
    assert choices["D"]["structure_sigma"][_term_key("1-64 MiB", False, True)] < 0.1  # no other D-class source
    run = RunInfo(gpus_per_process=8)
    assert shared_host(Measurement("AllReduce", 8, 1e-5, Span(None, 2, 8, 2), "x", 1, "nccl", run))
    assert not shared_host(Measurement("AllReduce", 8, 1e-5, Span(None, 1, 8, 1), "x", 1, "nccl", run))
    assert not shared_host(Measurement("AllReduce", 8, 1e-5, Span(None, 2, 8, 2), "x", 1, "nccl", RunInfo()))


def test_a_host_stall_widens_the_upper_end_only_and_is_not_read_as_model_error():
    """D's calls (an oversubscribed launch, stall bound 3 ms) run 2 ms slower than predicted:
    the stall bound covers them, so they neither widen S's structure term nor go uncovered;
    D's interval keeps its low end and adds the bound to its high one."""
    from benchmarks.calibration_transfer import _residual, _term_key, select

    mib = 2 ** 20

    def fold(source: str, measured: float, stall: float) -> dict:
        rows = [{**_row(f"{source}-a.txt", 8 * mib, 100e-6, same, stall > 0), "measured_s": measured,
                 "stall_s": stall} for same in (True, False) for _ in range(25)]
        return {"probe_log": f"{source}-a.txt", "source": source, "rows": rows}

    assert _residual({"predicted_s": 1e-4, "measured_s": 2.1e-3, "stall_s": 3e-3}) == 0.0
    assert _residual({"predicted_s": 1e-4, "measured_s": 3.2e-3, "stall_s": 3e-3}) == pytest.approx(-0.693, abs=1e-3)
    assert _residual({"predicted_s": 1e-4, "measured_s": 0.5e-4, "stall_s": 3e-3}) == pytest.approx(0.693, abs=1e-3)
    runs = {1.0: [fold("S", 100e-6, 0.0), fold("T", 105e-6, 0.0), fold("D", 2.1e-3, 3e-3)]}
    folds, choices = select(runs)
    assert choices["S"]["structure_sigma"][_term_key(">= 64 MiB", False, False)] < 0.1
    (d,) = [f for f in folds if f["source"] == "D"]
    assert all(r["low_s"] <= r["measured_s"] <= r["high_s"] for r in d["rows"])
    assert all(r["low_s"] > 50e-6 and r["high_s"] > 3e-3 for r in d["rows"])
