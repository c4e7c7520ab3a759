"""The best-first top-K search for every goal (synth/search/best_first.py with the completion
bound's finishing rule per goal, synth/search/completion.py) pops every valid program in
exactly the order of the full ranking: every program of the goal enumerated, costed as
`synth rank --collective` costs it (collective steps through the estimate, each Permute a
local copy), sorted by (time, text). Times are compared bit for bit."""

from __future__ import annotations

import itertools

import pytest

from synth.analysis.goal_rank import copy_rate, goal_program_times
from synth.hierarchy import build_hierarchy
from synth.model import ESTIMATES, cost_context
from synth.model.engine import engine_for
from synth.placement import enumerate_placements, parse_axes
from synth.search import Enumerator, SearchOptions, StateWalker, cheapest_programs, semantics_for
from synth.topology_file import load_topology

GOALS = ("allreduce", "reducescatter", "allgather", "alltoall", "broadcast", "reduce")
JOBS = (  # (topology, axes, reduction, hierarchy kind, placement index, max length)
    ("emu-2x2x2", "data=8", ("data",), "merged", 0, 5),
    ("dgx-a100-x4", "data=8,model=4", ("data",), "merged", 1, 5),
    ("dgx-a100-x4", "data=8,model=4", ("data", "model"), "split", 0, 4),
    ("paper-fig3", "data=4,model=4", ("data", "model"), "merged", 2, 4),
)
SIZES = (4096, 3 * 2**20 + 5, 2**30)


def full_ranking(context, goal, max_len, size, estimate):
    hierarchy = context.hierarchy
    programs = list(Enumerator(semantics_for(hierarchy, goal=goal), SearchOptions(max_len=max_len)).programs())
    times = goal_program_times(context, goal, programs, [size], estimate)[:, 0]
    return sorted(((float(time), str(program)) for time, program in zip(times, programs)),
                  key=lambda row: (row[0], row[1]))


@pytest.mark.parametrize("goal", GOALS)
@pytest.mark.parametrize("job", JOBS, ids=lambda job: f"{job[0]}-{job[3]}-{'+'.join(job[2])}")
def test_the_search_pops_every_program_of_every_goal_in_the_full_rankings_order(goal, job):
    name, axes, reduction, kind, which, max_len = job
    topology = load_topology(name)
    placements = enumerate_placements(topology, parse_axes(axes))
    hierarchy = build_hierarchy(placements[which % len(placements)], reduction, kind)
    for estimate, size in zip(itertools.cycle(ESTIMATES), SIZES):
        context = cost_context(hierarchy, topology)
        expected = full_ranking(context, goal, max_len, size, estimate)
        walker = StateWalker(hierarchy, goal)
        popped = [(time, str(program)) for time, program in
                  cheapest_programs(walker, engine_for(context), ESTIMATES[estimate], size, max_len,
                                    copy_rate(context))]
        assert popped == expected, (goal, hierarchy, estimate, size)


def test_a_goal_with_permute_steps_needs_a_copy_rate():
    topology = load_topology("emu-2x2x2")
    hierarchy = build_hierarchy(enumerate_placements(topology, parse_axes("data=8"))[0], ("data",), "merged")
    context = cost_context(hierarchy, topology)
    with pytest.raises(ValueError, match="copy rate"):
        next(cheapest_programs(StateWalker(hierarchy, "reducescatter"), engine_for(context), ESTIMATES["lockstep"],
                               4096, 4))
