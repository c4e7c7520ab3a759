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

How NCCL runs on the system (synth/model/nccl/, the NCCL performance model) takes a few more
optional keys. Line rates stay the facts in `bandwidth` and `uplinks`; what NCCL reaches on
them is a separate figure with its own source::

    [nccl]                             # optional: what NCCL's tables key on
    generation = "hopper"              # volta, ampere, hopper or blackwell (required in the table)
    nvls = true                        # NVLink SHARP on NVSwitch (Hopper and later); default false
    cpu = "intel"                      # intel or amd (NCCL's LL limits across nodes); default intel
    algorithms = ["ring", "tree"]      # optional: NCCL_ALGO as the system runs it; default all
    protocols = ["Simple", "LL128"]    # optional: NCCL_PROTO; default all
    gpus_per_thread = 1                # optional: GPUs one host thread launches calls on (nccl-tests -g N); default 1
    cuda_graphs = false                # optional: calls captured in CUDA graphs (no per-call host launch); default false
    min_ctas = 24                      # optional: NCCL_MIN_CTAS, the fewest channels a communicator runs on; default NCCL's
    max_ctas = 32                      # optional: NCCL_MAX_CTAS, the most; default NCCL's
    version = "2.26"                   # optional: the NCCL release (2.26 to 2.32); default the newest, 2.32
    symmetric = true                   # optional: buffers registered as symmetric windows (2.27+ kernels); default false
    launch_per_gpu = { value = "5 us", source = "..." }  # optional: host time per GPU a thread launches a call on
    ib_qps = 2                         # optional: NCCL_IB_QPS_PER_CONNECTION, queue pairs per connection; default 1
    cpu_cores = 1                      # optional: CPU cores the launcher binds each process to (mpirun); default unbound
    source = "..."                     # required

    [[levels]]
    ...
    link = { kind = "infiniband", source = "..." }   # nvswitch, nvlink, pcie | infiniband, roce, ethernet, loopback
    transport = { kind = "ib", gdr = true, source = "..." }  # network levels: ib, socket or plugin
    efficiency = { value = 0.96, source = "..." }    # fraction of the line rate NCCL moves data at
    overhead = { value = "15 us", source = "..." }   # per call spanning this level, beyond NCCL's latency

    [levels.protocols.LL]              # optional, per protocol (LL, LL128, Simple), for calls spanning
    bandwidth = { value = 0.5, source = "..." }      # the level: achieved / modelled rate
    latency = { value = 1.1, source = "..." }        # achieved / NCCL's own latency

A level whose units are separate hosts joined by an NVLink switch fabric (the 18 compute trays
of a GB200 NVL72 rack) says so with `nvlink_domain = true` (its link must be `nvswitch`, and no
level inside it a network). NCCL's multi-node NVLink (MNNVL) then fuses the domain into one
node: its rings, trees and NVLS run over NVLink across the trays, and only calls that leave the
domain use the network level outside it (synth/model/nccl/hardware.py)::

    [[levels]]
    name = "tray"
    size = 18
    nvlink_domain = true
    link = { kind = "nvswitch", source = "..." }

A `transport` may also give, for sockets, `sockets` (streams per connection: NCCL_SOCKET_NTHREADS
x NCCL_NSOCKS_PERTHREAD; default NCCL's for the NIC `vendor`: aws, gcp or other) and `stream`
(what one stream moves, e.g. "25 Gb/s"); for a plugin, `latency` (what it reports, added to each
network step) and `unpack = true` when its receive side unpacks on the GPU; for any kind, `floor`
(the least time of a call crossing the level, e.g. "40 us": a net plugin's per-call cost, which
NCCL's tables do not have; `synth calibrate` fits it); for any network, `message_rate`, the
messages per second one NIC processes (what bounds many small point-to-point posts; default per
NIC kind, synth/model/nccl/p2p.py); `fabric_share`, the share of the NICs' rate a call over more than
two hosts keeps across a multi-level fabric (e.g. 0.88; default 1, `synth calibrate` fits it:
synth/model/nccl/fabric_share.py). Without these keys the NCCL model assumes defaults and says which
(synth/model/nccl/hardware.py).

`synth calibrate` also records what it fitted on, so a ranking can say how sure it is::

    [[calibration]]
    collective = "AllReduce"
    level = "node"                     # the outermost level the measured group spans
    nodes = 2
    ranks_per_node = 8
    min_bytes = 8
    max_bytes = 17179869184
    points = 32
    rms_error = 0.031                  # relative, after the fit
    worst_error = 0.087
    file = "all_reduce_perf-2nodes.txt"
    backend = "nccl"                   # optional: the library measured (nccl or gloo)
    sigma = 0.06                       # optional: a prediction's standard deviation of log(time)
"""

from __future__ import annotations

import difflib
import os
import re
from importlib import resources
from pathlib import Path

from synth.errors import InputRangeError, UsageError
from synth.names import check_name, echo
from synth.text import escaped
from synth.topology import (CalibrationRecord, CollectiveFigures, Figure, Level, LinkKind, NcclSystem,
                            ProtocolFactors, Topology, Transport, Uplinks, check_levels)
from synth.units import (BANDWIDTH_EXAMPLE, TIME_EXAMPLE, format_bandwidth, format_time, parse_bandwidth, parse_bytes,
                         parse_time)

_TOPOLOGY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*\Z")
_TOP_KEYS = ("name", "description", "levels", "device", "nccl", "calibration")
_LEVEL_KEYS = ("name", "size", "bandwidth", "latency", "uplinks", "collectives", "fabric",
               "link", "transport", "efficiency", "overhead", "protocols", "nvlink_domain")
from synth.model.nccl.names import GENERATIONS, LINK_KINDS, NETWORK_LINK_KINDS  # noqa: E402 - NCCL's names, once
from synth.model.nccl.names import PROTOCOLS as NCCL_PROTOCOLS  # noqa: E402
from synth.model.nccl.names import SELECTABLE_ALGORITHMS as NCCL_ALGORITHMS  # noqa: E402
from synth.model.nccl.names import TRANSPORTS as TRANSPORT_KINDS  # noqa: E402
from synth.model.nccl.names import NCCL_VERSIONS  # noqa: E402
_LINK_KEYS = ("kind", "source")
_TRANSPORT_KEYS = ("kind", "source", "gdr", "sockets", "vendor", "stream", "latency", "unpack", "stages", "floor",
                   "message_rate", "fabric_share")
_NCCL_KEYS = ("generation", "source", "nvls", "cpu", "algorithms", "protocols", "buffsize", "gpus_per_thread",
              "cuda_graphs", "min_ctas", "max_ctas", "version", "symmetric", "launch_per_gpu", "ib_qps",
              "cpu_cores")
_CALIBRATION_KEYS = ("collective", "level", "nodes", "ranks_per_node", "min_bytes", "max_bytes", "points",
                     "rms_error", "worst_error", "file", "backend", "bands", "sigma")
_OPTIONAL_CALIBRATION_KEYS = ("backend", "bands", "sigma")
_BAND_KEYS = ("band", "rms_error", "worst_error", "points")
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


def topology_from_text(text: str, where: str) -> Topology:
    """A topology from TOML text (what `synth calibrate` checks before it writes a file)."""
    return _parse_topology(text, where, None)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def toml_loads(text: str, where: str) -> dict:
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
        raise UsageError(f"{where}: its values are nested too deeply to be a synth file") from None
    except ValueError as error:  # an integer past Python's 4,300-digit string limit
        digits = re.search(r"has (\d+) digits", str(error))
        count = f"{int(digits.group(1)):,} digits" if digits else "too many digits"
        raise InputRangeError(f"{where}: a number in the file has {count} (Python reads at most 4,300); "
                              f"no figure needs so many: write it shorter") from None


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
    link = _link(table["link"], where, f"{field}.link") if "link" in table else None
    transport = _transport(table["transport"], where, f"{field}.transport") if "transport" in table else None
    if transport is not None and link is not None and link.kind not in NETWORK_LINK_KINDS:
        raise _field_error(where, f"{field}.transport", f"given on a level whose link is {link.kind!r}; a transport "
                           f"belongs to a network level ({', '.join(NETWORK_LINK_KINDS)})")
    efficiency = _efficiency(table["efficiency"], where, f"{field}.efficiency") if "efficiency" in table else None
    overhead = None
    if "overhead" in table:
        overhead = _figure(table["overhead"], parse_time, TIME_EXAMPLE, where, f"{field}.overhead")
    protocols = _protocols(table["protocols"], where, f"{field}.protocols") if "protocols" in table else ()
    domain = _bool(table.get("nvlink_domain", False), where, f"{field}.nvlink_domain")
    if domain and (link is None or link.kind not in NVLINK_DOMAIN_KINDS):
        raise _field_error(where, f"{field}.nvlink_domain", "an NVLink domain's units are joined by an NVLink switch "
                           "fabric: give the level link = { kind = \"nvswitch\", source = \"...\" }")
    return Level(name, size, bandwidth, latency, uplinks, collectives, fabric, link, transport, efficiency, overhead,
                 protocols, domain)


NVLINK_DOMAIN_KINDS = ("nvswitch", "nvlink")


def _check_domains(levels: tuple[Level, ...], where: str) -> None:
    """A level that is an NVLink domain holds no network inside it: the domain is one NCCL node."""
    for index, level in enumerate(levels):
        if not level.nvlink_domain:
            continue
        for inner in levels[index + 1:]:
            if inner.link is not None and inner.link.kind in NETWORK_LINK_KINDS:
                raise _field_error(where, f"levels[{index}].nvlink_domain", f"level {inner.name!r} inside the NVLink "
                                   f"domain {level.name!r} is a network ({inner.link.kind}); a domain's levels are "
                                   f"NVLink: move the network level outside it or drop nvlink_domain")


def _protocols(value, where: str, field: str) -> tuple[tuple[str, ProtocolFactors], ...]:
    example = '[levels.protocols.LL] with bandwidth = { value = 0.5, source = "..." }'
    table = _table(value, where, field, NCCL_PROTOCOLS, example)
    result = []
    for protocol in NCCL_PROTOCOLS:
        if protocol not in table:
            continue
        sub = f"{field}.{protocol}"
        figures = _table(table[protocol], where, sub, ("bandwidth", "latency"), example)
        factors = {key: _factor(figures[key], where, f"{sub}.{key}") for key in ("bandwidth", "latency") if key in figures}
        result.append((protocol, ProtocolFactors(factors.get("bandwidth"), factors.get("latency"))))
    return tuple(result)


def _factor(value, where: str, field: str) -> Figure:
    table = _table(value, where, field, _FIGURE_KEYS, f'{{ value = 0.5, {_SOURCE_HINT} }}')
    raw = _require(table, "value", where, field, "value = 0.5")
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0.001 <= raw <= 1000:
        raise _field_error(where, f"{field}.value", f"{raw!r} is not a factor in [0.001, 1000]; write e.g. value = 0.5")
    return Figure(float(raw), _source(table, where, field))


def _table(value, where: str, field: str, keys: tuple[str, ...], example: str) -> dict:
    if not isinstance(value, dict):
        raise _field_error(where, field, f"{value!r} is not a table; write e.g. {example}")
    _check_keys(value, keys, where, field)
    return value


def _choice(value, allowed: tuple[str, ...], where: str, field: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise _field_error(where, field, f"{value!r} is not one of {', '.join(allowed)}")
    return value


def _bool(value, where: str, field: str) -> bool:
    if not isinstance(value, bool):
        raise _field_error(where, field, f"{value!r} is not true or false")
    return value


def _link(value, where: str, field: str) -> LinkKind:
    table = _table(value, where, field, _LINK_KEYS, f'link = {{ kind = "nvswitch", {_SOURCE_HINT} }}')
    kind = _choice(_require(table, "kind", where, field, 'kind = "infiniband"'), LINK_KINDS, where, f"{field}.kind")
    return LinkKind(kind, _source(table, where, field))


def _transport(value, where: str, field: str) -> Transport:
    table = _table(value, where, field, _TRANSPORT_KEYS, f'transport = {{ kind = "ib", {_SOURCE_HINT} }}')
    kind = _choice(_require(table, "kind", where, field, 'kind = "socket"'), TRANSPORT_KINDS, where, f"{field}.kind")
    source = _source(table, where, field)
    gdr = _bool(table.get("gdr", kind != "socket"), where, f"{field}.gdr")
    sockets = None
    if "sockets" in table:
        sockets = _positive_int(table["sockets"], where, f"{field}.sockets", "sockets = 4")
        if sockets > 64:
            raise _field_error(where, f"{field}.sockets", f"{sockets} is more than NCCL's 64 sockets per connection")
    vendor = _choice(table.get("vendor", "other"), ("aws", "gcp", "other"), where, f"{field}.vendor")
    stream = latency = None
    if "stream" in table:
        stream = Figure(parse_bandwidth(table["stream"], where=f"{where}: {field}.stream"), source)
    if "latency" in table:
        latency = Figure(parse_time(table["latency"], where=f"{where}: {field}.latency"), source)
    unpack = _bool(table.get("unpack", False), where, f"{field}.unpack")
    stages = None
    if "stages" in table:
        raw = table["stages"]
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 <= raw <= 1000:
            raise _field_error(where, f"{field}.stages", f"{raw!r} is not a number of pipeline stages in [0, 1000]")
        stages = Figure(float(raw), source)
    if kind != "socket" and (sockets is not None or stream is not None):
        raise _field_error(where, field, "sockets and stream describe the socket transport; drop them or set "
                                         "kind = \"socket\"")
    floor = Figure(parse_time(table["floor"], where=f"{where}: {field}.floor"), source) if "floor" in table else None
    message_rate = None
    if "message_rate" in table:
        raw = table["message_rate"]
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 < raw < 1e12:
            raise _field_error(where, f"{field}.message_rate", f"{raw!r} is not a NIC message rate in messages per "
                                                               f"second (e.g. message_rate = 215e6)")
        message_rate = Figure(float(raw), source)
    fabric_share = None
    if "fabric_share" in table:
        raw = table["fabric_share"]
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0.05 <= raw <= 1:
            raise _field_error(where, f"{field}.fabric_share", f"{raw!r} is not a share of the NICs' rate in "
                                                               f"[0.05, 1] (e.g. fabric_share = 0.88)")
        fabric_share = Figure(float(raw), source)
    return Transport(kind, source, gdr, sockets, vendor, stream, latency, unpack, stages, floor, message_rate,
                     fabric_share)


def _efficiency(value, where: str, field: str) -> Figure:
    table = _table(value, where, field, _FIGURE_KEYS, f'efficiency = {{ value = 0.9, {_SOURCE_HINT} }}')
    raw = _require(table, "value", where, field, "value = 0.9")
    number = None
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        number = float(raw)
    elif isinstance(raw, str) and raw.strip().endswith("%"):
        try:
            number = float(raw.strip()[:-1]) / 100
        except ValueError:
            number = None
    if number is None or not 0 < number <= 1:
        raise _field_error(where, f"{field}.value", f"{raw!r} is not a fraction of the line rate in (0, 1]; write "
                                                    f"e.g. value = 0.9 or value = \"90%\"")
    return Figure(number, _source(table, where, field))


def _nccl(value, where: str) -> NcclSystem:
    example = f'[nccl] with generation = "hopper" and {_SOURCE_HINT}'
    table = _table(value, where, "nccl", _NCCL_KEYS, example)
    generation = _choice(_require(table, "generation", where, "nccl", 'generation = "hopper"'), GENERATIONS, where,
                         "nccl.generation")
    source = _source(table, where, "nccl")
    nvls = _bool(table.get("nvls", False), where, "nccl.nvls")
    if nvls and generation not in ("hopper", "blackwell"):
        raise _field_error(where, "nccl.nvls", f"NVLS needs Hopper or later NVSwitch systems, not {generation}")
    cpu = _choice(table.get("cpu", "intel"), ("intel", "amd"), where, "nccl.cpu")
    lists = []
    for key, allowed in (("algorithms", NCCL_ALGORITHMS), ("protocols", NCCL_PROTOCOLS)):
        items = table.get(key, [])
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            raise _field_error(where, f"nccl.{key}", f"{items!r} is not a list of names; write e.g. {key} = "
                                                     f"[\"{allowed[0]}\"]")
        for item in items:
            _choice(item, allowed, where, f"nccl.{key}")
        lists.append(tuple(items))
    buffsize = None
    if "buffsize" in table:
        buffsize = parse_bytes(table["buffsize"], where=f"{where}: nccl.buffsize") if isinstance(table["buffsize"], str) \
            else _positive_int(table["buffsize"], where, "nccl.buffsize", 'buffsize = "8MiB"')
    gpus_per_thread = _positive_int(table.get("gpus_per_thread", 1), where, "nccl.gpus_per_thread", "gpus_per_thread = 8")
    cuda_graphs = _bool(table.get("cuda_graphs", False), where, "nccl.cuda_graphs")
    ctas = [_positive_int(table[key], where, f"nccl.{key}", f"{key} = 24") if key in table else None
            for key in ("min_ctas", "max_ctas")]
    version = _choice(table["version"], NCCL_VERSIONS, where, "nccl.version") if "version" in table else None
    symmetric = _bool(table.get("symmetric", False), where, "nccl.symmetric")
    launch = None
    if "launch_per_gpu" in table:
        launch = _figure(table["launch_per_gpu"], parse_time, TIME_EXAMPLE, where, "nccl.launch_per_gpu")
    qps = _positive_int(table.get("ib_qps", 1), where, "nccl.ib_qps", "ib_qps = 2")
    cores = _positive_int(table["cpu_cores"], where, "nccl.cpu_cores", "cpu_cores = 1") if "cpu_cores" in table else None
    return NcclSystem(generation, source, nvls, cpu, lists[0], lists[1], buffsize, gpus_per_thread, cuda_graphs, *ctas,
                      version, symmetric, launch, qps, cores)


def _calibration(value, where: str) -> tuple[CalibrationRecord, ...]:
    if not isinstance(value, list):
        raise _field_error(where, "calibration", "is not an array of tables; write each as [[calibration]]")
    records = []
    for index, table in enumerate(value):
        field = f"calibration[{index}]"
        table = _table(table, where, field, _CALIBRATION_KEYS, "[[calibration]] with collective, level, nodes, ...")
        values = {}
        for key in _CALIBRATION_KEYS:
            if key in _OPTIONAL_CALIBRATION_KEYS and key not in table:
                continue
            raw = _require(table, key, where, field, f"{key} = ...")
            if key == "backend":
                values[key] = _choice(raw, ("nccl", "gloo"), where, f"{field}.{key}")
            elif key == "bands":
                values[key] = _bands(raw, where, f"{field}.{key}")
            elif key in ("collective", "level", "file"):
                values[key] = _string(raw, where, f"{field}.{key}", f'{key} = "..."')
            elif key in ("rms_error", "worst_error", "sigma"):
                if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw < 0:
                    raise _field_error(where, f"{field}.{key}", f"{raw!r} is not a non-negative number")
                values[key] = float(raw)
            else:
                values[key] = _positive_int(raw, where, f"{field}.{key}", f"{key} = 2")
        records.append(CalibrationRecord(**values))
    return tuple(records)


def _bands(value, where: str, field: str) -> tuple:
    """A record's error per size band: [{ band = "1-64 MiB", rms_error, worst_error, points }, ...]."""
    from synth.model.heldout import BANDS

    names = tuple(name for name, _, _ in BANDS)
    if not isinstance(value, list):
        raise _field_error(where, field, "is not an array; write bands = [{ band = \"1-64 MiB\", rms_error = 0.05, "
                                         "worst_error = 0.1, points = 12 }]")
    bands = []
    for index, table in enumerate(value):
        entry = f"{field}[{index}]"
        table = _table(table, where, entry, _BAND_KEYS, '{ band = "1-64 MiB", rms_error = 0.05, worst_error = 0.1, points = 12 }')
        band = _choice(_require(table, "band", where, entry, 'band = "1-64 MiB"'), names, where, f"{entry}.band")
        errors = []
        for key in ("rms_error", "worst_error"):
            raw = _require(table, key, where, entry, f"{key} = 0.05")
            if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 <= raw < float("inf"):
                raise _field_error(where, f"{entry}.{key}", f"{raw!r} is not a non-negative number")
            errors.append(float(raw))
        points = _positive_int(_require(table, "points", where, entry, "points = 12"), where, f"{entry}.points", "points = 12")
        bands.append((band, errors[0], errors[1], points))
    return tuple(bands)


def _parse_topology(text: str, where: str, source_path: str | None) -> Topology:
    """Validate a whole document; `where` prefixes every message so the user finds the line."""
    document = toml_loads(text, where)
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
    _check_domains(levels, where)
    device = _device(document["device"], where) if "device" in document else None
    nccl = _nccl(document["nccl"], where) if "nccl" in document else None
    calibration = _calibration(document["calibration"], where) if "calibration" in document else ()
    for index, record in enumerate(calibration):
        if record.level not in {level.name for level in levels}:
            raise _field_error(where, f"calibration[{index}].level", f"{record.level!r} is not a level of this file")
    return Topology(name=name, description=" ".join(description.split()), levels=levels, source_path=source_path,
                    device=device, nccl=nccl, calibration=calibration)


# ---------------------------------------------------------------------------------------
# Writer: a topology as this TOML, so calibrated figures load like any other file. Values keep
# six significant digits for fitted figures (far below measurement noise) and fifteen for
# figures copied from a base, so a copy is exact; every figure keeps its source.


def _comment(line: str) -> str:
    """One TOML comment line: control characters (a file name may hold any but NUL and /)
    written as escapes, which a comment may not hold raw."""
    text = escaped(line, keep="\t")
    return f"# {text}" if text else "#"


def _digits(figure: Figure) -> int:
    return 6 if figure.source.startswith(("fitted by synth calibrate", "scaled by synth calibrate")) else 15


def _figure_table(figure: Figure, render) -> dict:
    return {"value": render(figure.value, _digits(figure)), "source": figure.source}


def render_topology(topology: Topology, header: str = "") -> str:
    """The topology as TOML (written by tomli-w, so every string is escaped as TOML wants),
    after `header` as comment lines."""
    import tomli_w

    comments = "".join(_comment(line) + "\n" for line in header.split("\n")) if header else ""
    return comments + tomli_w.dumps(topology_document(topology))


def topology_document(topology: Topology) -> dict:
    """The topology as the tables and keys of its file (this module's docstring), figures
    written with their units: what `render_topology` writes as TOML, for JSON alike."""
    document: dict = {"name": topology.name, "description": topology.description}
    if topology.nccl is not None:
        nccl = topology.nccl
        table = {"generation": nccl.generation, "nvls": bool(nccl.nvls), "cpu": nccl.cpu}
        for key, items in (("algorithms", nccl.algorithms), ("protocols", nccl.protocols)):
            if items:
                table[key] = list(items)
        if nccl.buffsize is not None:
            table["buffsize"] = nccl.buffsize
        if nccl.gpus_per_thread != 1:
            table["gpus_per_thread"] = nccl.gpus_per_thread
        if nccl.cuda_graphs:
            table["cuda_graphs"] = True
        if nccl.cpu_cores is not None:
            table["cpu_cores"] = nccl.cpu_cores
        if nccl.launch_per_gpu is not None:
            table["launch_per_gpu"] = _figure_table(nccl.launch_per_gpu, format_time)
        for key in ("min_ctas", "max_ctas", "version"):
            if getattr(nccl, key) is not None:
                table[key] = getattr(nccl, key)
        if nccl.symmetric:
            table["symmetric"] = True
        if nccl.ib_qps != 1:
            table["ib_qps"] = nccl.ib_qps
        table["source"] = nccl.source
        document["nccl"] = table
    document["levels"] = [_level_table(level) for level in topology.levels]
    if topology.calibration:
        document["calibration"] = [_calibration_table(record) for record in topology.calibration]
    if topology.device is not None:
        document["device"] = _device_table(topology.device)
    return document


def _level_table(level: Level) -> dict:
    table: dict = {"name": level.name, "size": level.size}
    if level.bandwidth is not None:
        table["bandwidth"] = _figure_table(level.bandwidth, format_bandwidth)
        table["latency"] = _figure_table(level.latency, format_time)
    if level.uplinks is not None:
        uplinks = level.uplinks
        table["uplinks"] = {"count": uplinks.count,
                            "bandwidth": format_bandwidth(uplinks.bandwidth.value, _digits(uplinks.bandwidth)),
                            "source": uplinks.bandwidth.source}
    if level.fabric is not None:
        table["fabric"] = _figure_table(level.fabric, format_bandwidth)
    if level.collectives:
        table["collectives"] = {name: {"bandwidth": _figure_table(figures.bandwidth, format_bandwidth),
                                       "latency": _figure_table(figures.latency, format_time)}
                                for name, figures in level.collectives}
    if level.link is not None:
        table["link"] = {"kind": level.link.kind, "source": level.link.source}
    if level.transport is not None:
        transport = level.transport
        entry: dict = {"kind": transport.kind, "gdr": bool(transport.gdr)}
        if transport.sockets is not None:
            entry["sockets"] = transport.sockets
        if transport.vendor != "other":
            entry["vendor"] = transport.vendor
        if transport.stream is not None:
            entry["stream"] = format_bandwidth(transport.stream.value, 15)
        if transport.latency is not None:
            entry["latency"] = format_time(transport.latency.value, _digits(transport.latency))
        if transport.unpack:
            entry["unpack"] = True
        if transport.stages is not None:
            entry["stages"] = round(transport.stages.value, 4)
        if transport.floor is not None:
            entry["floor"] = format_time(transport.floor.value, _digits(transport.floor))
        if transport.message_rate is not None:
            entry["message_rate"] = transport.message_rate.value
        if transport.fabric_share is not None:
            entry["fabric_share"] = round(transport.fabric_share.value, 4)
        entry["source"] = transport.source
        table["transport"] = entry
    if level.efficiency is not None:
        table["efficiency"] = {"value": round(level.efficiency.value, 6), "source": level.efficiency.source}
    if level.overhead is not None:
        table["overhead"] = _figure_table(level.overhead, format_time)
    protocols: dict = {}
    for protocol, factors in level.protocols:
        for key in ("bandwidth", "latency"):
            figure = getattr(factors, key)
            if figure is not None:
                protocols.setdefault(protocol, {})[key] = {"value": round(figure.value, 6), "source": figure.source}
    if protocols:
        table["protocols"] = protocols
    if level.nvlink_domain:
        table["nvlink_domain"] = True
    return table


def _calibration_table(record: CalibrationRecord) -> dict:
    table = {}
    for key in _CALIBRATION_KEYS:
        value = getattr(record, key)
        if key == "bands":
            if value:
                table[key] = [{"band": band, "rms_error": round(rms, 6), "worst_error": round(worst, 6), "points": points}
                              for band, rms, worst, points in value]
        elif value is not None:
            table[key] = round(value, 6) if isinstance(value, float) else value
    return table


# ---------------------------------------------------------------------------------------
# The device table (optional; read by `synth plan`): one accelerator's memory, memory bandwidth,
# dense peak compute rate per precision and the fraction of peak its matrix multiplications
# reach in a training step, each with its source::
#
#     [device]
#     name = "NVIDIA A100-SXM4-80GB"
#     memory = { value = "80 GiB", source = "..." }
#     memory_bandwidth = { value = "2039 GB/s", source = "..." }    # optional
#     matmul_efficiency = { value = "46%", source = "..." }         # optional; or value = 0.46
#
#     [device.peak]                                                  # dense FLOP/s per precision
#     fp16 = { value = "312 TFLOP/s", source = "..." }
#     bf16 = { value = "312 TFLOP/s", source = "..." }
#
# Precisions are fp32, tf32, fp16, bf16 and fp8; rates are written with a unit (FLOP/s or
# FLOPS, with k M G T P prefixes). A name that selects a built-in description (synth/devices.py)
# may leave out memory, memory_bandwidth and peaks: those come from the description (`Device.taken`).
#
#     [device.reserve]                  # optional: what the job holds besides the model (synth/plan/reserve.py)
#     cuda_context = { value = "500 MiB", source = "..." }
#     cublas_workspace = { value = "32 MiB", source = "..." }
#     nccl_communicator = { value = "294 MiB", source = "..." }       # per TP/CP/EP/DP communicator
#     fragmentation = { value = "5%", source = "..." }                # the allocator's; below it a layout is tight

_DEVICE_KEYS = ("name", "memory", "memory_bandwidth", "matmul_efficiency", "peak", "reserve")
_RESERVE_KEYS = ("cuda_context", "cublas_workspace", "nccl_communicator", "fragmentation")
_FLOP_RATE = re.compile(r"\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([kKMGTP]?)(?:FLOP/s|FLOPS|flop/s)\s*\Z", re.ASCII)
_FLOP_PREFIXES = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
FLOP_RATE_EXAMPLE = "312 TFLOP/s"


def parse_flop_rate(text, where: str | None = None) -> float:
    """'312 TFLOP/s' (or '312 TFLOPS') -> 3.12e14 FLOP/s."""
    prefix = f"{where}: " if where else ""
    match = _FLOP_RATE.match(text) if isinstance(text, str) else None
    if not match:
        raise UsageError(f'{prefix}{text!r} is not a compute rate; write e.g. "{FLOP_RATE_EXAMPLE}"')
    value = float(match[1]) * _FLOP_PREFIXES[match[2]]
    if not value > 0 or value == float("inf"):
        raise UsageError(f'{prefix}{text!r} is not a positive compute rate; write e.g. "{FLOP_RATE_EXAMPLE}"')
    return value


def parse_fraction(value, where: str | None = None) -> float:
    """0.46 or '46%' -> 0.46: a fraction in (0, 1]."""
    prefix = f"{where}: " if where else ""
    number = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str) and value.isascii():  # float() would also read Arabic-Indic digits
        text = value.strip()
        try:
            number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            number = None
    if number is None or not 0 < number <= 1:
        raise UsageError(f'{prefix}{value!r} is not a fraction in (0, 1]; write e.g. "46%" or 0.46')
    return number


def format_flop_rate(value: float, digits: int = 4) -> str:
    for scale, unit in ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s")):
        if value >= scale:
            return f"{value / scale:.{digits}g} {unit}"
    return f"{value:.{digits}g} FLOP/s"


def _device(table, where: str):
    from synth.devices import device_named
    from synth.topology import PRECISIONS, Device  # the value type lives with Topology
    from synth.units import parse_bytes

    field = "device"
    if not isinstance(table, dict):
        raise _field_error(where, field, 'is not a table; write [device] with name, memory and [device.peak]')
    _check_keys(table, _DEVICE_KEYS, where, field)
    name = _string(_require(table, "name", where, field, 'name = "NVIDIA A100-SXM4-80GB"'), where, f"{field}.name",
                   'name = "NVIDIA A100-SXM4-80GB"')
    described = device_named(name)
    if described is None:  # another device states what it has; a built-in one may leave figures to its description
        _require(table, "memory", where, field, 'memory = { value = "80 GiB", source = "..." }')
        _require(table, "peak", where, field, f'[device.peak] with bf16 = {{ value = "{FLOP_RATE_EXAMPLE}", source = "..." }}')
    memory = bandwidth = efficiency = None
    if "memory" in table:
        memory = _figure(table["memory"], lambda text, where: float(parse_bytes(text, where=where)), "80 GiB", where,
                         f"{field}.memory")
    if "memory_bandwidth" in table:
        bandwidth = _figure(table["memory_bandwidth"], parse_bandwidth, "2039 GB/s", where, f"{field}.memory_bandwidth")
    if "matmul_efficiency" in table:
        efficiency = _figure(table["matmul_efficiency"], parse_fraction, "46%", where, f"{field}.matmul_efficiency")
    peaks = table.get("peak", {})
    if not isinstance(peaks, dict) or (not peaks and described is None):
        raise _field_error(where, f"{field}.peak", f'needs at least one precision, e.g. bf16 = {{ value = "{FLOP_RATE_EXAMPLE}", source = "..." }}')
    _check_keys(peaks, PRECISIONS, where, f"{field}.peak")
    peak = tuple((precision, _figure(peaks[precision], parse_flop_rate, FLOP_RATE_EXAMPLE, where, f"{field}.peak.{precision}"))
                 for precision in PRECISIONS if precision in peaks)
    device = Device(" ".join(name.split()), memory, peak, bandwidth, efficiency, reserve=_reserve(table, where))
    return device if described is None else _completed(device, described)


def _reserve(table: dict, where: str) -> tuple:
    """[device.reserve]: the device's own figures for what the job holds besides the model
    (synth/plan/reserve.py names them and their defaults), each with its source."""
    from synth.units import parse_bytes

    field = "device.reserve"
    figures = table.get("reserve", {})
    if not isinstance(figures, dict):
        raise _field_error(where, field, 'is not a table; write [device.reserve] with e.g. cuda_context = '
                                         '{ value = "500 MiB", source = "..." }')
    _check_keys(figures, _RESERVE_KEYS, where, field)
    read = {key: (parse_fraction, "15%") if key == "fragmentation" else
            (lambda text, where: float(parse_bytes(text, where=where)), "500 MiB") for key in _RESERVE_KEYS}
    return tuple((key, _figure(figures[key], read[key][0], read[key][1], where, f"{field}.{key}"))
                 for key in _RESERVE_KEYS if key in figures)


def _completed(device, described):
    """A built-in device's [device] table with every figure it leaves out taken from the built-in
    description (synth/devices.py), each source saying so, and `taken` naming them."""
    import dataclasses

    from synth.topology import PRECISIONS

    def built_in(figure: Figure) -> Figure:
        return Figure(figure.value, f"built-in description {described.key}: {figure.source}")

    taken = []
    memory, bandwidth = device.memory, device.memory_bandwidth
    if memory is None:
        memory = built_in(described.memory)
        taken.append("memory")
    if bandwidth is None:
        bandwidth = built_in(described.memory_bandwidth)
        taken.append("memory_bandwidth")
    stated = dict(device.peak)
    taken += [f"peak.{precision}" for precision, _ in described.peak if precision not in stated]
    peak = {precision: built_in(figure) for precision, figure in described.peak} | stated
    peak = tuple((precision, peak[precision]) for precision in PRECISIONS if precision in peak)
    return dataclasses.replace(device, memory=memory, memory_bandwidth=bandwidth, peak=peak, described=described.key,
                               taken=tuple(taken))


def _exact_bytes(value: float, digits: int) -> str:
    """A byte count that reads back exactly: whole GiB or GB where it is one, else bytes."""
    count = int(value)
    if count % 2**30 == 0:
        return f"{count // 2**30} GiB"
    if count % 10**9 == 0:
        return f"{count // 10**9} GB"
    return f"{count} B"


def _exact_bandwidth(value: float, digits: int) -> str:
    """A bandwidth that reads back exactly: the shortest decimal form in B/s."""
    return f"{value!r} B/s" if value != int(value) else f"{int(value)} B/s"


def _device_table(device) -> dict:
    """The [device] table, when the topology has one (so a calibrated copy keeps it)."""
    table: dict = {"name": device.name, "memory": _figure_table(device.memory, _exact_bytes)}
    if device.memory_bandwidth is not None:
        table["memory_bandwidth"] = _figure_table(device.memory_bandwidth, _exact_bandwidth)
    if device.matmul_efficiency is not None:
        table["matmul_efficiency"] = _figure_table(device.matmul_efficiency, lambda value, digits: repr(value))
    if device.peak:
        table["peak"] = {precision: _figure_table(figure, format_flop_rate) for precision, figure in device.peak}
    if device.reserve:
        table["reserve"] = {key: _figure_table(figure, (lambda value, digits: repr(value)) if key == "fragmentation"
                                               else _exact_bytes) for key, figure in device.reserve}
    return table
