"""The routing's sampler draws its Gumbel keys a block of tokens at a time and picks each
token's top k by a partition: the same experts as one draw sorted whole (the definition)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synth.routing import largest, parse_routing


def drawn_whole(routing, rng, count, nodes):
    """The definition: every key drawn at once, each row sorted whole (stable)."""
    with np.errstate(divide="ignore"):
        keys = np.log(routing.probabilities())[None, :] + rng.gumbel(size=(count, routing.experts))
    if routing.node_limit is not None and routing.node_limit < nodes:
        per_node = routing.experts // nodes
        score = keys.reshape(count, nodes, per_node).max(axis=2)
        kept = np.argsort(-score, axis=1, kind="stable")[:, :routing.node_limit]
        allowed = np.zeros((count, nodes), dtype=bool)
        np.put_along_axis(allowed, kept, True, axis=1)
        keys = np.where(np.repeat(allowed, per_node, axis=1), keys, -np.inf)
    return np.sort(np.argsort(-keys, axis=1, kind="stable")[:, :routing.topk], axis=1)


@pytest.mark.parametrize("text,nodes", [
    ("tokens=4,topk=8,experts=256,node-limit=4", 32),
    ("tokens=4,topk=2,experts=64", 8),
    ("tokens=4,topk=3,experts=16,zipf=1.2,node-limit=2", 4),
    ("tokens=4,topk=2,experts=8,weights=0/0/1/1/0/0/1/0,node-limit=1", 4),
    ("tokens=4,topk=8,experts=8", 2),
    ("tokens=4,topk=8,experts=16384,node-limit=4", 512),  # more than one block of tokens
])
def test_sample_equals_one_whole_draw(text, nodes):
    routing = parse_routing(text)
    for seed in range(2):
        for count in (1, 5, 600):  # 600 tokens of 16,384 experts: two blocks
            rng, again = np.random.default_rng(seed), np.random.default_rng(seed)
            assert np.array_equal(routing.sample(rng, count, nodes), drawn_whole(routing, again, count, nodes))
            assert rng.integers(1 << 30) == again.integers(1 << 30)  # the stream is left where one draw leaves it


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 9), st.integers(1, 9), st.integers(0, 2**32 - 1))
def test_largest_is_a_stable_sort_head(rows, columns, k, seed):
    k = min(k, columns)
    values = np.random.default_rng(seed).integers(-2, 3, size=(rows, columns)).astype(float)  # many ties
    values[values == -2] = -np.inf
    assert np.array_equal(np.sort(largest(values, k), axis=1),
                          np.sort(np.argsort(-values, axis=1, kind="stable")[:, :k], axis=1))



@pytest.mark.parametrize("text", ["tokens=4,topk=8,experts=256,node-limit=4", "tokens=4,topk=3,experts=16,zipf=1.2,node-limit=2",
                                  "tokens=4,topk=2,experts=8,weights=0/0/1/1/0/0/1/0,node-limit=1",
                                  "tokens=4,topk=2,experts=8,weights=0/0/1/1/0/0/1/0"])
def test_one_draw_of_keys_serves_every_node_count(text):
    """Routing.pick from one draw of keys (what fanout keeps across node counts) is `sample`'s
    draw for every node count, and leaves the generator where `sample` leaves it."""
    routing = parse_routing(text)
    keys_rng = np.random.default_rng(3)
    keys = routing.gumbel_keys(keys_rng, 700)
    for nodes in (1, 2, 4):  # (8 nodes of one expert each leave node-limit=1 too few: refused by both)
        rng = np.random.default_rng(3)
        assert np.array_equal(routing.pick(keys, nodes), routing.sample(rng, 700, nodes))
        assert rng.bit_generator.state == keys_rng.bit_generator.state
