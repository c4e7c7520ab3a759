"""Exported torch scripts run for real: gloo on CPU, one process per device, via torchrun.

Starting torchrun is the slow part on a small machine, so one launch runs every valid program
of up to 3 steps of every 8-device case (2x4 and 2x2x2 hierarchies, an axis inside one level
and across several, two reduced axes, all three hierarchy kinds), of every goal, each checked
against torch's own collective (a plain all_reduce for an all-reduce; tests/test_goals_export.py
runs length 4 under `-m slow`). Smaller launches cover the CLI path, a deliberately corrupted
script and bench.
"""

from __future__ import annotations

import ast
import csv
import json

import pytest

from export_cases import entries, goal_entries
from synth.export import torch_script
from synth.execute.launch import torchrun
from synth.export.plan import buffer_count, build_plan
from synth.export.provenance import Provenance

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torchrun

FAST = ["--backend", "gloo", "--check", "--iters", "1", "--warmup", "0"]
LEVELS_2X2 = ("--levels", "node=2,gpu=2", "--axes", "data=4", "--reduce", "data", "--placement", "[[2,2]]")
PROGRAM = "ReduceScatter(InsideGroup(gpu)); AllReduce(Parallel(node)); AllGather(InsideGroup(gpu))"


def test_every_short_program_of_every_case_passes_its_check(tmp_path):
    plan = build_plan(entries(3) + goal_entries(3))
    assert {program.goal.name for program in plan.programs} >= {"allreduce", "reducescatter", "allgather", "alltoall"}
    script = tmp_path / "batch.py"
    script.write_text(torch_script.render(plan, Provenance(("pytest",))))
    result = torchrun(script, plan.world_size, FAST + ["--bytes", "1000"], timeout=600)
    assert result.returncode == 0, result.log[-4000:]
    report = result.report
    assert len(report["results"]) == len(plan.programs) > 100
    failed = [plan.programs[row["program"]].text for row in report["results"] if row["wrong"] != 0]
    assert not failed, failed
    for row in report["results"]:  # 1000 B rounded up to N chunks of whole elements (an all-reduce's)
        if not plan.programs[row["program"]].goal.is_all_reduce:
            continue
        assert row["count"] == buffer_count(1000, plan.programs[row["program"]].chunks) == row["bytes"] // 4
    assert "rounded up to 1024 B" in result.log and "rounded up to 1008 B" in result.log
    assert "check passed" in result.log
    assert report["baselines"], "no baseline all_reduce row"


def _corrupt(script_text: str) -> str:
    """Shift the chunk range of the AllReduce step (step 1) by its own length on every rank:
    counts stay equal, so nothing hangs, but the wrong chunks get summed."""
    tree = ast.parse(script_text)
    assign = next(node for node in tree.body if isinstance(node, ast.Assign) and node.targets[0].id == "PLAN")
    literal = assign.value.args[0].value
    plan = json.loads(literal)
    chunks = plan["programs"][0]["chunks"]
    for call in plan["programs"][0]["steps"][1]["calls"]:
        length = call[4] - call[3]
        call[3], call[4] = (call[3] + length) % chunks, (call[3] + length) % chunks + length
    return script_text.replace(repr(literal), repr(json.dumps(plan, sort_keys=True, separators=(",", ":"))))


def test_cli_script_passes_and_a_corrupted_copy_fails(run_cli, tmp_path):
    script = tmp_path / "program.py"
    code, _, stderr = run_cli("export", *LEVELS_2X2, "--program", PROGRAM, "--format", "torch", "-o", str(script))
    assert code == 0, stderr
    result = torchrun(script, 4, FAST + ["--bytes", "4KiB"], timeout=300)
    assert result.returncode == 0, result.log[-4000:]
    assert "check passed" in result.log and "baseline" in result.log
    row = result.report["results"][0]
    assert row["wrong"] == 0 and row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * 2 * 3 / 4)

    corrupted = tmp_path / "corrupted.py"
    corrupted.write_text(_corrupt(script.read_text()))
    assert corrupted.read_text() != script.read_text()
    result = torchrun(corrupted, 4, FAST + ["--bytes", "4KiB"], timeout=300)
    assert result.returncode != 0
    assert "CHECK FAILED" in result.log
    assert result.report["results"][0]["wrong"] > 0


def test_bench_writes_checked_measurements(run_cli, tmp_path):
    code, stdout, stderr = run_cli("bench", *LEVELS_2X2, "--program", PROGRAM,
                                   "--program", "Reduce(InsideGroup(gpu)); AllReduce(Master(node)); Broadcast(InsideGroup(gpu))",
                                   "--backend", "gloo", "-b", "1KiB", "-e", "2KiB", "--iters", "2", "--warmup", "0",
                                   "-o", str(tmp_path))
    assert code == 0, stderr
    path = next(tmp_path.glob("bench-*.csv"))
    assert f"wrote {path}" in stdout
    lines = path.read_text().splitlines()
    header = [line for line in lines if line.startswith("# ")]
    assert any(line.startswith("# command: synth bench --levels node=2,gpu=2") for line in header)
    assert any(line.startswith("# machine: ") and "cores" in line for line in header)
    assert any(line.startswith("# date: ") for line in header)
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    programs = [row for row in rows if row["role"] != "baseline all_reduce"]
    assert len(programs) == 3 * 2  # two programs and the default all-reduce, at two sizes
    assert {row["role"] for row in programs} == {"synthesized", "default all-reduce"}
    assert all(row["check"] == "ok" for row in programs)
    assert sorted(int(row["measured_rank"]) for row in programs if row["bytes"] == "1024") == [1, 2, 3]
    for row in rows:
        assert float(row["busbw_gbs"]) == pytest.approx(float(row["algbw_gbs"]) * 2 * 3 / 4, rel=1e-3)


TOPOLOGY_2X2 = """
name = "test-2x2"
[[levels]]
name = "node"
size = 2
bandwidth = { value = "1 GB/s", source = "estimate: loopback, for the test" }
latency = { value = "50 us", source = "estimate: loopback, for the test" }
[[levels]]
name = "gpu"
size = 2
bandwidth = { value = "2 GB/s", source = "estimate: loopback, for the test" }
latency = { value = "20 us", source = "estimate: loopback, for the test" }
"""


def test_bench_top_k_puts_predictions_beside_measurements(run_cli, tmp_path):
    topology = tmp_path / "test-2x2.toml"
    topology.write_text(TOPOLOGY_2X2)
    results = tmp_path / "results"
    code, stdout, stderr = run_cli("bench", "--topology", str(topology), "--axes", "data=4", "--reduce", "data",
                                   "--top", "2", "--max-len", "3", "--backend", "gloo", "--bytes", "8KiB",
                                   "--iters", "2", "--warmup", "0", "-o", str(results))
    assert code == 0, stderr
    path = next(results.glob("bench-*.csv"))
    lines = path.read_text().splitlines()
    assert any("predicted: the simulator on test-2x2 with the gloo model" in line for line in lines)
    rows = [row for row in csv.DictReader(line for line in lines if not line.startswith("#"))
            if row["role"] != "baseline all_reduce"]
    assert 2 <= len(rows) <= 3  # the top 2, and the default all-reduce when it is not among them
    assert sorted(int(row["simulator_rank"]) for row in rows) == list(range(1, len(rows) + 1))
    assert all(float(row["predicted_time_us"]) > 0 and row["check"] == "ok" for row in rows)


def test_timeout_reaches_the_scripts_groups(run_cli, tmp_path):
    """--timeout is given to the groups the script creates too (torch gives new_group the
    backend's 30 minutes otherwise): a rank that never joins a step fails the run in seconds."""
    script = tmp_path / "program.py"
    code, _, stderr = run_cli("export", *LEVELS_2X2, "--program", PROGRAM, "--format", "torch", "-o", str(script))
    assert code == 0, stderr
    text = script.read_text()
    anchor = "    sizes = sizes_of(args)\n"
    assert anchor in text
    stuck = tmp_path / "stuck.py"  # rank 3 stays away after the communicators are made
    stuck.write_text(text.replace(anchor, anchor + "    if rank == 3:\n        time.sleep(600)\n", 1))
    result = torchrun(stuck, 4, FAST + ["--bytes", "4KiB", "--timeout", "3"], timeout=150)  # LaunchError if it hangs
    assert result.returncode != 0
    assert "Timed out waiting 3000ms" in result.log, result.log[-4000:]  # gloo's words, with --timeout's 3 s
