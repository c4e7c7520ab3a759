"""The proxy floor of the NCCL model (synth/model/nccl/proxy.py): one host thread per GPU posts
every network step of every channel crossing the node at that GPU, each at NCCL's own per-step
cost (src/graph/tuning.cc:190-195 getNetOverhead, :316-322), so a ring call across nodes takes at
least baseLat + steps x loops x operations per step x that cost. Cases worked out by hand from
NCCL 2.26.2's source."""

from __future__ import annotations

from dataclasses import replace

import pytest

from synth.model.nccl import Call, Hardware, Link, Network, estimate, estimate_for, tuning
from synth.model.nccl.proxy import (operations_per_step, proxy_floor_s, ring_loops, tree_loops,
                                   tree_operations_per_loop)

GB = 1e9
NVLINK4 = Link("nvswitch", 450 * GB, 0.824, "topo.h SM90_NVLINK_BW")
IB400 = Network(Link("infiniband", 50 * GB, 0.96, "search.cc ladder"), 8)
RING_LL128 = Hardware("hopper", 8, NVLINK4, IB400, algorithms=("ring",), protocols=("LL128",))


def test_a_ring_ll128_call_over_two_h100_nodes_waits_for_its_proxy():
    """2 x 8 H100, 8 NICs, Intel hosts, ring/LL128 AllReduce of 1 MiB on the communicator's 16
    channels (8 ring channels at 48 GB/s doubled, connect.cc:452): each channel enters and leaves
    each node once, so the busiest proxy posts ceil(2 x 16 / 8) = 4 operations per step; 2 x 15 =
    30 steps; one loop (64 KiB per channel < 16 ranks x 576,000-byte LL128 chunk: 614,400-byte
    step x 120/128); 1 us per LL128 step (Intel). Floor: baseLat 14 + 30 x 4 x 1 = 134 us, above
    NCCL's own latency of 14 + 28 x 1.9 + 2 x 4.0 = 75.2 us and the 7 us of transfer."""
    call = Call("AllReduce", 2, 8, 1 << 20)
    table = tuning(RING_LL128, call)
    assert table.channels == 16
    assert table.get("ring", "LL128")[0] == pytest.approx(75.2)
    assert operations_per_step(RING_LL128, call, 16) == 4
    assert ring_loops(table, RING_LL128, call, "LL128", 16) == 1
    assert proxy_floor_s(table, RING_LL128, call, "ring", "LL128", 16) == pytest.approx(134e-6)
    e = estimate(RING_LL128, call)
    assert (e.choice.algorithm, e.choice.protocol, e.choice.channels) == ("ring", "LL128", 16)
    assert e.time_s == pytest.approx(134e-6)


def test_a_ring_of_24_channels_posts_every_channels_receive_alone():
    """NCCL_MIN_CTAS=24 on 2 x 8 H100: channels 16-23 copy channels 0-7 (copyChannels, round
    robin), so each GPU's proxy still serves 3 entries and 3 exits: ceil(2 x 24 / 8) = 6 operations
    per step, floor 14 + 30 x 6 x 1 = 194 us. No grouped receives: a ring or tree connection owns
    its receive comm (net.cc recvSetup: shared = 0 when a graph is given; recvProxyConnect accepts
    one per connection), and recvProxyProgress groups only subs sharing one, so each channel's
    receive is its own irecv and test."""
    call = Call("AllReduce", 2, 8, 1 << 20)
    table = tuning(RING_LL128, call)
    assert operations_per_step(RING_LL128, call, 24) == 6
    assert proxy_floor_s(table, RING_LL128, call, "ring", "LL128", 24) == pytest.approx(194e-6)


def test_amd_hosts_pay_twice_the_per_step_cost():
    """getNetOverhead: 2 us per step on AMD CPUs: 14 + 30 x 4 x 2 = 254 us."""
    amd = replace(RING_LL128, cpu="amd")
    call = Call("AllReduce", 2, 8, 1 << 20)
    assert estimate(amd, call).time_s == pytest.approx(254e-6)


def test_simple_steps_cost_three_times_and_large_calls_run_more_loops():
    """ring/Simple, 4 MiB buffers: 512 KiB steps, 2 MiB chunks (ALLREDUCE_CHUNKSTEPS 4). 1 GiB over
    16 channels: 64 MiB per channel over 16 ranks x 2 MiB = 2 loops of 30 steps, 4 operations each
    at 3 us: floor 8.4 + 2 x 30 x 4 x 3 = 728.4 us, far below the ~2.9 ms transfer (no effect)."""
    simple = replace(RING_LL128, protocols=("Simple",))
    call = Call("AllReduce", 2, 8, 1 << 30)
    table = tuning(simple, call)
    assert ring_loops(table, simple, call, "Simple", 16) == 2
    assert proxy_floor_s(table, simple, call, "ring", "Simple", 16) == pytest.approx(728.4e-6)
    e = estimate(simple, call)
    assert e.time_s > 2e-3 and e.latency_s == pytest.approx(table.get("ring", "Simple")[0] * 1.4e-6)


def test_no_proxy_floor_inside_a_node_nor_for_the_nvls_tree():
    """One node has no network connection; the NVLS tree's fill counts its proxy stages."""
    one_node = Call("AllReduce", 1, 8, 1 << 20)
    hardware = Hardware("hopper", 8, NVLINK4, IB400, nvls=True)
    assert proxy_floor_s(tuning(hardware, one_node), hardware, one_node, "ring", "LL128", 16) == 0.0
    two_nodes = Call("AllReduce", 2, 8, 1 << 20)
    table = tuning(hardware, two_nodes)
    assert proxy_floor_s(table, hardware, two_nodes, "nvls_tree", "Simple", 16) == 0.0
    nvls_tree = estimate_for(hardware, two_nodes, "nvls_tree", "Simple")
    assert nvls_tree.latency_s == pytest.approx(table.get("nvls_tree", "Simple")[0] * 1e-6)


def test_a_tree_ll128_call_over_eight_h100_nodes_waits_for_its_proxy():
    """8 x 8 H100, tree/LL128 AllReduce of 4 MiB on 16 channels: 256 KiB per channel. The LL128
    chunk (576,000 bytes) shrinks for it (enqueue.cc:1901-1909, nsteps = 1 + log2 8 + 0.1 x 8 =
    4.8): halved while bytes/chunk < 4.8 x 64 / 8 = 38.4 and chunk > 128 KiB (72,000), then while
    < 9.6 and > 32 KiB (18,000): 15 loops. An inner node of the double binary tree has 3 network
    peers, one operation each per direction: 6 per loop and channel, 2 channels per GPU (16 over
    8 NICs): 15 x 12 = 180 operations at 1 us. Floor 14 + 180 = 194 us, above NCCL's latency
    14 + 2 x (7 x 1.25 + 3 x 8.5) = 82.5 us plus 36 us of transfer (measured on
    NVIDIA/nccl-tests#309's 8-node cluster: 204 us)."""
    hardware = Hardware("hopper", 8, NVLINK4, IB400, algorithms=("tree",), protocols=("LL128",))
    call = Call("AllReduce", 8, 8, 4 << 20)
    table = tuning(hardware, call)
    assert table.get("tree", "LL128")[0] == pytest.approx(82.5)
    assert tree_loops(table, hardware, call, "LL128", 16) == 15
    assert tree_operations_per_loop(hardware, call, 16) == 12
    e = estimate(hardware, call)
    assert (e.choice.algorithm, e.choice.channels) == ("tree", 16)
    assert e.time_s == pytest.approx(194e-6)


def test_a_tree_across_two_nodes_has_one_peer():
    """Two nodes: one network peer per tree node, 2 operations per loop and channel."""
    call = Call("AllReduce", 2, 8, 4 << 20)
    assert tree_operations_per_loop(Hardware("hopper", 8, NVLINK4, IB400), call, 16) == 4


def test_proxy_threads_of_one_process_share_the_cores_its_launcher_bound_it_to():
    """nccl-tests -g 8 under mpirun -n 2 (Open MPI binds each process to one core: 2 hardware
    threads): the 8 proxy threads of the process share 2 CPUs, so each step's host work takes 4x;
    the same call launched one process per GPU, or unbound, keeps 1x. The 1 MiB ring/LL128
    call above: baseLat 14 + 30 steps x 4 operations x 1 us x 4 = 494 us."""
    from synth.model.nccl.proxy import cpu_share

    call = Call("AllReduce", 2, 8, 1 << 20)
    table = tuning(RING_LL128, call)
    bound = replace(RING_LL128, gpus_per_thread=8, cpu_cores=1)
    assert cpu_share(bound) == 4
    assert proxy_floor_s(table, bound, call, "ring", "LL128", 16) == pytest.approx(494e-6)
    assert cpu_share(replace(RING_LL128, gpus_per_thread=8)) == 1  # not bound
    assert cpu_share(replace(RING_LL128, cpu_cores=1)) == 1  # one GPU per process
    assert cpu_share(replace(RING_LL128, gpus_per_thread=2, cpu_cores=1)) == 1  # a CPU per thread
    assert cpu_share(replace(RING_LL128, gpus_per_thread=8, cpu_cores=2)) == 2
    # NCCL's choice reads its tables, not the host: the same pick either way
    assert tuning(bound, call) == table


def test_an_oversubscribed_process_may_wait_a_scheduler_slice_across_nodes_only():
    """Its busy threads (a proxy per GPU and the launching thread) outnumber its CPUs: -g 2 on
    one core (3 threads, 2 hardware threads) may wait one slice; -g 1, unbound, or one node not."""
    from synth.model.nccl.proxy import SCHED_SLICE_S, host_stall_s, oversubscribed

    across, inside = Call("AllReduce", 2, 2, 1 << 20), Call("AllReduce", 1, 8, 1 << 20)
    bound = replace(RING_LL128, gpus_per_thread=2, cpu_cores=1)
    assert oversubscribed(bound) and host_stall_s(bound, across) == SCHED_SLICE_S == 3e-3
    assert host_stall_s(bound, inside) == 0.0
    assert host_stall_s(replace(RING_LL128, gpus_per_thread=8), across) == 0.0
    assert host_stall_s(replace(RING_LL128, cpu_cores=1), across) == 0.0
    assert not oversubscribed(replace(RING_LL128, gpus_per_thread=2, cpu_cores=2))
    # the stall is an interval's, not the prediction's
    assert estimate(bound, across).time_s == estimate(replace(bound, cpu_cores=None), across).time_s


def test_the_bound_cores_are_read_written_and_checked_in_a_topology_file():
    """`[nccl] cpu_cores` is a figure a user edits: it round-trips, and a value that is not a
    positive whole number is refused with its name, never read as another figure."""
    from synth.errors import UsageError
    from synth.topology_file import load_topology, render_topology, topology_from_text

    base = load_topology("dgx-h100-2x8x8")
    bound = replace(base, nccl=replace(base.nccl, cpu_cores=2))
    text = render_topology(bound)
    assert topology_from_text(text, "test.toml").nccl.cpu_cores == 2
    assert load_topology("dgx-h100-2x8x8").nccl.cpu_cores is None  # unbound unless a file says so
    for bad in ("0", "-1", "1.5", '"two"'):
        with pytest.raises(UsageError, match="cpu_cores"):
            topology_from_text(text.replace("cpu_cores = 2", f"cpu_cores = {bad}"), "test.toml")
