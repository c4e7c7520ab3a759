"""The plan search's estimate by unit of work (synth/plan/search.py): each count checked against
the placements themselves, and the seconds the sum of count x measured unit cost."""

from __future__ import annotations

import math

import pytest

from synth.placement import enumerate_placements
from synth.plan import search
from synth.plan.degrees import enumerate_degrees
from synth.plan.equivalent import equivalent_sizes, span
from synth.plan.model import PRESETS
from synth.plan.search import PlanRequest, estimate
from synth.plan.step import compute_of
from synth.topology_file import load_topology


@pytest.fixture(scope="module")
def request_and_size():
    topology = load_topology("dgx-a100-x4")
    model = PRESETS["gpt3-1.3b"]
    request = PlanRequest(model, topology, compute_of(topology.device, model.precision))
    return request, estimate(request)


def test_schedule_pairs_and_their_sizes_are_counted_from_the_placements(request_and_size):
    request, size = request_and_size
    pairs, lower_bound = set(), set()
    for choice in enumerate_degrees(request.topology.device_count, request.model, request.limits):
        if not request.space.settings(request.model, choice):
            continue
        for placement in enumerate_placements(request.topology, choice.axes()):
            if choice.dp > 1:
                pairs.add((choice, span(placement, choice.data_axes())))
            for axis in choice.axes():
                if axis.size > 1 and axis.name not in choice.data_axes():
                    lower_bound.add(span(placement, (axis.name,)))
    assert size.schedules == len(pairs)
    spans = {factors for _, factors in pairs}
    assert size.schedule_devices == sum(math.prod(equivalent_sizes(request.topology, f)) for f in spans)
    assert size.searched_shapes == len(lower_bound)


def test_the_seconds_are_the_units_times_their_counts(request_and_size):
    _, size = request_and_size
    units = size.seconds_by_unit()
    assert units["bounds"] == pytest.approx(size.bounds * search.SECONDS_PER_BOUND)
    assert units["placements"] == pytest.approx(size.placements * search.SECONDS_PER_PLACEMENT)
    assert units["group_shapes"] == pytest.approx(size.searched_shapes * search.SECONDS_PER_SHAPE
                                                  + size.searched_devices * search.SECONDS_PER_SHAPE_DEVICE)
    assert units["gradient_schedules"] == pytest.approx(size.schedules * search.SECONDS_PER_SCHEDULE
                                                        + size.schedule_devices * search.SECONDS_PER_SCHEDULE_DEVICE)
    assert sum(units.values()) == pytest.approx(size.estimated_s)


def test_a_moe_plan_counts_the_experts_gradient_schedules_too():
    """A MoE choice reduces its routed experts' gradients over the expert data-parallel groups in
    a schedule of its own (step.py): one pair per (choice, expert span), beside the dense one."""
    topology = load_topology("dgx-a100-x4")
    model = PRESETS["mixtral-8x7b"]
    request = PlanRequest(model, topology, compute_of(topology.device, model.precision))
    dense, experts = set(), set()
    for choice in enumerate_degrees(topology.device_count, model, request.limits):
        if not request.space.settings(model, choice, True) or choice.dp == 1:
            continue
        for placement in enumerate_placements(topology, choice.axes()):
            dense.add((choice, span(placement, choice.data_axes())))
            if choice.expert_data_axes():
                experts.add((choice, span(placement, choice.expert_data_axes())))
    assert experts and estimate(request).schedules == len(dense) + len(experts)


def test_the_first_bounds_are_the_searchs_own(monkeypatch):
    """The estimate's first bounds are what the search computes first: a lower-bound prediction
    per candidate bounded alone, and one collective-free floor per (choice, settings) group and
    representative."""
    from synth.plan import step

    topology = load_topology("dgx-a100-x4")
    model = PRESETS["mixtral-8x7b"]
    request = PlanRequest(model, topology, compute_of(topology.device, model.precision),
                          space=search.SearchSpace(zero_stages=(1, 3), hsdp=(False, True)))
    counted = {"floors": 0, "alone": 0}
    real_floor, real_predict = search.group_floor, search.predict

    def floor(*args, communication=True, **kwargs):
        if not communication:
            counted["floors"] += len(args[5])
        return real_floor(*args, communication=communication, **kwargs)

    monkeypatch.setattr(search, "group_floor", floor)
    monkeypatch.setattr(search, "predict", lambda *a, **k: real_predict(*a, **k))
    found = {}

    def listed(*args, **kwargs):  # the placements, to count the candidates bounded alone
        result = search_listed(*args, **kwargs)
        found[args[1]] = result
        return result

    search_listed = search.listed_placements
    monkeypatch.setattr(search, "listed_placements", listed)
    result = search.plan(request)
    size = result.size
    alone = 0
    for choice in enumerate_degrees(topology.device_count, model, request.limits):
        settings = request.space.settings(model, choice, True)
        if settings and choice.axes() in found:
            alone += len(found[choice.axes()]) * sum(1 for s in settings if choice.dp == 1 or s.hsdp)
    assert step is not None and counted["floors"] and alone
    assert size.bounds == alone + counted["floors"]
