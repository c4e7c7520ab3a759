"""Topology files, their validation, the built-ins, and the unit parsers they rely on."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

from synth.errors import UsageError
from synth.topology import Figure, Level, Topology, Uplinks, check_levels, topology_from_levels
from synth.topology_file import builtin_topology_names, load_topology
from synth.units import format_bandwidth, format_bytes, format_time, parse_bandwidth, parse_bytes, parse_time

BUILTINS = {
    "paper-fig3": (("server", 2), ("cpu", 2), ("gpu", 4)),
    "dgx-a100": (("gpu", 8),),
    "dgx-h100": (("gpu", 8),),
    "dgx-a100-x4": (("node", 4), ("gpu", 8)),
    "dgx-h100-2x8x8": (("rack", 2), ("node", 8), ("gpu", 8)),
    "gcp-a2-2x16": (("vm", 2), ("gpu", 16)),
    "gcp-n1-v100-4x8": (("vm", 4), ("gpu", 8)),
    "emu-2x4": (("node", 2), ("gpu", 4)),
    "emu-4x2": (("node", 4), ("gpu", 2)),
    "emu-2x2x2": (("rack", 2), ("node", 2), ("gpu", 2)),
    "gb200-nvl72": (("rack", 2), ("tray", 18), ("gpu", 4)),
    "aws-p6-b200-2x8": (("node", 2), ("gpu", 8)),
}


def one_line_naming(error: pytest.ExceptionInfo, *fragments: str) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# --- built-ins ---------------------------------------------------------------------------


def test_builtin_names_are_sorted_and_complete():
    names = builtin_topology_names()
    assert names == sorted(names)
    assert set(BUILTINS) <= set(names)


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_builtin_loads_with_sizes_figures_and_sources(name):
    topology = load_topology(name)
    assert topology.name == name
    assert tuple(zip(topology.level_names, topology.sizes)) == BUILTINS[name]
    assert topology.description
    assert topology.has_link_figures
    assert topology.source_path and Path(topology.source_path).name == f"{name}.toml"
    for level in topology.levels:
        figures = [level.bandwidth, level.latency] + ([level.uplinks.bandwidth] if level.uplinks else [])
        for figure in figures:
            assert figure.value > 0 and math.isfinite(figure.value)
            assert figure.source.strip()
        assert 1e-9 <= level.latency.value <= 1e-3  # seconds: between a ns and a ms
        assert 1e8 <= level.bandwidth.value <= 1e13  # bytes/s: between 100 MB/s and 10 TB/s


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_every_builtin_file_is_also_loadable_by_path(name):
    builtin = load_topology(name)
    by_path = load_topology(builtin.source_path)
    assert (by_path.name, by_path.levels) == (builtin.name, builtin.levels)


def test_known_figures():
    a100 = load_topology("dgx-a100-x4")
    node, gpu = a100.levels
    assert gpu.bandwidth.value == pytest.approx(300e9)
    assert node.bandwidth.value == pytest.approx(25e9)  # one GPU's own 200 Gb/s NIC
    assert node.uplinks == Uplinks(8, Figure(pytest.approx(25e9), node.uplinks.bandwidth.source))
    assert load_topology("dgx-h100").levels[0].bandwidth.value == pytest.approx(450e9)
    h100 = load_topology("dgx-h100-2x8x8")
    rack, node, _ = h100.levels
    assert node.uplinks.count == 8 and node.uplinks.bandwidth.value == pytest.approx(50e9)
    rack_nics = node.uplinks.count * node.uplinks.bandwidth.value * h100.levels[1].size
    assert rack.uplinks.count * rack.uplinks.bandwidth.value < rack_nics  # oversubscribed
    assert load_topology("gcp-a2-2x16").levels[0].uplinks.bandwidth.value == pytest.approx(12.5e9)
    for emu in ("emu-2x4", "emu-4x2", "emu-2x2x2"):
        node = load_topology(emu).levels[load_topology(emu).level_index("node")]
        assert node.uplinks.count == 1
        assert "placeholder" in node.bandwidth.source


# --- units -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("300 GB/s", 300e9),
        ("200 Gb/s", 25e9),
        ("25 GiB/s", 25 * 2**30),
        ("100 Mb/s", 12.5e6),
        ("1.5 TB/s", 1.5e12),
        ("100Gbps", 12.5e9),
        ("400 Gbit/s", 50e9),
        ("10 kB/s", 1e4),
        (" 15.75 GB/s ", 15.75e9),
        ("1e3 MB/s", 1e9),
    ],
)
def test_parse_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text, expected",
    [("5 us", 5e-6), ("1.2 µs", 1.2e-6), ("1.2 μs", 1.2e-6), ("500 ns", 5e-7), ("2 ms", 2e-3), ("1 s", 1.0), ("3.4us", 3.4e-6)],
)
def test_parse_time(text, expected):
    assert parse_time(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("256MiB", 256 * 2**20),
        ("1 KiB", 1024),
        ("4GB", 4 * 10**9),
        ("1024", 1024),
        ("1.5 KiB", 1536),
        ("8 GiB", 8 * 2**30),
        ("1e6", 10**6),
        ("3 B", 3),
        (4096, 4096),
    ],
)
def test_parse_bytes(text, expected):
    value = parse_bytes(text)
    assert value == expected and isinstance(value, int)


@pytest.mark.parametrize(
    "parse, text, fragment",
    [
        (parse_bandwidth, "25 GB", "is a size, not a bandwidth"),
        (parse_bandwidth, "5 us", "is a time, not a bandwidth"),
        (parse_bandwidth, "25", "has no unit"),
        (parse_bandwidth, "0 GB/s", "not a positive bandwidth"),
        (parse_bandwidth, "-3 GB/s", "not a positive bandwidth"),
        (parse_bandwidth, "fast", "is not a bandwidth"),
        (parse_bandwidth, "25 XB/s", "is not a bandwidth"),
        (parse_bandwidth, "", "is not a bandwidth"),
        (parse_bandwidth, 25e9, "expected a string with a unit"),
        (parse_bandwidth, "inf GB/s", "is not a bandwidth"),
        (parse_time, "25 GB/s", "is a bandwidth, not a time"),
        (parse_time, "5 hours", "is not a time"),
        (parse_time, "0 us", "not a positive time"),
        (parse_time, "5", "has no unit"),
        (parse_bytes, "4 Gb", "in bits"),
        (parse_bytes, "0", "not a positive byte size"),
        (parse_bytes, -5, "not a positive byte size"),
        (parse_bytes, "1.5 B", "whole number of bytes"),
        (parse_bytes, "5 us", "is a time, not a byte size"),
        (parse_bytes, "25 GB/s", "is a bandwidth, not a byte size"),
        (parse_bytes, "256 parsecs", "is not a byte size"),
        (parse_bytes, "lots", "is not a byte size"),
    ],
)
def test_units_reject_with_one_line_and_an_example(parse, text, fragment):
    with pytest.raises(UsageError) as error:
        parse(text)
    one_line_naming(error, fragment, repr(text), "write e.g.")


def test_unit_errors_name_where():
    with pytest.raises(UsageError) as error:
        parse_bytes("12 parsecs", where="--bytes")
    assert str(error.value).startswith("--bytes: '12 parsecs'")


def test_format_round_trips():
    assert format_bandwidth(300e9) == "300 GB/s"
    assert format_time(5e-6) == "5 us"
    assert format_bytes(256 * 2**20) == "256 MiB"
    for value in (12.5e9, 1.5e12, 4e6):
        assert parse_bandwidth(format_bandwidth(value)) == pytest.approx(value)
    for value in (3.4e-6, 2e-3, 5e-7):
        assert parse_time(format_time(value)) == pytest.approx(value)


# --- validation of files -----------------------------------------------------------------

GOOD = """
name = "tiny"
description = "a test system"

[[levels]]
name = "node"
size = 2
bandwidth = { value = "25 GB/s", source = "test" }
latency = { value = "5 us", source = "test" }
uplinks = { count = 2, bandwidth = "200 Gb/s", source = "test" }

[[levels]]
name = "gpu"
size = 4
bandwidth = { value = "300 GB/s", source = "test" }
latency = { value = "1 us", source = "test" }
"""


def write(tmp_path: Path, text: str, name: str = "x.toml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


def test_good_file_loads(tmp_path):
    path = write(tmp_path, GOOD)
    topology = load_topology(path)
    assert topology.name == "tiny" and topology.description == "a test system"
    assert topology.sizes == (2, 4) and topology.device_count == 8
    node, gpu = topology.levels
    assert node.bandwidth == Figure(25e9, "test")
    assert node.latency == Figure(pytest.approx(5e-6), "test")
    assert node.uplinks == Uplinks(2, Figure(25e9, "test"))
    assert gpu.uplinks is None
    assert topology.source_path == str(Path(path).resolve())


def test_bare_hierarchy_without_figures(tmp_path):
    path = write(tmp_path, 'name = "bare"\n[[levels]]\nname = "node"\nsize = 2\n[[levels]]\nname = "gpu"\nsize = 8\n')
    topology = load_topology(path)
    assert topology.sizes == (2, 8) and not topology.has_link_figures
    assert topology.description == ""


def test_sub_table_form_equals_inline_form(tmp_path):
    split = GOOD.replace(
        'bandwidth = { value = "300 GB/s", source = "test" }', '[levels.bandwidth]\nvalue = "300 GB/s"\nsource = "test"'
    )
    split = split.replace('latency = { value = "1 us", source = "test" }', "")
    split += '[levels.latency]\nvalue = "1 us"\nsource = "test"\n'
    first = load_topology(write(tmp_path, GOOD, "a.toml"))
    second = load_topology(write(tmp_path, split, "b.toml"))
    assert first.levels == second.levels


BAD_CASES = [
    # (description, replace this, with this, fragments the message must contain)
    ("unknown top-level key", 'description = "a test system"', 'colour = "red"', ["colour", "unknown key"]),
    ("unknown level key", 'size = 4', 'size = 4\nbandwith = 3', ["levels[1].bandwith", "did you mean 'bandwidth'"]),
    (
        "unknown figure key",
        'latency = { value = "1 us", source = "test" }',
        'latency = { value = "1 us", source = "test", unit = "us" }',
        ["levels[1].latency.unit", "unknown key"],
    ),
    (
        "unknown uplink key",
        'uplinks = { count = 2, bandwidth = "200 Gb/s", source = "test" }',
        'uplinks = { count = 2, bandwidth = "200 Gb/s", source = "test", speed = 1 }',
        ["levels[0].uplinks.speed", "unknown key"],
    ),
    ("missing name", 'name = "tiny"', "", ["name", "missing"]),
    ("missing size", "size = 4", "", ["levels[1].size", "missing", "size = 8"]),
    ("missing level name", 'name = "gpu"', "", ["levels[1].name", "missing"]),
    ("zero size", "size = 4", "size = 0", ["levels[1].size", "0 is not a positive integer"]),
    ("negative size", "size = 2", "size = -2", ["levels[0].size", "-2 is not a positive integer"]),
    ("float size", "size = 4", "size = 4.0", ["levels[1].size", "not a positive integer"]),
    ("string size", "size = 4", 'size = "4"', ["levels[1].size", "not a positive integer"]),
    ("bool size", "size = 4", "size = true", ["levels[1].size", "not a positive integer"]),
    ("bad level name", 'name = "gpu"', 'name = "1gpu"', ["levels[1].name", "'1gpu'", "letters, digits"]),
    ("non-string level name", 'name = "gpu"', "name = 7", ["levels[1].name", "not a string"]),
    ("duplicate level name", 'name = "gpu"', 'name = "node"', ["levels[1].name", "'node'", "unique"]),
    ("bad topology name", 'name = "tiny"', 'name = "tiny cluster!"', ["name", "not a topology name"]),
    ("non-string description", 'description = "a test system"', "description = 3", ["description", "not a string"]),
    (
        "bandwidth without /s",
        'value = "300 GB/s"',
        'value = "300 GB"',
        ["levels[1].bandwidth.value", "'300 GB'", 'write e.g. "25 GB/s"'],
    ),
    ("time as bandwidth", 'value = "300 GB/s"', 'value = "3 us"', ["levels[1].bandwidth.value", "is a time"]),
    ("bandwidth as latency", 'value = "1 us"', 'value = "1 GB/s"', ["levels[1].latency.value", "is a bandwidth"]),
    ("number as bandwidth", 'value = "300 GB/s"', "value = 3e11", ["levels[1].bandwidth.value", "with a unit"]),
    ("zero latency", 'value = "1 us"', 'value = "0 us"', ["levels[1].latency.value", "not a positive time"]),
    (
        "bad uplink bandwidth",
        'bandwidth = "200 Gb/s"',
        'bandwidth = "200 Gb"',
        ["levels[0].uplinks.bandwidth", "'200 Gb'", "not a bandwidth"],
    ),
    ("zero uplink count", "count = 2", "count = 0", ["levels[0].uplinks.count", "not a positive integer"]),
    ("missing uplink count", "count = 2, ", "", ["levels[0].uplinks.count", "missing"]),
    (
        "bandwidth without latency",
        'latency = { value = "1 us", source = "test" }',
        "",
        ["levels[1].latency", "missing while bandwidth is given"],
    ),
    (
        "latency without bandwidth",
        'bandwidth = { value = "300 GB/s", source = "test" }',
        "",
        ["levels[1].bandwidth", "missing while latency is given"],
    ),
    (
        "missing figure source",
        'bandwidth = { value = "300 GB/s", source = "test" }',
        'bandwidth = { value = "300 GB/s" }',
        ["levels[1].bandwidth.source", "missing"],
    ),
    (
        "empty figure source",
        'latency = { value = "1 us", source = "test" }',
        'latency = { value = "1 us", source = "  " }',
        ["levels[1].latency.source", "empty"],
    ),
    (
        "missing uplink source",
        ', source = "test" }\n\n[[levels]]',
        " }\n\n[[levels]]",
        ["levels[0].uplinks.source", "missing"],
    ),
    ("missing figure value", '{ value = "1 us", source', "{ source", ["levels[1].latency.value", "missing"]),
    (
        "figure given as a bare string",
        'bandwidth = { value = "300 GB/s", source = "test" }',
        'bandwidth = "300 GB/s"',
        ["levels[1].bandwidth", "not a table with value and source"],
    ),
    (
        "uplinks without link figures",
        'bandwidth = { value = "25 GB/s", source = "test" }\nlatency = { value = "5 us", source = "test" }\n',
        "",
        ["levels[0].uplinks", "without the level's bandwidth and latency"],
    ),
    ("invalid TOML", 'name = "tiny"', "name = ", ["not valid TOML"]),
]


@pytest.mark.parametrize("label, old, new, fragments", BAD_CASES, ids=[case[0] for case in BAD_CASES])
def test_bad_files_raise_one_line_naming_the_field(tmp_path, label, old, new, fragments):
    assert old in GOOD, label
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(UsageError) as error:
        load_topology(path)
    message = one_line_naming(error, path, *fragments)
    assert message.startswith(f"{path}: ")


@pytest.mark.parametrize(
    "text, fragments",
    [
        ('name = "x"\n', ["levels", "missing"]),
        ('name = "x"\nlevels = []\n', ["levels", "at least one level"]),
        ('name = "x"\nlevels = [1, 2]\n', ["levels[0]", "not a table"]),
        ('name = "x"\n[levels]\nname = "gpu"\nsize = 2\n', ["levels", "at least one level"]),
        ('name = "x"\n[[levels]]\nname = "a"\nsize = 1048576\n[[levels]]\nname = "b"\nsize = 2\n', ["devices"]),
    ],
)
def test_bad_level_lists(tmp_path, text, fragments):
    path = write(tmp_path, text)
    with pytest.raises(UsageError) as error:
        load_topology(path)
    one_line_naming(error, path, *fragments)


def test_missing_file_lists_builtins(tmp_path):
    missing = str(tmp_path / "nope.toml")
    with pytest.raises(UsageError) as error:
        load_topology(missing)
    one_line_naming(error, "nope.toml", "dgx-a100-x4", "paper-fig3")


def test_unknown_builtin_lists_builtins():
    with pytest.raises(UsageError) as error:
        load_topology("dgx-b200-x9")
    one_line_naming(error, "'dgx-b200-x9'", "dgx-a100", "emu-2x4", "gcp-a2-2x16")


def test_directory_is_not_a_topology(tmp_path):
    with pytest.raises(UsageError) as error:
        load_topology(str(tmp_path) + "/")
    one_line_naming(error, "not a file")


def test_builtin_error_names_the_builtin_file(tmp_path, monkeypatch):
    """Messages about shipped files say `topologies/<name>.toml`, the path in the repository."""
    import synth.topology_file as topology_module

    (tmp_path / "broken.toml").write_text('name = "broken"\n[[levels]]\nname = "gpu"\nsize = 0\n', encoding="utf-8")
    monkeypatch.setattr(topology_module, "_builtin_dir", lambda: tmp_path)
    assert builtin_topology_names() == ["broken"]
    with pytest.raises(UsageError) as error:
        load_topology("broken")
    one_line_naming(error, "topologies/broken.toml: levels[0].size")


# --- bare hierarchies --------------------------------------------------------------------


def test_topology_from_levels():
    topology = topology_from_levels("rack=2, node=4,gpu=8")
    assert topology.level_names == ("rack", "node", "gpu")
    assert topology.sizes == (2, 4, 8) and topology.device_count == 64
    assert not topology.has_link_figures
    assert topology.level_index("node") == 1
    assert topology_from_levels("2,4").level_names == ("l0", "l1")


@pytest.mark.parametrize("text", ["", "gpu=0", "gpu=x", "1gpu=2", "gpu=2,gpu=4", "a=1024,b=1024,c=2", "gpu=-1"])
def test_topology_from_levels_rejects(text):
    with pytest.raises(UsageError) as error:
        topology_from_levels(text)
    assert "\n" not in str(error.value)


def test_level_index_unknown_name():
    with pytest.raises(UsageError) as error:
        topology_from_levels("node=2,gpu=4").level_index("rack")
    one_line_naming(error, "'rack'", "node, gpu")


def test_check_levels_rules():
    with pytest.raises(UsageError):
        check_levels((), "t")
    with pytest.raises(UsageError):
        check_levels((Level("a", 2), Level("a", 2)), "t")
    with pytest.raises(UsageError):
        check_levels((Level("a", 0),), "t")
    check_levels((Level("a", 2), Level("b", 3)), "t")


def test_topologies_are_frozen_and_hashable():
    topology = load_topology("dgx-a100-x4")
    with pytest.raises(AttributeError):
        topology.name = "other"  # type: ignore[misc]
    assert hash(topology) == hash(load_topology("dgx-a100-x4"))
    assert isinstance(topology, Topology)


def test_builtins_found_from_a_source_checkout(monkeypatch):
    """Without installed package data, the repository's topologies/ directory is used."""
    import pathlib

    import synth.topology_file as topology_module

    if not (pathlib.Path(topology_module.__file__).resolve().parent.parent / "topologies").is_dir():
        pytest.skip("synth is installed from a wheel here: there is no source checkout beside it")

    def not_installed(package):
        raise ModuleNotFoundError(package)

    monkeypatch.setattr(topology_module.resources, "files", not_installed)
    assert set(BUILTINS) <= set(builtin_topology_names())
    assert load_topology("emu-2x4").sizes == (2, 4)
