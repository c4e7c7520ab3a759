"""The planner costs every collective on the smallest equivalent system (synth/plan/equivalent.py):
every cost it asks, and so every predicted step, equals the whole system's."""

from __future__ import annotations

import dataclasses
import math

import pytest

from synth.model.nccl.hardware import nccl_view
from synth.placement import Placement, enumerate_placements
from synth.plan import costs as costs_module
from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import Degrees
from synth.plan.equivalent import OTHERS, REDUCED, Equivalent, equivalent, equivalent_sizes
from synth.plan.model import PRESETS
from synth.plan.search import SearchSpace
from synth.plan.step import compute_of, predict
from synth.topology import Figure
from synth.topology_file import load_topology


def _resized(name: str, **sizes):
    topology = load_topology(name)
    levels = tuple(dataclasses.replace(level, size=sizes.get(level.name, level.size)) for level in topology.levels)
    return dataclasses.replace(topology, levels=levels)


def _with_rack_fabric(topology):
    """A fabric on the outermost level: a link every band shares."""
    rack = dataclasses.replace(topology.levels[0], fabric=Figure(120e9, "test"))
    return dataclasses.replace(topology, levels=(rack,) + topology.levels[1:])


def _whole(topology, factors):
    """The collective on the whole system (the reference: no level cut)."""
    others = tuple(size // factor for size, factor in zip(topology.sizes, factors))
    placement = Placement(topology.level_names, topology.sizes, (OTHERS, REDUCED), (math.prod(others), math.prod(factors)),
                          (others, tuple(factors)))
    return Equivalent(topology, placement)


def test_levels_outside_the_groups_are_cut_and_a_node_is_never_split():
    topology = _resized("dgx-h100-2x8x8", rack=64)  # rack, node (NCCL's node level), gpu
    assert equivalent_sizes(topology, (4, 2, 1)) == (4, 8, 8)  # the racks the groups span; nodes kept whole
    assert equivalent_sizes(topology, (1, 4, 2)) == (1, 4, 8)
    assert equivalent_sizes(topology, (1, 1, 8)) == (1, 1, 8)  # inside a node: one node
    assert equivalent(topology, (4, 2, 1)).placement.matrix == ((1, 4, 8), (4, 2, 1))
    # a level with a fabric is never cut to the units spanned (no capacity is ever scaled)
    assert equivalent_sizes(_with_rack_fabric(topology), (4, 2, 1)) == (64, 8, 8)
    assert equivalent_sizes(_with_rack_fabric(topology), (1, 4, 2)) == (1, 4, 8)


CASES = [
    ("dgx-h100-2x8x8", {"rack": 8}, Degrees(16, 4, 8), "gpt3-1.3b"),
    ("dgx-h100-2x8x8", {"rack": 4}, Degrees(32, 2, 4), "gpt3-1.3b"),
    ("dgx-h100-2x8x8+fabric", {"rack": 4}, Degrees(8, 8, 4), "gpt3-1.3b"),
    ("selene", {"node": 16}, Degrees(16, 2, 4), "gpt3-2.7b"),
]


@pytest.mark.parametrize("name, sizes, degrees, model_name", CASES)
def test_every_predicted_step_equals_the_whole_systems(name, sizes, degrees, model_name, monkeypatch):
    base, _, fabric = name.partition("+")
    topology = _resized(base, **sizes)
    if fabric:
        topology = _with_rack_fabric(topology)
    model = PRESETS[model_name]
    compute = compute_of(topology.device, model.precision)
    space = SearchSpace(sequence_parallel=(False, True), recompute=("none",), sharded_optimizer=(False, True))
    settings = space.settings(model, degrees)
    placements = enumerate_placements(topology, degrees.axes())[::5][:4]
    small = CommunicationCosts(topology)
    small_steps = [predict(model, compute, small, degrees, p, s) for p in placements for s in settings]
    monkeypatch.setattr(costs_module, "equivalent", _whole)
    whole = CommunicationCosts(topology)
    whole_steps = [predict(model, compute, whole, degrees, p, s) for p in placements for s in settings]
    assert small_steps and len(small_steps) == len(whole_steps)
    for a, b in zip(small_steps, whole_steps):
        assert a.step_s == pytest.approx(b.step_s, rel=1e-9, abs=1e-12)
        assert a.breakdown.to_json() == pytest.approx(b.breakdown.to_json(), rel=1e-9, abs=1e-12)
        assert [(r.name, r.levels) for r in a.routes] == [(r.name, r.levels) for r in b.routes]
        assert [r.program for r in a.routes] == [r.program for r in b.routes]
        for x, y in zip(a.routes, b.routes):
            assert x.time_s == pytest.approx(y.time_s, rel=1e-9, abs=1e-12)
    # the small systems are small: the units the groups span at their outermost level, each whole
    for key in small._best:
        spanned = next(level for level, factor in enumerate(key) if factor > 1)
        node = nccl_view(topology).node_level  # a node is never split
        if spanned > node:
            expected = math.prod(topology.sizes[node + 1:])  # one node
        elif topology.levels[spanned].fabric is not None:
            expected = math.prod(topology.sizes[spanned:])  # the outer levels cut, this one whole
        else:
            expected = key[spanned] * math.prod(topology.sizes[spanned + 1:])
        assert equivalent(topology, key).device_count == expected <= topology.device_count


def test_single_calls_go_through_the_same_estimate_as_all_reduce_programs():
    """A reduce-scatter or all-gather is timed like the all-reduce programs (the pipelined
    estimate by default), not by the lockstep step time: the flat AllReduce call priced the way
    reduce_scatter is (goal_programs) equals the default all-reduce's time the program search
    reports."""
    topology = _resized("dgx-h100-2x8x8", rack=4)
    costs = CommunicationCosts(topology)
    for placement in enumerate_placements(topology, Degrees(8, 8, 4).axes())[::3]:
        for axes in (("dp",), ("tp",), ("pp",)):
            for size in (1 << 16, 48 << 20):
                call = costs.goal_programs("AllReduce", placement, axes).best(size)
                assert call.baseline_time_s == pytest.approx(costs.all_reduce(placement, axes, size).default_time_s,
                                                             rel=1e-12)
