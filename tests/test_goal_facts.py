"""Each goal carries its facts (synth/goals.py), and the code that used to ask a goal's name
reads them: where the result is read, whether a combine's program runs backwards, the torch
runtime's flat call, input, result and bus factor. Plan files name their goal; the name is
parsed where the file is read, and an unknown one is refused naming the field."""

from __future__ import annotations

import ast
import json
from importlib import resources

import pytest

import synth.goals as goals
from export_cases import CASES
from synth.errors import PlanFileError
from synth.export.plan import PlanEntry, build_plan
from synth.export.torch_script import flat_facts
from synth.goals import GOALS, ROUTED_GOALS
from synth.torch.moe_plan import read_dispatch_plan
from synth.torch.plan import ReductionPlan, plan_programs


def test_each_named_constant_is_its_goal():
    named = {"allreduce": goals.ALL_REDUCE, "reducescatter": goals.REDUCE_SCATTER, "allgather": goals.ALL_GATHER,
             "alltoall": goals.ALL_TO_ALL, "broadcast": goals.BROADCAST, "reduce": goals.REDUCE,
             "dispatch": goals.DISPATCH, "combine": goals.COMBINE}
    assert named == {**GOALS, **ROUTED_GOALS}


def test_where_each_goal_leaves_its_result():
    assert {name: goal.result for name, goal in GOALS.items()} == {
        "allreduce": goals.WHOLE, "reducescatter": goals.OWN_BLOCK, "allgather": goals.WHOLE,
        "alltoall": goals.WHOLE, "broadcast": goals.WHOLE, "reduce": goals.ROOT_ONLY}


def test_only_the_combine_runs_its_program_backwards():
    assert [goal.name for goal in (*GOALS.values(), *ROUTED_GOALS.values()) if goal.reverses] == ["combine"]


def test_the_runtime_has_a_flat_call_for_every_goal_and_no_other():
    """Read without importing torch: FLAT_CALLS names exactly the goals' torch calls."""
    source = resources.files("synth.export").joinpath("torch_runtime.py").read_text(encoding="utf-8")
    (table,) = [node.value for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "FLAT_CALLS" for t in node.targets)]
    assert sorted(key.value for key in table.keys) == sorted(goal.torch_call for goal in GOALS.values())


@pytest.mark.parametrize("name", list(GOALS))
def test_a_script_carries_its_goals_flat_facts(name):
    """The facts the runtime reads, for a group of 8: nccl-tests' bus factors (the figures the
    runtime once computed from the goal's name), the input and the result as synth's goals say."""
    case = CASES[0]
    goal = GOALS[name]
    text = goal.flat_call(case.built.level_names[0])
    program = build_plan([PlanEntry(case.built, text, goal=goal)]).programs[0]
    n = program.chunks
    factors = {"allreduce": 2 * (n - 1) / n, "reducescatter": (n - 1) / n, "allgather": (n - 1) / n,
               "alltoall": (n - 1) / n, "broadcast": 1.0, "reduce": 1.0}
    assert flat_facts(program) == {"call": goal.torch_call, "input": goal.start, "result": goal.result,
                                   "bus_factor": factors[name]}


def _saved(goal: str) -> dict:
    """A saved all-reduce plan whose program names `goal`."""
    case = CASES[0]
    document = plan_programs(case.built, [goals.ALL_REDUCE.flat_call(case.built.level_names[0])]).to_document()
    document["programs"][0]["goal"] = goal
    return document


@pytest.mark.parametrize("name", ["bogus", "dispatch", "AllReduce", ["allreduce"]])
def test_a_plan_naming_an_unknown_goal_is_refused_naming_the_field(name):
    with pytest.raises(PlanFileError, match=r"programs\[0\]\.goal is .*, not one of allreduce, reducescatter"):
        ReductionPlan.from_document(_saved(name))


def test_a_plan_reads_its_goal_as_the_object():
    plan = ReductionPlan.from_document(json.loads(json.dumps(_saved("allreduce"))))
    assert plan.goal is goals.ALL_REDUCE and plan.collective == "allreduce"


@pytest.mark.parametrize("name", ["allreduce", "bogus", 7])
def test_a_dispatch_plan_naming_another_goal_is_refused(name):
    document = {"format": "synth-routed-plan", "version": 1, "collective": name}
    with pytest.raises(PlanFileError, match="collective is .*, not one of dispatch, combine"):
        read_dispatch_plan(document)
