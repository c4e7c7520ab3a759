"""The top-K search is exact on longer programs than tests/test_estimates.py draws: on several
topologies, placements, hierarchies, sizes, backends and both estimates, the search pops every
program in exactly the full ranking's order (times bit for bit, ties by text), and `top(K)`
is the full ranking's head for K from 1 to past the number of programs."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synth.search.rank import Ranker
from synth.hierarchy import build_hierarchy
from synth.model import ESTIMATES, cost_context
from synth.model.algorithms import NCCL_FLOWS
from synth.placement import enumerate_placements, make_placement, parse_axes
from synth.topology_file import load_topology

SIZES = (1, 4096, 65536, 3 * 2**20 + 5, 2**30)
JOBS = (  # (topology, axes, reductions to ask for)
    ("emu-2x2x2", "data=4,model=2", (("data",), ("data", "model"))),
    ("dgx-a100-x4", "data=8,model=4", (("data",), ("model",), ("data", "model"))),
    ("paper-fig3", "data=4,model=4", (("data",), ("data", "model"))),
    ("dgx-h100-2x8x8", "data=16,model=8", (("data",), ("data", "model"))),
    ("gcp-a2-2x16", "data=16,model=2", (("data",), ("data", "model"))),
)
BACKENDS = ("nccl", "gloo", NCCL_FLOWS)  # NCCL as measured, gloo, the flow model


def assert_search_is_the_full_ranking(ranker: Ranker, sizes) -> None:
    full = ranker.rank(sizes)
    for size, rows in zip(sizes, full):
        popped = [(time, str(program)) for time, program in ranker.cheapest(size)]
        assert popped == [(row.time_s, str(row.program)) for row in rows], (ranker.hierarchy, size)
        for k in (1, 2, 5, 17, len(rows) + 3):
            top = ranker.top(size, k)
            assert [row for row in top if not (row.baseline and row not in rows[:k])] == rows[:k]
            assert sum(row.baseline for row in top) == 1


@pytest.mark.parametrize("estimate", ESTIMATES)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_search_pops_every_program_in_the_full_rankings_order(estimate, data):
    name, axes_text, requests = data.draw(st.sampled_from(JOBS))
    topology = load_topology(name)
    placement = data.draw(st.sampled_from(enumerate_placements(topology, parse_axes(axes_text))))
    hierarchy = build_hierarchy(placement, data.draw(st.sampled_from(requests)),
                                data.draw(st.sampled_from(("merged", "split"))))
    if hierarchy.group_size == 1:
        return
    max_len = 5 if len(hierarchy.sizes) <= 3 else 4
    backend = data.draw(st.sampled_from(BACKENDS))
    sizes = data.draw(st.lists(st.sampled_from(SIZES), min_size=1, max_size=2, unique=True))
    assert_search_is_the_full_ranking(Ranker(cost_context(hierarchy, topology, backend), max_len, estimate), sizes)


@pytest.mark.slow
@pytest.mark.parametrize("estimate", ESTIMATES)
def test_the_search_is_exact_on_the_benchmarks_program_set(estimate):
    """benchmarks/ranking.py's 18,101 programs (4 levels, up to 6 steps): every program, in order."""
    topology = load_topology("paper-fig3")
    placement = make_placement(topology, parse_axes("data=4,model=4"), [[1, 2, 2], [2, 1, 2]])
    hierarchy = build_hierarchy(placement, ("data", "model"), "split")
    assert_search_is_the_full_ranking(Ranker(cost_context(hierarchy, topology), 6, estimate), (65536, 2**30))
