"""`synth rank --top K` and `synth export --top K` of every goal take the best-first search's K
(synth.analysis.goal_rank.top_goal), and what they print is the whole ranking's first K and the
baseline, field for field and in order (the whole ranking is the oracle)."""

from __future__ import annotations

import json

import pytest

from synth.analysis.goal_rank import rank_goal, top_goal
from synth.goals import GOALS
from synth.hierarchy import build_hierarchy
from synth.model.context import cost_context
from synth.placement import enumerate_placements, parse_axes
from synth.topology_file import load_topology

JOBS = (  # (topology, axes, reduction, hierarchy kind, placement index, max length)
    ("emu-2x2x2", "data=8", ("data",), "merged", 0, 5),
    ("paper-fig3", "data=4,model=4", ("data", "model"), "merged", 2, 4),
)


@pytest.mark.parametrize("goal", sorted(GOALS))
@pytest.mark.parametrize("job", JOBS, ids=lambda job: f"{job[0]}-{'+'.join(job[2])}")
def test_the_top_k_rows_are_the_whole_rankings_first_k(goal, job):
    name, axes, reduction, kind, which, max_len = job
    topology = load_topology(name)
    placements = enumerate_placements(topology, parse_axes(axes))
    hierarchy = build_hierarchy(placements[which % len(placements)], reduction, kind)
    for backend, estimate, size in (("nccl", "lockstep", 4096), ("gloo", "pipelined", 3 * 2**20 + 5)):
        context = cost_context(hierarchy, topology, backend)
        full = rank_goal(context, goal, [size], max_len, estimate)[0]
        for k in (1, 3, len(full) + 1):
            expected = full[:k] + [row for row in full[k:] if row.baseline]
            assert top_goal(context, goal, [size], k, max_len, estimate) == [expected], (goal, backend, estimate, size, k)


@pytest.mark.parametrize("goal", ["reducescatter", "allgather", "alltoall", "broadcast", "reduce"])
def test_rank_top_prints_the_whole_rankings_head(run_cli, goal):
    job = ("--topology", "emu-2x2x2", "--axes", "data=4,model=2", "--reduce", "data", "--collective", goal,
           "--bytes", "3MiB", "--max-len", "4", "--json")
    code, out, err = run_cli("rank", *job)
    assert code == 0, err
    full = json.loads(out)
    code, out, err = run_cli("rank", *job, "--top", "3")
    assert code == 0, err
    top = json.loads(out)
    by_placement = {}
    for row in full:
        by_placement.setdefault(json.dumps(row["matrix"]), []).append(row)
    expected = []
    for rows in by_placement.values():
        expected += rows[:3] + [row for row in rows[3:] if row["baseline"]]
    assert top == expected
