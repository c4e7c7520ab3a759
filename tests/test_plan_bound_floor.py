"""The search's tighter bound (synth/plan/search.py, step.predict's `floor`): a candidate the first
bound does not stop is bounded again with its gradient schedules' lower bounds before its full
prediction. Checked: the bound never exceeds the full prediction, and the search ranks the same
rows with it as without it."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from synth.placement import enumerate_placements, parse_axes
from synth.plan import moe, search
from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import DegreeLimits, enumerate_degrees
from synth.plan.model import PRESETS
from synth.plan.search import PlanRequest, SearchSpace, plan
from synth.plan.step import compute_of, predict
from synth.topology_file import load_topology


def test_moe_layers_are_counted_as_the_listing_counts_them():
    model = PRESETS["mixtral-8x7b"]
    for first_dense, every in ((0, 1), (3, 2), (1, 3), (5, 4)):
        shaped = dataclasses.replace(model, first_dense=first_dense, moe_every=every)
        for start, stop in itertools.product(range(-2, shaped.layers + 3), repeat=2):
            listed = sum(1 for index in range(start, stop) if moe.is_moe_layer(shaped, index))
            assert moe.moe_layers_in(shaped, start, stop) == listed


@pytest.fixture(scope="module")
def moe_request():
    topology = load_topology("dgx-h100-2x8x8")
    model = PRESETS["qwen3-30b-a3b"]
    space = SearchSpace(recompute=("selective", "full"), activation_offload=(False,))
    return PlanRequest(model, topology, compute_of(topology.device, model.precision), DegreeLimits(pp=1),
                       space=space, top=3)


def test_the_tighter_bound_is_between_the_first_bound_and_the_full_prediction(moe_request):
    request = moe_request
    costs = CommunicationCosts(request.topology)
    checked = 0
    for choice in enumerate_degrees(request.topology.device_count, request.model, request.limits):
        if choice.dp == 1:
            continue
        for placement in itertools.islice(enumerate_placements(request.topology, choice.axes()), 2):
            for settings in request.space.settings(request.model, choice)[::3]:
                args = (request.model, request.compute, costs, choice, placement, settings)
                loose = predict(*args, data_parallel=False).step_s
                tight = predict(*args, floor=True).step_s
                full = predict(*args).step_s
                assert loose <= tight <= full
                checked += tight > loose
    assert checked  # the floor tightens some bounds


def test_the_search_ranks_the_same_rows_with_the_tighter_bound(moe_request, monkeypatch):
    tight = plan(moe_request)
    real = search.predict

    def loose(*args, floor=False, **kwargs):  # the first bound only: the tighter one never tightens
        return real(*args, data_parallel=False) if floor else real(*args, **kwargs)

    monkeypatch.setattr(search, "predict", loose)
    plain = plan(moe_request)
    assert [search._key(p) for p in tight.ranked] == [search._key(p) for p in plain.ranked]
    assert [search._key(p) for p in tight.pareto] == [search._key(p) for p in plain.pareto]
    assert tight.bounded >= plain.bounded


def test_the_sharded_schedules_floor_is_below_the_schedule_and_above_zero():
    """The sharded optimizer's reduce-scatter schedule is bounded by the reduce-scatter goal's own
    bound (no program searched): never above the schedule's exposed time, and not zero."""
    topology = load_topology("dgx-h100-2x8x8")
    costs = CommunicationCosts(topology)
    checked = positive = 0
    for placement in itertools.islice(enumerate_placements(topology, parse_axes("dp=16,tp=8")), 40):
        for tensors, backward_s in (((2**24,) * 8 + (2**26,), 0.004), ((2**20,) * 30, 0.02), ((2**28,), 0.0)):
            floor = costs.gradient_floor(placement, ("dp",), tensors, backward_s, True)
            schedule = costs.gradient_schedule(placement, ("dp",), tensors, backward_s, True)
            assert 0.0 <= floor <= schedule.exposed_s
            checked += 1
            positive += floor > 0
    assert checked > 20 and positive
