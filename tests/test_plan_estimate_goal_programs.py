"""The plan estimate's goal-program unit (synth/plan/search.py): the (collective, group shape)
pairs a reduce-scatter, all-gather or all-to-all is priced on, and the programs of their lists,
counted before the search and checked against what a real search builds."""

from __future__ import annotations

import math

import pytest

from synth.placement import enumerate_placements
from synth.commands.plan import resize
from synth.plan import search
from synth.plan.costs import goal_program_rows
from synth.plan.degrees import enumerate_degrees
from synth.plan.equivalent import equivalent_sizes, span
from synth.plan.model import PRESETS
from synth.plan.search import PlanRequest, estimate, goal_calls, plan
from synth.plan.step import compute_of
from synth.topology_file import load_topology


@pytest.fixture(scope="module", params=[("dgx-a100-x4", None), ("dgx-h100-2x8x8", "node=2")])
def planned(request):
    name, size = request.param
    topology = load_topology(name)
    if size is not None:  # three levels, few devices
        topology = resize(topology, size)
    model = PRESETS["gpt3-1.3b"]
    plan_request = PlanRequest(model, topology, compute_of(topology.device, model.precision))
    size = estimate(plan_request)
    return plan_request, size, plan(plan_request, size=size)


def _counted(request: PlanRequest, sharded: bool = True) -> set:
    """The estimate's pairs, listed from the placements themselves (one per placement);
    `sharded=False`: those of the settings without the sharded optimizer only (what the
    lower-bound pass prices for every candidate)."""
    pairs = set()
    host = request.compute.host_bandwidth is not None
    for choice in enumerate_degrees(request.topology.device_count, request.model, request.limits):
        settings = request.space.settings(request.model, choice, host)
        if not settings:
            continue
        if not sharded:
            settings = [setting for setting in settings if not setting.sharded_optimizer]
        for placement in enumerate_placements(request.topology, choice.axes()):
            pairs |= goal_calls(choice, settings, request.model, choice.axes(), placement.matrix)
    return pairs


def test_the_goal_shapes_the_search_prices_are_the_counted_ones(planned):
    request, size, result = planned
    counted = _counted(request)
    assert size.goal_shapes == len(counted)
    built = set(result.costs._goals)
    assert built <= counted  # the data-parallel ones only where a full prediction ran
    assert _counted(request, sharded=False) <= built  # priced for every candidate


def test_the_program_count_is_the_lists_the_search_prices(planned):
    request, size, result = planned
    assert size.goal_programs == sum(goal_program_rows(c, shape, request.max_len) for c, shape in _counted(request))
    assert result.costs._goals, "the plan priced no goal programs: pick one that does"
    for (collective, shape), programs in result.costs._goals.items():
        assert len(programs.every().programs) == goal_program_rows(collective, shape, request.max_len)


def test_the_goal_unit_adds_to_the_estimate(planned):
    _, size, _ = planned
    units = size.seconds_by_unit()
    assert units["goal_programs"] == pytest.approx(size.goal_shapes * search.SECONDS_PER_GOAL_SHAPE
                                                   + size.goal_programs * search.SECONDS_PER_GOAL_PROGRAM
                                                   + size.goal_schedule_programs
                                                   * search.SECONDS_PER_GOAL_SCHEDULE_PROGRAM)
    assert sum(units.values()) == pytest.approx(size.estimated_s)


def test_the_sharded_schedules_programs_are_counted_per_choice_and_span(planned):
    request, size, result = planned
    pairs = set()
    for choice in enumerate_degrees(request.topology.device_count, request.model, request.limits):
        settings = request.space.settings(request.model, choice, request.compute.host_bandwidth is not None)
        if choice.dp == 1 or not any(s.sharded_optimizer and s.zero < 3 for s in settings):
            continue
        for placement in enumerate_placements(request.topology, choice.axes()):
            pairs.add((choice, span(placement, choice.data_axes())))
    assert size.goal_schedule_programs == sum(
        goal_program_rows("ReduceScatter", factors, request.max_len)
        * math.prod(equivalent_sizes(request.topology, factors)) for _, factors in pairs)
    searched = {factors for factors, _, _, sharded in result.costs._schedules if sharded}
    assert searched and searched <= {factors for _, factors in pairs}
