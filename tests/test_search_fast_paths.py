"""The search's shortcuts agree with the plain paths they stand for: the walker ends a
reduce-scatter or reduce program at any goal state (not only where a goal has one state) with
the calls lowering gives; an interned step keyed by its distinct roots' spans is the step of
every call's span; a Permute of a whole buffer by byte getters equals the place-by-place
reordering; NCCL's network nodes by one integer per prefix equal a row-wise unique."""

from __future__ import annotations

import random

import numpy as np
import pytest

from synth.goals import GOALS
from synth.hierarchy import build_hierarchy
from synth.lowering import lower
from synth.model.context import cost_context
from synth.model.engine import CostEngine, step_calls
from synth.model.nccl.backend import _network_nodes, _view
from synth.placement import enumerate_placements, parse_axes
from synth.search.walker import StateWalker
from synth.semantics import Holding, _permute, place_map
from synth.topology_file import load_topology


def _hierarchy(name="paper-fig3", axes="data=16", reduce=("data",)):
    topology = load_topology(name)
    return build_hierarchy(enumerate_placements(topology, parse_axes(axes))[0], reduce, "merged")


@pytest.mark.parametrize("goal", ["reducescatter", "reduce", "allreduce"])
def test_walked_programs_equal_lowered_ones(goal):
    hierarchy = _hierarchy()
    walker = StateWalker(hierarchy, GOALS[goal])
    programs = list(walker.enumerator(3).programs())
    assert programs
    for program in programs:
        if any(step.is_permute for step in program.steps):
            continue
        lowered = tuple(step_calls(step) for step in lower(program, hierarchy, GOALS[goal]).steps
                        if step.places is None)
        assert walker.walk(program) == lowered, program


@pytest.mark.parametrize("goal", sorted(GOALS))
def test_interned_steps_equal_every_calls_span(goal):
    walker = StateWalker(_hierarchy(), GOALS[goal])
    machine = walker.machine
    frontier, seen = [machine.initial], {machine.initial}
    while frontier and len(seen) < 300:
        state = frontier.pop()
        for index in range(len(walker.alphabet)):
            after = machine.apply(state, index)
            if walker.permutes[index] or after is None:  # a step taken: valid, and calling
                continue
            roots, factor = walker._call_roots[index]
            spans = tuple(machine.members[state[root]][3] * factor for root in roots)
            step = walker.interned_step(state, index)
            assert step.chunks == spans and step.calls == tuple(walker.calls[index])
            if after not in seen:
                seen.add(after)
                frontier.append(after)


def _slow_permute(member, places, order, field):
    lo, hi, sets, length, tags, _ = member
    mask = (1 << field) - 1
    new_sets, new_tags = 0, [0] * (hi - lo)
    for place in range(lo, hi):
        new_sets |= ((sets >> (place * field)) & mask) << (places[place] * field)
        new_tags[places[place]] = tags[place]
    return Holding(lo, hi, new_sets, length, tuple(new_tags), order)


@pytest.mark.parametrize("sizes", [(2, 2), (2, 2, 2, 2), (4, 2, 2), (3, 2)])
def test_whole_buffer_permutes_equal_the_place_by_place_reordering(sizes):
    rng = random.Random(len(sizes))
    levels = tuple(range(len(sizes)))
    chunks = int(np.prod(sizes))
    for field in (8, 16):
        for _ in range(20):
            before, after = tuple(rng.sample(levels, len(levels))), tuple(rng.sample(levels, len(levels)))
            places = place_map(sizes, before, after)
            member = Holding(0, chunks, rng.getrandbits(field * chunks), chunks,
                             tuple(rng.randrange(100) for _ in range(chunks)), before)
            assert _permute(member, places, after, field, chunks) == _slow_permute(member, places, after, field)


def test_network_nodes_equal_a_row_wise_unique():
    topology = load_topology("dgx-h100-2x8x8")
    engine_sites = []
    hierarchy = build_hierarchy(enumerate_placements(topology, parse_axes("data=128"))[0], ("data",), "merged")
    engine = CostEngine(cost_context(hierarchy, topology))
    for members in ((0, 1, 2, 3, 4, 5, 6, 7), tuple(range(0, 128, 8)), tuple(range(0, 128, 3))):
        engine_sites.append(engine.call("AllReduce", members).site)
    for site in engine_sites:
        view, _ = _view(site.levels, site.nccl)
        coords = np.array(site.coords, dtype=np.int64).reshape(len(site.coords), -1)
        expected = np.unique(coords[:, :view.node_level + 1], axis=0, return_inverse=True)[1].reshape(-1)
        assert np.array_equal(_network_nodes(site), expected)


def test_permute_member_of_a_whole_buffer_equals_the_reordering():
    """Semantics.permute_member's path for whole buffers of byte-wide fields (16 members of
    the quotient: 2-byte fields) gives what `_permute` gives."""
    from synth.semantics import Semantics

    semantics = Semantics(("a", "b", "c", "d"), (2, 2, 2, 2), quotient=True, goal=GOALS["alltoall"])
    n = semantics.member_count
    assert n % 8 == 0
    rng = random.Random(7)
    levels = tuple(range(4))
    for _ in range(50):
        before, after = tuple(rng.sample(levels, 4)), tuple(rng.sample(levels, 4))
        member = Holding(0, n, rng.getrandbits(n * n), semantics.real_member_count,
                         tuple(rng.randrange(n) for _ in range(n)), before)
        expected = _permute(member, semantics.places(before, after), after, n, semantics.real_member_count)
        assert semantics.permute_member(member, after) == expected


def _grouped_by_loop(sizes, key, include):
    """The forms' groups as first written: a loop over every member's position."""
    from itertools import product as cartesian

    groups: dict[tuple, list[int]] = {}
    for rank, position in enumerate(cartesian(*(range(size) for size in sizes))):
        if include(position):
            groups.setdefault(key(position), []).append(rank)
    return tuple(tuple(members) for members in groups.values() if len(members) > 1)


@pytest.mark.parametrize("sizes", [(1,), (2,), (3, 1, 2), (4, 8, 16, 8), (2, 2, 2), (5, 1, 3, 1), (1, 1), (2, 3, 4)])
def test_form_groups_equal_the_loop_over_positions(sizes):
    from synth.semantics import inside_group, master, parallel

    for level in range(len(sizes)):
        assert inside_group(sizes, level)[0] == _grouped_by_loop(sizes, lambda p: p[:level], lambda p: True)
        assert parallel(sizes, level)[0] == _grouped_by_loop(sizes, lambda p: p[:level] + p[level + 1:],
                                                             lambda p: True)
        assert master(sizes, level)[0] == _grouped_by_loop(sizes, lambda p: p[:level], lambda p: not any(p[level + 1:]))


def test_calls_canonicalized_together_equal_one_by_one():
    from synth.model.backend import canonical_coords, canonical_labels

    rng = np.random.default_rng(7)
    for _ in range(200):
        calls, size, levels = (int(x) for x in rng.integers(1, (6, 40, 5)))
        coords = rng.integers(0, int(rng.integers(1, 9)), size=(calls, size, levels))
        labels = canonical_labels(coords)
        assert labels.shape == coords.shape
        assert [tuple(map(tuple, call)) for call in labels.tolist()] == [canonical_coords(call) for call in coords]


def test_a_steps_sites_are_its_calls_first_at_each_site():
    topology = load_topology("dgx-h100-2x8x8")
    hierarchy = build_hierarchy(enumerate_placements(topology, parse_axes("data=128"))[0], ("data",), "merged")
    calls = (tuple(range(0, 128, 16)), tuple(range(1, 128, 16)), tuple(range(8)), (8, 9, 10, 11, 12, 13, 14, 15),
             tuple(range(2, 128, 16)))
    sites = CostEngine(cost_context(hierarchy, topology)).sites("AllReduce", calls)
    engine = CostEngine(cost_context(hierarchy, topology))
    first: dict = {}
    for members in calls:
        first.setdefault(engine.call("AllReduce", members).site_id, members)
    assert sites == tuple(first.values())


def test_a_prefix_extended_where_its_links_change_equals_the_dense_sum():
    from synth.model import PIPELINED

    topology = load_topology("dgx-h100-2x8x8")
    hierarchy = build_hierarchy(enumerate_placements(topology, parse_axes("data=128"))[0], ("data",), "merged")
    engine = CostEngine(cost_context(hierarchy, topology))
    steps = (step_calls_of(("AllReduce", (tuple(range(8)), tuple(range(16, 128, 16))))),
             step_calls_of(("AllReduce", tuple(tuple(range(g, 128, 8)) for g in range(8)))))
    figures = engine.figures(steps, np.array([1 << 20]))
    prefix = PIPELINED.start(engine, 1 << 20)
    dense = np.zeros(len(engine.network.capacity))
    for index in (0, 1, 0):
        prefix = PIPELINED.extend(engine, prefix, figures, index)
        dense = dense + engine.regimes[int(figures.regime[index, 0])].link_s
        assert np.array_equal(prefix[0], dense) and prefix[2] == float(dense.max())
    sparse = [engine.regimes[int(r)].busy_links is not None for r in figures.regime[:, 0]]
    assert sparse == [True, False]  # both ways taken


def step_calls_of(step):
    from synth.model import StepCalls

    collective, calls = step
    return StepCalls(collective, calls, tuple(1 for _ in calls))
