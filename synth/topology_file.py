"""The TOML format of topologies: reading a file (built-in by name, or a path) into a
`Topology` (synth/topology.py) and writing one back (what `synth calibrate` produces).

A topology comes from a TOML file (built-in by name, or a path) or from a bare `--levels`
list, which has sizes only: enough for placements and synthesis, not for costs.
Every figure carries its source, so a reader can check where a number came from.

The file format (`load_topology`; built-ins live in `topologies/<name>.toml`)::

    name = "dgx-a100-x4"               # required: letters, digits, '_', '-', '.'
    description = "4 DGX A100 nodes"   # optional

    [[levels]]                         # required, one table per level, outermost first
    name = "node"                      # required, an identifier unique in the file
    size = 4                           # required, children per parent, a positive integer
    bandwidth = { value = "25 GB/s", source = "..." }  # per device, one direction
    latency = { value = "5 us", source = "..." }
    uplinks = { count = 8, bandwidth = "200 Gb/s", source = "..." }

    [[levels]]
    name = "gpu"
    size = 8
    bandwidth = { value = "300 GB/s", source = "..." }
    latency = { value = "1 us", source = "..." }

`bandwidth` is what one device gets when it alone talks to a device in another unit of
this level (inside the same parent): for a DGX A100 node level, one GPU's own 200 Gb/s NIC,
not the node's NIC total divided by its GPUs. `latency` is the per-message latency of that
path. `uplinks` (optional) are the links each unit of the level shares to reach the rest of
the system: a node's NIC pool, a rack's spine uplinks; `bandwidth` there is per link.
Link figures are optional as a group, so a file may describe a bare hierarchy, but a level
with one of bandwidth and latency must have both, and uplinks need them too. Every figure
needs a non-empty `source`: a spec sheet, a paper, or `estimate: ...` saying how it was
guessed. Values carry units (see synth.units); bare numbers are refused, so a figure can be
checked against its source as written.

A level may also carry figures for single collectives, for a backend whose collectives
differ from one another (gloo's reduce-scatter is a whole all-reduce); `synth calibrate`
writes them::

    [levels.collectives.AllGather]     # optional; AllReduce, ReduceScatter, AllGather, Reduce, Broadcast
    bandwidth = { value = "1.2 GB/s", source = "..." }
    latency = { value = "80 us", source = "..." }

Both figures are required in such a table, and the level must have its own bandwidth and
latency (they stay the figures of every collective not listed). The simulator costs a step
of that collective with these figures in place of the level's, and the level's uplinks
scaled by the same factor as its bandwidth (`Topology.for_collective`): the figures say how
fast the level's links run for that collective.

A level may also say that the interconnect joining its units inside one parent is a shared
medium of limited total capacity (a bus, an oversubscribed switch, the emulated cluster's
node loopback, whose one queue carries every byte a node's devices send each other)::

    fabric = { value = "15.6 MB/s", source = "..." }   # optional: all traffic of the level, per parent

Every byte between two units of the level (inside one parent) crosses it once, whatever its
direction, so a step's time is at least the level's traffic in one parent over this figure;
the per-device `bandwidth` still caps each device. Per-collective figures scale it like the
uplinks.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from importlib import resources
from pathlib import Path

from synth.errors import UsageError
from synth.names import check_name, echo
from synth.topology import CollectiveFigures, Figure, Level, Topology, Uplinks, check_levels
from synth.units import BANDWIDTH_EXAMPLE, TIME_EXAMPLE, format_bandwidth, format_time, parse_bandwidth, parse_time

_TOPOLOGY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*\Z")
_TOP_KEYS = ("name", "description", "levels")
_LEVEL_KEYS = ("name", "size", "bandwidth", "latency", "uplinks", "collectives", "fabric")
_COLLECTIVE_KEYS = ("bandwidth", "latency")
_FIGURE_KEYS = ("value", "source")
_UPLINK_KEYS = ("count", "bandwidth", "source")
MAX_FILE_BYTES = 1 << 20  # a topology file of a megabyte is something else
_SOURCE_HINT = 'source = "spec sheet, paper, or estimate: how it was guessed"'


def _builtin_dir():
    """The directory of built-in topology files: package data when installed, else the
    repository's `topologies/` beside `synth/` (a source checkout run without installing)."""
    try:
        directory = resources.files("synth.topologies")
        if any(entry.name.endswith(".toml") for entry in directory.iterdir()):
            return directory
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
        pass
    return Path(__file__).resolve().parent.parent / "topologies"


def builtin_topology_names() -> list[str]:
    """Names accepted by `load_topology` without a path, sorted."""
    directory = _builtin_dir()
    try:
        entries = list(directory.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(entry.name[: -len(".toml")] for entry in entries if entry.name.endswith(".toml"))


def _builtin_list() -> str:
    names = builtin_topology_names()
    return ", ".join(names) if names else "(none installed)"


def load_topology(spec: str | os.PathLike) -> Topology:
    """A topology from a built-in name (`dgx-a100-x4`) or a path to a TOML file.

    A spec ending in `.toml` or containing a path separator is a path; anything else is a
    built-in name first and a path only if no built-in has that name.
    """
    text_spec = os.fspath(spec)
    shown = echo(text_spec)
    looks_like_path = text_spec.endswith(".toml") or "/" in text_spec or os.sep in text_spec
    if not looks_like_path and text_spec in builtin_topology_names():
        entry = _builtin_dir() / f"{text_spec}.toml"
        where = f"topologies/{text_spec}.toml"
        text = entry.read_text(encoding="utf-8")
        return _parse_topology(text, where, str(entry))
    path = Path(text_spec)
    try:  # a name too long for the file system, or a NUL in it, is no file either
        is_file, exists = path.is_file(), path.exists()
    except (OSError, ValueError):
        is_file = exists = False
    if not is_file:
        if looks_like_path or exists:
            problem = f"no topology file {shown}" if not exists else f"{shown} is not a file"
            raise UsageError(f"{problem}: give a path to a TOML file or a built-in name: {_builtin_list()}")
        raise UsageError(f"unknown topology {shown}: use a built-in name ({_builtin_list()}) or a path to a .toml file")
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise UsageError(f"{shown}: {path.stat().st_size} bytes is not a topology file (at most {MAX_FILE_BYTES})")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"{shown}: cannot read the file ({_one_line(error)}); give a readable UTF-8 TOML file") from None
    return _parse_topology(text, text_spec if len(text_spec) <= 200 else shown, str(path.resolve()))


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def _toml_loads(text: str, where: str) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the same parser, packaged as tomli
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise UsageError(f"{where}: reading TOML needs Python 3.11 or the 'tomli' package") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"{where}: not valid TOML: {_one_line(error)}") from None
    except RecursionError:  # tables or arrays nested thousands deep
        raise UsageError(f"{where}: not a topology file: its values are nested too deeply") from None


def _field_error(where: str, field: str, message: str) -> UsageError:
    return UsageError(f"{where}: {field}: {message}")


def _check_keys(table: dict, allowed: tuple[str, ...], where: str, field: str) -> None:
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"allowed keys are {', '.join(allowed)}"
            name = f"{field}.{key}" if field else str(key)
            raise _field_error(where, name, f"unknown key; {hint}")


def _require(table: dict, key: str, where: str, field: str, example: str):
    if key not in table:
        raise _field_error(where, f"{field}.{key}" if field else key, f"missing; add e.g. {example}")
    return table[key]


def _string(value, where: str, field: str, example: str) -> str:
    if not isinstance(value, str):
        raise _field_error(where, field, f"{value!r} is not a string; write e.g. {example}")
    return value


def _positive_int(value, where: str, field: str, example: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _field_error(where, field, f"{value!r} is not a positive integer; write e.g. {example}")
    return value


def _source(table: dict, where: str, field: str) -> str:
    source = _require(table, "source", where, field, _SOURCE_HINT)
    source = _string(source, where, f"{field}.source", _SOURCE_HINT)
    if not source.strip():
        raise _field_error(where, f"{field}.source", f"is empty; every figure needs one, e.g. {_SOURCE_HINT}")
    return " ".join(source.split())


def _figure(value, parse, example: str, where: str, field: str) -> Figure:
    form = f'{field.rsplit(".", 1)[-1]} = {{ value = "{example}", {_SOURCE_HINT} }}'
    if not isinstance(value, dict):
        raise _field_error(where, field, f"{value!r} is not a table with value and source; write e.g. {form}")
    _check_keys(value, _FIGURE_KEYS, where, field)
    quantity = _require(value, "value", where, field, f'value = "{example}"')
    number = parse(quantity, where=f"{where}: {field}.value")
    return Figure(number, _source(value, where, field))


def _uplinks(value, where: str, field: str) -> Uplinks:
    form = f'uplinks = {{ count = 8, bandwidth = "200 Gb/s", {_SOURCE_HINT} }}'
    if not isinstance(value, dict):
        raise _field_error(where, field, f"{value!r} is not a table; write e.g. {form}")
    _check_keys(value, _UPLINK_KEYS, where, field)
    count = _positive_int(_require(value, "count", where, field, "count = 8"), where, f"{field}.count", "count = 8")
    quantity = _require(value, "bandwidth", where, field, 'bandwidth = "200 Gb/s"')
    bandwidth = parse_bandwidth(quantity, where=f"{where}: {field}.bandwidth")
    return Uplinks(count, Figure(bandwidth, _source(value, where, field)))


def _collectives(value, where: str, field: str) -> tuple[tuple[str, CollectiveFigures], ...]:
    """The optional per-collective figures of a level, in the language's collective order."""
    from synth.language import collective_names  # the grammar is the one list of collectives

    names = collective_names()
    form = f'[levels.collectives.AllGather] with bandwidth = {{ value = "{BANDWIDTH_EXAMPLE}", source = "..." }} and latency'
    if not isinstance(value, dict):
        raise _field_error(where, field, f"{value!r} is not a table; write e.g. {form}")
    _check_keys(value, names, where, field)
    result = []
    for name in names:
        if name not in value:
            continue
        table, sub = value[name], f"{field}.{name}"
        if not isinstance(table, dict):
            raise _field_error(where, sub, f"{table!r} is not a table; write e.g. {form}")
        _check_keys(table, _COLLECTIVE_KEYS, where, sub)
        bandwidth = _require(table, "bandwidth", where, sub, f'bandwidth = {{ value = "{BANDWIDTH_EXAMPLE}", source = "..." }}')
        latency = _require(table, "latency", where, sub, f'latency = {{ value = "{TIME_EXAMPLE}", source = "..." }}')
        result.append((name, CollectiveFigures(
            _figure(bandwidth, parse_bandwidth, BANDWIDTH_EXAMPLE, where, f"{sub}.bandwidth"),
            _figure(latency, parse_time, TIME_EXAMPLE, where, f"{sub}.latency"))))
    return tuple(result)


def _level(table, index: int, where: str, seen: dict[str, int]) -> Level:
    field = f"levels[{index}]"
    if not isinstance(table, dict):
        raise _field_error(where, field, 'is not a table; write each level as [[levels]] with name = "gpu" and size = 8')
    _check_keys(table, _LEVEL_KEYS, where, field)
    name = _string(_require(table, "name", where, field, 'name = "gpu"'), where, f"{field}.name", 'name = "gpu"')
    try:
        check_name(name, "level")
    except UsageError as error:
        raise _field_error(where, f"{field}.name", str(error)) from None
    if name in seen:
        raise _field_error(
            where, f"{field}.name", f"level name {name!r} is also levels[{seen[name]}].name; level names must be unique"
        )
    seen[name] = index
    size = _positive_int(_require(table, "size", where, field, "size = 8"), where, f"{field}.size", "size = 8")
    has_bandwidth, has_latency = "bandwidth" in table, "latency" in table
    if has_bandwidth != has_latency:
        missing, present = ("latency", "bandwidth") if has_bandwidth else ("bandwidth", "latency")
        example = (
            f'latency = {{ value = "{TIME_EXAMPLE}", source = "..." }}'
            if missing == "latency"
            else f'bandwidth = {{ value = "{BANDWIDTH_EXAMPLE}", source = "..." }}'
        )
        raise _field_error(where, f"{field}.{missing}", f"missing while {present} is given; add e.g. {example} or drop {present}")
    if "uplinks" in table and not has_bandwidth:
        raise _field_error(where, f"{field}.uplinks", "given without the level's bandwidth and latency; add them or drop uplinks")
    if "fabric" in table and not has_bandwidth:
        raise _field_error(where, f"{field}.fabric", "given without the level's bandwidth and latency; add them or drop fabric")
    if "collectives" in table and not has_bandwidth:
        raise _field_error(where, f"{field}.collectives",
                           "given without the level's bandwidth and latency (the figures of every other collective); add them")
    bandwidth = latency = uplinks = None
    collectives: tuple[tuple[str, CollectiveFigures], ...] = ()
    if has_bandwidth:
        bandwidth = _figure(table["bandwidth"], parse_bandwidth, BANDWIDTH_EXAMPLE, where, f"{field}.bandwidth")
        latency = _figure(table["latency"], parse_time, TIME_EXAMPLE, where, f"{field}.latency")
    if "uplinks" in table:
        uplinks = _uplinks(table["uplinks"], where, f"{field}.uplinks")
    if "collectives" in table:
        collectives = _collectives(table["collectives"], where, f"{field}.collectives")
    fabric = None
    if "fabric" in table:
        fabric = _figure(table["fabric"], parse_bandwidth, BANDWIDTH_EXAMPLE, where, f"{field}.fabric")
    return Level(name, size, bandwidth, latency, uplinks, collectives, fabric)


def _parse_topology(text: str, where: str, source_path: str | None) -> Topology:
    """Validate a whole document; `where` prefixes every message so the user finds the line."""
    document = _toml_loads(text, where)
    _check_keys(document, _TOP_KEYS, where, "")
    name = _string(_require(document, "name", where, "", 'name = "my-cluster"'), where, "name", 'name = "my-cluster"')
    if not _TOPOLOGY_NAME.match(name):
        raise _field_error(where, "name", f"{name!r} is not a topology name; use letters, digits, '_', '-' and '.', e.g. \"my-cluster\"")
    description = _string(document.get("description", ""), where, "description", 'description = "2 nodes of 8 GPUs"')
    raw_levels = _require(document, "levels", where, "", '[[levels]] tables with name and size')
    if not isinstance(raw_levels, list) or not raw_levels:
        raise _field_error(where, "levels", 'needs at least one level; write each as [[levels]] with name = "gpu" and size = 8')
    seen: dict[str, int] = {}
    levels = tuple(_level(table, index, where, seen) for index, table in enumerate(raw_levels))
    check_levels(levels, where)
    return Topology(name=name, description=" ".join(description.split()), levels=levels, source_path=source_path)


# ---------------------------------------------------------------------------------------
# Writer: a topology as this TOML, so calibrated figures load like any other file. Values keep
# six significant digits for fitted figures (far below measurement noise) and fifteen for
# figures copied from a base, so a copy is exact; every figure keeps its source.


def _toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes (\\" \\\\ \\n \\uXXXX) are TOML's."""
    return json.dumps(text, ensure_ascii=False)


def _digits(figure: Figure) -> int:
    return 6 if figure.source.startswith(("fitted by synth calibrate", "scaled by synth calibrate")) else 15


def _write_figure(table: str, figure: Figure, render) -> list[str]:
    return ["", f"[{table}]", f"value = {_toml_string(render(figure.value, _digits(figure)))}",
            f"source = {_toml_string(figure.source)}"]


def render_topology(topology: Topology, header: str = "") -> str:
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    lines += [f"name = {_toml_string(topology.name)}", f"description = {_toml_string(topology.description)}"]
    for level in topology.levels:
        lines += ["", "[[levels]]", f"name = {_toml_string(level.name)}", f"size = {level.size}"]
        if level.bandwidth is not None:
            lines += _write_figure("levels.bandwidth", level.bandwidth, format_bandwidth)
            lines += _write_figure("levels.latency", level.latency, format_time)
        if level.uplinks is not None:
            uplinks = level.uplinks
            lines += ["", "[levels.uplinks]", f"count = {uplinks.count}",
                      f"bandwidth = {_toml_string(format_bandwidth(uplinks.bandwidth.value, _digits(uplinks.bandwidth)))}",
                      f"source = {_toml_string(uplinks.bandwidth.source)}"]
        if level.fabric is not None:
            lines += _write_figure("levels.fabric", level.fabric, format_bandwidth)
        for name, figures in level.collectives:
            lines += _write_figure(f"levels.collectives.{name}.bandwidth", figures.bandwidth, format_bandwidth)
            lines += _write_figure(f"levels.collectives.{name}.latency", figures.latency, format_time)
    return "\n".join(lines) + "\n"
