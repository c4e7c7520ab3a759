"""Per-collective level figures (`[levels.collectives.NAME]`): loading, validation, and the
simulator costing a step of that collective with them and every other step as before."""

from __future__ import annotations

import textwrap

import pytest

from synth.errors import UsageError
from synth.hierarchy import build_hierarchy
from synth.language import parse_program
from synth.lowering import lower
from synth.placement import make_placement, parse_axes
from synth.model import cost_context, simulate
from synth.topology_file import load_topology

BASE = """\
name = "two-by-four"

[[levels]]
name = "node"
size = 2
bandwidth = { value = "10 GB/s", source = "estimate: test" }
latency = { value = "10 us", source = "estimate: test" }
%s
[[levels]]
name = "gpu"
size = 4
bandwidth = { value = "100 GB/s", source = "estimate: test" }
latency = { value = "1 us", source = "estimate: test" }
"""

ALLGATHER = """
[levels.collectives.AllGather]
bandwidth = { value = "5 GB/s", source = "fitted: test" }
latency = { value = "30 us", source = "fitted: test" }
"""


def write(tmp_path, extra: str):
    path = tmp_path / "t.toml"
    path.write_text(BASE % textwrap.dedent(extra))
    return path


def test_collective_figures_load_and_replace_the_level_for_that_collective_only(tmp_path):
    topology = load_topology(write(tmp_path, ALLGATHER))
    node = topology.levels[0]
    assert [name for name, _ in node.collectives] == ["AllGather"]
    assert node.figures_for("AllGather")[0].value == 5e9
    assert node.figures_for("AllGather")[1].value == pytest.approx(30e-6)
    assert node.figures_for("AllReduce") == (node.bandwidth, node.latency)
    assert topology.for_collective("AllReduce") is topology
    seen = topology.for_collective("AllGather")
    assert seen.levels[0].bandwidth.value == 5e9 and seen.levels[1] == topology.levels[1]
    assert hash(seen) is not None


def test_collectives_are_kept_in_language_order(tmp_path):
    extra = """
    [levels.collectives.Broadcast]
    bandwidth = { value = "5 GB/s", source = "s" }
    latency = { value = "30 us", source = "s" }
    [levels.collectives.AllReduce]
    bandwidth = { value = "6 GB/s", source = "s" }
    latency = { value = "20 us", source = "s" }
    """
    topology = load_topology(write(tmp_path, extra))
    assert [name for name, _ in topology.levels[0].collectives] == ["AllReduce", "Broadcast"]


@pytest.mark.parametrize("extra, fragments", [
    ('[levels.collectives.Scatter]\nbandwidth = { value = "5 GB/s", source = "s" }\nlatency = { value = "3 us", source = "s" }\n',
     ["levels[0].collectives.Scatter", "unknown key"]),
    ('[levels.collectives.AllGathr]\nbandwidth = { value = "5 GB/s", source = "s" }\n',
     ["did you mean 'AllGather'"]),
    ('[levels.collectives.AllGather]\nbandwidth = { value = "5 GB/s", source = "s" }\n',
     ["levels[0].collectives.AllGather.latency", "missing"]),
    ('[levels.collectives.AllGather]\nbandwidth = { value = "5 GB/s", source = "s" }\nlatency = { value = "3 us", source = "" }\n',
     ["collectives.AllGather.latency.source", "empty"]),
    ('[levels.collectives.AllGather]\nbandwidth = { value = "5 us", source = "s" }\nlatency = { value = "3 us", source = "s" }\n',
     ["collectives.AllGather.bandwidth.value", "is a time"]),
    ('[levels.collectives.AllGather]\nbandwidth = { value = "5 GB/s", source = "s" }\nlatency = { value = "3 us", source = "s" }\nefficiency = 0.5\n',
     ["collectives.AllGather.efficiency", "unknown key"]),
    ('collectives = 3\n', ["levels[0].collectives", "not a table"]),
    ('[levels.collectives]\nAllGather = 3\n', ["levels[0].collectives.AllGather", "not a table"]),
])
def test_bad_collective_tables_are_one_line_errors(tmp_path, extra, fragments):
    with pytest.raises(UsageError) as error:
        load_topology(write(tmp_path, extra))
    message = str(error.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_collectives_need_the_level_figures(tmp_path):
    path = tmp_path / "bare.toml"
    path.write_text(textwrap.dedent("""\
        name = "bare"
        [[levels]]
        name = "gpu"
        size = 4
        [levels.collectives.AllGather]
        bandwidth = { value = "5 GB/s", source = "s" }
        latency = { value = "3 us", source = "s" }
        """))
    with pytest.raises(UsageError, match=r"levels\[0\].collectives: given without the level's bandwidth"):
        load_topology(path)


def step_costs(topology, text: str, size: int = 2**24):
    placement = make_placement(topology, parse_axes("data=8"), [[2, 4]])
    hierarchy = build_hierarchy(placement, ("data",))
    return simulate(lower(parse_program(text), hierarchy), cost_context(hierarchy, topology, "gloo"), size,
                    "lockstep").steps


def test_the_simulator_costs_each_collective_with_its_own_figures(tmp_path):
    tuned = load_topology(write(tmp_path, ALLGATHER))
    (tmp_path / "plain.toml").write_text(BASE % "")
    plain = load_topology(tmp_path / "plain.toml")
    # The node level with the AllGather figures as its own: what AllGather steps must see.
    (tmp_path / "swapped.toml").write_text((BASE % "").replace('"10 GB/s"', '"5 GB/s"').replace('"10 us"', '"30 us"'))
    swapped = load_topology(tmp_path / "swapped.toml")
    program = "ReduceScatter(Parallel(node)); AllReduce(Parallel(gpu)); AllGather(Parallel(node))"
    tuned_steps, plain_steps, swapped_steps = (step_costs(t, program) for t in (tuned, plain, swapped))
    assert tuned_steps[0].time_s == plain_steps[0].time_s  # ReduceScatter: the level's figures
    assert tuned_steps[1].time_s == plain_steps[1].time_s  # AllReduce inside the node: untouched
    assert tuned_steps[2].time_s == swapped_steps[2].time_s  # AllGather: its own figures
    assert tuned_steps[2].time_s > plain_steps[2].time_s


def test_a_collective_sees_the_level_uplinks_scaled_like_its_bandwidth(tmp_path):
    extra = """
    uplinks = { count = 2, bandwidth = "10 GB/s", source = "estimate: test" }
    """ + ALLGATHER
    topology = load_topology(write(tmp_path, extra))
    seen = topology.for_collective("AllGather").levels[0]
    assert seen.uplinks.count == 2
    assert seen.uplinks.bandwidth.value == pytest.approx(5e9)  # 10 GB/s x (5 GB/s / 10 GB/s)
    assert topology.for_collective("Broadcast").levels[0].uplinks.bandwidth.value == 10e9
