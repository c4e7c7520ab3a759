"""Small output fixes: every figure a command prints says what it is (issue 22, section 3)."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from synth.calibrate.confidence import Confidence, band_errors
from synth.plan.model import PRESETS
from synth.topology import CalibrationRecord

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"


def test_export_top_1_says_when_nothing_beats_the_flat_call(run_cli, tmp_path):
    out = tmp_path / "plan.json"
    code, stdout, err = run_cli("export", "--topology", "dgx-a100", "--axes", "dp=8", "--reduce", "dp", "--top", "1",
                                "--format", "json", "-o", str(out))
    assert code == 0, err
    assert "nothing beats the flat call here" in err and "AllReduce(InsideGroup(gpu))" in err
    assert stdout.strip() == f"wrote {out}"
    code, _, err = run_cli("export", "--topology", "dgx-a100", "--axes", "dp=8", "--reduce", "dp", "--program",
                           "AllReduce(InsideGroup(gpu))", "--format", "json", "-o", str(out))
    assert code == 0 and "nothing beats" not in err  # a program the user chose is not a ranking's verdict


def test_plan_list_models_honours_json(run_cli):
    code, out, err = run_cli("plan", "--list-models", "--json")
    assert code == 0, err
    models = json.loads(out)
    assert [entry["name"] for entry in models] == list(PRESETS)
    mixtral = next(entry for entry in models if entry["name"] == "mixtral-8x7b")
    assert mixtral["active_parameters"] < mixtral["parameters"] and mixtral["model"]["layers"] == 32


def test_sweep_says_what_its_win_count_counts(run_cli, tmp_path):
    code, out, err = run_cli("sweep", "--topology", "gcp-n1-v100-4x8", "--axes", "data=8,model=4", "-b", "1KiB",
                             "-e", "4KiB", "-o", str(tmp_path / "sweep"))
    assert code == 0, err
    match = re.search(r"(\d+) configurations .* beats the default all-reduce on (\d+) of the (\d+) configurations "
                      r"\((\d+\.\d)%\)", out)
    assert match and match[1] == match[3] and int(match[2]) <= int(match[3])
    assert float(match[4]) == pytest.approx(100 * int(match[2]) / int(match[3]), abs=0.05)


def test_calibrate_labels_the_fits_rms_apart_from_the_replays(run_cli, tmp_path):
    code, out, err = run_cli("calibrate", str(EXAMPLES / "all_reduce_perf-h100-ib-2x8.txt"), "--topology",
                             "hgx-h100-ib-4x8", "-o", str(tmp_path / "h100.toml"))
    assert code == 0, err
    text = " ".join((out + err).split())
    assert "replay of the written file over all 32 measurements" in text and "fit rel. RMS" in text
    from synth.calibrate.report import nccl_fit_rows

    headers = nccl_fit_rows(SimpleNamespace(fits=()))[0]
    assert "fit rel. RMS (group)" in headers and "fit worst (group)" in headers


def test_band_errors_per_size_band():
    bands = band_errors([(1024, 0.1), (2048, -0.3), (2 << 20, 0.05), (1 << 30, 0.02)])
    assert [band for band, *_ in bands] == ["< 1 MiB", "1-64 MiB", ">= 64 MiB"]
    small = bands[0]
    assert small[1] == pytest.approx((0.5 * (0.01 + 0.09)) ** 0.5) and small[2] == pytest.approx(0.3) and small[3] == 2


def test_the_error_stated_is_the_one_at_the_size_asked():
    record = CalibrationRecord("AllReduce", "node", 2, 8, 8, 1 << 30, 4, 0.2, 0.3, "run.txt", "nccl",
                               band_errors([(1024, 0.3), (2048, 0.1), (1 << 30, 0.02), (1 << 29, 0.01)]))
    confidence = Confidence(record, True)
    large = confidence.describe(1 << 30)
    assert large.startswith("model error at >= 64 MiB (this size's band) 1.6% RMS (worst 2.0%, 2 sizes)")
    assert "20.0% RMS over all its sizes" in large
    assert "it measured no size in 1-64 MiB" in confidence.describe(4 << 20)
    assert "this size's band" not in Confidence(record.__class__(*[getattr(record, f) for f in (
        "collective", "level", "nodes", "ranks_per_node", "min_bytes", "max_bytes", "points", "rms_error",
        "worst_error", "file")]), True).describe(1 << 30)  # an older record without bands: its overall error


def test_rank_on_a_calibrated_topology_states_the_band_error(run_cli, tmp_path):
    calibrated = tmp_path / "h100.toml"
    code, _, err = run_cli("calibrate", str(EXAMPLES / "all_reduce_perf-h100-ib-2x8.txt"), "--topology",
                           "hgx-h100-ib-4x8", "-o", str(calibrated))
    assert code == 0, err
    assert "bands = [" in calibrated.read_text()  # written, and read back by rank below
    code, out, err = run_cli("rank", "--topology", str(calibrated), "--axes", "model=2,data=16", "--reduce", "data",
                             "--placement", "[[2,1],[2,8]]", "--bytes", "1MiB", "--top", "2")
    assert code == 0, err
    assert "model error at 1-64 MiB (this size's band)" in " ".join(out.split())


def test_reducer_summary_is_a_dict_for_loggers_and_describe_reads_it():
    pytest.importorskip("torch")
    from synth.torch.reducer import PlanRun, describe_summary

    run = PlanRun(0, {"programs": [{"text": "AllReduce(InsideGroup(gpu))"}, {"text": "AllReduce(InsideGroup(node))"}]},
                  {1: ("gpu", object())}, "digest", timedelta(seconds=90), SimpleNamespace(created=2))
    summary = run.summary({0: 3, 1: 1}, "tensor(s)")
    assert json.loads(json.dumps(summary)) == summary  # plain values a logger takes
    assert summary["reused_from_mesh"] == [{"communicator": 1, "dimension": "gpu"}]
    assert summary["timeout_s"] == 90 and summary["groups_created"] == 2
    assert [entry["count"] for entry in summary["programs"]] == [3, 1]
    assert describe_summary(summary).splitlines() == [
        "reused from the mesh: communicator 1 = dimension gpu", "groups created: 2, timeout 0:01:30",
        "3 tensor(s) by program 0: AllReduce(InsideGroup(gpu))", "1 tensor(s) by program 1: AllReduce(InsideGroup(node))"]
