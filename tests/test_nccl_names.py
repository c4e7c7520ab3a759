"""NCCL's names are defined once (synth/model/nccl/names.py) and every reader uses them; one bus
factor (the collective's record); NCCL's table looked up by key."""

from __future__ import annotations

import math

from synth import topology_file
from synth.calibrate import nccl_fit
from synth.collectives import RECORDS
from synth.model import cost, nccl
from synth.model.nccl import hardware as nccl_hardware
from synth.model.nccl import names as nccl_names
from synth.model.nccl import system, tables as nccl_tables
from synth.model.nccl import Call, Hardware, Link, tuning


def test_every_reader_uses_the_one_definition():
    assert topology_file.GENERATIONS is nccl_names.GENERATIONS is nccl.GENERATIONS
    assert topology_file.NCCL_PROTOCOLS is nccl_names.PROTOCOLS is nccl.PROTOCOLS is nccl_fit.PROTOCOLS
    assert nccl_tables.PROTOCOLS is nccl_names.PROTOCOLS
    assert topology_file.TRANSPORT_KINDS is nccl_names.TRANSPORTS is nccl.TRANSPORTS
    assert topology_file.NETWORK_LINK_KINDS is nccl_names.NETWORK_LINK_KINDS is nccl.NET_KINDS
    assert nccl_hardware.NETWORK_KINDS is nccl.NET_KINDS is system.NET_KINDS
    assert nccl.COLLECTIVES is nccl_names.COLLECTIVES
    assert set(topology_file.LINK_KINDS) == set(nccl.INTRA_KINDS) - {"none"} | set(nccl.NET_KINDS)
    assert set(nccl_names.SELECTABLE_ALGORITHMS) <= set(nccl_names.ALGORITHMS)
    assert set(nccl.PAYLOAD) == set(nccl_names.PROTOCOLS)


def test_one_bus_factor():
    for name, record in RECORDS.items():
        for n in (2, 3, 8, 64):
            assert nccl.bus_factor(name, n) == record.bus_factor(n)
    assert cost.bus_factor(8) == RECORDS["AllReduce"].bus_factor(8) == 1.75


def test_tuning_get_is_a_lookup_that_agrees_with_the_entries():
    table = tuning(Hardware("ampere", 8, Link("nvswitch", 300e9, 0.8, "x")), Call("AllReduce", 1, 8, 1))
    for algorithm, protocol, latency, bandwidth, cap in table.entries:
        assert table.get(algorithm, protocol) == (latency, bandwidth)
        assert table.cap(algorithm, protocol) == cap
    assert table.get("collnet_direct", "LL") == (0.0, 0.0) and math.isinf(table.cap("collnet_direct", "LL"))
    assert hash(table) == hash(tuning(Hardware("ampere", 8, Link("nvswitch", 300e9, 0.8, "x")), Call("AllReduce", 1, 8, 1)))


def test_no_import_circle_between_the_seam_the_algorithms_and_the_nccl_backend():
    """The vocabulary is the seam's (backend.py imports no algorithm), the algorithms import the
    seam only, and the registry (backends.py) is the one module that names the backends."""
    import ast
    from pathlib import Path

    model = Path(cost.__file__).parent

    def imported(name: str) -> set[str]:
        tree = ast.parse((model / f"{name}.py").read_text(encoding="utf-8"))
        found = set()
        for node in tree.body:  # what loading the module imports (a function's lazy import is not)
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
                found |= {f"{node.module}.{alias.name}" for alias in node.names}
        return found

    assert not {m for m in imported("backend") if m.startswith("synth.model.")}
    assert not imported("algorithms") & {"synth.model.nccl.backend", "synth.model.backends"}
    assert "synth.model.backends" not in imported("nccl/backend")


def test_a_network_level_read_two_ways_is_said():
    """One reading of a topology: where the per-device bandwidth (what the flow model and the
    bounds read) and one uplink (the NIC NCCL's model reads) disagree, NCCL's view says so."""
    from dataclasses import replace

    from synth.model.nccl.hardware import nccl_view
    from synth.topology import Figure, Uplinks
    from synth.topology_file import load_topology

    topology = load_topology("hgx-h100-ib-4x8")
    assert not [a for a in nccl_view(topology).assumptions if "differs" in a]
    node = topology.levels[0]
    odd = replace(node, uplinks=Uplinks(4, Figure(450e9 / 8, "hand-written")))
    view = nccl_view(replace(topology, levels=(odd,) + topology.levels[1:]))
    (said,) = [a for a in view.assumptions if "differs" in a]
    assert "400 Gb/s" in said and "450 Gb/s" in said
