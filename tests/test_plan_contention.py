"""Link contention between overlapped and critical-path communication (synth/plan/contention.py):
which links two collectives share follows from their groups' spans; the share and the stretch
by hand; in the step, present where the gradient reduction shares the network with the
context-parallel exchange and absent where tensor parallelism stays on NVLink."""

from __future__ import annotations

import pytest

from synth.placement import make_placement
from synth.plan.contention import Background, level_capacity, moved_bytes, shared_share, stretch
from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import Degrees
from synth.plan.model import PRESETS
from synth.plan.step import Compute, Settings, predict
from synth.topology_file import load_topology


def test_bytes_moved_by_hand():
    assert moved_bytes(1 << 20, 4) == 3 * (1 << 18)  # S (n-1)/n
    assert moved_bytes(1 << 20, 4, all_reduce=True) == 3 * (1 << 19)
    assert moved_bytes(1 << 20, 1) == 0


def test_level_capacity_from_the_topology():
    selene = load_topology("selene")
    # node level: 200 Gb/s per GPU (its own HCA), eight 200 Gb/s uplinks shared by 8 GPUs: 25 GB/s
    assert level_capacity(selene, 0) == pytest.approx(25e9)
    assert level_capacity(selene, 1) == pytest.approx(300e9)  # NVLink, each direction


def test_stretch_by_hand():
    # a quarter of the link taken half the time: 1 s of foreground runs at 3/4 half the time
    assert stretch(1.0, 0.25, 0.5) == pytest.approx(0.5 * 0.25 / 0.75)
    assert stretch(1.0, 0.8, 1.0) == 1.0  # a saturated link shared equally: twice as long
    assert stretch(1.0, 0.0, 1.0) == 0.0 and stretch(0.0, 0.5, 1.0) == 0.0


def _selene_placement(degrees, matrix):
    topology = load_topology("selene")
    return topology, make_placement(topology, degrees.axes(), matrix)


def test_shared_share_only_where_both_span_the_slowest_level():
    # dp 8 across the nodes, cp 8 inside them: the context exchange is paced by NVLink, which the
    # gradient reduction (all on InfiniBand) does not use
    degrees = Degrees(8, 1, 1, 8)
    topology, placement = _selene_placement(degrees, ((8, 1), (1, 8)))
    costs = CommunicationCosts(topology)
    background = Background(("dp",), 1e9, 0.1, 1.0)
    assert shared_share(costs, placement, ("cp",), background) == 0.0
    # swapped (cp across the nodes, dp inside): cp is paced by InfiniBand, which dp does not span
    _, swapped = _selene_placement(degrees, ((1, 8), (8, 1)))
    assert shared_share(costs, swapped, ("cp",), background) == 0.0
    # both across nodes (dp 2 x cp 4 over 8 nodes): the reduction takes 10 GB/s of the 25 GB/s
    degrees = Degrees(2, 8, 1, 4)
    topology, placement = _selene_placement(degrees, ((2, 1), (4, 1), (1, 8)))
    assert shared_share(costs, placement, ("cp",), background) == pytest.approx(1e9 / 0.1 / 25e9)
    assert shared_share(costs, placement, ("tp",), background) == 0.0  # tp on NVLink
    assert shared_share(costs, placement, ("cp",), Background(("dp",), 1e9, 0.01, 1.0)) == 1.0


def _step(degrees, matrix, **settings):
    topology, placement = _selene_placement(degrees, matrix)
    costs = CommunicationCosts(topology)
    compute = Compute(312e12, 0.5, 80 * 2 ** 30, 2e12)
    model = PRESETS["gpt3-1.3b"]
    return predict(model, compute, costs, degrees, placement, Settings(1, **settings))


def test_contention_in_the_step_is_computed_from_the_links():
    # cp across the nodes with dp: the gradient reduction behind backward slows the exchange
    shared = _step(Degrees(2, 8, 1, 4), ((2, 1), (4, 1), (1, 8)), sequence_parallel=True)
    assert shared.breakdown.contention > 0
    assert shared.step_s == pytest.approx(shared.breakdown.total)
    # tp inside the node, dp across: no link in common, nothing added
    apart = _step(Degrees(8, 8, 1), ((8, 1), (1, 8)), sequence_parallel=True)
    assert apart.breakdown.contention == 0.0
    # without the overlap there is nothing running beside the critical path
    serial = _step(Degrees(2, 8, 1, 4), ((2, 1), (4, 1), (1, 8)), sequence_parallel=True, overlap_gradients=False)
    assert serial.breakdown.contention == 0.0


def test_overlapped_pipeline_transfers_share_the_network_with_the_context_exchange():
    # pp 2 and cp 4 across the nodes, tp 8 inside: with the interleaved schedule's overlap each
    # transfer runs beside its chunk's context-parallel exchange on InfiniBand
    degrees, matrix = Degrees(1, 8, 2, 4), ((2, 1), (4, 1), (1, 8))
    overlapped = _step(degrees, matrix, virtual=2, sequence_parallel=True, overlap_p2p=True)
    assert overlapped.breakdown.context_parallel > 0 and overlapped.breakdown.contention > 0
    assert overlapped.step_s == pytest.approx(overlapped.breakdown.total)
    serial = _step(degrees, matrix, virtual=2, sequence_parallel=True, overlap_p2p=False)
    assert serial.breakdown.contention == 0.0
