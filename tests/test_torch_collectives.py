"""synth.torch's reduce-scatter, all-gather and all-to-all (synth/torch/collectives.py) for real,
under torchrun with gloo on 8 CPU processes (tests/torch_collectives_worker.py): every program
of up to 3 steps of each goal on every 8-device export case against torch's own
reduce_scatter_tensor / all_gather_into_tensor / all_to_all_single, exact on integer-valued
floats; the refusals where torch's result would differ; FSDP2 trained with the hierarchical
reduce-scatter (and all-gather) set through `set_custom_reduce_scatter` against FSDP2's own.
Plans of every goal survive saving and the JSON export without torch."""

from __future__ import annotations

from pathlib import Path

import pytest

import synth.torch as st
from export_cases import CASES
from synth.export import json_plan
from synth.export.plan import PlanEntry, build_plan
from synth.export.provenance import Provenance, hierarchy_metadata, placement_metadata
from synth.language import parse_program
from synth.search import Enumerator, SearchOptions, semantics_for
from synth.topology import topology_from_levels

WORKER = Path(__file__).resolve().parent / "torch_collectives_worker.py"
RS = "Permute(gpu,node); ReduceScatter(InsideGroup(gpu)); ReduceScatter(Parallel(node))"
GOALS = ("reducescatter", "allgather", "alltoall")


def run(args, timeout=600) -> list[dict]:
    pytest.importorskip("torch")
    from synth.execute.launch import torchrun

    result = torchrun(WORKER, 8, args, timeout=timeout)
    assert result.returncode == 0, result.log[-6000:]
    return result.report["ranks"]


@pytest.fixture(scope="module")
def launched() -> list[dict]:
    """One launch of 8 ranks for both checks below (the programs, then FSDP2): starting the
    ranks costs more than either check."""
    return run(["--case", "programs", "fsdp", "--max-len", "3"])


def test_plans_of_every_goal_round_trip_through_a_file_and_the_json_export(tmp_path):
    for goal in GOALS:
        for case in CASES[:2]:
            programs = list(Enumerator(semantics_for(case.built, goal=goal), SearchOptions(max_len=4)).programs())
            plan = st.plan_programs(case.built, programs, collective=goal)
            assert plan.collective == goal
            assert st.load_plan(plan.save(tmp_path / f"{goal}.json")) == plan
            exported = build_plan(PlanEntry(case.built, program, goal=goal) for program in programs)
            metadata = placement_metadata(topology_from_levels(case.levels), case.built.placement)
            metadata.update(hierarchy_metadata(case.built))
            path = tmp_path / f"{goal}-{case.name}-export.json"
            path.write_text(json_plan.render(exported, Provenance(("t",)), metadata, 3000))
            assert st.load_plan(path, program=len(programs) - 1).plan == exported


def test_a_plan_of_another_goal_is_refused_and_goals_do_not_mix():
    from synth.errors import InvalidProgramError, UsageError

    with pytest.raises(InvalidProgramError):
        st.plan_reduction("node=2,gpu=4", "data=8", "data", [[2, 4]], programs=RS)  # not an all-reduce
    plan = st.plan_reduction("node=2,gpu=4", "data=8", "data", [[2, 4]], programs=RS, collective="reducescatter")
    assert plan.collective == "reducescatter" and plan.plan.programs[0].final_places is not None
    with pytest.raises(UsageError, match="same collective"):
        mixed = build_plan([PlanEntry(CASES[0].built, parse_program(RS), goal="reducescatter"),
                            PlanEntry(CASES[0].built, parse_program("AllReduce(InsideGroup(node))"))])
        st.ReductionPlan(mixed, plan.reduction_groups, plan.ranges)


def test_best_by_size_ranks_the_goal():
    plan = st.plan_reduction("dgx-a100-x4", "data=32", "data", [[4, 8]], collective="reducescatter", max_len=3,
                             min_bytes=2**20, max_bytes=2**22)
    assert plan.collective == "reducescatter"
    assert "reduce-scatter" in plan.description


@pytest.mark.torchrun
def test_every_program_of_every_goal_equals_torchs_own_collective_on_8_gloo_ranks(launched):
    ranks = launched
    for report in ranks:
        rows = report["results"]
        assert {(row["case"], row["goal"]) for row in rows} == {(case.name, goal) for case in CASES for goal in GOALS}
        assert len(rows) > 60
        assert not [row for row in rows if row["wrong"]], [row for row in rows if row["wrong"]][:5]
        assert all(row["untouched"] for row in rows)  # reduce_scatter_tensor leaves its input as it was
        assert any("Permute" in row["program"] for row in rows)
        refused = report["refusals"]
        assert "equal pieces" in refused["ragged"] and refused["equal_splits_wrong"] == 0
        assert refused["async_completed"]
        assert refused["avg_diff"] == 0 and refused["premul_diff"] == 0  # powers of two: exact
        assert "sums (SUM, AVG, PREMUL_SUM)" in refused["max_refused"]
        assert "collective='alltoall'" in refused["wrong_goal"]
        assert "run it with synth.torch.HierarchicalReduceScatter" in refused["not_an_all_reduce"]
        assert "steps[0].places [0, 0, 0, 0, 0, 0, 0, 0] is not a permutation" in refused["changed_load"]
        assert "not a permutation" in refused["changed_run"]  # built in code: refused by the reducer
    assert all("other ranks than the plan's" in report["refusals"]["other_group"] for report in ranks[:4])


@pytest.mark.torchrun
def test_fsdp2_with_the_hierarchical_reduce_scatter_trains_like_fsdp2_itself(launched):
    ranks = launched
    for report in ranks:
        assert report["modules"] == 4
        assert report["moved"] > 1e-4  # it trained
        assert report["rs_diff"] <= 1e-6 and report["rs_ag_diff"] <= 1e-6, report
        # every module's reduce-scatter and all-gather went through the programs, every step
        assert report["scatter_calls"] >= 4 * 3 and report["gather_calls"] >= 4 * 3
        assert report["scatter_summary"]["reused_from_mesh"] == [{"communicator": 0, "dimension": "shard"}]
        from synth.torch.reducer import describe_summary

        assert describe_summary(report["scatter_summary"]).splitlines()[0] == \
            "reused from the mesh: communicator 0 = dimension shard"
