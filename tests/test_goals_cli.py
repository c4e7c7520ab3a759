"""`--collective` on the commands that take `--reduce` (docs/model.md section 7, "Goals"):
`check` and `programs` take every goal; the commands that cost or run programs take the
default all-reduce and refuse the others with one line (exit 2); the default changes nothing."""

from __future__ import annotations

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


@pytest.mark.parametrize("command", [("explore", "--bytes", "1MiB"),
                                     ("export", "--format", "json", "--top", "1", "-o", "unused.json"), ("bench",),
                                     ("fusion", "--tensors", "1MiB")])
def test_commands_that_cost_or_run_programs_refuse_other_goals_for_now(run_cli, command):
    code, _, err = run_cli(*command, *COSTED, "--collective", "alltoall")
    assert code == 2 and "--collective alltoall" in err and "synth programs" in err


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
