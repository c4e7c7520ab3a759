"""`--collective` on the commands that take `--reduce` (docs/model.md section 7, "Goals"):
`check`, `programs`, `rank`, `explore`, `export` (torch, JSON) and `bench` take every goal;
`fusion` (gradient buckets, an all-reduce by nature) and NCCL C exports refuse the others with
one line (exit 2); the default changes nothing."""

from __future__ import annotations

import csv
import json

import pytest

NODE_GPU = ("--levels", "node=2,gpu=4", "--axes", "8", "--reduce", "a0")
COSTED = ("--topology", "dgx-a100-x4", "--axes", "32", "--reduce", "a0")


@pytest.mark.parametrize("goal, program", [
    ("reducescatter", "Permute(gpu,node); ReduceScatter(InsideGroup(gpu)); ReduceScatter(Parallel(node))"),
    ("allgather", "Permute(gpu,node); AllGather(Parallel(node)); AllGather(InsideGroup(gpu)); Permute(node,gpu)"),
    ("alltoall", "AllToAll(Parallel(node)); Permute(gpu,node); AllToAll(InsideGroup(gpu)); Permute(node,gpu)"),
    ("broadcast", "Broadcast(Master(node)); Broadcast(InsideGroup(gpu))"),
    ("reduce", "Reduce(InsideGroup(gpu)); Reduce(Master(node))"),
    ("all-reduce", "AllReduce(InsideGroup(node))"),
])
def test_check_proves_programs_of_every_goal(run_cli, goal, program):
    code, out, _ = run_cli("check", *NODE_GPU, "--collective", goal, program)
    assert code == 0 and out.startswith("valid:")


def test_check_refuses_a_wrong_block_order_with_the_reason(run_cli):
    code, _, err = run_cli("check", *NODE_GPU, "--collective", "reducescatter",
                           "ReduceScatter(InsideGroup(gpu)); ReduceScatter(Parallel(node))")
    assert code == 1 and "wrong order" in err and "Permute" in err and len(err.strip().splitlines()) == 1


def test_programs_lists_each_goals_programs_and_the_default_is_all_reduce(run_cli):
    code, out, _ = run_cli("programs", *NODE_GPU, "--collective", "alltoall", "--max-len", "4", "--json")
    found = [row["program"] for row in json.loads(out)]
    assert code == 0 and "AllToAll(InsideGroup(node))" in found
    assert "AllToAll(Parallel(node)); Permute(gpu,node); AllToAll(InsideGroup(gpu)); Permute(node,gpu)" in found
    _, default, _ = run_cli("programs", *NODE_GPU, "--max-len", "3", "--count")
    _, named, _ = run_cli("programs", *NODE_GPU, "--max-len", "3", "--count", "--collective", "allreduce")
    assert default == named


def test_an_unknown_collective_is_a_usage_error(run_cli):
    code, _, err = run_cli("programs", *NODE_GPU, "--collective", "gather")
    assert code == 2 and "--collective" in err and "reducescatter" in err


def test_fusion_an_all_reduce_by_nature_refuses_other_goals(run_cli):
    code, _, err = run_cli("fusion", "--tensors", "1MiB", *COSTED, "--collective", "alltoall")
    assert code == 2 and "--collective alltoall" in err and "synth programs" in err


@pytest.mark.parametrize("goal", ["reducescatter", "allgather", "alltoall", "broadcast", "reduce"])
def test_explore_ranks_every_placement_for_the_goal_with_rank_s_best_program(run_cli, goal):
    code, out, err = run_cli("explore", "--topology", "dgx-a100-x4", "--axes", "a=8,b=4", "--reduce", "a",
                             "--collective", goal, "--bytes", "64KiB", "--max-len", "4", "--json")
    rows = json.loads(out)
    assert code == 0, err
    assert len(rows) > 1 and all(row["collective"] == goal for row in rows)
    assert [row["best_time_s"] for row in rows] == sorted(row["best_time_s"] for row in rows)
    assert all(row["best_time_s"] <= row["baseline_time_s"] and row["bound_ratio"] >= 1 for row in rows)
    first = rows[0]
    _, ranked, _ = run_cli("rank", "--topology", "dgx-a100-x4", "--axes", "a=8,b=4", "--reduce", "a",
                           "--placement", first["placement"], "--collective", goal, "--bytes", "64KiB",
                           "--max-len", "4", "--json")
    best = json.loads(ranked)[0]
    assert best["program"] == first["best_program"] and best["time_s"] == pytest.approx(first["best_time_s"])


def test_explore_table_names_the_goal_and_its_flat_call(run_cli):
    code, out, _ = run_cli("explore", *COSTED, "--collective", "reducescatter", "--bytes", "64KiB", "--max-len", "3")
    assert code == 0 and "reduce-scatter" in out and "flat ReduceScatter" in out


@pytest.mark.parametrize("goal", ["reducescatter", "alltoall"])
def test_export_top_k_writes_the_goal_s_k_best_programs(run_cli, goal, tmp_path):
    _, ranked, _ = run_cli("rank", *COSTED, "--collective", goal, "--bytes", "64KiB", "--max-len", "4", "--json")
    best = [row["program"] for row in json.loads(ranked)][:3]
    target = tmp_path / "top.json"
    code, _, err = run_cli("export", *COSTED, "--collective", goal, "--top", "3", "--max-len", "4",
                           "--bytes", "64KiB", "--format", "json", "-o", str(target))
    assert code == 0, err
    document = json.loads(target.read_text())
    assert [entry["text"] for entry in document["programs"]] == best
    assert all(entry["collective"] == goal for entry in document["programs"])
    assert f"--collective {goal} --top 3" in document["command"]
    code, _, err = run_cli("export", *COSTED, "--collective", goal, "--top", "1", "--format", "nccl",
                           "-o", str(tmp_path / "top.c"))
    assert code == 0, err
    assert "GOAL_OP" in (tmp_path / "top.c").read_text()


def test_export_writes_a_torch_script_nccl_c_file_or_json_plan_of_any_goal(run_cli, tmp_path):
    program = "AllToAll(Parallel(node)); Permute(gpu,node); AllToAll(InsideGroup(gpu)); Permute(node,gpu)"
    target = tmp_path / "a2a.py"
    code, out, _ = run_cli("export", *NODE_GPU, "--collective", "alltoall", "--format", "torch", "--program", program,
                           "-o", str(target))
    assert code == 0 and '"goal":"alltoall"' in target.read_text() and "--collective alltoall" in target.read_text()
    code, _, _ = run_cli("export", *NODE_GPU, "--collective", "alltoall", "--format", "json", "--program", program,
                         "-o", str(tmp_path / "a2a.json"))
    document = json.loads((tmp_path / "a2a.json").read_text())
    (entry,) = document["programs"]
    assert code == 0 and entry["collective"] == "alltoall" and entry["final_places"] == list(range(8))
    kinds = [step["collective"] for step in entry["steps"]]
    assert kinds == ["AllToAll", "Permute", "AllToAll", "Permute"]
    assert sorted(entry["steps"][1]["places"]) == list(range(8)) and entry["steps"][1]["places"] != list(range(8))
    code, _, _ = run_cli("export", *NODE_GPU, "--collective", "alltoall", "--format", "nccl", "--program", program,
                         "-o", str(tmp_path / "a2a.c"))
    source = (tmp_path / "a2a.c").read_text()
    assert code == 0 and "#define GOAL_OP OP_ALL_TO_ALL" in source and source.count("OP_PERMUTE") >= 2


@pytest.mark.parametrize("goal", ["reducescatter", "allgather", "alltoall", "broadcast", "reduce"])
def test_rank_orders_each_goals_programs_with_its_flat_call_as_baseline(run_cli, goal):
    code, out, _ = run_cli("rank", *COSTED, "--collective", goal, "--bytes", "64KiB", "--max-len", "4", "--json")
    rows = json.loads(out)
    assert code == 0 and rows
    times = [row["time_s"] for row in rows]
    assert times == sorted(times)
    (baseline,) = [row for row in rows if row["baseline"]]
    flat = {"reducescatter": "ReduceScatter", "allgather": "AllGather", "alltoall": "AllToAll",
            "broadcast": "Broadcast", "reduce": "Reduce"}[goal]
    assert baseline["program"] == f"{flat}(InsideGroup(node))" and baseline["speedup"] == 1.0
    assert all(row["bound_ratio"] >= 1 for row in rows)
    code, out, _ = run_cli("rank", *COSTED, "--collective", goal, "--bytes", "64KiB", "--max-len", "4", "--top", "1",
                           "--json")
    top = json.loads(out)
    assert top[0]["program"] == rows[0]["program"] and len(top) <= 2


def test_a_permuted_reduce_scatter_beats_the_flat_call_on_small_buffers(run_cli):
    code, out, _ = run_cli("rank", *COSTED, "--collective", "reducescatter", "--bytes", "64KiB", "--max-len", "3",
                           "--json")
    rows = {row["program"]: row for row in json.loads(out)}
    permuted = rows["Permute(gpu,node); ReduceScatter(InsideGroup(gpu)); ReduceScatter(Parallel(node))"]
    assert permuted["speedup"] > 1


@pytest.mark.torchrun
def test_bench_runs_and_checks_a_goal_s_best_programs_on_8_gloo_ranks(run_cli, tmp_path):
    pytest.importorskip("torch", reason="synth bench runs programs with torch")
    results = tmp_path / "results"
    code, _, err = run_cli("bench", "--topology", "emu-2x4-gloo", "--axes", "data=8", "--reduce", "data",
                           "--collective", "alltoall", "--top", "2", "--max-len", "4", "--backend", "gloo",
                           "--bytes", "8KiB", "--iters", "1", "--warmup", "0", "-o", str(results))
    assert code == 0, err
    lines = next(results.glob("bench-*.csv")).read_text().splitlines()
    assert any("--collective alltoall" in line for line in lines if line.startswith("# command:"))
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    programs = [row for row in rows if not row["role"].startswith("baseline")]
    assert {row["role"] for row in programs} >= {"flat AllToAll"} and all(row["check"] == "ok" for row in programs)
    assert any("Permute" in row["program"] for row in programs)
    assert sorted(int(row["simulator_rank"]) for row in programs) == list(range(1, len(programs) + 1))
    (baseline,) = [row for row in rows if row["role"].startswith("baseline")]
    assert baseline["program"] == "torch.distributed.all_to_all_single"
