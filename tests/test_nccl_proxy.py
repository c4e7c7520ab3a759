"""The proxy floor of the NCCL model (synth/model/nccl/proxy.py) as NCCL 2.26.2 prices it: one
nsteps x net overhead per call inside the ring's latency (src/graph/tuning.cc:190-195
getNetOverhead, :316-322 "Inter-node rings still have to launch nsteps * net overhead"), not
multiplied by the ring's loops nor by the channels a proxy thread serves, not charged to the
classic tree; net.cc posts one request per slice. Cases worked out by hand from the source."""

from __future__ import annotations

from dataclasses import replace

import pytest

from synth.model.nccl import Call, Hardware, Link, Network, estimate, estimate_for, tuning
from synth.model.nccl.proxy import posts_per_pass, proxy_floor_s, ring_steps

GB = 1e9
NVLINK4 = Link("nvswitch", 450 * GB, 0.824, "topo.h SM90_NVLINK_BW")
IB400 = Network(Link("infiniband", 50 * GB, 0.96, "search.cc ladder"), 8)
RING_LL128 = Hardware("hopper", 8, NVLINK4, IB400, algorithms=("ring",), protocols=("LL128",))


def test_a_ring_call_pays_nsteps_times_the_net_overhead_once():
    """2 x 8 H100, ring/LL128 AllReduce of 1 MiB on 16 channels: nsteps = 2 x 15 = 30, 1 us per
    LL128 step (Intel): floor baseLat 14 + 30 = 44 us, whatever the channels (the old floor,
    ceil(2 x 16 / 8) = 4 operations per step, was 134 us). NCCL's own latency, 14 + 28 x
    max(1.9, 1) + 2 x 4.0 = 75.2 us, already holds it: the floor does not bind."""
    call = Call("AllReduce", 2, 8, 1 << 20)
    table = tuning(RING_LL128, call)
    assert table.channels == 16
    assert table.get("ring", "LL128")[0] == pytest.approx(75.2)
    assert proxy_floor_s(table, RING_LL128, call, "ring", "LL128", 16) == pytest.approx(44e-6)
    assert proxy_floor_s(table, RING_LL128, call, "ring", "LL128", 2) == pytest.approx(44e-6)
    e = estimate(RING_LL128, call)
    assert e.latency_s == pytest.approx(75.2e-6)


def test_amd_hosts_pay_twice_the_per_step_cost():
    """getNetOverhead: 2 us per step on AMD CPUs: 14 + 30 x 2 = 74 us."""
    amd = replace(RING_LL128, cpu="amd")
    call = Call("AllReduce", 2, 8, 1 << 20)
    assert proxy_floor_s(tuning(amd, call), amd, call, "ring", "LL128", 16) == pytest.approx(74e-6)


def test_simple_steps_cost_three_times_and_large_calls_pay_once():
    """ring/Simple over 1 GiB: 8.4 + 30 x 3 = 98.4 us, the same for every loop count (the old
    floor multiplied by 2 loops and 4 operations: 728.4 us)."""
    simple = replace(RING_LL128, protocols=("Simple",))
    small, large = Call("AllReduce", 2, 8, 1 << 20), Call("AllReduce", 2, 8, 1 << 30)
    for call in (small, large):
        assert proxy_floor_s(tuning(simple, call), simple, call, "ring", "Simple", 16) == pytest.approx(98.4e-6)


def test_one_post_per_slice():
    """net.cc posts sliceSteps at a time: a Simple ring step (ALLREDUCE_CHUNKSTEPS 4 over
    SLICESTEPS 2) is two posts, an LL or LL128 step one; AllGather's pass is n - 1 steps."""
    all_reduce, all_gather = Call("AllReduce", 2, 8, 1 << 20), Call("AllGather", 2, 8, 1 << 20)
    assert ring_steps(all_reduce) == 30 and ring_steps(all_gather) == 15
    assert posts_per_pass(all_reduce, "Simple") == 60
    assert posts_per_pass(all_reduce, "LL128") == 30
    assert posts_per_pass(all_gather, "LL") == 15


def test_no_proxy_floor_inside_a_node_for_the_tree_nor_the_nvls_tree():
    """One node has no network connection; NCCL's tree latency has no per-step net overhead;
    the NVLS tree's fill counts its proxy stages."""
    one_node = Call("AllReduce", 1, 8, 1 << 20)
    hardware = Hardware("hopper", 8, NVLINK4, IB400, nvls=True)
    assert proxy_floor_s(tuning(hardware, one_node), hardware, one_node, "ring", "LL128", 16) == 0.0
    two_nodes = Call("AllReduce", 2, 8, 1 << 20)
    table = tuning(hardware, two_nodes)
    assert proxy_floor_s(table, hardware, two_nodes, "nvls_tree", "Simple", 16) == 0.0
    assert proxy_floor_s(table, hardware, two_nodes, "tree", "LL128", 16) == 0.0
    nvls_tree = estimate_for(hardware, two_nodes, "nvls_tree", "Simple")
    assert nvls_tree.latency_s == pytest.approx(table.get("nvls_tree", "Simple")[0] * 1e-6)


def test_a_tree_call_over_eight_nodes_is_nccl_latency_plus_transfer():
    """8 x 8 H100, tree/LL128 AllReduce of 4 MiB: NCCL's latency 14 + 2 x (7 x 1.25 + 3 x 8.5) =
    82.5 us, no proxy floor on top (the old floor charged 15 loops x 12 operations: 194 us)."""
    hardware = Hardware("hopper", 8, NVLINK4, IB400, algorithms=("tree",), protocols=("LL128",))
    call = Call("AllReduce", 8, 8, 4 << 20)
    assert tuning(hardware, call).get("tree", "LL128")[0] == pytest.approx(82.5)
    e = estimate(hardware, call)
    assert e.latency_s == pytest.approx(82.5e-6)
    assert e.time_s == pytest.approx(e.latency_s + e.fill_s + e.transfer_s)
