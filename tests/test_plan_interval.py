"""`synth plan` on a calibrated topology states a 90% interval of the step's communication
terms (synth/calibrate/plan_interval.py), from the [[calibration]] records' sigma as
`synth rank` does; without records, or with records that carry no sigma, it says nothing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from synth.cli import main

BASE = Path(__file__).resolve().parent.parent / "topologies" / "dgx-h100-2x8x8.toml"
PLAN = ["-m", "mixtral-8x7b", "--dp", "32", "--tp", "1", "--pp", "4", "--ep", "8", "--micro-batch", "1",
        "--virtual-stages", "8", "--sequence-parallel", "off", "--top", "1"]


def _record(collective: str, nodes: int, per_node: int, sigma: float | None) -> str:
    spread = f"sigma = {sigma}\n" if sigma is not None else ""
    return (f'\n[[calibration]]\ncollective = "{collective}"\nlevel = "node"\nnodes = {nodes}\n'
            f"ranks_per_node = {per_node}\nmin_bytes = 1024\nmax_bytes = 1073741824\npoints = 12\n"
            f'rms_error = 0.04\nworst_error = 0.09\nfile = "probe.csv"\nbackend = "nccl"\n{spread}')


@pytest.fixture
def calibrated(tmp_path):
    def write(sigmas: dict[tuple[str, int, int], float | None]) -> str:
        text = BASE.read_text() + "".join(_record(c, n, r, s) for (c, n, r), s in sigmas.items())
        path = tmp_path / "calibrated.toml"
        path.write_text(text)
        return str(path)
    return write


def test_the_plan_states_the_interval_of_its_communication(calibrated, capsys, monkeypatch):
    # the records' own sigmas alone (no structure term, synth/calibrate/transfer_error.py), to see which is taken
    monkeypatch.setattr("synth.calibrate.transfer_error.STRUCTURE_SIGMA", {})
    path = calibrated({("AllToAll", 1, 8): 0.10, ("ReduceScatter", 2, 8): 0.05, ("AllGather", 2, 1): 0.20})
    assert main(["plan", "-t", path, *PLAN, "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["ranked"][0]
    sure = best["communication_interval_s"]
    assert sure["low"] < sure["seconds"] < sure["high"]
    b = best["breakdown"]
    communication = sum(b[k] for k in ("tensor_parallel_s", "context_parallel_s", "pipeline_p2p_s",
                                       "data_parallel_exposed_s", "embedding_sync_s", "expert_parallel_s",
                                       "contention_s"))
    assert sure["seconds"] == pytest.approx(communication)
    # the expert all-to-all inside a node takes the AllToAll record's sigma
    assert sure["sigmas"]["expert_parallel"] == pytest.approx(0.10)
    z = 1.6448536
    widest = max(sure["sigmas"].values())
    assert sure["high"] <= sure["seconds"] * math.exp(z * widest) * (1 + 1e-9)
    assert main(["plan", "-t", path, *PLAN]) == 0
    out = capsys.readouterr().out
    assert "How sure: the winner's step" in out and "90% interval" in out


@pytest.mark.parametrize("records", [{}, {("AllToAll", 1, 8): None}])
def test_no_interval_without_fitted_spreads(calibrated, capsys, records):
    path = calibrated(records)
    assert main(["plan", "-t", path, *PLAN, "--json"]) == 0
    assert "communication_interval_s" not in json.loads(capsys.readouterr().out)["ranked"][0]
    assert main(["plan", "-t", path, *PLAN]) == 0
    assert "How sure" not in capsys.readouterr().out
