"""The planner prices reduce-scatter, all-gather and all-to-all by their best synthesized
program (synth/plan/costs.py), the same programs and times `rank_goal` ranks."""

from __future__ import annotations

import json
import math

import pytest

from synth.analysis.goal_rank import rank_goal
from synth.hierarchy import build_hierarchy
from synth.model.backends import resolve_backend
from synth.model.context import cost_context
from synth.placement import enumerate_placements
from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import Degrees
from synth.topology_file import load_topology

MiB = 2**20
CALLS = {"ReduceScatter": "reduce_scatter", "AllGather": "all_gather", "AllToAll": "all_to_all"}


def _whole_system_ranking(topology, placement, axes, goal, size):
    """rank_goal on the whole system's groups (not the planner's smaller equivalent system)."""
    hierarchy = build_hierarchy(placement, axes, "merged")
    context = cost_context(hierarchy, topology, resolve_backend("nccl"))
    return rank_goal(context, goal, [size])[0]


@pytest.fixture(scope="module")
def selene():
    topology = load_topology("selene")  # 8 nodes x 8 GPUs
    placement = enumerate_placements(topology, Degrees(64, 1, 1).axes())[0]
    return topology, placement, CommunicationCosts(topology)


def test_a_synthesized_reduce_scatter_beats_the_flat_call_and_equals_goal_rank_best(selene):
    topology, placement, costs = selene
    call = costs.reduce_scatter(placement, ("dp",), MiB)
    ranked = _whole_system_ranking(topology, placement, ("dp",), "reducescatter", MiB)
    flat = next(row for row in ranked if row.baseline)
    assert str(flat.program) == "ReduceScatter(InsideGroup(node))"
    assert call.program == str(ranked[0].program) != str(flat.program)
    assert call.time_s == pytest.approx(ranked[0].time_s, rel=1e-9)
    assert call.default_time_s == pytest.approx(flat.time_s, rel=1e-9)
    assert call.synthesized and call.gain > 1.5 and call.collective == "ReduceScatter"


@pytest.mark.parametrize("collective", ["AllGather", "AllToAll"])
@pytest.mark.parametrize("size", [64 * 1024, 64 * MiB])
def test_every_goal_is_priced_at_goal_rank_best(selene, collective, size):
    topology, placement, costs = selene
    call = getattr(costs, CALLS[collective])(placement, ("dp",), size)
    ranked = _whole_system_ranking(topology, placement, ("dp",), collective, size)
    assert call.program == str(ranked[0].program)
    assert call.time_s == pytest.approx(ranked[0].time_s, rel=1e-9)
    assert call.time_s <= call.default_time_s
    assert call.synthesized == (call.time_s < call.default_time_s * (1 - 1e-9))


def test_one_enumeration_per_goal_and_group_shape(selene):
    _, placement, costs = selene
    first = costs.goal_programs("ReduceScatter", placement, ("dp",))
    for other in enumerate_placements(load_topology("selene"), Degrees(64, 1, 1).axes())[1:4]:
        assert costs.goal_programs("ReduceScatter", other, ("dp",)) is first  # the same factors per level
    assert costs.reduce_scatter(placement, ("dp",), MiB) is costs.reduce_scatter(placement, ("dp",), MiB)


def test_the_route_names_its_synthesized_collective_and_gain(selene):
    _, placement, costs = selene
    scatter = costs.reduce_scatter(placement, ("dp",), MiB)
    gather = costs.all_gather(placement, ("dp",), MiB)
    found = costs.synthesized(placement, ("dp",), f"{scatter.program}; {gather.program}", MiB)
    assert [c.collective for c in found] == ["ReduceScatter", "AllGather"]
    assert costs.bottleneck(placement, ("dp",), f"{scatter.program}; {gather.program}", MiB)


def test_plan_of_a_published_moe_model_names_its_synthesized_collectives(capsys):
    from synth.cli import main

    # top 20: tight layouts (inside the fragmentation headroom, kept since issue 22) fill the first ten
    assert main(["plan", "--topology", "selene", "--model", "mixtral-8x7b", "--json", "--top", "20"]) == 0
    document = json.loads(capsys.readouterr().out)
    rows = [row for prediction in document["ranked"] for row in prediction["synthesized"]]
    assert rows, "some candidate of Mixtral on selene runs a synthesized collective"
    for row in rows:
        assert row["collective"] in ("AllReduce", "ReduceScatter", "AllGather", "AllToAll", "dispatch", "combine")
        assert row["gain"] > 1 and row["time_s"] < row["flat_time_s"]


@pytest.mark.parametrize("names, sizes", [(("rack", "node", "gpu"), (16, 2, 8)), (("node", "gpu"), (8, 4)),
                                          (("vm", "gpu"), (3, 1))])
@pytest.mark.parametrize("goal", ["reducescatter", "allgather", "alltoall", "broadcast", "reduce"])
def test_one_enumeration_per_quotient_shape_lists_every_program_of_the_real_one(names, sizes, goal):
    """goal_rank enumerates once per level count and quotient sizes and renames the levels:
    the same programs as the search on the real hierarchy (max_len 4 keeps it quick)."""
    from synth.analysis.goal_rank import _enumerated
    from synth.search import Enumerator, SearchOptions
    from synth.semantics import Semantics

    direct = {str(program) for program in
              Enumerator(Semantics(names, sizes, quotient=True, goal=goal), SearchOptions(max_len=4)).programs()}
    listed = set(_enumerated(names, sizes, goal, 4)[1])
    flat = {f"{collective}(InsideGroup({names[0]}))" for collective in
            ("ReduceScatter", "AllGather", "AllToAll", "Broadcast", "Reduce")}
    assert direct <= listed and listed - direct <= flat  # the flat call is always listed (the baseline)


@pytest.mark.parametrize("name", ["dgx-h100-2x8x8", "selene", "gb200-nvl72"])
def test_small_groups_costed_whole_are_the_search_answer(name):
    """Reduce-scatters and all-gathers over small groups come from every program costed at once
    (costs.COSTED_WHOLE_MEMBERS): the same program, time and flat call's time, to the bit, as
    the best-first search on the same groups at each size."""
    from synth.plan import costs as plan_costs
    from synth.search import BestPrograms

    topology = load_topology(name)
    costs = CommunicationCosts(topology)
    checked = 0
    n = topology.device_count
    for degrees, axes in ((Degrees(n // 8, 8, 1), ("tp",)), (Degrees(n // 16, 4, 4), ("tp", "pp")),
                          (Degrees(n // 2, 2, 1), ("dp",)), (Degrees(n // 8, 2, 4), ("dp", "tp"))):
        for placement in enumerate_placements(topology, degrees.axes())[:3]:
            factors = costs.factors(placement, axes)
            if math.prod(factors) < 2 or math.prod(factors) > plan_costs.COSTED_WHOLE_MEMBERS:
                continue
            for goal in plan_costs.COSTED_WHOLE:
                search = BestPrograms(costs._context(factors), costs.max_len, goal=goal)
                for size in (4096, 3 * MiB + 2048, 96 * MiB):
                    call = getattr(costs, CALLS[goal.collective])(placement, axes, size)
                    choice = search.best(size)
                    assert (call.program, call.time_s, call.default_time_s) == (
                        str(choice.program), choice.time_s, choice.baseline_time_s)
                    checked += 1
    assert checked >= 24
