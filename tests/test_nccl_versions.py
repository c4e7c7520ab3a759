"""NCCL by version: `[nccl] version` and `symmetric` change the prediction where NCCL's source
changed (2.27's symmetric kernels for registered windows inside one node, 2.27's 24 NVLS
channels inside one Blackwell node or NVLink domain) and nowhere else."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from synth.errors import UsageError
from synth.model.nccl import symmetric
from synth.model.nccl.hardware import call_for, estimate_group, nccl_view
from synth.model.nccl.names import DEFAULT_VERSION, NCCL_VERSIONS
from synth.topology import NcclSystem
from synth.topology_file import builtin_topology_names, load_topology, render_topology, topology_from_text

SIZES = (1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 28)
COLLECTIVES = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast")


def _as(topology, version: str, registered: bool = False):
    system = topology.nccl or NcclSystem("ampere", "assumed")
    return replace(topology, nccl=replace(system, version=version, symmetric=registered))


def _groups(topology):
    n = topology.device_count
    inner = topology.sizes[-1]
    return [list(range(min(inner, n))), list(range(n))]


def _blackwell_nvls(topology) -> bool:
    return topology.nccl is not None and topology.nccl.generation == "blackwell" and topology.nccl.nvls


@pytest.mark.parametrize("name", [n for n in builtin_topology_names()])
def test_without_registered_buffers_the_versions_agree_except_blackwell_nvls_channels(name):
    topology = load_topology(name)
    if not topology.has_link_figures:
        pytest.skip("no link figures: nothing NCCL prices")
    assert topology.nccl is None or topology.nccl.version is None  # built-ins take the default
    # Blackwell's per-channel caps move from 2.28 (test_blackwell_per_channel_caps_...): up to 2.27 here
    blackwell = topology.nccl is not None and topology.nccl.generation == "blackwell"
    old, new = _as(topology, "2.26"), _as(topology, "2.27" if blackwell else DEFAULT_VERSION)
    for devices in _groups(topology):
        for collective in COLLECTIVES:
            for nbytes in SIZES:
                a = estimate_group(old, devices, collective, nbytes)
                b = estimate_group(new, devices, collective, nbytes)
                assert (a.choice.algorithm, a.choice.protocol) == (b.choice.algorithm, b.choice.protocol)
                if a.choice.algorithm in ("nvls", "nvls_tree") and _blackwell_nvls(topology) and a.call.nodes == 1:
                    assert (a.choice.channels, b.choice.channels) == (32, 24)  # nvls.cc NVLS_NCHANNELS_SM100_NVL
                else:
                    assert a.time_s == b.time_s and a.choice == b.choice


def test_the_default_is_the_newest_and_2_26_stays_the_transcribed_tables():
    assert DEFAULT_VERSION == NCCL_VERSIONS[-1] == "2.32"
    assert NCCL_VERSIONS == ("2.26", "2.27", "2.28", "2.29", "2.30", "2.31", "2.32")
    view = nccl_view(load_topology("dgx-h100-x2"))
    assert view.hardware.version == DEFAULT_VERSION and not view.hardware.symmetric


def test_registered_buffers_take_the_symmetric_kernels_from_2_27_inside_one_node_only():
    topology = load_topology("dgx-h100")
    for version, expected in (("2.26", False), ("2.27", True), ("2.28", True)):
        registered = _as(topology, version, registered=True)
        estimate = estimate_group(registered, list(range(8)), "AllReduce", 1 << 10)
        assert (estimate.choice.algorithm == "symmetric") == expected
    plain = estimate_group(_as(topology, "2.28"), list(range(8)), "AllReduce", 1 << 10)
    sym = estimate_group(_as(topology, "2.28", True), list(range(8)), "AllReduce", 1 << 10)
    assert sym.time_s < plain.time_s  # lower latency at small sizes (NCCL 2.27 release notes)
    assert estimate_group(_as(topology, "2.28", True), list(range(8)), "Broadcast", 1 << 10).choice.algorithm != \
        "symmetric"  # no symmetric kernel for Broadcast
    across = _as(load_topology("dgx-h100-x2"), "2.28", True)  # two nodes: nNodes > 1, no symmetric kernels
    estimate = estimate_group(across, list(range(16)), "AllReduce", 1 << 10)
    assert estimate.choice.algorithm != "symmetric"
    domain = _as(load_topology("gb200-nvl72"), "2.28", True)  # one multi-node NVLink domain: nNodes == 1
    assert estimate_group(domain, list(range(8)), "AllReduce", 1 << 10).choice.algorithm == "symmetric"


def test_the_symmetric_model_is_nccl_2_27_3s_formula():
    """symmetric.cc:97-100 and :175-178 on Hopper: RSxLD_AGxST at 64 blocks has bandwidth
    softmin(64 x 65 GiB/s, 320 GiB/s) ~ 320 GiB/s; for 1 GiB its time is 7.8 us plus
    2 x (n-1)/n GiB over it; NCCL then takes the fewest blocks within 2.5% of that time."""
    time, blocks, base = symmetric._query("AllReduce_RSxLD_AGxST", 1 << 30, 8, False, 1, 64)
    bus = 2 * (1 << 30) * 7 / 8
    full = symmetric._model(bus, 7.8, 64, 65 * symmetric.GBPS, 1.0, 320 * symmetric.GBPS)
    assert base == 7.8
    assert full == pytest.approx(7.8 + bus / (320 * symmetric.GBPS) - 1, rel=0.001)
    assert full <= time <= 1.025 * full and blocks < 64
    assert symmetric._softplus(-50, 1) == pytest.approx(math.log1p(math.exp(-50)))
    hardware = nccl_view(_as(load_topology("dgx-h100"), "2.27", True)).hardware
    _, call = call_for(load_topology("dgx-h100"), nccl_view(load_topology("dgx-h100")), list(range(8)), "AllReduce",
                       1 << 10)
    assert symmetric.kernels_for(hardware, call) == symmetric.KERNELS["AllReduce"]  # NVLS: multicast ones too


def test_version_and_symmetric_are_read_checked_and_written_back():
    base = load_topology("dgx-h100")
    text = render_topology(_as(base, "2.27", True))
    again = topology_from_text(text, "copy.toml")
    assert (again.nccl.version, again.nccl.symmetric) == ("2.27", True)
    bad = text.replace('version = "2.27"', 'version = "2.25"')
    with pytest.raises(UsageError, match="nccl.version.*2.26, 2.27, 2.28, 2.29, 2.30, 2.31, 2.32"):
        topology_from_text(bad, "bad.toml")


def test_2_28_prices_symmetric_calls_in_whole_kilobyte_cells():
    topology = load_topology("dgx-h100")
    small = {version: estimate_group(_as(topology, version, True), list(range(8)), "AllReduce", 100)
             for version in ("2.27", "2.28")}
    kib = estimate_group(_as(topology, "2.27", True), list(range(8)), "AllReduce", 1024)
    assert small["2.28"].choice.nccl_time_s == kib.choice.nccl_time_s != small["2.27"].choice.nccl_time_s


def _rs_and_ag(topology, version: str, registered: bool, devices, nbytes):
    return {collective: estimate_group(_as(topology, version, registered), devices, collective, nbytes)
            for collective in ("ReduceScatter", "AllGather")}


def test_2_29_runs_registered_calls_across_nvlink_domains_on_the_hierarchical_kernels():
    """v2.29.7 src/sym_kernels.cc: with registered buffers a ReduceScatter or AllGather spanning
    NVLink domains runs on the rail kernels (ReduceScatter_RailA2A_Lsa*, AllGather_RailRing_LsaSTMC);
    2.28 ran them on its ring; inside one domain nothing changes from 2.28 to 2.29."""
    racks = load_topology("dgx-h100-x2")  # two 8-GPU NVSwitch nodes over InfiniBand
    for nbytes in (1 << 16, 1 << 24, 1 << 28):
        old = _rs_and_ag(racks, "2.28", True, list(range(16)), nbytes)
        new = _rs_and_ag(racks, "2.29", True, list(range(16)), nbytes)
        assert old["ReduceScatter"].choice.algorithm != "symmetric"
        assert new["ReduceScatter"].choice.protocol.startswith("ReduceScatter_RailA2A_Lsa")
        assert new["AllGather"].choice.protocol == "AllGather_RailRing_LsaSTMC"
        assert new["ReduceScatter"].time_s != old["ReduceScatter"].time_s
        unregistered = _rs_and_ag(racks, "2.29", False, list(range(16)), nbytes)
        assert unregistered["ReduceScatter"].choice == old["ReduceScatter"].choice  # needs registered windows
    domain = load_topology("gb200-nvl72")  # inside one NVLink domain: the one-domain kernels, as in 2.28
    for nbytes in (1 << 16, 1 << 24):
        old = _rs_and_ag(domain, "2.28", True, list(range(72)), nbytes)
        new = _rs_and_ag(domain, "2.29", True, list(range(72)), nbytes)
        for collective in old:
            assert old[collective].choice == new[collective].choice and old[collective].time_s == new[collective].time_s
    across = _rs_and_ag(domain, "2.28", True, list(range(144)), 1 << 24)  # the two NVL72 racks over InfiniBand
    later = _rs_and_ag(domain, "2.29", True, list(range(144)), 1 << 24)
    assert across["ReduceScatter"].choice.algorithm != "symmetric"
    assert later["ReduceScatter"].choice.protocol == "ReduceScatter_RailA2A_LsaLDMC"  # NVLS: the multicast variant
    assert later["ReduceScatter"].time_s != across["ReduceScatter"].time_s
    one_per_node = _rs_and_ag(racks, "2.30", True, [0, 8], 1 << 20)  # one rank per domain: no NVLink leg (C's x/0)
    assert one_per_node["ReduceScatter"].choice.protocol == "ReduceScatter_RailA2A_LsaLD"
    assert math.isfinite(one_per_node["ReduceScatter"].time_s)
    sockets = load_topology("gcp-a3-high-2x8")  # a net plugin, no GPU-initiated networking assumed: no change
    if sockets.nccl is not None and sockets.nccl.generation in ("hopper", "blackwell"):
        old = _rs_and_ag(sockets, "2.28", True, list(range(16)), 1 << 20)
        new = _rs_and_ag(sockets, "2.29", True, list(range(16)), 1 << 20)
        assert old["ReduceScatter"].choice == new["ReduceScatter"].choice


def test_the_hierarchical_reduce_scatter_is_nccl_s_own_model():
    """queryModel_gin (v2.29.7): time = bytes / min(blocks x smBw / smMul, lsaBw / lsaMul,
    ginBw / ginMul) + the first chunk through NVLink and the network + one GIN latency."""
    from synth.model.nccl import gin

    topology = _as(load_topology("dgx-h100-x2"), "2.29", True)
    hardware, call = call_for(topology, nccl_view(topology), list(range(16)), "ReduceScatter", 1 << 30)
    nbytes = (1 << 30) // 16
    time, blocks, base = gin.query("ReduceScatter_RailA2A_LsaLD", hardware, call, nbytes)
    sm_mul, lsa_mul, gin_mul = gin._multipliers(call, False)
    assert (sm_mul, lsa_mul, gin_mul) == (8 * 1 + 8 + 1, 7 * 2, 1)
    lsa_bw, gin_bw = 360e9, hardware.network.link.bandwidth
    rate = min(blocks * 14.5e9 / sm_mul, lsa_bw / lsa_mul, gin_bw / gin_mul)
    fill = min(nbytes, (64 << 10) * blocks) * (lsa_mul / lsa_bw + gin_mul / gin_bw)
    assert time == pytest.approx((nbytes / rate + fill + 14e-6) * 1e6) and base == 14.0
    retuned = replace(hardware, version="2.30")
    assert gin.query("ReduceScatter_RailA2A_LsaLD", retuned, call, nbytes)[0] != time  # 2.30's SM rates and chunk


def test_the_default_change_moves_only_registered_calls_across_domains():
    """2.28 -> 2.32 without registered buffers: the same prediction everywhere (checked on every
    built-in above for 2.26); with them, only calls across NVLink domains move."""
    topology = load_topology("dgx-h100-x2")
    for collective in COLLECTIVES:
        for nbytes in SIZES:
            a = estimate_group(_as(topology, "2.28"), list(range(16)), collective, nbytes)
            b = estimate_group(_as(topology, "2.32"), list(range(16)), collective, nbytes)
            assert a.choice == b.choice and a.time_s == b.time_s
            inside = [estimate_group(_as(topology, version, True), list(range(8)), collective, nbytes)
                      for version in ("2.28", "2.32")]
            assert inside[0].choice == inside[1].choice and inside[0].time_s == inside[1].time_s


def test_blackwell_per_channel_caps_follow_nccl_s_tables_by_release():
    from synth.model.nccl.tables import per_channel_caps
    old = per_channel_caps("blackwell", "2.27")
    assert old == ((2 * 36.7,) * 3, (2 * 36.7, 2 * 36.7, 2 * 29.0), (2 * 38.7, 2 * 41.4, 2 * 36.0), (0.0, 96.0, 80.0))
    # v2.28.9-1, v2.29.7-1, v2.30.7-1 src/graph/tuning.cc, Blackwell rows
    assert per_channel_caps("blackwell", "2.28") == ((2 * 36.7, 34.6, 2 * 36.7), (55.6, 31.67, 20.0),
                                                     (70.0, 42.8, 24.0), (0.0, 96.0, 43.8))
    assert per_channel_caps("blackwell", "2.29")[0] == (40.0, 40.0, 40.0)
    assert per_channel_caps("blackwell", "2.29")[3] == (0.0, 96.0, 43.8)
    assert per_channel_caps("blackwell", "2.30")[3] == (0.0, 96.0, 80.0)
    assert per_channel_caps("blackwell", "2.32") == per_channel_caps("blackwell", "2.30")
    for version in NCCL_VERSIONS:  # Hopper's rows never moved
        assert per_channel_caps("hopper", version) == per_channel_caps("hopper", "2.26")


def test_blackwell_ring_ll128_is_capped_at_the_release_s_per_channel_figure():
    from synth.model.nccl.tables import _tuning
    topology = load_topology("aws-p6-b200-2x8")

    def ring_ll128(version):
        hardware = nccl_view(_as(topology, version)).hardware
        tuning = _tuning(hardware, "AllReduce", 2, 8)
        entry = next(e for e in tuning.entries if e[:2] == ("ring", "LL128"))
        return entry[4], tuning

    caps = {version: ring_ll128(version)[0] for version in ("2.27", "2.28", "2.29", "2.30")}
    channels = caps["2.29"] * 2 * 15 / 16 / 40.0  # cap = channels x per-channel, as algorithm bandwidth
    assert caps["2.27"] == pytest.approx(caps["2.29"] * 2 * 36.7 / 40.0)
    assert caps["2.28"] == pytest.approx(caps["2.29"] * 34.6 / 40.0)  # two nodes: index2 = 1
    assert caps["2.30"] == pytest.approx(caps["2.29"]) and channels == pytest.approx(round(channels))
