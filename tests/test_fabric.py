"""A level's shared interconnect (`fabric`): parsed, written back, costed, and what the
emulated cluster's figures put there (its node loopback)."""

from __future__ import annotations

import numpy as np
import pytest

from synth.topology_file import render_topology
from synth.emulate.layout import emulated_figures, loopback_rate, unit_rate
from synth.errors import UsageError
from synth.model.network import Network
from synth.topology_file import load_topology

TOML = """
name = "bus"
[[levels]]
name = "node"
size = 2
bandwidth = { value = "10 MB/s", source = "test" }
latency = { value = "1 us", source = "test" }
[[levels]]
name = "gpu"
size = 4
bandwidth = { value = "40 MB/s", source = "test" }
latency = { value = "1 us", source = "test" }
fabric = { value = "40 MB/s", source = "test: one queue per node" }
[levels.collectives.AllGather]
bandwidth = { value = "20 MB/s", source = "test" }
latency = { value = "2 us", source = "test" }
"""


@pytest.fixture
def bus(tmp_path):
    path = tmp_path / "bus.toml"
    path.write_text(TOML)
    return load_topology(path)


def test_fabric_parses_writes_back_and_scales_with_a_collective(bus, tmp_path):
    assert bus.levels[1].fabric.value == 40e6 and bus.levels[0].fabric is None
    again = tmp_path / "again.toml"
    again.write_text(render_topology(bus))
    assert load_topology(again).levels[1].fabric == bus.levels[1].fabric
    assert bus.for_collective("AllGather").levels[1].fabric.value == pytest.approx(20e6)


def test_fabric_needs_the_level_figures(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('name = "x"\n[[levels]]\nname = "gpu"\nsize = 2\nfabric = { value = "1 GB/s", source = "s" }\n')
    with pytest.raises(UsageError, match="fabric"):
        load_topology(path)


def test_every_intra_node_byte_crosses_its_node_fabric_once(bus):
    network = Network(bus)
    # a 4-rank ring inside node 0 (ranks 0..3), 1 byte per hop, and one pair inside node 1
    src, dst = np.array([0, 1, 2, 3, 4]), np.array([1, 2, 3, 0, 5])
    loads = network.loads(src, dst, np.ones(5))
    names = network.link_names
    assert loads[names.index("node0 gpu-fabric")] == 4
    assert loads[names.index("node1 gpu-fabric")] == 1
    # a pair alone: its devices' links and the fabric run at 40 MB/s, so 1 MB takes 25 ms ...
    assert network.makespan(np.array([0]), np.array([1]), np.array([1e6]))[0] == pytest.approx(0.025)
    # ... and four devices at once share the fabric: 4 MB through it take 100 ms
    seconds, busiest = network.makespan(src[:4], dst[:4], np.full(4, 1e6))
    assert seconds == pytest.approx(0.1) and names[busiest] == "node0 gpu-fabric"
    assert "node0 gpu-fabric" in network.route(0, 1) and "node0 gpu-fabric" not in network.route(0, 4)


def test_emulated_figures_are_the_shaped_rates():
    topology = load_topology("emu-2x2x2")
    figures = emulated_figures(topology, 1 / 128)
    rack, node, gpu = figures.levels
    assert gpu.fabric.value == gpu.bandwidth.value == pytest.approx(loopback_rate(topology) / 128)
    assert node.uplinks.count == 1 and node.uplinks.bandwidth.value == pytest.approx(unit_rate(topology, 1) / 128)
    assert rack.bandwidth.value == pytest.approx(unit_rate(topology, 0) / 128) and rack.fabric is None
    assert [level.latency for level in figures.levels] == [level.latency for level in topology.levels]


def test_pipelined_estimate_is_at_most_the_lockstep_sum_and_equal_for_one_call():
    from synth.emulate.layout import emulated_figures
    from synth.hierarchy import build_hierarchy
    from synth.language import parse_program
    from synth.lowering import lower
    from synth.placement import make_placement, parse_axes
    from synth.model import LOCKSTEP, PIPELINED, CostEngine, cost_context, program_cost

    topology = emulated_figures(load_topology("emu-2x4"), 1 / 256)
    placement = make_placement(topology, parse_axes("data=4,model=2"), ((2, 2), (1, 2)))
    hierarchy = build_hierarchy(placement, ("data",), "merged")
    context = cost_context(hierarchy, topology, "gloo")
    engine = CostEngine(context)
    nbytes = 65536

    def both(text):
        lowered = lower(parse_program(text), hierarchy)
        return (program_cost(context, lowered, nbytes, LOCKSTEP, engine).time_s,
                program_cost(context, lowered, nbytes, PIPELINED, engine))

    lockstep, pipelined = both("AllReduce(InsideGroup(node))")
    assert pipelined.time_s == pytest.approx(lockstep, rel=0.01)  # the same link-seconds, less the hop latencies
    # two groups: one's intra-node steps overlap the other's use of the uplink
    lockstep, pipelined = both("AllReduce(InsideGroup(gpu)); AllReduce(Master(node)); Broadcast(InsideGroup(gpu))")
    assert pipelined.time_s < 0.7 * lockstep
    assert pipelined.busiest_link.endswith("uplinks out") and pipelined.link_bound_s == pytest.approx(2 * nbytes / 3.90625e6)


@pytest.mark.parametrize("name", ["emu-2x2x2-gloo", "dgx-h100-x2", "gb200-nvl72"])
def test_one_link_name_is_the_listed_one(name, bus):
    """Network.link_name finds a name from its number without listing every link, the same."""
    for topology in (bus, load_topology(name)):
        network = Network(topology)
        found = [network.link_name(link) for link in range(len(network.capacity))]
        assert "link_names" not in network.__dict__  # found without the list
        assert tuple(found) == Network(topology).link_names
