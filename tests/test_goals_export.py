"""Exported torch scripts of every goal run for real: gloo on CPU, 8 ranks via torchrun, each
program checked against torch's own collective over its reduction groups (all_reduce,
reduce_scatter_tensor, all_gather_into_tensor, all_to_all_single, broadcast, reduce) on the
same input. One launch runs every valid program of up to 4 steps of every goal on the export
cases (2x4 and 2x2x2 hierarchies, an axis inside one level and across several, two reduced
axes, the split and system hierarchies)."""

from __future__ import annotations

import pytest

from export_cases import CASES
from synth.export import torch_script
from synth.export.plan import PlanEntry, build_plan
from synth.export.provenance import Provenance
from synth.goals import GOALS
from synth.search import Enumerator, SearchOptions, semantics_for

OTHER_GOALS = [goal for goal in GOALS if goal != "allreduce"]


def goal_entries(max_len: int) -> list[PlanEntry]:
    found = []
    for case in CASES:
        hierarchy = case.built
        for goal in OTHER_GOALS:
            for program in Enumerator(semantics_for(hierarchy, goal=goal), SearchOptions(max_len=max_len)).programs():
                found.append(PlanEntry(hierarchy, program, f"{case.name} {goal}", goal))
    return found


def test_the_plans_of_every_goal_carry_their_permutations_and_final_places():
    entries = goal_entries(4)
    plan = build_plan(entries)
    assert {program.goal for program in plan.programs} == set(OTHER_GOALS)
    permuted = [program for program in plan.programs if any(step.places for step in program.steps)]
    assert permuted and all(step.communicator == -1 for program in permuted for step in program.steps if step.places)
    assert all(program.final_places is not None for program in plan.programs
               if program.goal in ("reducescatter", "allgather", "alltoall"))


@pytest.mark.torchrun
def test_every_short_program_of_every_goal_equals_torchs_own_collective_on_8_gloo_ranks(tmp_path):
    pytest.importorskip("torch")
    from synth.execute.launch import torchrun

    plan = build_plan(goal_entries(4))
    script = tmp_path / "goals.py"
    script.write_text(torch_script.render(plan, Provenance(("pytest",))))
    result = torchrun(script, plan.world_size, ["--backend", "gloo", "--check", "--iters", "1", "--warmup", "0",
                                                "--bytes", "1000"], timeout=600)
    assert result.returncode == 0, result.log[-4000:]
    report = result.report
    assert len(report["results"]) == len(plan.programs)
    failed = [(plan.programs[row["program"]].label, plan.programs[row["program"]].text)
              for row in report["results"] if row["wrong"] != 0]
    assert not failed, failed
    assert "check passed" in result.log


@pytest.mark.torchrun
def test_a_program_with_its_permutation_dropped_fails_the_check(tmp_path):
    """The check sees block order: the same plans with every Permute made the identity fail."""
    pytest.importorskip("torch")
    import dataclasses

    from synth.execute.launch import torchrun
    from synth.language import parse_program

    hierarchy = CASES[0].built  # node=2,gpu=4
    entries = [PlanEntry(hierarchy, parse_program(text), goal, goal) for goal, text in (
        ("reducescatter", "Permute(gpu,node); ReduceScatter(InsideGroup(gpu)); ReduceScatter(Parallel(node))"),
        ("allgather", "Permute(gpu,node); AllGather(Parallel(node)); AllGather(InsideGroup(gpu)); Permute(node,gpu)"),
        ("alltoall", "AllToAll(Parallel(node)); Permute(gpu,node); AllToAll(InsideGroup(gpu)); Permute(node,gpu)"),
    )]
    plan = build_plan(entries)
    identity = tuple(range(8))
    broken = dataclasses.replace(plan, programs=tuple(
        dataclasses.replace(program, steps=tuple(dataclasses.replace(step, places=identity) if step.places else step
                                                 for step in program.steps), final_places=identity)
        for program in plan.programs))
    script = tmp_path / "broken.py"
    script.write_text(torch_script.render(broken, Provenance(("pytest",))))
    result = torchrun(script, plan.world_size, ["--backend", "gloo", "--check", "--iters", "1", "--warmup", "0",
                                                "--bytes", "1000"], timeout=600)
    assert result.returncode != 0 and "CHECK FAILED for program(s) 0,1,2" in result.log, result.log[-3000:]
