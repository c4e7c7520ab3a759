"""What `synth export --collective GOAL --top K --format torch` writes runs, for every goal:
each goal's two best programs on the emulated 2 x 4 system (the ranking's own choice, Permute
steps included), exported through the command line, checked against torch's own collective
(all_reduce, reduce_scatter_tensor, all_gather_into_tensor, all_to_all_single, broadcast,
reduce) under torchrun with gloo on 8 ranks. The six exported plans run in one launch (the
slow part on a small machine): their PLANs are joined into one script with the same runtime.
Every short program of every goal runs in tests/test_goals_export.py; the synth.torch calls
in tests/test_torch_collectives.py.

Slow (`pytest -m slow`): an 8-rank launch that repeats what the default suite shows faster,
every program of up to 4 steps of every other goal on the same 2 x 4 hierarchy checked against
torch (tests/test_goals_export.py, these programs among them) and the command line's torch
export running for real (tests/test_export_torchrun.py)."""

from __future__ import annotations

import ast
import json

import pytest

from synth.cli import main
from synth.export.torch_script import runtime_source
from synth.goals import GOALS

pytestmark = pytest.mark.slow

SYSTEM = ("--topology", "emu-2x4-gloo", "--axes", "data=8", "--reduce", "data")


def exported_plan(path) -> dict:
    """The PLAN literal of an exported script (data, never run as code here)."""
    tree = ast.parse(path.read_text())
    assign = next(node for node in tree.body if isinstance(node, ast.Assign) and node.targets[0].id == "PLAN")
    return json.loads(assign.value.args[0].value)


def joined(plans: list[dict]) -> dict:
    """One plan running every program of `plans`, communicator ids shifted per plan."""
    result = {"world_size": plans[0]["world_size"], "communicators": [], "programs": [], "command": "pytest"}
    for plan in plans:
        offset = len(result["communicators"])
        result["communicators"] += plan["communicators"]
        for program in plan["programs"]:
            program = dict(program, reduction=program["reduction"] + offset)
            program["steps"] = [dict(step, comm=step["comm"] + offset if step["comm"] >= 0 else -1)
                                for step in program["steps"]]
            result["programs"].append(program)
    return result


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    pytest.importorskip("torch")
    from synth.execute.launch import torchrun

    directory = tmp_path_factory.mktemp("goals")
    plans = []
    for goal in GOALS:
        script = directory / f"{goal}.py"
        code = main(["export", *SYSTEM, "--collective", goal, "--top", "2", "--max-len", "4", "--bytes", "64KiB",
                     "--backend", "gloo", "--format", "torch", "--batch", "-o", str(script)])
        assert code == 0, goal
        plans.append(exported_plan(script))
    plan = joined(plans)
    script = directory / "all-goals.py"
    script.write_text(runtime_source().rstrip() + f"\n\n\nPLAN = json.loads({json.dumps(plan)!r})\n\n"
                      "if __name__ == \"__main__\":\n    sys.exit(main(PLAN))\n")
    result = torchrun(script, plan["world_size"], ["--backend", "gloo", "--check", "--iters", "1", "--warmup", "0",
                                                    "--bytes", "4KiB"], timeout=600)
    assert result.returncode == 0, result.log[-4000:]
    return plan, result.report


@pytest.mark.torchrun
@pytest.mark.parametrize("goal", list(GOALS))
def test_the_exported_best_programs_of_each_goal_equal_torchs_own_collective_on_8_gloo_ranks(launch, goal):
    plan, report = launch
    mine = [index for index, program in enumerate(plan["programs"]) if program.get("goal", "allreduce") == goal]
    assert len(mine) == 2, [program["text"] for program in plan["programs"]]
    rows = [row for row in report["results"] if row["program"] in mine]
    assert len(rows) == 2 and all(row["wrong"] == 0 for row in rows), rows
    (baseline,) = [row for row in report["baselines"] if set(row["programs"]) & set(mine)]
    assert baseline["goal"] == goal and set(baseline["programs"]) == set(mine)  # timed against the goal's own call


@pytest.mark.torchrun
def test_the_ranked_programs_include_permuting_ones(launch):
    plan, _ = launch
    assert any("Permute" in program["text"] for program in plan["programs"])
