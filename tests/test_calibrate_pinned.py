"""A run that pins NCCL's algorithm (NCCL_ALGO) is fitted as it ran, and the check of a base's
NVLS setting never refits with a setting that leaves NCCL no algorithm (issue 25)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from synth.calibrate import read_measurements
from synth.calibrate.nccl_fit import calibrate_nccl, nvls_flipped, pinned_algorithms
from synth.errors import UsageError
from synth.model.nccl.names import algorithms_of_setting
from synth.topology_file import load_topology

LOG = Path(__file__).resolve().parent / "data" / "nccl-logs" / "h100-1x8-nvls-pinned-all_reduce_perf.txt"


def _base(tmp_path: Path, name: str, nvls: bool, algorithms: str = "") -> Path:
    text = Path(load_topology("dgx-h100").source_path).read_text(encoding="utf-8")
    setting = f"nvls = {str(nvls).lower()}" + (f"\nalgorithms = [{algorithms}]" if algorithms else "")
    path = tmp_path / name
    path.write_text(text.replace("nvls = true", setting), encoding="utf-8")
    return path


def test_nccl_algo_settings_read_as_nccl_reads_them():
    assert algorithms_of_setting("NVLS", "AllReduce") == ("nvls",)
    assert algorithms_of_setting("ring,Tree", "AllReduce") == ("ring", "tree")
    assert algorithms_of_setting("^nvls,nvlstree", "AllReduce") == ("ring", "tree", "pat")
    assert algorithms_of_setting("allreduce:nvls;broadcast:ring", "AllReduce") == ("nvls",)
    assert algorithms_of_setting("allreduce:nvls;broadcast:ring", "AllGather") == ("ring", "tree", "nvls",
                                                                                   "nvls_tree", "pat")
    assert algorithms_of_setting("CollNetDirect", "AllReduce") == ()
    assert algorithms_of_setting("fast", "AllReduce") is None


def test_the_log_pin_is_read_and_fitted_as_it_ran():
    _, measurements = read_measurements(str(LOG), None, None)
    assert {m.run.nccl_algo for m in measurements} == {"NVLS"}
    assert pinned_algorithms(measurements) == ("nvls",)
    base = load_topology("dgx-h100")
    result = calibrate_nccl(measurements, base)
    assert {e.algorithm for fit in result.fits for g in fit.groups for e in g.errors} == {"nvls"}
    assert result.topology.nccl.algorithms == base.nccl.algorithms  # the pin is the run's, not the system's


def test_the_nvls_check_never_refits_without_an_algorithm():
    _, measurements = read_measurements(str(LOG), None, None)
    base = load_topology("dgx-h100")
    assert nvls_flipped(base, measurements) is None  # NCCL_ALGO=NVLS: NVLS off leaves nothing
    unpinned = [replace(m, run=replace(m.run, nccl_algo=None)) for m in measurements]
    assert nvls_flipped(base, unpinned).nccl.nvls is False
    only_nvls = replace(base, nccl=replace(base.nccl, algorithms=("nvls", "nvls_tree")))
    assert nvls_flipped(only_nvls, unpinned) is None
    ring = replace(base, nccl=replace(base.nccl, nvls=False, algorithms=("ring",)))
    assert nvls_flipped(ring, unpinned) is None  # NVLS on changes nothing NCCL may pick
    assert nvls_flipped(load_topology("dgx-a100"), unpinned) is None  # no NVLS before Hopper


def test_a_poor_fit_of_a_pinned_nvls_run_ends_without_a_traceback(run_cli, tmp_path, monkeypatch):
    import synth.commands.calibration as command

    monkeypatch.setattr(command, "CONTRADICTION_FLOOR", -1.0)  # every fit checked as if poor
    base = _base(tmp_path, "nvls-only.toml", True, '"nvls"')
    code, stdout, stderr = run_cli("calibrate", str(LOG), "-t", str(base), "-o", str(tmp_path / "out.toml"))
    assert code == 0, stderr
    assert "Traceback" not in stdout + stderr and "contradict" not in stdout + stderr


def test_a_pin_the_base_cannot_run_is_one_line(run_cli, tmp_path):
    code, _, stderr = run_cli("calibrate", str(LOG), "-t", str(_base(tmp_path, "off.toml", False)))
    assert code == 2 and "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1
    assert "NCCL_ALGO=NVLS" in stderr and "nvls = true" in stderr
    code, _, stderr = run_cli("calibrate", str(LOG), "-t", str(_base(tmp_path, "off-pinned.toml", False, '"nvls"')))
    assert code == 2 and "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1


def test_runs_pinned_differently_are_refused():
    _, measurements = read_measurements(str(LOG), None, None)
    other = [replace(m, run=replace(m.run, nccl_algo="Ring")) for m in measurements]
    with pytest.raises(UsageError, match="different NCCL_ALGO"):
        pinned_algorithms(measurements + other)
    unknown = [replace(m, run=replace(m.run, nccl_algo="Fast")) for m in measurements]
    with pytest.raises(UsageError, match="NCCL_ALGO=Fast"):
        pinned_algorithms(unknown)
