"""synth bench --calibrate: the measured winner, the run's flat calls calibrating the topology,
and the programs ranked again on it (gloo, 4 local processes)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from synth.commands.bench_loop import check_loop_options, measured_winners
from synth.errors import UsageError
from synth.topology_file import load_topology


def _row(program, nbytes, seconds, check="ok"):
    return SimpleNamespace(placement="[[2,2]]", program=program, nbytes=nbytes, seconds=seconds, check=check)


def test_the_winner_is_the_fastest_checked_row_per_size():
    rows = [_row("a", 8, 2.0), _row("b", 8, 1.0), _row("c", 8, 0.5, "not run"), _row("a", 16, 1.0)]
    winners = measured_winners(rows)
    assert winners[("[[2,2]]", 8)].program == "b" and winners[("[[2,2]]", 16)].program == "a"


def test_one_size_and_no_measurements_cannot_calibrate():
    with pytest.raises(UsageError, match="two sizes or more"):
        check_loop_options(SimpleNamespace(calibrate="out.toml", measurements=[]), [1 << 20])
    with pytest.raises(UsageError, match="--measurements is for --calibrate"):
        check_loop_options(SimpleNamespace(calibrate=None, measurements=["x.csv"]), [1 << 20])


@pytest.mark.skipif(sys.platform != "linux", reason="4 local gloo processes under torchrun")
def test_bench_calibrate_closes_the_loop(run_cli, tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "loop.toml"
    code, stdout, stderr = run_cli("bench", "--topology", "emu-2x2", "--axes", "data=4", "--reduce", "data", "--top", "2",
                                   "--backend", "gloo", "-b", "64KiB", "-e", "4MiB", "-f", "8", "-n", "4", "-w", "1",
                                   "-o", str(tmp_path / "run"), "--calibrate", str(out))
    assert code == 0, stderr
    assert sum(line.startswith("measured winner at ") for line in stdout.splitlines()) == 3
    assert "ranked again on it: its first choice is the measured winner at" in stdout
    calibrated = load_topology(str(out))
    assert calibrated.calibration and all(r.sigma is not None for r in calibrated.calibration)
