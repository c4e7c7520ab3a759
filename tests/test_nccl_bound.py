"""The achievable bound (synth/model/bound.py achievable_line): the physical bound's cut with
each level's links at the rate NCCL reaches on them, worked by hand, and no program of the NCCL
model below it."""

from __future__ import annotations

import pytest

from synth.search.rank import Ranker
from synth.model.bound import achievable_bound, lower_bound
from synth.model.context import cost_context
from synth.model.nccl.hardware import level_efficiencies
from synth.topology_file import load_topology
from tests.test_simulate import CASES, hierarchy_of

GiB = 2 ** 30


def test_a100_node_achievable_is_the_ring_bound_at_20_of_25_gb_per_nvlink():
    """8 A100 on NVSwitch: 2 x 7/8 x S must leave a GPU; NCCL moves 20 of 25 GB/s per NVLink3
    link (topo.h SM80_NVLINK_BW), so 240 of 300 GB/s."""
    topology, hierarchy = hierarchy_of("dgx-a100", "data=8", "data")
    context = cost_context(hierarchy, topology)
    assert level_efficiencies(topology) == (pytest.approx(0.8),)
    assert achievable_bound(context, GiB).transfer_s == pytest.approx(2 * 7 / 8 * GiB / 240e9)
    assert lower_bound(context, GiB).transfer_s == pytest.approx(2 * 7 / 8 * GiB / 300e9)


def test_h100_nvls_achievable_is_s_at_nvls_efficiency():
    """The switch reduces: S per GPU, at NVLS's 0.85 of NCCL's 20.6 of 25 GB/s per NVLink4 link."""
    topology, hierarchy = hierarchy_of("dgx-h100", "data=8", "data")
    context = cost_context(hierarchy, topology)
    assert achievable_bound(context, GiB).transfer_s == pytest.approx(GiB / (450e9 * 20.6 / 25 * 0.85))


def test_a_topology_without_nccl_figures_keeps_line_rates():
    assert set(level_efficiencies(load_topology("emu-2x2x2"))) == {1.0}


@pytest.mark.parametrize("topology_name,axes,reduce,matrix", CASES + [("dgx-h100", "data=8", "data", None)])
def test_no_nccl_program_beats_the_achievable_bound(topology_name, axes, reduce, matrix):
    topology, hierarchy = hierarchy_of(topology_name, axes, reduce, matrix)
    ranker = Ranker(cost_context(hierarchy, topology, "nccl"), 3, "lockstep")
    for size, rows in zip((2 ** 20, 2 ** 30), ranker.rank((2 ** 20, 2 ** 30))):
        achievable = ranker.achievable_bound(size).time_s
        assert ranker.lower_bound(size).time_s <= achievable + 1e-15
        assert all(row.time_s >= achievable * (1 - 1e-9) for row in rows)
