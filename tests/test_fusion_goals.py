"""Fusion of gradient buckets for the goals that reduce gradients (reduce-scatter, reduce) and
a clear refusal for the others (synth/analysis/fusion.py)."""

from __future__ import annotations

import math

import pytest

from synth.analysis.fusion import FusionGoalError, plan_fusion
from synth.analysis.goal_rank import rank_goal
from synth.hierarchy import build_hierarchy
from synth.model.context import cost_context
from synth.placement import make_placement, parse_axes
from synth.topology_file import load_topology

MiB = 2**20
TENSORS = (4 * MiB, 16 * MiB, 8 * 1024, 64 * MiB, 1 * MiB)


@pytest.fixture(scope="module")
def context():
    topology = load_topology("dgx-a100-x4")
    placement = make_placement(topology, parse_axes("data=8,model=4"), [[4, 2], [1, 4]])
    return cost_context(build_hierarchy(placement, ("data",)), topology, "nccl")


@pytest.mark.parametrize("goal", ["reducescatter", "reduce"])
def test_each_bucket_runs_the_goals_fastest_program_and_the_plan_beats_ddps_buckets(context, goal):
    plan = plan_fusion(context, TENSORS, goal=goal)
    assert plan.plan.finish_s <= plan.baseline.finish_s * (1 + 1e-12) and plan.gain >= 1 - 1e-12
    assert plan.times == "exact"
    for bucket in plan.plan.buckets:
        ranked = rank_goal(context, goal, [bucket.bytes])[0]
        assert str(bucket.program) == str(ranked[0].program)
        assert bucket.time_s == pytest.approx(ranked[0].time_s, rel=1e-12)
    flat = next(row for row in rank_goal(context, goal, [TENSORS[0]])[0] if row.baseline)
    assert all(str(bucket.program) == str(flat.program) for bucket in plan.baseline.buckets)


def test_all_gradients_at_once_make_one_bucket_of_the_whole_buffer(context):
    plan = plan_fusion(context, TENSORS, compute_rate=math.inf, goal="reducescatter")
    assert len(plan.plan.buckets) == 1 and plan.plan.buckets[0].bytes == sum(TENSORS)


@pytest.mark.parametrize("goal", ["allgather", "alltoall", "broadcast"])
def test_a_goal_that_moves_no_gradients_is_refused(context, goal, run_cli):
    with pytest.raises(FusionGoalError, match="fusion buckets gradients"):
        plan_fusion(context, TENSORS, goal=goal)
    code, stdout, stderr = run_cli("fusion", "--topology", "dgx-a100-x4", "--axes", "data=8,model=4", "--reduce", "data",
                                   "--placement", "[[4,2],[1,4]]", "--tensors", "4MiB,16MiB", "--collective", goal)
    assert code == 2 and stdout == "" and len(stderr.strip().splitlines()) == 1
    assert "allreduce, reducescatter, reduce" in stderr
