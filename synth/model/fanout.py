"""Expected traffic of one dispatch or combine step, from the routing's fan-out
(docs/model.md section 8, "Dispatch and combine").

A dispatch step over levels V, after the levels R are resolved (synth/routed.py), sends one
copy of a token for each distinct projection of its destination members onto the levels
R + V whose digits on V differ from the owner's (the copies that stay are local). Combine
runs the same count backwards: a step over V, after R, sends one partial per distinct
projection of the destinations onto the levels not in R whose V digits differ from the
owner's. So both are "distinct projections onto a set of levels `classes`, moving on
`moving`", per token, in expectation:

* uniform routing without a node limit, exactly: the classes of the projection are U
  (the product of the sizes of `classes`), each with c = E/U experts, a given class is
  reached with probability 1 - C(E-c, k)/C(E, k), and U - U/K of them (K the product of the
  sizes of `moving`) differ from the owner on `moving`;
* a node limit or a skew: over 2^14 tokens drawn as the router draws them
  (synth/routing.py), owners uniform over the members, a fixed seed.

Under a skew the members differ, and the bytes of each ordered pair are priced
(`step_pairs`): the owners are uniform over the members and independent of the router, so a
dispatch pair (x, y) of a step over V after R carries, per token owned, the prod(R) owners'
copies that reach y's class (its digits on R + V): `prod(R) q(y)`, with `q` the chance a
token has an expert there; a combine pair carries the partials of the prod(classes - V)
owners it serves: `prod(classes - V) q(x)`, `q` over the sender's digits on `classes`. So a
pair's bytes depend on one end (the receiver in dispatch, the sender in combine), `q`
counted over the same 2^14 drawn tokens, and capped at the capacity factor times its mean.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from math import comb

import numpy as np

from synth.model.weighted import PairBytes
from synth.routing import Routing

SAMPLES = 1 << 14
SEED = 2024


@dataclass(frozen=True)
class StepTraffic:
    """Per token owned: copies sent in expectation (`copies`); and the step's group size
    `peers + 1`."""

    copies: float
    group: int

    def span_bytes(self, routing: Routing) -> float:
        """Bytes one member sends in the step on average, spread evenly over its group as an
        equal-split all-to-all of that span would (the engine's pairwise flows)."""
        if self.group < 2:
            return 0.0
        per_peer = routing.tokens * routing.bytes_per_token * self.copies / (self.group - 1)
        return per_peer * self.group


def _product(sizes, levels) -> int:
    result = 1
    for level in levels:
        result *= sizes[level]
    return result


def step_traffic(routing: Routing, sizes: tuple[int, ...], classes: frozenset[int], moving: frozenset[int],
                 toward_owner: bool) -> StepTraffic:
    """The expected traffic of one step (module docstring); `toward_owner` for combine, whose
    count of partials is dispatch's of copies. Per token, so the same for any token count."""
    return _traffic(routing.with_tokens(1), tuple(sizes), frozenset(classes), frozenset(moving))


@lru_cache(maxsize=4096)
def _traffic(routing: Routing, sizes: tuple[int, ...], classes: frozenset[int], moving: frozenset[int]
             ) -> StepTraffic:
    group = _product(sizes, moving)
    members = _product(sizes, range(len(sizes)))
    routing.experts_per_member(members)
    if routing.node_limit is None and not routing.skewed:
        classes_count = _product(sizes, classes)
        return StepTraffic((classes_count - classes_count // group) * _uniform_reach(routing, classes_count), group)
    return _sampled(routing, sizes, classes, moving, group)


def _uniform_reach(routing: Routing, classes_count: int) -> float:
    """The chance a token routed uniformly (its top-k of the experts, no node limit) has an
    expert in a given one of `classes_count` equal classes of experts."""
    per_class = routing.experts // classes_count
    return 1 - comb(routing.experts - per_class, routing.topk) / comb(routing.experts, routing.topk)


def _inner_level(sizes) -> int:
    return max((i for i, size in enumerate(sizes) if size > 1), default=len(sizes) - 1)


@lru_cache(maxsize=64)
def _experts(routing: Routing, nodes: int) -> tuple[np.ndarray, dict]:
    """SAMPLES tokens' experts [token, k] over `nodes` nodes, and the generator's state after
    them (the draw does not depend on the members: kept once for every group shape)."""
    if SAMPLES * routing.experts > _KEPT_KEYS:  # the keys too large to keep: drawn again
        rng = np.random.default_rng(SEED)
        experts = routing.sample(rng, SAMPLES, nodes)
        return experts, rng.bit_generator.state
    keys, state = _keys(replace(routing, tokens=1, node_limit=None, capacity=None))
    return routing.pick(keys, nodes), state


_KEPT_KEYS = 1 << 23  # router keys (8 bytes each) kept for every node count: up to 64 MiB


@lru_cache(maxsize=1)
def _keys(routing: Routing) -> tuple[list, dict]:
    """The router's keys of SAMPLES tokens (Routing.gumbel_keys) and the generator's state after
    them: what every node count's draw (`_experts`) picks from, drawn once."""
    rng = np.random.default_rng(SEED)
    keys = routing.gumbel_keys(rng, SAMPLES)
    return keys, rng.bit_generator.state


@lru_cache(maxsize=64)
def _drawn(routing: Routing, sizes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per level, of SAMPLES tokens: [level, k, token] the digit of each copy's host member
    times the level's stride (so a class's key is the sum over its levels), and [level, k,
    token] whether that digit differs from the owner's (a copy's tokens contiguous: counted a
    copy against another, `_distinct_count`)."""
    members = _product(sizes, range(len(sizes)))
    nodes = members // sizes[_inner_level(sizes)]
    experts, state = _experts(routing, nodes)  # [token, k]
    rng = np.random.default_rng(SEED)
    rng.bit_generator.state = state
    owners = rng.integers(members, size=SAMPLES)
    hosts = experts // routing.experts_per_member(members)
    host_digits = np.unravel_index(np.ascontiguousarray(hosts.T), sizes)  # [k, token] each
    owner_digits = np.unravel_index(owners, sizes)
    strides = [_product(sizes, range(level + 1, len(sizes))) for level in range(len(sizes))]
    scaled = np.stack([digits * stride for digits, stride in zip(host_digits, strides)]).astype(np.int32)
    differs = np.stack([host != owner[None, :] for host, owner in zip(host_digits, owner_digits)])
    scaled.setflags(write=False)
    differs.setflags(write=False)
    return scaled, differs


def _class_keys(scaled: np.ndarray, classes) -> np.ndarray:
    """[k, token] each copy's class: its host's digits on `classes` (others 0), raveled."""
    keys = np.zeros(scaled.shape[1:], dtype=np.int32)
    for level in sorted(classes):
        keys += scaled[level]
    return keys


def _sampled(routing, sizes, classes, moving, group) -> StepTraffic:
    scaled, differs = _drawn(routing, sizes)
    if not moving:
        return StepTraffic(0 / SAMPLES, group)
    leaves = np.logical_or.reduce([differs[level] for level in sorted(moving)])
    return StepTraffic(_distinct_count(np.where(leaves, _class_keys(scaled, classes), -1)) / SAMPLES, group)


def _distinct_count(keys: np.ndarray) -> int:
    """[k, token] keys: each token's distinct non-negative keys, summed over the tokens
    (`_distinct`'s count); for a few copies by comparing each with those before it, quicker
    than a sort of every token's keys."""
    if len(keys) > 16:
        return int(_distinct(np.ascontiguousarray(keys.T)).sum())
    first = keys >= 0
    for j in range(1, len(keys)):
        for i in range(j):
            first[j] &= keys[j] != keys[i]
    return int(first.sum())


def _distinct(keys: np.ndarray) -> np.ndarray:
    """[token, k] True at the first of each distinct non-negative key in a row (a row sort:
    the k keys of a token are few)."""
    keys.sort(axis=1)
    first = np.ones(keys.shape, dtype=bool)
    first[:, 1:] = keys[:, 1:] != keys[:, :-1]
    return first & (keys >= 0)


def step_pairs(routing: Routing, sizes: tuple[int, ...], classes: frozenset[int], moving: frozenset[int],
               toward_owner: bool) -> PairBytes:
    """The bytes every ordered pair of the step's groups carries in expectation (module
    docstring), keyed by the receiver (dispatch) or the sender (combine, `toward_owner`)."""
    per_token = _pair_copies(routing.with_tokens(1), tuple(sizes), frozenset(classes), frozenset(moving))
    return PairBytes(per_token * (routing.tokens * routing.bytes_per_token), not toward_owner)


@lru_cache(maxsize=1024)
def _pair_copies(routing: Routing, sizes: tuple[int, ...], classes: frozenset[int], moving: frozenset[int]
                 ) -> np.ndarray:
    """[member] per token owned, the copies (partials) a pair keyed by the member carries:
    prod(classes - moving) x the chance a token reaches the member's class on `classes`."""
    members = _product(sizes, range(len(sizes)))
    routing.experts_per_member(members)
    in_classes = np.array([level in classes for level in range(len(sizes))])
    digits = np.stack(np.unravel_index(np.arange(members), sizes), axis=-1)
    own_class = np.ravel_multi_index(tuple(np.where(in_classes, digits, 0).T), sizes)
    if routing.node_limit is None and not routing.skewed:
        reach = np.full(members, _uniform_reach(routing, _product(sizes, classes)))
    else:
        keys = np.ascontiguousarray(_class_keys(_drawn(routing, sizes)[0], classes).T)  # [token, k]
        reached = keys[_distinct(keys)]  # each token's distinct classes, once
        reach = (np.bincount(reached, minlength=members) / SAMPLES)[own_class]
    copies = _product(sizes, classes - moving) * reach
    if routing.capacity is not None:  # an expert drops tokens beyond capacity x its mean load
        copies = np.minimum(copies, routing.capacity * copies.mean())
    copies.setflags(write=False)
    return copies


def cut_copies(routing: Routing, sizes: tuple[int, ...], outer: frozenset[int]) -> float:
    """Per token, the expected copies that must leave its owner's unit of the levels `outer`
    (one per distinct destination unit other than the owner's): what any dispatch, and
    backwards any combine, carries across that cut at least."""
    return step_traffic(routing, tuple(sizes), frozenset(outer), frozenset(outer), False).copies
