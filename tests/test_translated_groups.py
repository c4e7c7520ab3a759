"""Translated groups (synth.model.engine.translated_columns): an engine whose groups are
translates of group 0 keeps only the shared links and group 0's own in its regimes, and every
figure it gives (step times, regimes' drains and busiest links, program times, the search's
best programs) is the one of the engine over every link, bit for bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from synth.goals import BY_COLLECTIVE
from synth.model import engine as engine_module
from synth.model.engine import CostEngine, canonical_devices, translated_columns
from synth.model.estimate import LOCKSTEP, PIPELINED
from synth.plan.costs import CommunicationCosts
from synth.search.rank import Ranker
from synth.topology import Figure
from synth.topology_file import load_topology
from tests.test_pair_loads import _network


def _resized(name: str, fabric: bool = False, **sizes):
    topology = load_topology(name)
    levels = tuple(dataclasses.replace(level, size=sizes.get(level.name, level.size)) for level in topology.levels)
    if fabric:  # a link every band of the outermost level shares
        levels = (dataclasses.replace(levels[0], fabric=Figure(120e9, "test")),) + levels[1:]
    return dataclasses.replace(topology, levels=levels)


@pytest.mark.parametrize("sizes, uplinks, fabrics", [((3, 4, 2), (0, 1), ()), ((2, 3, 4), (1,), (0, 2)),
                                                     ((4, 4), (0,), (0,))])
def test_shared_loads_are_the_loads_of_the_shared_links_bit_for_bit(sizes, uplinks, fabrics):
    network = _network(sizes, uplinks, fabrics)
    generator = np.random.default_rng(7)
    for count in (1, 50, 5000):
        src = generator.integers(0, network.device_count, count)
        dst = (src + generator.integers(1, network.device_count, count)) % network.device_count
        nbytes = generator.random(count) * 3
        assert np.array_equal(network.shared_loads(src, dst, nbytes), network.loads(src, dst, nbytes)[:network.shared_links])
    assert network.shared_links == len(network.capacity) - 2 * network.depth * network.device_count


def test_groups_that_are_not_translates_keep_every_link():
    network = _network((2, 4), (0,), ())
    assert translated_columns(network, np.array([[0, 1]])) is None  # one group
    assert translated_columns(network, np.array([[0, 1], [2, 5]])) is None  # group 1's members are in two units
    assert translated_columns(network, np.array([[2, 3], [0, 1]])) is None  # group 0 is not the least
    columns = translated_columns(network, np.array([[0, 4], [1, 5]]))
    own = np.concatenate([network.inject[[0, 4]].ravel(), network.eject[[0, 4]].ravel()])
    assert columns.tolist() == list(range(network.shared_links)) + sorted(own.tolist())


CASES = [
    ("dgx-h100-2x8x8", False, {"rack": 4}, (4, 2, 1)),
    ("dgx-h100-2x8x8", False, {"rack": 4}, (2, 2, 2)),
    ("dgx-h100-2x8x8", True, {"rack": 4}, (4, 1, 2)),
    ("selene", False, {"node": 4}, (4, 2)),
]


@pytest.mark.parametrize("name, fabric, sizes, factors", CASES)
def test_translated_engine_gives_the_whole_engines_figures(name, fabric, sizes, factors, monkeypatch):
    from synth.model.network import Network

    shared_pairs = []  # the all-to-alls' pairwise phases priced on the shared links alone
    pair_loads = Network.pair_loads

    def recorded(self, *args, shared_only=False):
        shared_pairs.append(shared_only)
        return pair_loads(self, *args, shared_only=shared_only)

    monkeypatch.setattr(Network, "pair_loads", recorded)
    topology = _resized(name, fabric, **sizes)
    context = CommunicationCosts(topology)._context(factors)
    devices = canonical_devices(context)
    assert len(devices) > 1
    quotient = CostEngine(context, devices)
    assert quotient.columns is not None and quotient.link_count < len(context.network.capacity)
    monkeypatch.setattr(engine_module, "translated_columns", lambda network, devices: None)
    whole = CostEngine(context, devices)
    assert whole.columns is None
    sizes_asked = [1 << 10, 3 << 20, 1 << 30]
    for goal in ("AllReduce", "AllGather", "ReduceScatter", "AllToAll"):
        for estimate in (PIPELINED, LOCKSTEP):
            a = Ranker(context, 3, estimate, engine=quotient, goal=BY_COLLECTIVE[goal])
            b = Ranker(context, 3, estimate, engine=whole, goal=BY_COLLECTIVE[goal])
            programs = a.every_program()
            assert np.array_equal(a.times(programs, sizes_asked), b.times(b.every_program(), sizes_asked))
            for size in sizes_asked:
                assert [(row.program, row.time_s) for row in a.top(size, 3)] == \
                    [(row.program, row.time_s) for row in b.top(size, 3)]
    assert any(shared_pairs)
    assert len(quotient.regimes) == len(whole.regimes)
    for x, y in zip(quotient.regimes, whole.regimes):
        assert (x.latency_s, x.drain_s, x.links, x.chain_latency_s, x.chain_drain_s) == \
            (y.latency_s, y.drain_s, y.links, y.chain_latency_s, y.chain_drain_s)
        assert np.array_equal(x.link_s, y.link_s[quotient.columns])
        others = np.setdiff1d(np.arange(len(y.link_s)), quotient.columns)
        # every link left out carries what a kept one carries: the maximum is kept
        assert y.link_s[others].max(initial=0.0) <= x.link_s.max()


@pytest.mark.parametrize("kind", ["merged", "split", "system"])
def test_group_devices_are_the_hierarchys_groups(kind):
    from synth.hierarchy import build_hierarchy, group_devices
    from synth.placement import enumerate_placements
    from synth.plan.degrees import Degrees

    topology = _resized("dgx-h100-2x8x8", rack=4)
    for degrees in (Degrees(8, 4, 8), Degrees(2, 2, 64), Degrees(256, 1, 1)):
        for placement in enumerate_placements(topology, degrees.axes())[::7][:6]:
            for axes in (("dp",), ("tp",), ("dp", "tp"), ("pp", "dp", "tp")):
                if not set(axes) <= set(placement.axis_names):
                    continue
                hierarchy = build_hierarchy(placement, axes, kind)
                found = group_devices(hierarchy)
                assert found.dtype == np.int64
                assert np.array_equal(found, np.array(hierarchy.groups, dtype=np.int64))
