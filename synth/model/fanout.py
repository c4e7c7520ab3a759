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

Under a skew the busiest member, not the mean, finishes the exchange: the hottest sender's
or receiver's load over the mean (`hot`), capped by the capacity factor, scales the step's
bytes (priced as if every pair carried the hottest member's per-peer load: an upper estimate).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import comb

import numpy as np

from synth.routing import Routing

SAMPLES = 1 << 14
SEED = 2024


@dataclass(frozen=True)
class StepTraffic:
    """Per token owned: copies sent in expectation (`copies`), the busiest receiver's load
    over the mean (`hot`, 1 without a skew); and the step's group size `peers + 1`."""

    copies: float
    hot: float
    group: int

    def span_bytes(self, routing: Routing) -> float:
        """Bytes one member sends in the step, spread evenly over its group as an equal-split
        all-to-all of that span would (the engine's pairwise flows): its per-peer load is the
        expected one, times `hot`."""
        if self.group < 2:
            return 0.0
        per_peer = routing.tokens * routing.bytes_per_token * self.copies * self.hot / (self.group - 1)
        return per_peer * self.group


def _product(sizes, levels) -> int:
    result = 1
    for level in levels:
        result *= sizes[level]
    return result


def step_traffic(routing: Routing, sizes: tuple[int, ...], classes: frozenset[int], moving: frozenset[int],
                 toward_owner: bool) -> StepTraffic:
    """The expected traffic of one step (module docstring); `toward_owner` for combine. Per
    token, so the same for any token count."""
    return _traffic(routing.with_tokens(1), tuple(sizes), frozenset(classes), frozenset(moving), toward_owner)


@lru_cache(maxsize=4096)
def _traffic(routing: Routing, sizes: tuple[int, ...], classes: frozenset[int], moving: frozenset[int],
             toward_owner: bool) -> StepTraffic:
    group = _product(sizes, moving)
    members = _product(sizes, range(len(sizes)))
    routing.experts_per_member(members)
    if routing.node_limit is None and not routing.skewed:
        classes_count = _product(sizes, classes)
        per_class = routing.experts // classes_count
        reached = 1 - comb(routing.experts - per_class, routing.topk) / comb(routing.experts, routing.topk)
        return StepTraffic((classes_count - classes_count // group) * reached, 1.0, group)
    return _sampled(routing, sizes, classes, moving, toward_owner, group)


def _inner_level(sizes) -> int:
    return max((i for i, size in enumerate(sizes) if size > 1), default=len(sizes) - 1)


@lru_cache(maxsize=64)
def _experts(routing: Routing, nodes: int) -> tuple[np.ndarray, dict]:
    """SAMPLES tokens' experts [token, k] over `nodes` nodes, and the generator's state after
    them (the draw does not depend on the members: kept once for every group shape)."""
    rng = np.random.default_rng(SEED)
    experts = routing.sample(rng, SAMPLES, nodes)
    return experts, rng.bit_generator.state


@lru_cache(maxsize=64)
def _drawn(routing: Routing, sizes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(host digits [token, k, level], owner digits [token, 1, level]) of SAMPLES tokens."""
    members = _product(sizes, range(len(sizes)))
    nodes = members // sizes[_inner_level(sizes)]
    experts, state = _experts(routing, nodes)  # [token, k]
    rng = np.random.default_rng(SEED)
    rng.bit_generator.state = state
    owners = rng.integers(members, size=SAMPLES)
    hosts = experts // routing.experts_per_member(members)
    return (np.stack(np.unravel_index(hosts, sizes), axis=-1).astype(np.int32),
            np.stack(np.unravel_index(owners, sizes), axis=-1).astype(np.int32)[:, None, :])


def _sampled(routing, sizes, classes, moving, toward_owner, group) -> StepTraffic:
    members = _product(sizes, range(len(sizes)))
    host_digits, owner_digits = _drawn(routing, sizes)
    hosts = host_digits[..., 0]
    in_classes = np.array([level in classes for level in range(len(sizes))])
    in_moving = np.array([level in moving for level in range(len(sizes))])
    projected = np.where(in_classes, host_digits, 0)
    differs = (host_digits != owner_digits)[..., in_moving].any(axis=-1) if in_moving.any() else np.zeros(hosts.shape, bool)
    keys = np.ravel_multi_index(tuple(np.moveaxis(projected, -1, 0)), sizes) + members * np.arange(SAMPLES)[:, None]
    sent_keys, first = np.unique(keys[differs], return_index=True)
    copies = len(sent_keys) / SAMPLES
    hot = 1.0
    if routing.skewed and len(sent_keys):
        owner_all = np.broadcast_to(owner_digits, host_digits.shape)
        if toward_owner:  # a partial leaves from the expert's digits on `classes` for the owner's on `moving`
            ends = (~in_classes, ~in_classes | in_moving)
        else:  # a copy leaves from the destination's digits on the resolved levels for its digits on `classes`
            ends = (~in_classes | in_moving, ~in_classes)
        for take_owner in ends:  # the busiest sender and the busiest receiver
            digits = np.where(take_owner, owner_all, host_digits)[differs][first]
            load = np.bincount(np.ravel_multi_index(tuple(digits.T), sizes), minlength=members)
            hot = max(hot, float(load.max() / load.mean()))
        if routing.capacity is not None:
            hot = min(hot, routing.capacity)
    return StepTraffic(copies, hot, group)


def cut_copies(routing: Routing, sizes: tuple[int, ...], outer: frozenset[int]) -> float:
    """Per token, the expected copies that must leave its owner's unit of the levels `outer`
    (one per distinct destination unit other than the owner's): what any dispatch, and
    backwards any combine, carries across that cut at least."""
    return step_traffic(routing, tuple(sizes), frozenset(outer), frozenset(outer), False).copies
