"""The per-cluster floors of the NCCL model: the host's launch time per GPU (launch.py) and a
network's per-call floor (transports.call_floor_s) as topology figures with a default and its
source, which `synth calibrate` fits; and the proxy charge as NCCL's tuning prices it
(proxy.nccl_priced_floor_s, src/graph/tuning.cc:316-322), worked out by hand from NCCL 2.26.2."""

from __future__ import annotations

from dataclasses import replace

import pytest

from synth.calibrate.measurements import Measurement, RunInfo, Span
from synth.calibrate.nccl_fit import PROBE_PRIORS, calibrate_nccl
from synth.errors import UsageError
from synth.model.nccl import Call, Hardware, Link, Network, estimate, tuning
from synth.model.nccl.hardware import estimate_group, nccl_view
from synth.model.nccl.launch import LAUNCH_SOURCE, LAUNCH_US_PER_GPU, launch_floor_s, launch_s_per_gpu
from synth.model.nccl.proxy import nccl_priced_floor_s, posts_per_pass
from synth.model.nccl.transports import CALL_FLOOR, call_floor_s
from synth.topology import Figure
from synth.topology_file import load_topology, render_topology, topology_from_text

GB = 1e9
NVLINK4 = Link("nvswitch", 450 * GB, 0.824, "topo.h SM90_NVLINK_BW")
IB400 = Network(Link("infiniband", 50 * GB, 0.96, "search.cc ladder"), 8)
PLUGIN = Network(Link("ethernet", 25 * GB, 0.96, "search.cc ladder"), 8, transport="plugin")


# --- the launch per GPU --------------------------------------------------------------------------


def test_the_launch_per_gpu_is_a_hardware_figure_with_a_default():
    """nccl-tests -g 8 on a host that launches in 3 us per GPU: 8 x 3 = 24 us; without a figure,
    the default (a fit on three logs, and said so)."""
    default = Hardware("hopper", 8, NVLINK4, gpus_per_thread=8)
    assert launch_s_per_gpu(default) == pytest.approx(LAUNCH_US_PER_GPU * 1e-6)
    assert "fit" in LAUNCH_SOURCE
    fast = replace(default, launch_s_per_gpu=3e-6)
    assert launch_floor_s(fast) == pytest.approx(24e-6)
    assert estimate(fast, Call("AllReduce", 1, 8, 8)).time_s == pytest.approx(24e-6)


def test_a_topology_gives_the_launch_per_gpu_and_writes_it_back():
    text = render_topology(load_topology("dgx-a100"))
    text = text.replace('[nccl]\n', '[nccl]\nlaunch_per_gpu = { value = "3 us", source = "measured" }\ngpus_per_thread = 8\n')
    topology = topology_from_text(text, "t.toml")
    assert topology.nccl.launch_per_gpu == Figure(3e-6, "measured")
    assert nccl_view(topology).hardware.launch_s_per_gpu == pytest.approx(3e-6)
    assert estimate_group(topology, list(range(8)), "AllReduce", 8).time_s == pytest.approx(24e-6)
    again = topology_from_text(render_topology(topology), "again.toml")
    assert again.nccl.launch_per_gpu == topology.nccl.launch_per_gpu


def test_a_bad_launch_figure_is_named():
    text = render_topology(load_topology("dgx-a100")).replace(
        '[nccl]\n', '[nccl]\nlaunch_per_gpu = { value = "fast", source = "x" }\n')
    with pytest.raises(UsageError, match="launch_per_gpu"):
        topology_from_text(text, "t.toml")


def test_calibrate_fits_the_launch_per_gpu_of_a_g8_run():
    """A -g 8 run whose small calls sit flat at 28 us: 8 launches of 3.5 us (not the default's
    5.6); the calibrated topology carries the fitted host figure."""
    base = load_topology("dgx-a100")
    run = RunInfo(gpus_per_process=8)
    sizes = (8, 64, 512, 4096)
    measurements = [Measurement("AllReduce", size, 28e-6, Span(None, 8, 1, 1), "run.txt", i, "nccl", run)
                    for i, size in enumerate(sizes)]
    fitted = calibrate_nccl(measurements, base).topology
    assert fitted.nccl.gpus_per_thread == 1  # written back as the hardware, one process per GPU
    assert fitted.nccl.launch_per_gpu.value == pytest.approx(3.5e-6, rel=0.1)
    assert "synth calibrate" in fitted.nccl.launch_per_gpu.source


# --- a network's per-call floor ------------------------------------------------------------------


def test_every_transport_kind_has_a_default_floor_with_its_source():
    assert set(CALL_FLOOR) == {"ib", "socket", "plugin"}
    for value, source in CALL_FLOOR.values():
        assert value == 0.0 and source  # NCCL's own: no plugin documents one (module comment)
    hardware = Hardware("hopper", 8, NVLINK4, PLUGIN)
    assert call_floor_s(hardware, Call("AllReduce", 2, 8, 8)) == 0.0


def test_a_plugin_floor_binds_small_calls_across_nodes_only():
    """A 60 us floor: an 8 B call over 2 x 8 takes 60 us (NCCL's own latency is below it); a
    1 GiB call is untouched, and so is a call inside one node."""
    base = Hardware("hopper", 8, NVLINK4, PLUGIN)
    floored = replace(base, network=replace(PLUGIN, floor_s=60e-6))
    small, large = Call("AllReduce", 2, 8, 8), Call("AllReduce", 2, 8, 2 ** 30)
    assert estimate(base, small).time_s < 60e-6
    assert estimate(floored, small).time_s == pytest.approx(60e-6)
    assert estimate(floored, large).time_s == estimate(base, large).time_s
    inside = Call("AllReduce", 1, 8, 8)
    assert estimate(floored, inside).time_s == estimate(base, inside).time_s


def test_a_topology_gives_a_transport_floor_and_writes_it_back():
    text = render_topology(load_topology("gcp-a3-mega-2x8"))
    text = text.replace('kind = "plugin"\n', 'kind = "plugin"\nfloor = "40 us"\n', 1)
    topology = topology_from_text(text, "t.toml")
    view = nccl_view(topology)
    assert view.hardware.network.floor_s == pytest.approx(40e-6)
    again = topology_from_text(render_topology(topology), "again.toml")
    assert nccl_view(again).hardware.network.floor_s == pytest.approx(40e-6)


def test_calibrate_registers_a_plugin_floor_and_not_an_ib_one():
    """The fit's unknowns: a plugin or socket level's per-call floor is one (the overhead may take
    the small calls' time instead: both are fitted, with priors), an InfiniBand level's is not."""
    from synth.calibrate.nccl_fit import _floor_params, _Point

    for name, expected, per in (("gcp-a3-mega-2x8", True, 8), ("hgx-h100-ib-4x8", False, 8),
                                ("rtx5090-loopback", True, 1)):
        topology = load_topology(name)
        view = nccl_view(topology)
        points = [_Point(Measurement("AllReduce", 8, 50e-6, Span(None, 2, per, 2), "r.txt", 1, "nccl"),
                         tuple(range(2 * per)))]
        kinds = {p.kind for p in _floor_params(topology, view.node_level, points, view, 1e-4)}
        assert ("floor" in kinds) == expected


def test_a_probe_whose_every_size_sits_on_a_plugin_floor_fits_the_floor():
    """Four probe sizes of an A3 High all-gather all take about 1.1 ms, three times the model's:
    the miss is a per-call cost of the plugin, not four outliers; calibrate fits it (the floor, a
    max() flat where it does not bind, is started at the shortest call too) and the sizes in
    between come out within 15%."""
    base = load_topology("gcp-a3-high-2x8")
    probe = {1 << 20: 1116e-6, 2 << 20: 1071e-6, 32 << 20: 1305e-6, 64 << 20: 1522e-6}
    measurements = [Measurement("AllGather", size, t, Span(None, 2, 8, 2), "a3high.txt", i, "nccl")
                    for i, (size, t) in enumerate(probe.items())]
    fit = calibrate_nccl(measurements, base, priors=PROBE_PRIORS)
    assert not any(e.outlier for g in fit.fits[0].groups for e in g.errors)
    # the floor and the per-call overhead trade off (both fitted, with priors): one carries it
    floor = fit.topology.levels[0].transport.floor
    assert max(floor.value, fit.fits[0].overhead_s) > 0.5e-3 and "synth calibrate" in floor.source
    for size, measured in ((4 << 20, 1123.8e-6), (16 << 20, 1263.4e-6)):  # the log's own, not fitted on
        predicted = estimate_group(fit.topology, list(range(16)), "AllGather", size).time_s
        assert abs(predicted / measured - 1) < 0.15


# --- the proxy charge as NCCL's tuning prices it -------------------------------------------------


def test_nccl_prices_one_nsteps_times_the_net_overhead_per_call():
    """2 x 8 H100, ring AllReduce: nsteps = 30; LL128 1 us a step (Intel): 14 + 30 = 44 us;
    Simple 3 us a step: 8.4 + 90 = 98.4 us, for 1 MiB and 1 GiB alike; AMD twice; none for
    the tree, whose latency has no per-step net overhead (tuning.cc:323-327)."""
    hardware = Hardware("hopper", 8, NVLINK4, IB400)
    small, large = Call("AllReduce", 2, 8, 1 << 20), Call("AllReduce", 2, 8, 1 << 30)
    assert nccl_priced_floor_s(hardware, small, "ring", "LL128") == pytest.approx(44e-6)
    for call in (small, large):
        assert nccl_priced_floor_s(hardware, call, "ring", "Simple") == pytest.approx(98.4e-6)
    assert nccl_priced_floor_s(replace(hardware, cpu="amd"), small, "ring", "LL128") == pytest.approx(74e-6)
    assert nccl_priced_floor_s(hardware, small, "tree", "LL128") == 0.0
    # NCCL's own ring latency holds it: 14 + 28 x max(1.9, 1) + 2 x 4.0 = 75.2 us
    assert tuning(hardware, small).get("ring", "LL128")[0] == pytest.approx(75.2)


def test_net_cc_posts_one_request_per_slice():
    """A Simple ring step is ALLREDUCE_CHUNKSTEPS 4 / SLICESTEPS 2 = 2 posts; LL and LL128 one."""
    call = Call("AllReduce", 2, 8, 1 << 20)
    assert posts_per_pass(call, "Simple") == 60
    assert posts_per_pass(call, "LL128") == 30
    assert posts_per_pass(Call("AllGather", 2, 8, 1 << 20), "LL") == 15


# --- leave one source out: every fold refits the host figure on the other sources ----------------


def test_a_fold_takes_the_launch_per_gpu_from_the_other_sources_only(monkeypatch):
    """Three sources that fitted a launch per GPU (4.9, 5.0 and 6.0 us, the last from two logs):
    holding one out gives the median of the others, whatever their transport class, never its
    own; figures of another class stay out."""
    from pathlib import Path
    from types import SimpleNamespace

    from benchmarks import fidelity

    def log(name, source):
        return SimpleNamespace(path=Path(name), name=name, source=SimpleNamespace(name=source, topology="t"))

    logs = [log("a.txt", "A"), log("b.txt", "B"), log("c1.txt", "C"), log("c2.txt", "C")]
    classes = {"a.txt": "one node", "b.txt": "across nodes, ib", "c1.txt": "one node", "c2.txt": "one node"}
    monkeypatch.setattr(fidelity, "log_class", lambda entry: classes[entry.name])
    fits = {"a.txt": {"launch_per_gpu": 4.9e-6, "overhead_s": 1e-6}, "b.txt": {"launch_per_gpu": 5.0e-6},
            "c1.txt": {"launch_per_gpu": 6.0e-6}, "c2.txt": {"launch_per_gpu": 6.2e-6, "overhead_s": 3e-6}}
    figures, _ = fidelity.pooled(logs[0], logs, fits)
    assert figures["launch_per_gpu"] == pytest.approx((5.0e-6 + 6.1e-6) / 2)  # B and C's median, not A's
    assert figures["overhead_s"] == pytest.approx(3e-6)  # of its class only (C)
    figures, _ = fidelity.pooled(logs[2], logs, fits)
    assert figures["launch_per_gpu"] == pytest.approx((4.9e-6 + 5.0e-6) / 2)


def test_a_fold_takes_a_plugin_floor_from_the_same_plugin_and_machine_only(monkeypatch):
    """A per-call floor is one plugin's on one machine type (TCPX's is not TCPXO's): a fold moves
    it from other sources on the same built-in topology, else leaves the transport's default."""
    from pathlib import Path
    from types import SimpleNamespace

    from benchmarks import fidelity

    def log(name, source, topology):
        return SimpleNamespace(path=Path(name), name=name, source=SimpleNamespace(name=source, topology=topology))

    logs = [log("high1.txt", "H1", "gcp-a3-high-2x8"), log("high2.txt", "H2", "gcp-a3-high-2x8"),
            log("mega.txt", "M", "gcp-a3-mega-2x8")]
    monkeypatch.setattr(fidelity, "log_class", lambda entry: "across nodes, plugin")
    fits = {"high1.txt": {"floor_s": 1.1e-3}, "high2.txt": {"floor_s": 0.6e-3}, "mega.txt": {"floor_s": 0.12e-3}}
    assert fidelity.pooled(logs[0], logs, fits)[0]["floor_s"] == pytest.approx(0.6e-3)
    assert "floor_s" not in fidelity.pooled(logs[2], logs, fits)[0]
