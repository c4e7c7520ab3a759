"""The classic tree's time at mid sizes (synth/model/nccl/tables.tree_correction,
chunking.ll128_tree_stages): NCCL's own measured tree efficiency by size, which the time on the
hardware applies as it applies the ring plateau, and the LL128 tree's pipeline fill over the
steps calcCollChunking counts (enqueue.cc nstepsLL128, v2.26.2). Cases worked by hand."""

from __future__ import annotations

import pytest

from synth.model.nccl import Call, Hardware, Link, Network, estimate_for, tuning
from synth.model.nccl.chunking import chunk_bytes, ll128_tree_stages
from synth.model.nccl.tables import tree_correction

GB = 1e9
MiB = 2 ** 20
HGX_H100 = Hardware("hopper", 8, Link("nvswitch", 450 * GB, 20.6 / 25, "topo.h SM90_NVLINK_BW"),
                    Network(Link("infiniband", 50 * GB, 0.96, "search.cc ladder"), 8), nvls=True)


@pytest.mark.parametrize("nbytes, protocol, factor", [
    (MiB, "LL128", 0.6),  # log2i(2^20 >> 6) = 14: treeCorrectionFactor[LL128][14]
    (4 * MiB, "LL128", 0.8),  # class 16
    (128 * 2 ** 10, "LL", 0.5),  # class 11
    (64, "Simple", 0.9),  # class 0
    (512 * MiB, "LL128", 1.0),  # class 23: past the table (64 B to 256 MB)
])
def test_the_tree_correction_is_nccls_factor_for_the_size_class(nbytes, protocol, factor):
    assert tree_correction(Call("AllReduce", 8, 8, nbytes), "tree", protocol) == factor


def test_the_tree_correction_leaves_other_algorithms_and_collectives_alone():
    assert tree_correction(Call("AllReduce", 8, 8, MiB), "ring", "LL128") == 1.0
    assert tree_correction(Call("AllReduce", 8, 8, MiB), "nvls_tree", "Simple") == 1.0
    assert tree_correction(Call("ReduceScatter", 8, 8, MiB), "tree", "LL128") == 1.0
    assert tree_correction(Call("AllReduce", 8, 8, 32), "tree", "LL128") == 1.0  # below 64 B


def test_a_tree_reaches_nccls_ceiling_at_the_corrected_share():
    """1 and 4 MiB on 8 nodes run the LL128 tree on all 16 channels (16 x 640 x 8 B < 1 MiB),
    bound by NCCL's per-channel LL128 tree maximum, so the transfers differ by the size and the
    factors: 4 x 0.6 / 0.8 = 3."""
    small = estimate_for(HGX_H100, Call("AllReduce", 8, 8, MiB), "tree", "LL128")
    large = estimate_for(HGX_H100, Call("AllReduce", 8, 8, 4 * MiB), "tree", "LL128")
    assert small.choice.channels == large.choice.channels == 16
    assert small.bottleneck == large.bottleneck == "protocol"
    assert large.transfer_s / small.transfer_s == pytest.approx(3.0)


def test_the_correction_leaves_the_links_rates_alone():
    """A Simple tree has no measured ceiling in NCCL's table (its per-channel tree figure is a
    budget), so its time at 128 MiB (factor 0.9) is the links' alone: bytes over the rate its
    busiest resource drains them at."""
    e = estimate_for(HGX_H100, Call("AllReduce", 8, 8, 128 * MiB), "tree", "Simple")
    assert e.bottleneck in ("intra", "net")
    (load,) = [load for load in e.loads if load.resource == e.bottleneck]
    assert e.transfer_s == pytest.approx(load.seconds)


@pytest.mark.parametrize("nodes, stages", [(1, 0.8), (2, 1.8), (4, 2.8), (8, 3.8), (16, 4.8)])
def test_the_ll128_tree_fills_over_nccls_steps_less_the_one_the_transfer_counts(nodes, stages):
    assert ll128_tree_stages(Call("AllReduce", nodes, 8, MiB)) == pytest.approx(stages)


def test_the_ll128_tree_chunk_of_a_1_mib_call_over_8_nodes_by_hand():
    """enqueue.cc calcCollChunking, per channel (64 KiB of 1 MiB on 16 channels): LL128's step is
    4,915,200 / 8 = 614,400 B of lines, 576,000 B of data; nstepsLL128 = 1 + 3 + 0.8 = 4.8;
    halved while 64 KiB / chunk < 4.8 x 64 / 8 and chunk > 128 KiB: 72,000; then while
    64 KiB / chunk < 4.8 x 16 / 8 and chunk > 32 KiB: 36,000, 18,000."""
    call = Call("AllReduce", 8, 8, MiB)
    assert chunk_bytes(tuning(HGX_H100, call), HGX_H100, call, "tree", "LL128", 16) == 18000


def test_the_fill_is_the_stages_times_one_chunk_at_the_channels_rate():
    call = Call("AllReduce", 8, 8, MiB)
    e = estimate_for(HGX_H100, call, "tree", "LL128")
    per_channel = MiB / e.transfer_s / e.choice.channels  # bytes/s of one channel
    assert e.fill_s == pytest.approx(3.8 * 18000 / per_channel)
    ring = estimate_for(HGX_H100, call, "ring", "LL128")
    assert ring.fill_s == 0.0  # rings stream from the first step
