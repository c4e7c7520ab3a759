"""Point-to-point as NCCL schedules it (synth/model/nccl/p2p.py) and the all-to-all priced from it:
channels per peer by NCCL's rule, the protocol switch at the documented per-peer size, per-call
overheads that now reach the all-to-all, and the per-class schedule equal to a per-pair one."""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synth.calibrate.all_to_all import predicted_times
from synth.errors import UsageError
from synth.model.nccl import p2p, tables
from synth.model.nccl.system import Hardware, Link, Network
from synth.topology import Figure
from synth.topology_file import load_topology, render_topology, topology_from_text

H100_NVSWITCH = Link("nvswitch", 450e9, 0.824, "test")
NDR = Link("infiniband", 50e9, 0.96, "test")


def hopper(nodes: int = 2) -> Hardware:
    return Hardware("hopper", 8, H100_NVSWITCH, Network(NDR, 8) if nodes > 1 else None)


@lru_cache(maxsize=None)
def h100() -> object:
    return load_topology("dgx-h100-2x8x8")


def with_level(topology, index: int, **changes):
    levels = list(topology.levels)
    levels[index] = dataclasses.replace(levels[index], **changes)
    return dataclasses.replace(topology, levels=tuple(levels))


# --- channels per peer ---------------------------------------------------------------------------


def test_net_peer_channels_follow_paths_cc():
    """2 per net peer, halved while 2 x ranks > 4 x p2pnChannels, at least the GPU's NICs, or
    NCCL_NCHANNELS_PER_NET_PEER when given (paths.cc:780-792)."""
    assert p2p.net_peer_channels(16, 16) == 2
    assert p2p.net_peer_channels(32, 16) == 2  # 2 x 32 = 64 = 4 x 16: not above
    assert p2p.net_peer_channels(33, 16) == 1
    assert p2p.net_peer_channels(4096, 32) == 1
    assert p2p.net_peer_channels(4096, 32, nics_per_gpu=2) == 2
    assert p2p.net_peer_channels(4096, 32, given=4) == 4


def test_communicator_p2p_channels():
    """p2pnChannels a power of two of the communicator's channels; per peer pow2Up of the least
    over peers (2 per NVLink inside a node), at most p2pnChannels; nChannelsMin halves while
    nChannelsMin x ranks > p2pnChannels."""
    one_node = p2p.p2p_comm(hopper(1), 1, 8, 24)
    assert one_node.channels == 32
    assert one_node.per_peer == 32  # pow2Up(2 x 18 NVLinks) = 64, at most 32
    assert one_node.least == 4  # 32 x 8 > 32 -> ... -> 4 x 8 = 32
    assert one_node.step == p2p.NVL_CHUNK
    two_nodes = p2p.p2p_comm(hopper(), 2, 8, 16)
    assert (two_nodes.channels, two_nodes.per_peer, two_nodes.least, two_nodes.step) == (16, 2, 1, p2p.NET_CHUNK)
    large = p2p.p2p_comm(hopper(), 512, 8, 32)
    assert (large.per_peer, large.least) == (1, 1)


def test_operation_channels_and_chunks():
    """addP2pToPlan: across nodes a part is between step/2 and step, doubling up to nChannelsMax;
    the network chunk is a quarter of the step below one step of bytes, half below eight."""
    comm = p2p.p2p_comm(hopper(), 2, 8, 16)  # per peer 2, least 1, step 128 KiB
    small = p2p.operation(comm, 100_000, True)
    assert (small.protocol, small.channels, small.chunk) == ("Simple", 1, p2p.NET_CHUNK // 4)
    assert small.posts == -(-100_000 // (p2p.NET_CHUNK // 4))
    mid = p2p.operation(comm, 1 << 19, True)  # 4 steps of bytes: half a step per chunk, 2 channels
    assert (mid.channels, mid.chunk) == (2, p2p.NET_CHUNK // 2)
    assert mid.posts == 2 * ((1 << 18) // (p2p.NET_CHUNK // 2))
    large = p2p.operation(comm, 1 << 24, True)
    assert (large.channels, large.chunk) == (2, p2p.NET_CHUNK)
    assert p2p.operation(comm, 1 << 24, False).posts == 0  # inside the node: no proxy


# --- protocol ------------------------------------------------------------------------------------


def test_protocol_switches_at_the_documented_per_peer_size():
    """LL while the bytes to a peer are at most nChannelsMax x NCCL_P2P_LL_THRESHOLD (16 KiB)."""
    comm = p2p.p2p_comm(hopper(), 2, 8, 16)
    threshold = comm.per_peer * 16384
    assert p2p.protocol_for(comm, threshold) == "LL"
    assert p2p.protocol_for(comm, threshold + 1) == "Simple"


def test_the_all_to_all_runs_the_protocol_nccl_picks():
    """Through the backend: a 16-GPU all-to-all (2 nodes) runs LL up to 2 x 16 KiB per peer."""
    from synth.model.backend import CallSite, canonical_coords
    from synth.model.nccl.backend import NCCL_MEASURED, _all_to_all_site
    from synth.model.network import network_for

    topology = h100()
    site = CallSite("AllToAll", canonical_coords(network_for(topology).coords[:16]), topology.levels, topology.nccl)
    plans = NCCL_MEASURED.plans(site)
    assert [plan.algorithm for plan in plans] == ["pairwise/LL", "pairwise/Simple"]
    threshold = _all_to_all_site(site)[1].comm.per_peer * 16384
    call_bytes = np.array([threshold * 16, (threshold + 1) * 16], dtype=float)
    flow = np.zeros((2, 2)) + 1e-5
    own = NCCL_MEASURED.alone_s(site, plans, call_bytes, flow)
    assert np.isfinite(own[0, 0]) and np.isinf(own[0, 1])
    assert np.isinf(own[1, 0]) and np.isfinite(own[1, 1])


# --- overheads reach the all-to-all --------------------------------------------------------------


def test_a_per_call_overhead_changes_the_all_to_all():
    """40 us of per-call overhead on the level a call spans adds 40 us to the all-to-all (it was
    ignored when the all-to-all was its flows alone)."""
    topology = h100()
    ranks, sizes = tuple(range(16)), [4096, 1 << 20]
    plain = predicted_times(topology, ranks, sizes)
    slower = predicted_times(with_level(topology, 1, overhead=Figure(40e-6, "test")), ranks, sizes)
    assert np.allclose(slower - plain, 40e-6, rtol=1e-6)


def test_the_proxy_floor_binds_for_many_small_messages(monkeypatch):
    """128 GPUs on 16 nodes at 64 KiB per peer: 2 x 120 network operations of 1-2 posts each on
    one proxy thread take longer than the bytes; a slower proxy step makes the call slower."""
    topology = with_level(h100(), 1, size=16)
    ranks, sizes = tuple(range(128)), [128 * 65536]
    before = float(predicted_times(topology, ranks, sizes)[0])
    monkeypatch.setitem(tables.NET_OVERHEAD, "intel", 1.0 + 40 / 3)  # 40 us more per Simple step
    after = float(predicted_times(topology, ranks, sizes)[0])
    assert after - before > 40e-6


def test_a_slow_nic_message_rate_binds():
    """A NIC's message rate (a topology figure) bounds a call of many small posts."""
    topology = h100()
    transport = dataclasses.replace(topology.levels[1].transport, message_rate=Figure(1e5, "test: a slow NIC"))
    slow = with_level(topology, 1, transport=transport)
    ranks, sizes = tuple(range(16)), [16 * 4096]
    assert predicted_times(slow, ranks, sizes)[0] > predicted_times(topology, ranks, sizes)[0] + 1e-4


def test_message_rate_round_trips_and_bad_values_say_so():
    topology = h100()
    transport = dataclasses.replace(topology.levels[1].transport, message_rate=Figure(330e6, "test"))
    text = render_topology(with_level(topology, 1, transport=transport))
    assert "message_rate = 330000000.0" in text
    assert topology_from_text(text, "test").levels[1].transport.message_rate.value == 330e6
    with pytest.raises(UsageError, match="message_rate"):
        topology_from_text(text.replace("message_rate = 330000000.0", 'message_rate = "fast"'), "test")


def test_the_all_to_all_never_gets_faster_with_more_bytes():
    """The engine's search bounds need a call's time alone non-decreasing in its bytes, across the
    protocol switch and the chunk and channel changes."""
    topology = h100()
    sizes = sorted({int(s) for s in np.geomspace(16, 1 << 26, 120)} | {16 * 32768, 16 * 32769, 16 * 131072})
    times = predicted_times(topology, tuple(range(16)), sizes)
    assert np.all(np.diff(times) >= -1e-15)


# --- per class equals per pair -------------------------------------------------------------------


def brute_schedule(comm: p2p.P2pComm, coords: np.ndarray, node_level: int | None, nbytes: int) -> p2p.Schedule:
    """The schedule from every pair one by one: each member's sends and receives, the busiest."""
    k = len(coords)
    posts, parts, protocols, widths = [], [], set(), set()
    for a in range(k):
        mine_posts, mine_parts = 0, 0
        for b in range(k):
            network = node_level is not None and bool((coords[a, :node_level + 1] != coords[b, :node_level + 1]).any())
            op = p2p.operation(comm, nbytes, network and a != b, itself=a == b)
            mine_parts += op.channels
            if a != b:
                mine_posts += 2 * op.posts
                if network or node_level is None or not any(
                        (coords[a, :node_level + 1] != coords[c, :node_level + 1]).any() for c in range(k)):
                    protocols.add(op.protocol)
                    widths.add(op.channels)
        posts.append(mine_posts)
        parts.append(mine_parts)
    per_channel = -(-max(parts) // comm.channels)
    batches = -(-per_channel // p2p.P2P_PER_BATCH)
    plans = max(1, -(-(batches * min(comm.channels, max(parts))) // (p2p.BATCHES_PER_PLAN - comm.per_peer)))
    (protocol,), (width,) = protocols, widths
    return p2p.Schedule(protocol, width, max(posts), batches, plans)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(2, 4), min_size=2, max_size=4), data=st.data())
def test_per_class_schedule_equals_per_pair(sizes, data):
    count = int(np.prod(sizes))
    chosen = data.draw(st.lists(st.integers(0, count - 1), min_size=2, max_size=min(count, 12), unique=True))
    coords = np.stack(np.unravel_index(np.array(chosen), sizes), axis=1)
    node_level = data.draw(st.sampled_from([None] + list(range(len(sizes) - 1))))
    nodes = 1 if node_level is None else len({tuple(row[:node_level + 1]) for row in coords.tolist()})
    comm_channels = data.draw(st.sampled_from([2, 8, 16, 24, 32]))
    nbytes = data.draw(st.integers(0, 1 << 22))
    hardware = hopper(nodes)
    ranks_per_node = max(np.unique(coords[:, :node_level + 1], axis=0, return_counts=True)[1]) if node_level is not None \
        else len(coords)
    comm = p2p.p2p_comm(hardware, nodes, int(ranks_per_node), comm_channels)
    classes = p2p.peer_classes(coords, node_level if nodes > 1 else None)
    assert p2p.schedule(comm, classes, nbytes) == brute_schedule(comm, coords, node_level if nodes > 1 else None,
                                                                 nbytes)


def test_4096_members_are_priced_by_class():
    """The all-to-all over 4096 GPUs: its peers are two classes, and its time is finite."""
    base = h100()
    rack, node, gpu = base.levels
    topology = dataclasses.replace(base, levels=(dataclasses.replace(rack, name="pod", size=4),
                                                 dataclasses.replace(rack, size=8),
                                                 dataclasses.replace(node, size=16), gpu))
    coords = np.stack(np.unravel_index(np.arange(4096), topology.sizes), axis=1)
    classes = p2p.peer_classes(coords, 2)
    assert classes == (p2p.PeerClass(4088, True), p2p.PeerClass(7, False))
    times = predicted_times(topology, tuple(range(4096)), [1 << 28])
    assert np.isfinite(times).all()


def test_headroom_is_the_time_the_proxy_holds_the_call_back():
    """Proxy-bound (128 GPUs on 16 nodes, 64 KiB per peer), the call's links could carry more:
    its headroom is positive, and what is left beyond its flows (the residual the engine adds to
    a shared step) is its fixed part, never negative."""
    from synth.model.backend import CallSite, canonical_coords
    from synth.model.nccl.backend import NCCL_MEASURED
    from synth.model.network import network_for

    topology = with_level(h100(), 1, size=16)
    site = CallSite("AllToAll", canonical_coords(network_for(topology).coords[:128]), topology.levels, topology.nccl)
    plans = NCCL_MEASURED.plans(site)
    call_bytes = np.array([128 * 1024, 128 * 65536, 128 * (1 << 22)], dtype=float)
    latency = np.array([sum(phase.latency_s for phase in plan.phases) for plan in plans])
    flow = latency[None, :] + call_bytes[:, None] * np.array([2e-11, 1e-11])[None, :]
    own = NCCL_MEASURED.alone_s(site, plans, call_bytes, flow)
    room = NCCL_MEASURED.headroom_s(site, plans, call_bytes, flow)
    picked = np.isfinite(own)
    assert room[1, 1] > 0
    assert np.all(own[picked] - flow[picked] - room[picked] >= -1e-15)
