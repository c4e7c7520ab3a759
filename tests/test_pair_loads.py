"""An all-to-all's link loads priced per class of equal flows (Network.pair_loads) are the
per-flow loads (Network.loads over every pair) bit for bit, on full and partial hierarchies,
with uplinks, fabrics and a node rule, and they decline (None) where the classes do not hold;
the network's link tables (built as arrays) give each flow the links of its route on the graph."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synth.model import engine
from synth.model.backend import FlowArrays, PairwiseFlows
from synth.model.network import Network, sequential_sums
from synth.topology import Figure, uniform_topology
from tests.test_model_call_shape import CASES, case_times


def _network(sizes: tuple[int, ...], uplinks: tuple[int, ...], fabrics: tuple[int, ...]) -> Network:
    names = [f"l{i}" for i in range(len(sizes))]
    topology = uniform_topology(list(zip(names, sizes)), [1e9 * (i + 1) for i in range(len(sizes))], 1e-6,
                                uplinks={names[i]: (2, 3e9) for i in uplinks})
    levels = tuple(dataclasses.replace(level, fabric=Figure(5e9, "test")) if i in fabrics else level
                   for i, level in enumerate(topology.levels))
    return Network(dataclasses.replace(topology, levels=levels))


def _every_pair(sets: np.ndarray, node, inter, intra) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, bytes) of every pair of every set, weighted as PairwiseFlows' arrays are."""
    src, dst, nbytes = [], [], []
    for row, devices in enumerate(sets):
        flows = PairwiseFlows(len(devices), 1.0)
        same = np.full(len(flows), True) if node is None else (np.array(node)[flows.src] == np.array(node)[flows.dst])
        src.append(devices[flows.src])
        dst.append(devices[flows.dst])
        nbytes.append(np.where(same, intra[row], inter[row]))
    return np.concatenate(src), np.concatenate(dst), np.concatenate(nbytes)


def _per_flow(network: Network, sets: np.ndarray, node, inter, intra) -> np.ndarray:
    return network.loads(*_every_pair(sets, node, inter, intra))


@st.composite
def systems(draw):
    depth = draw(st.integers(1, 4))
    sizes = tuple(draw(st.lists(st.integers(1, 4), min_size=depth, max_size=depth)))
    uplinks = tuple(i for i in range(depth) if draw(st.booleans()))
    fabrics = tuple(i for i in range(depth) if draw(st.booleans()))
    return sizes, uplinks, fabrics


@settings(max_examples=60, deadline=None)
@given(systems(), st.data())
def test_classes_price_every_pair_bit_for_bit(system, data):
    sizes, uplinks, fabrics = system
    network = _network(*system)
    count = network.device_count
    if count < 2:
        return
    k = data.draw(st.integers(2, count))
    groups = data.draw(st.integers(1, max(1, min(3, count // k))))
    # disjoint sets of k devices, any placement (a full hierarchy or not)
    order = np.array(data.draw(st.permutations(range(count))), dtype=np.int64)
    full = data.draw(st.booleans())
    sets = (np.arange(groups * k).reshape(groups, k) if full else order[:groups * k].reshape(groups, k))
    inter = np.array([1.0 / k / 0.96 * (r + 1) / 3 for r in range(groups)])
    intra = np.array([1.0 / k / 0.8 * (r + 1) / 3 for r in range(groups)])
    split = data.draw(st.integers(0, len(sizes)))
    stride = int(np.prod(sizes[split:]))
    # members' nodes: the units of level `split - 1` (a unit of the hierarchy), as NCCL's view gives them
    node = tuple(np.unique(sets[0] // stride, return_inverse=True)[1].tolist())
    for rule in (None, node):
        classes = network.pair_loads(sets, rule, inter, intra)
        if classes is None:  # declined only where a class's flows are not all alike
            assert not _aligned(network, sets, rule) or _mixed(network, sets, rule, inter, intra)
            continue
        assert np.array_equal(classes, _per_flow(network, sets, rule, inter, intra))
    assert network.pair_loads(sets, None, inter, intra) is not None or _mixed(network, sets, None, inter, intra)


def _aligned(network: Network, sets: np.ndarray, node) -> bool:
    """Whether in every set two members share a node exactly when they agree down to some level."""
    if node is None:
        return True
    node = np.array(node)
    for devices in sets:
        levels = {}
        for a in range(len(devices)):
            for b in range(len(devices)):
                if a != b:
                    level = int(network.first_difference(devices[a], devices[b]))
                    levels.setdefault(level, set()).add(bool(node[a] == node[b]))
        if any(len(kinds) > 1 for kinds in levels.values()):
            return False
        across = [level for level, kinds in levels.items() if kinds == {False}]
        within = [level for level, kinds in levels.items() if kinds == {True}]
        if across and within and max(across) > min(within):
            return False
    return True


def _mixed(network: Network, sets: np.ndarray, node, inter, intra) -> bool:
    """Whether some link carries flows of two different weights (per flow, one weight at a time)."""
    src, dst, nbytes = _every_pair(sets, node, inter, intra)
    carried = np.stack([network.loads(src, dst, (nbytes == value).astype(float)) > 0 for value in np.unique(nbytes)])
    return bool((carried.sum(axis=0) > 1).any())


def test_a_node_that_is_not_a_unit_of_the_hierarchy_is_declined():
    network = _network((2, 4), (0,), ())
    sets = np.arange(8)[None, :]
    node = (0, 0, 1, 1, 0, 0, 1, 1)  # halves of each level-0 unit: no level's units
    assert network.pair_loads(sets, node, np.array([1.0]), np.array([0.5])) is None


def test_a_link_with_flows_of_two_weights_is_declined():
    network = _network((2, 2, 2), (2,), ())
    sets = np.arange(8)[None, :]
    node = tuple((np.arange(8) // 4).tolist())  # nodes are level-0 units: level-2 uplinks mix weights
    assert network.pair_loads(sets, node, np.array([1.0]), np.array([0.5])) is None
    assert network.pair_loads(sets, None, np.array([1.0]), np.array([0.5])) is not None


def test_a_device_twice_is_declined():
    network = _network((2, 2), (), ())
    assert network.pair_loads(np.array([[0, 1, 1]]), None, np.array([1.0]), np.array([1.0])) is None


def test_pairwise_flows_read_as_the_arrays_they_stand_for():
    k = 5
    src, dst = np.repeat(np.arange(k), k), np.tile(np.arange(k), k)
    keep = src != dst
    node = (0, 0, 1, 1, 1)
    flows = PairwiseFlows(k, 1.0 / k).divided(node, 0.96, 0.8)
    divisor = np.where(np.array(node)[src[keep]] != np.array(node)[dst[keep]], 0.96, 0.8)
    expected = FlowArrays(src[keep], dst[keep], np.full(k * (k - 1), 1.0 / k) / divisor)
    assert flows == PairwiseFlows(k, 1.0 / k).divided(node, 0.96, 0.8) and len(flows) == k * (k - 1)
    assert list(flows) == list(expected)
    assert flows.weight(False, 0.5) == expected.fraction[k - 2] / 0.5  # member 0 -> 4: across nodes
    assert flows.weight(True, 0.5) == expected.fraction[0] / 0.5
    with pytest.raises(ValueError):
        flows.divided(node, 0.9, 0.9)
    again = pickle.loads(pickle.dumps(flows))  # to worker processes
    assert again == flows and list(again) == list(expected)


ALL_TO_ALL_CASES = [case for case in CASES if case[7] == "alltoall"]


@pytest.mark.parametrize("case", ALL_TO_ALL_CASES, ids=lambda case: case[0])
def test_the_engine_prices_all_to_all_by_classes_as_it_would_flow_by_flow(case, monkeypatch):
    priced = []
    original = Network.pair_loads

    def counted(self, *args):
        found = original(self, *args)
        priced.append(found is not None)
        return found

    def priced_afresh():  # engines are kept per context (engine_for): price with a new one
        engine._local_flows.cache_clear()
        engine._ENGINES.clear()
        return case_times(case)

    monkeypatch.setattr(Network, "pair_loads", counted)
    by_classes = priced_afresh()
    assert any(priced)  # the classes were used
    declined = []
    monkeypatch.setattr(Network, "pair_loads", lambda self, *args: declined.append(1))  # always None
    assert np.array_equal(priced_afresh(), by_classes)
    assert declined  # priced again, flow by flow


@settings(max_examples=30, deadline=None)
@given(systems(), st.data())
def test_the_tables_give_each_flow_the_links_of_its_route_on_the_graph(system, data):
    network = _network(*system)
    if network.device_count < 2:
        return
    src = data.draw(st.integers(0, network.device_count - 1))
    dst = data.draw(st.integers(0, network.device_count - 1).filter(lambda d: d != src))
    loaded = network.loads(np.array([src]), np.array([dst]), np.array([1.0]))
    assert sorted(network.link_names[i] for i in np.flatnonzero(loaded)) == sorted(network.route(src, dst))
    assert set(loaded.tolist()) <= {0.0, 1.0}  # no link twice


@settings(max_examples=80, deadline=None)
@given(st.one_of(st.floats(min_value=5e-324, max_value=1e300, allow_nan=False, allow_infinity=False),
                 st.integers(1, 2**20).map(lambda n: n * 2.0 ** -24)),  # the second: sums that tie
       st.lists(st.integers(1, 200_000), min_size=1, max_size=6))
def test_sequential_sums_are_the_sums_added_one_by_one(value, counts):
    expected = np.cumsum(np.full(max(counts), value))[np.array(counts) - 1]
    assert np.array_equal(sequential_sums(value, np.array(counts)), expected)


def test_few_flows_joined_in_one_bincount_sum_as_the_parts_do(monkeypatch):
    import synth.model.network as network_module

    network = _network((2, 4, 8), (0, 1), (1,))
    rng = np.random.default_rng(3)
    src = rng.integers(0, network.device_count, 500)
    dst = (src + rng.integers(1, network.device_count, 500)) % network.device_count
    nbytes = rng.random(500) * 1e6
    joined = network.loads(src, dst, nbytes)
    monkeypatch.setattr(network_module, "_JOINED_FLOWS", -1)
    assert np.array_equal(joined, network.loads(src, dst, nbytes))
