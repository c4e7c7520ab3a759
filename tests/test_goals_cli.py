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


@pytest.mark.parametrize("command", [("rank", "--bytes", "1MiB"), ("explore", "--bytes", "1MiB"),
                                     ("export", "--format", "json", "--top", "1", "-o", "unused.json"), ("bench",),
                                     ("fusion", "--tensors", "1MiB")])
def test_commands_that_cost_or_run_programs_refuse_other_goals_for_now(run_cli, command):
    code, _, err = run_cli(*command, *COSTED, "--collective", "alltoall")
    assert code == 2 and "--collective alltoall" in err and "synth programs" in err


def test_export_writes_a_torch_script_of_any_goal_and_refuses_the_other_formats(run_cli, tmp_path):
    program = "AllToAll(Parallel(node)); Permute(gpu,node); AllToAll(InsideGroup(gpu)); Permute(node,gpu)"
    target = tmp_path / "a2a.py"
    code, out, _ = run_cli("export", *NODE_GPU, "--collective", "alltoall", "--format", "torch", "--program", program,
                           "-o", str(target))
    assert code == 0 and '"goal":"alltoall"' in target.read_text() and "--collective alltoall" in target.read_text()
    code, _, err = run_cli("export", *NODE_GPU, "--collective", "alltoall", "--format", "json", "--program", program,
                           "-o", str(tmp_path / "a2a.json"))
    assert code == 2 and "--collective alltoall" in err
