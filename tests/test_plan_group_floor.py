"""The search's group floor (synth/plan/step.py group_floor, search.py): one (degrees, settings)
pair's step-time floor and memory, shared by its placements. Checked: the floor is below every
placement's first bound and the memory is each candidate's own."""

from __future__ import annotations

import itertools

from synth.placement import enumerate_placements
from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import DegreeLimits, enumerate_degrees
from synth.plan.model import PRESETS
from synth.plan.search import SearchSpace
from synth.plan.step import compute_of, group_floor, predict, representatives
from synth.topology_file import load_topology


def test_the_group_floor_is_below_every_placements_bound_and_its_memory_is_theirs():
    topology = load_topology("dgx-h100-2x8x8")
    model = PRESETS["qwen3-30b-a3b"]
    compute = compute_of(topology.device, model.precision)
    costs = CommunicationCosts(topology)
    space = SearchSpace(recompute=("selective", "full"))
    checked = 0
    for choice in enumerate_degrees(topology.device_count, model, DegreeLimits()):
        if choice.dp == 1:
            continue
        placements = list(itertools.islice(enumerate_placements(topology, choice.axes()), 12))
        classes, memo = representatives(costs, choice, placements), {}
        for settings in space.settings(model, choice)[::2]:
            floor = group_floor(model, compute, costs, choice, settings, classes, memo)
            for placement in placements:
                bound = predict(model, compute, costs, choice, placement, settings, data_parallel=False)
                assert floor.step_s <= bound.step_s
                assert floor.memory == bound.memory
                checked += 1
    assert checked > 100


def test_the_unpriced_floor_is_below_the_exact_one_with_the_same_memory_and_prices_nothing():
    """The floor the search tries first (no collective priced) never stops a group the exact
    floor would keep: it is no higher, and its memory is the same."""
    topology = load_topology("dgx-h100-2x8x8")
    model = PRESETS["mixtral-8x7b"]
    compute = compute_of(topology.device, model.precision)
    costs = CommunicationCosts(topology)
    checked = 0
    for choice in enumerate_degrees(topology.device_count, model, DegreeLimits()):
        if choice.dp == 1 or choice.ep == 1:
            continue
        placements = list(itertools.islice(enumerate_placements(topology, choice.axes()), 6))
        classes, memo = representatives(costs, choice, placements), {}
        for settings in SearchSpace().settings(model, choice)[::3]:
            before = (len(costs._single), len(costs._routed))
            unpriced = group_floor(model, compute, costs, choice, settings, classes, communication=False)
            assert (len(costs._single), len(costs._routed)) == before
            exact = group_floor(model, compute, costs, choice, settings, classes, memo)
            assert unpriced.step_s <= exact.step_s
            assert unpriced.memory == exact.memory
            checked += 1
    assert checked > 20
