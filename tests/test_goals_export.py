"""Exported torch scripts of every goal run for real: gloo on CPU, 8 ranks via torchrun, each
program checked against torch's own collective over its reduction groups (all_reduce,
reduce_scatter_tensor, all_gather_into_tensor, all_to_all_single, broadcast, reduce) on the
same input. One launch runs every valid program of up to 4 steps of every goal on the export
cases (2x4 and 2x2x2 hierarchies, an axis inside one level and across several, two reduced
axes, the split and system hierarchies)."""

from __future__ import annotations

import pytest

from export_cases import CASES, goal_entries
from synth.export import torch_script
from synth.export.plan import PlanEntry, build_plan
from synth.export.provenance import Provenance
from synth.goals import GOALS
from synth.search import Enumerator, SearchOptions, semantics_for

OTHER_GOALS = [goal for goal in GOALS if goal != "allreduce"]


def test_the_plans_of_every_goal_carry_their_permutations_and_final_places():
    entries = goal_entries(4)
    plan = build_plan(entries)
    assert {program.goal.name for program in plan.programs} == set(OTHER_GOALS)
    permuted = [program for program in plan.programs if any(step.places for step in program.steps)]
    assert permuted and all(step.communicator == -1 for program in permuted for step in program.steps if step.places)
    assert all(program.final_places is not None for program in plan.programs
               if program.goal.name in ("reducescatter", "allgather", "alltoall"))


@pytest.mark.torchrun
@pytest.mark.slow  # length 3 (387 programs) runs by default in tests/test_export_torchrun.py, in its launch
@pytest.mark.parametrize("max_len", [4])
def test_every_short_program_of_every_goal_equals_torchs_own_collective_on_8_gloo_ranks(tmp_path, max_len):
    """Length 4 (1,147 programs, a minute more than length 3) with `-m slow`."""
    pytest.importorskip("torch")
    from synth.execute.launch import torchrun

    plan = build_plan(goal_entries(max_len))
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


def _replay(document) -> dict:
    """Replay every program of a JSON plan on per-rank numpy buffers (independently of synth's
    runtimes): {program index: (inputs, outputs)}."""
    import numpy as np

    world, n = document["world_size"], document["buffer"]["chunks"]
    chunk = document["buffer"]["chunk_count"]
    count = document["buffer"]["count"]
    result = {}
    for index, program in enumerate(document["programs"]):
        rng = np.random.default_rng(index)
        inputs = rng.integers(-100, 100, size=(world, count)).astype(np.int64)
        buffers = inputs.copy()
        goal = program.get("collective", "allreduce")
        groups = document["communicators"][program["reduction_communicator"]]["groups"]
        if goal == "allgather":  # only its own block is input
            for group in groups:
                for key, rank in enumerate(group):
                    keep = np.zeros(count, dtype=bool)
                    keep[key * chunk:(key + 1) * chunk] = True
                    buffers[rank] = np.where(keep, buffers[rank], 0)
            inputs = buffers.copy()
        for step in program["steps"]:
            if step["collective"] == "Permute":
                places = step["places"]
                moved = np.empty_like(buffers)
                for place, target in enumerate(places):
                    moved[:, target * chunk:(target + 1) * chunk] = buffers[:, place * chunk:(place + 1) * chunk]
                buffers = moved
                continue
            done = set()
            for entry in step["ranks"]:
                if entry["idle"] or tuple(entry["members"]) in done:
                    continue
                members = entry["members"]
                done.add(tuple(members))
                calls = {e["rank"]: e for e in step["ranks"] if not e["idle"] and e["members"] == members}
                op = step["collective"]
                first = calls[members[0]]
                span = slice(first["offset"], first["offset"] + first["count"])
                if op in ("AllReduce", "Reduce", "Broadcast"):
                    value = buffers[members[0], span] if op == "Broadcast" else sum(buffers[m, span] for m in members)
                    for m in (members[:1] if op == "Reduce" else members):
                        buffers[m, span] = value
                elif op == "ReduceScatter":
                    total = sum(buffers[m, span] for m in members)
                    for m in members:
                        call = calls[m]
                        block = slice(call["recv_offset"] - first["offset"], call["recv_offset"] - first["offset"] + call["recv_count"])
                        buffers[m, call["recv_offset"]:call["recv_offset"] + call["recv_count"]] = total[block]
                elif op == "AllGather":
                    joined = np.concatenate([buffers[m, calls[m]["send_offset"]:calls[m]["send_offset"] + calls[m]["send_count"]]
                                             for m in members])
                    for m in members:
                        buffers[m, span] = joined
                elif op == "AllToAll":
                    k, size = len(members), first["count"] // len(members)
                    old = {m: buffers[m, span].copy() for m in members}
                    for j, m in enumerate(members):
                        buffers[m, span] = np.concatenate([old[source][j * size:(j + 1) * size] for source in members])
        result[index] = (inputs, buffers, goal, groups)
    return result


def test_json_plans_of_every_goal_replayed_on_numpy_equal_the_collective():
    import numpy as np

    from synth.export import json_plan
    from synth.export.provenance import hierarchy_metadata, placement_metadata
    from synth.topology import topology_from_levels

    for case in CASES[:2]:
        hierarchy = case.built
        for goal in OTHER_GOALS:
            entries = [PlanEntry(hierarchy, program, "", goal)
                       for program in Enumerator(semantics_for(hierarchy, goal=goal), SearchOptions(max_len=4)).programs()]
            plan = build_plan(entries)
            metadata = placement_metadata(topology_from_levels(case.levels), hierarchy.placement)
            metadata.update(hierarchy_metadata(hierarchy))
            import json
            document = json.loads(json_plan.render(plan, Provenance(("pytest",)), metadata, 8 * 4 * 2))
            n, chunk = document["buffer"]["chunks"], document["buffer"]["chunk_count"]
            for index, (inputs, outputs, found_goal, groups) in _replay(document).items():
                assert found_goal == goal
                text = document["programs"][index]["text"]
                places = document["programs"][index].get("final_places")
                for group in groups:
                    total = sum(inputs[m] for m in group)
                    for key, rank in enumerate(group):
                        mine = slice(key * chunk, (key + 1) * chunk)
                        if goal == "reducescatter":
                            place = places[key]
                            assert np.array_equal(outputs[rank, place * chunk:(place + 1) * chunk], total[mine]), text
                        elif goal == "allgather":
                            assert np.array_equal(outputs[rank], sum(inputs[m] for m in group)), text
                        elif goal == "alltoall":
                            want = np.concatenate([inputs[m][mine] for m in group])
                            assert np.array_equal(outputs[rank], want), text
                        elif goal == "broadcast":
                            assert np.array_equal(outputs[rank], inputs[group[0]]), text
                        elif goal == "reduce" and key == 0:
                            assert np.array_equal(outputs[rank], total), text
