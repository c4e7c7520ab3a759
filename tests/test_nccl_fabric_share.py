"""The fabric's share of the NICs' rate (synth/model/nccl/fabric_share.py): a per-cluster figure that slows the
NICs of calls over more hosts than a leaf holds, shrinks with queue pairs per connection, is read
and written by topology files, and is what a probe over more hosts fits, so the probe's miss does
not carry to a two-host call of the same system."""

from __future__ import annotations

from dataclasses import replace

import pytest

from synth.calibrate.measurements import Measurement, RunInfo, Span
from synth.calibrate.nccl_fit import calibrate_nccl
from synth.calibrate.probe import PROBE_SIZES
from synth.errors import UsageError
from synth.model.nccl.hardware import estimate_group, nccl_view
from synth.model.nccl.fabric_share import LEAF_HOSTS, FABRIC_SHARE, fabric_share
from synth.model.nccl.system import Call
from synth.topology import Figure
from synth.topology_file import load_topology, render_topology, topology_from_text

GIB = 2 ** 30


def _cluster(nodes: int = 8, share: float | None = None, qps: int = 1):
    base = load_topology("hgx-h100-ib-4x8")
    levels = list(base.levels)
    transport = levels[0].transport
    if share is not None:
        transport = replace(transport, fabric_share=Figure(share, "test truth"))
    levels[0] = replace(levels[0], size=nodes, transport=transport)
    return replace(base, levels=tuple(levels), nccl=replace(base.nccl, ib_qps=qps))


def _devices(nodes: int) -> list[int]:
    return list(range(8 * nodes))


def _time(topology, nodes: int, size: int = 8 * GIB) -> float:
    return estimate_group(topology, _devices(nodes), "AllReduce", size).time_s


def test_the_default_loses_nothing_and_the_share_applies_beyond_a_leaf():
    assert FABRIC_SHARE[0] == 1.0 and "estimate" in FABRIC_SHARE[1]
    hardware = nccl_view(_cluster(share=0.8)).hardware
    assert fabric_share(hardware, Call("AllReduce", LEAF_HOSTS, 8, GIB)) == 1.0
    assert fabric_share(hardware, Call("AllReduce", LEAF_HOSTS + 1, 8, GIB)) == pytest.approx(0.8)
    assert fabric_share(nccl_view(_cluster()).hardware, Call("AllReduce", 8, 8, GIB)) == 1.0


def test_queue_pairs_per_connection_shrink_the_loss():
    hardware = nccl_view(_cluster(share=0.8, qps=4)).hardware
    assert fabric_share(hardware, Call("AllReduce", 8, 8, GIB)) == pytest.approx(0.95)


def test_a_large_call_over_eight_hosts_slows_and_one_over_two_does_not():
    slow, fast = _cluster(share=0.85), _cluster()
    assert _time(slow, 2) == pytest.approx(_time(fast, 2))
    assert _time(slow, 8) > 1.1 * _time(fast, 8)


def test_the_share_is_read_written_and_checked_in_a_topology_file():
    topology = _cluster(share=0.88, qps=2)
    again = topology_from_text(render_topology(topology), "test.toml")
    assert again.levels[0].transport.fabric_share.value == pytest.approx(0.88)
    assert again.nccl.ib_qps == 2
    text = render_topology(topology).replace("fabric_share = 0.88", "fabric_share = 1.5")
    with pytest.raises(UsageError, match="fabric_share"):
        topology_from_text(text, "test.toml")


def _probe(truth, nodes: int) -> list[Measurement]:
    span = Span(truth.levels[0].name, nodes, 8, nodes)
    return [Measurement("AllReduce", size, _time(truth, nodes, size), span, "probe.txt", line, "nccl",
                        RunInfo(gpus_per_process=1))
            for line, size in enumerate(PROBE_SIZES, 1)]


def test_a_probe_over_eight_hosts_fits_the_fabric_share_not_the_links():
    """A cluster whose fabric keeps 80% of the NICs' rate beyond a leaf: the probe over 8 hosts
    moves the fabric's share, and the 2-host prediction stays the documented one."""
    truth = _cluster(share=0.8)
    fitted = calibrate_nccl(_probe(truth, 8), _cluster()).topology
    share = fitted.levels[0].transport.fabric_share
    assert share is not None and share.value < 0.9 and "synth calibrate" in share.source
    assert _time(fitted, 2) == pytest.approx(_time(_cluster(), 2), rel=0.02)
    assert _time(fitted, 8) == pytest.approx(_time(truth, 8), rel=0.06)


def test_a_probe_over_two_hosts_leaves_the_fabric_share_alone():
    fitted = calibrate_nccl(_probe(_cluster(), 2), _cluster()).topology
    assert fitted.levels[0].transport.fabric_share is None
