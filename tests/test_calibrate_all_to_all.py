"""Calibration of every goal: nccl-tests alltoall_perf logs fitted under the NCCL model
(synth/calibrate/all_to_all.py), and an exported program's table of another goal read with
that goal's baseline (synth/calibrate/export_results.py). Small hand-made logs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from synth.calibrate import read_measurements
from synth.calibrate.all_to_all import predicted_times
from synth.calibrate.groups import devices
from synth.topology_file import load_topology

RANKS = "\n".join(f"#  Rank {r:2d} Group  0 Pid {40210 + r:6d} on {'gpu01' if r < 4 else 'gpu02':>10} device {r % 4:2d} "
                  f"[0x07] NVIDIA H100 80GB HBM3" for r in range(8))
# (bytes, out-of-place time in us): 2 hosts x 4 H100, every rank's buffer split into 8 blocks
ROWS = ((1024, 40.0), (16384, 42.0), (262144, 60.0), (4194304, 260.0), (67108864, 3300.0), (268435456, 13100.0))


def alltoall_log() -> str:
    lines = ["# nThread 1 nGpus 1 minBytes 1024 maxBytes 268435456 step: 16(factor) warmup iters: 5 iters: 20 "
             "agg iters: 1 validation: 1 graph: 0", "#", "# Using devices", RANKS, "#",
             "#                                                              out-of-place                       in-place",
             "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   "
             "busbw #wrong",
             "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  "
             "(GB/s)"]
    for size, time_us in ROWS:
        algbw = size / time_us / 1e3
        busbw = algbw * 7 / 8  # alltoall_perf: (n-1)/n
        lines.append(f"{size:>12} {size // 32:>13} {'float':>9} {'none':>7} {-1:>7} {time_us:>8.2f} {algbw:>7.2f} "
                     f"{busbw:>7.2f} {0:>6} {'N/A':>8} {'N/A':>7} {'N/A':>7} {'N/A':>6}")
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 8.99", "#"]
    return "\n".join(lines) + "\n"


def test_an_alltoall_log_reads_as_all_to_all_measurements(tmp_path):
    path = tmp_path / "alltoall_perf.txt"
    path.write_text(alltoall_log())
    kind, measurements = read_measurements(str(path))
    assert kind == "nccl-tests text"
    assert {m.collective for m in measurements} == {"AllToAll"}
    assert {(m.span.hosts, m.span.per_unit) for m in measurements} == {(2, 4)}
    assert [(m.bytes, round(m.time_s * 1e6, 2)) for m in measurements] == list(ROWS)  # in place N/A: out of place


def test_an_unnamed_alltoall_table_is_refused_naming_both_tests(tmp_path):
    from synth.errors import UsageError

    path = tmp_path / "run.log"
    path.write_text(alltoall_log())
    with pytest.raises(UsageError, match="fits AllGather or AllToAll"):
        read_measurements(str(path))


def test_calibrate_fits_the_all_to_all_figures_of_the_level_it_spans(tmp_path, run_cli):
    path = tmp_path / "alltoall_perf.txt"
    path.write_text(alltoall_log())
    out = tmp_path / "calibrated.toml"
    code, stdout, stderr = run_cli("calibrate", str(path), "-o", str(out), "--json")
    assert code == 0, stderr
    document = json.loads(stdout)
    groups = [group for fit in document["fits"] for group in fit["groups"]]
    assert [(g["collective"], g["nodes"], g["ranks_per_node"]) for g in groups] == [("AllToAll", 2, 4)]
    topology = load_topology(str(out))
    node = topology.levels[0]
    assert node.name == "node" and "AllToAll" in dict(node.collectives)
    assert "fitted by synth calibrate" in dict(node.collectives)["AllToAll"].bandwidth.source
    assert all(name == "AllToAll" for level in topology.levels for name, _ in level.collectives)
    # the written file reproduces what the fit reports, through the planner's own engine
    _, measurements = read_measurements(str(path))
    ranks = tuple(devices(measurements[0], topology)[1])
    predicted = predicted_times(topology, ranks, [m.bytes for m in measurements])
    reported = [size["predicted_s"] for size in groups[0]["sizes"]]
    assert predicted == pytest.approx(reported, rel=1e-5)  # the file writes figures to 6 digits
    errors = np.array([p / m.time_s - 1 for p, m in zip(predicted, measurements)])
    assert float(np.sqrt(np.mean(errors ** 2))) < 0.25  # the model's steps in the bandwidth: see the docstring
    assert document["replay_relative_rms"] == pytest.approx(float(np.sqrt(np.mean(errors ** 2))), rel=1e-6)


def test_a_gloo_benchmark_csv_of_all_to_all_fits_through_its_flows(tmp_path, run_cli):
    rows = "".join(f"AllToAll,gpu,2,{size},{2e-5 + size / 2e9},gloo\n" for size in (1024, 65536, 1 << 20, 1 << 24))
    path = tmp_path / "bench.csv"
    path.write_text("collective,level,group_size,bytes,time_s,backend\n" + rows)
    code, stdout, stderr = run_cli("calibrate", str(path), "--topology", "emu-2x2", "--json")
    assert code == 0, stderr
    fits = json.loads(stdout)["fits"]
    assert [(fit["level"], fit["collective"]) for fit in fits] == [("gpu", "AllToAll")]


EXPORT_COMMAND = ("synth export --topology emu-2x2 --axes data=2,model=2 --reduce data --placement [[2,1],[1,2]] "
                  "--collective reducescatter --format torch -o rs.py")
HEADER = ("#                                                 out-of-place                     in-place\n"
          "#       size        count     type  redop   root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
          "#        (B)   (elements)                            (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)")


def _rows(scale: float, suffix: str = "") -> str:
    lines = []
    for size in (4096, 65536, 1 << 20, 1 << 24):
        time_us = scale * (30 + size / 2e3)
        lines.append(f"{size:>12} {size // 4:>12} {'float':>8} {'sum':>6} {-1:>6} {'N/A':>8} {'N/A':>7} {'N/A':>7} "
                     f"{'N/A':>6} {time_us:>8.2f} {size / time_us / 1e3:>7.2f} {size / time_us / 2e3:>7.2f} "
                     f"{'N/A':>6}{suffix}")
    return "\n".join(lines)


def reduce_scatter_table() -> str:
    return "\n".join([
        f"# command: {EXPORT_COMMAND}",
        "# 2 program(s) on 4 ranks, backend gloo, type float, 2 iteration(s) after 1 warm-up run(s) (-n 2 -w 1)",
        "#", "# program 0: ReduceScatter(InsideGroup(node))",
        "# 2 reduction group(s) of n = 2 ranks; the buffer is cut into 2 chunks",
        "# reduction groups: [[0,2],[1,3]]", HEADER, _rows(1.0), "# Avg bus bandwidth    : 1 ",
        "#", "# program 1: Permute(node); ReduceScatter(InsideGroup(node)); Permute(node)",
        "# 2 reduction group(s) of n = 2 ranks; the buffer is cut into 2 chunks",
        "# reduction groups: [[0,2],[1,3]]", HEADER, _rows(1.3), "# Avg bus bandwidth    : 1 ",
        "#", "# baseline: one call of each program's collective over each reduction group (all_reduce unless named)",
        HEADER, _rows(1.1, "   (programs 0,1)"), "# Avg bus bandwidth    : 1 "]) + "\n"


def test_a_torch_table_of_another_goal_reads_with_that_goals_baseline(tmp_path, run_cli):
    path = tmp_path / "table.txt"
    path.write_text(reduce_scatter_table())
    kind, measurements = read_measurements(str(path))
    assert kind == "exported program output"
    # program 0 (one ReduceScatter call) and the baseline (reduce_scatter_tensor); program 1 is a program
    assert len(measurements) == 8 and {m.collective for m in measurements} == {"ReduceScatter"}
    assert {(m.span.level, m.span.size, m.backend) for m in measurements} == {("node", 2, "gloo")}
    code, stdout, stderr = run_cli("calibrate", str(path), "--json")
    assert code == 0, stderr
    assert [fit["collective"] for fit in json.loads(stdout)["fits"]] == ["ReduceScatter"]


def test_the_scripts_json_of_another_goal_reads_with_that_goals_baseline(tmp_path):
    document = {"format": "synth-export-results", "command": EXPORT_COMMAND, "backend": "gloo",
                "programs": [{"label": "", "text": "ReduceScatter(InsideGroup(node))",
                              "reduction_groups": [[0, 2], [1, 3]]}],
                "results": [{"bytes": size, "time_us": 30 + size / 2e3, "program": 0} for size in (4096, 1 << 20)],
                "baselines": [{"bytes": size, "time_us": 33 + size / 2e3, "programs": [0], "goal": "reducescatter"}
                              for size in (4096, 1 << 20)]}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document))
    kind, measurements = read_measurements(str(path))
    assert kind == "exported script JSON"
    assert [m.collective for m in measurements] == ["ReduceScatter"] * 4
