"""Predictions that do not apply are said to: gloo calibrations carry their [[calibration]]
records (so they are not "uncalibrated"), `synth bench` names a calibration made for another
setup and predictions far from the measurement, and a base whose `nvls` the measurements
contradict is named with the field to fix."""

from __future__ import annotations

import json
from pathlib import Path

from synth.calibrate.confidence import model_error
from synth.execute.report import BenchRow, Prediction, calibrated_setup, far_off_note, setup_notes
from synth.topology_file import load_topology

REPOSITORY = Path(__file__).resolve().parent.parent
GLOO_CSV = REPOSITORY / "results" / "accuracy" / "microbench-emu-2x4-calibration.csv"
NCCL_LOG = REPOSITORY / "docs" / "examples" / "all_reduce_perf-h100-ib-2x8.txt"


def test_a_gloo_fit_writes_its_calibration_records(run_cli, tmp_path):
    out = tmp_path / "gloo.toml"
    code, _, stderr = run_cli("calibrate", str(GLOO_CSV), "-t", "emu-2x4", "--backend", "gloo", "-o", str(out))
    assert code == 0, stderr
    topology = load_topology(out)
    assert topology.calibration and {r.backend for r in topology.calibration} == {"gloo"}
    assert {r.file for r in topology.calibration} == {GLOO_CSV.name}
    confidence = model_error(topology, "AllReduce", 2, 4, 128 * 1024)
    assert confidence.calibrated and confidence.exact and "uncalibrated" not in confidence.describe()


def test_the_shipped_gloo_calibrations_are_calibrated():
    for name in ("emu-2x4-gloo", "emu-2x2x2-gloo"):
        topology = load_topology(name)
        assert topology.calibration, name
        backends, scale = calibrated_setup(topology)
        assert backends == {"gloo"} and scale in ("1/256", "1/128"), (name, scale)


def test_bench_names_a_calibration_for_another_setup():
    emulated = load_topology("emu-2x4-gloo")
    notes = setup_notes(emulated, "gloo", emulated=False, scale=None)
    assert len(notes) == 1 and "calibrated on the emulated cluster" in notes[0] and "not emulated" in notes[0]
    assert setup_notes(emulated, "gloo", emulated=True, scale="1/256") == []
    assert "emulate scale 1/256" in setup_notes(emulated, "gloo", emulated=True, scale="1/512")[0]
    other = setup_notes(emulated, "nccl", emulated=True, scale=None)
    assert len(other) == 1 and "calibrated with gloo measurements and this run uses nccl" in other[0]
    assert setup_notes(load_topology("dgx-a100"), "nccl", emulated=False, scale=None) == []


def row(measured: float, predicted: float | None) -> BenchRow:
    prediction = None if predicted is None else Prediction(predicted, 1.0, 1.0, 1)
    return BenchRow("[[8]]", "gpu", "synthesized", "P", 1024, 256, measured, 1.0, 1.0, "ok", 1, prediction)


def test_bench_says_when_predictions_are_far_off():
    topology = load_topology("emu-2x4-gloo")
    note = far_off_note([row(1e-3, 3e-2), row(1e-3, 2e-2), row(1e-3, 4e-2), row(1e-3, None)], topology)
    assert note is not None and "30x the measured times (median over 3 rows" in note
    assert "1/20 of the measured times" in far_off_note([row(2e-2, 1e-3)], topology)
    assert far_off_note([row(1e-3, 1.5e-3), row(1e-3, 0.7e-3)], topology) is None
    assert far_off_note([row(1e-3, None)], topology) is None


def test_a_base_whose_nvls_the_measurements_contradict_is_named(run_cli, tmp_path):
    text = load_topology("hgx-h100-ib-4x8").source_path
    base = tmp_path / "no-nvls.toml"
    base.write_text(Path(text).read_text(encoding="utf-8").replace("nvls = true", "nvls = false"), encoding="utf-8")
    code, stdout, stderr = run_cli("calibrate", str(NCCL_LOG), "-t", str(base), "-o", str(tmp_path / "out.toml"))
    assert code == 0, stderr
    warning = [line for line in (stdout + stderr).splitlines() if "contradict" in line]
    assert warning and "nvls = false" in warning[0] and "nvls = true" in warning[0], stdout + stderr
    code, stdout, _ = run_cli("calibrate", str(NCCL_LOG), "-t", "hgx-h100-ib-4x8", "--json")
    assert code == 0 and json.loads(stdout)["base_contradictions"] == []
