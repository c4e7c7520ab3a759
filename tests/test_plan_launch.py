"""The planner's launch exports against the frameworks' own rules: Megatron-LM's RankGenerator
(megatron-core) and JAX's create_hybrid_device_mesh, each called itself when installed; the
memoized communication costs against fresh searches."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from synth.analysis.best import BestPrograms
from synth.model.context import cost_context
from synth.export.mesh import device_mesh_array
from synth.hierarchy import build_hierarchy
from synth.placement import enumerate_placements
from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import Degrees
from synth.plan.launch import (hybrid_mesh_layout, jax_hybrid_mesh, megatron_order, megatron_rank_mesh,
                               published_placement)
from synth.topology_file import load_topology

CASES = [(load_topology("dgx-a100-x4"), Degrees(2, 4, 4)), (load_topology("dgx-a100-x4"), Degrees(4, 8, 1)),
         (load_topology("dgx-h100-2x8x8"), Degrees(4, 8, 4)), (load_topology("dgx-h100-2x8x8"), Degrees(8, 2, 4, 2))]


def _groups_by_role(placement):
    return {name: sorted(sorted(group) for group in placement.axis_groups(name)) for name in placement.axis_names}


def _megatron_groups(degrees, order):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_state = pytest.importorskip("megatron.core.parallel_state")
    generator = parallel_state.RankGenerator(tp=degrees.tp, ep=1, dp=degrees.dp, pp=degrees.pp, cp=degrees.cp,
                                             order=order)
    return {role: sorted(sorted(group) for group in generator.get_ranks(role))
            for role in ("pp", "dp", "cp", "tp") if degrees.of(role) > 1}


@pytest.mark.parametrize("topology, degrees", CASES)
def test_megatron_order_numbers_ranks_like_the_placement(topology, degrees):
    for placement in enumerate_placements(topology, degrees.axes()):
        order = megatron_order(placement)
        expressible = order.order is not None
        mesh = device_mesh_array(placement)
        for megatron, _flag in (("tp-cp-ep-dp-pp", None), ("tp-cp-ep-pp-dp", "--use-tp-pp-dp-mapping")):
            same = np.array_equal(mesh, megatron_rank_mesh(degrees, megatron))
            if same:
                assert expressible, (placement.to_text(), megatron)
        if expressible:
            assert np.array_equal(mesh, megatron_rank_mesh(degrees, order.order))


@pytest.mark.parametrize("topology, degrees", CASES)
def test_megatron_rank_generator_agrees(topology, degrees):
    """Megatron's own RankGenerator gives the placement's groups for the order we name."""
    checked = 0
    for placement in enumerate_placements(topology, degrees.axes()):
        order = megatron_order(placement)
        if order.order is None:
            continue
        assert _megatron_groups(degrees, order.order) == _groups_by_role(placement)
        checked += 1
    assert checked >= 1
    default = published_placement(degrees, topology)
    assert megatron_order(default).order == "tp-cp-ep-dp-pp"
    assert _megatron_groups(degrees, "tp-cp-ep-dp-pp") == _groups_by_role(default)


def test_not_expressible_orders_say_why():
    topology = load_topology("dgx-a100-x4")
    placements = enumerate_placements(topology, Degrees(2, 4, 4).axes())
    refused = [megatron_order(p) for p in placements if megatron_order(p).order is None]
    assert refused and all("not expressible" in order.reason for order in refused)


def _fake_devices(nodes, per_node):
    return [SimpleNamespace(id=rank, process_index=rank // per_node, platform="gpu", device_kind="fake")
            for rank in range(nodes * per_node)]


@pytest.mark.parametrize("topology, degrees", CASES)
def test_jax_hybrid_mesh_shapes_against_create_hybrid_device_mesh(topology, degrees):
    for placement in enumerate_placements(topology, degrees.axes()):
        hybrid = jax_hybrid_mesh(placement)
        inner = tuple(row[-1] for row in placement.matrix)
        outer = tuple(int(np.prod(row[:-1])) for row in placement.matrix)
        layout = hybrid_mesh_layout(inner, outer, placement.level_sizes[-1])
        assert (hybrid.mesh_shape is not None) == np.array_equal(layout, device_mesh_array(placement))
        if hybrid.mesh_shape is None:
            continue
        mesh_utils = pytest.importorskip("jax.experimental.mesh_utils")
        nodes = int(np.prod(outer))
        devices = _fake_devices(nodes, placement.level_sizes[-1])
        mesh = mesh_utils.create_hybrid_device_mesh(hybrid.mesh_shape, hybrid.dcn_mesh_shape, devices,
                                                    process_is_granule=True)
        ranks = np.vectorize(lambda device: device.id)(mesh)
        assert np.array_equal(ranks, device_mesh_array(placement)), placement.to_text()


def test_memoized_costs_equal_fresh_searches():
    """Placements whose reduced axes span the same units per level cost the same (costs.py)."""
    topology = load_topology("dgx-h100-2x8x8")
    costs = CommunicationCosts(topology)
    checked = 0
    placements = enumerate_placements(topology, Degrees(8, 4, 4).axes())
    for placement in placements:
        for axes, size in ((("dp",), 3 << 20), (("tp",), 64 << 20)):
            memoized = costs.all_reduce(placement, axes, size)
            fresh = BestPrograms(cost_context(build_hierarchy(placement, axes), topology)).best(size)
            assert (memoized.program, memoized.time_s) == (str(fresh.program), fresh.time_s)
            checked += 1
    assert checked == 2 * len(placements)
    assert len(costs._best) < checked  # some placements shared a search


def test_point_to_point_contention_and_levels():
    topology = load_topology("dgx-a100-x4")
    costs = CommunicationCosts(topology)
    inside = published_placement(Degrees(4, 2, 4), topology)  # pp innermost of the node? tp inner, dp, then pp
    seconds, link = costs.point_to_point(inside, "pp", 1 << 20)
    assert seconds > 0 and link
    placements = enumerate_placements(topology, Degrees(1, 4, 8).axes())
    times = {p.to_text(): costs.point_to_point(p, "pp", 64 << 20)[0] for p in placements}
    assert min(times.values()) < max(times.values())  # crossing nodes costs more than NVLink
