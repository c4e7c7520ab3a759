"""The co-design grid: a TOML file naming the axes of a sweep over systems, models and the planner's choices.

Every axis is a list of values; the sweep is their product (points.py). A value is checked here,
once, so that a typo is refused before any point is planned. The file (docs/codesign.md):

    [sweep]
    token_budget = 1e12                # tokens to train (time and cost to train it, per point)
    prices = { dgx-h100 = 3.0 }        # per device-hour, by the topology that gives the device
    [axes]
    topology = ["dgx-h100-2x8x8"]      # base systems (built-in names or TOML files)
    device = ["dgx-h100", "selene"]    # optional: [device] and [nccl] taken from these instead
    nccl_version = ["2.26", "2.28"]    # optional: the systems' [nccl] version
    nccl_symmetric = [false, true]     # optional: buffers registered as symmetric windows (2.27+)
    model = ["llama3-70b"]
    global_batch = [1024]              # optional: sequences per step (default: the model's)
    seq_len = [4096]                   # optional (default: the model's)
    [axes.levels.node]                 # figures of one level of the base systems
    size = [2, 4]                      # units per parent (node count, NVLink domain size, ...)
    bandwidth = ["400 Gb/s"]           # per device, one direction
    latency = ["5 us"]
    nics = [4, 8]                      # the level's uplinks per unit (a node's NICs)
    nic_bandwidth = ["400 Gb/s"]       # per uplink
    oversubscription = [1, 2]          # the uplinks' bandwidth divided by this
    [axes.plan]                        # the planner's choices, as `synth plan` takes them
    tp = [8]
    recompute = ["none", "none,selective,full"]

The NCCL version and symmetric registration are the systems' `[nccl] version` and `symmetric`
(synth/topology_file.py, docs/calibrate.md): swept, they replace the base's (or the swept device's) values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from synth.codesign.errors import GridError
from synth.errors import UsageError

LEVEL_FIGURES = ("size", "bandwidth", "latency", "nics", "nic_bandwidth", "oversubscription")
PLAN_INTEGERS = ("tp", "pp", "dp", "ep", "etp", "cp", "max_tp")
PLAN_CHOICES = {
    "recompute": None,  # comma-separated none/selective/full
    "sequence_parallel": ("on", "off", "both"),
    "zero1": ("on", "off", "both"),
    "zero_stage": None,  # comma-separated 1/2/3
    "offload": ("on", "off", "both"),
    "micro_batch": None,  # comma-separated positive integers
    "virtual_stages": None,
    "fp8": (False, True),
}
PLAN_KEYS = PLAN_INTEGERS + tuple(PLAN_CHOICES)
NCCL_AXES = ("nccl_version", "nccl_symmetric")  # the systems' [nccl] version and symmetric
TOP_KEYS = ("topology", "device", *NCCL_AXES, "model", "global_batch", "seq_len", "levels", "plan")
SWEEP_KEYS = ("token_budget", "prices", "max_len", "backend", "memory_headroom")
MAX_POINTS = 10**8  # a grid beyond this is a typo in an axis, not a study


@dataclass(frozen=True)
class Axis:
    """One swept figure: its column name (e.g. `node.nics`, `plan.tp`) and its values in order."""

    name: str
    values: tuple


@dataclass(frozen=True)
class Grid:
    """The axes (outermost first: systems, then models, then planner choices, so that neighbouring
    points share a system and its priced collectives) and the sweep's settings."""

    axes: tuple[Axis, ...]
    token_budget: float | None = None
    prices: tuple[tuple[str, float], ...] = ()  # (device source topology, price per device-hour)
    max_len: int = 5
    backend: str = "nccl"
    memory_headroom: float = 0.1
    source: str = ""

    @property
    def size(self) -> int:
        return math.prod(len(axis.values) for axis in self.axes)

    def axis(self, name: str) -> Axis | None:
        return next((axis for axis in self.axes if axis.name == name), None)

    def price(self, device_source: str) -> float | None:
        return dict(self.prices).get(device_source)


def load_grid(path: str | Path) -> Grid:
    """Read and check a grid file (raises GridError naming the key and the fix)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise GridError(f"grid {path}: cannot read it ({getattr(error, 'strerror', None) or error}); "
                        f"give a TOML grid file (docs/codesign.md)") from None
    return grid_from_text(text, str(path))


def grid_from_text(text: str, where: str) -> Grid:
    from synth.topology_file import toml_loads  # the one TOML reader: tomli on 3.10, bad numbers and nesting named

    try:
        data = toml_loads(text, f"grid {where}")
    except UsageError as error:
        raise GridError(f"{error}; see docs/codesign.md for the form") from None
    _keys(data, ("sweep", "axes"), where, "")
    sweep = data.get("sweep", {})
    axes_table = data.get("axes")
    if not isinstance(sweep, dict) or not isinstance(axes_table, dict):
        raise GridError(f"grid {where}: give an [axes] table (and optionally [sweep]); see docs/codesign.md")
    _keys(sweep, SWEEP_KEYS, where, "sweep.")
    _keys(axes_table, TOP_KEYS, where, "axes.")
    axes = []
    for name in ("topology", "device"):
        if name in axes_table:
            axes.append(Axis(name, _strings(axes_table[name], where, f"axes.{name}")))
    if "nccl_version" in axes_table:
        axes.append(Axis("nccl_version", _versions(axes_table["nccl_version"], where)))
    if "nccl_symmetric" in axes_table:
        axes.append(Axis("nccl_symmetric", _booleans(axes_table["nccl_symmetric"], where, "axes.nccl_symmetric")))
    if "topology" not in axes_table:
        raise GridError(f"grid {where}: axes.topology is missing; give base systems, e.g. topology = [\"selene\"]")
    levels = axes_table.get("levels", {})
    if not isinstance(levels, dict):
        raise GridError(f"grid {where}: axes.levels must be tables, e.g. [axes.levels.node] size = [2, 4]")
    for level, figures in levels.items():
        if not isinstance(figures, dict):
            raise GridError(f"grid {where}: axes.levels.{level} must be a table, e.g. size = [2, 4]")
        _keys(figures, LEVEL_FIGURES, where, f"axes.levels.{level}.")
        for figure in LEVEL_FIGURES:
            if figure in figures:
                axes.append(Axis(f"{level}.{figure}", _level_values(figures[figure], figure, where,
                                                                       f"axes.levels.{level}.{figure}")))
    if "model" not in axes_table:
        raise GridError(f"grid {where}: axes.model is missing; give models, e.g. model = [\"llama3-70b\"]")
    axes.append(Axis("model", _strings(axes_table["model"], where, "axes.model")))
    for name in ("global_batch", "seq_len"):
        if name in axes_table:
            axes.append(Axis(name, _positive_ints(axes_table[name], where, f"axes.{name}")))
    plan = axes_table.get("plan", {})
    if not isinstance(plan, dict):
        raise GridError(f"grid {where}: axes.plan must be a table, e.g. [axes.plan] tp = [1, 8]")
    _keys(plan, PLAN_KEYS, where, "axes.plan.")
    for name in PLAN_KEYS:
        if name in plan:
            axes.append(Axis(f"plan.{name}", _plan_values(plan[name], name, where)))
    grid = Grid(tuple(axes), _budget(sweep.get("token_budget"), where), _prices(sweep.get("prices", {}), where),
                _max_len(sweep.get("max_len", 5), where), _string(sweep.get("backend", "nccl"), where, "sweep.backend"),
                _headroom(sweep.get("memory_headroom", 0.1), where), where)
    if grid.size > MAX_POINTS:
        raise GridError(f"grid {where}: {grid.size:,} points, more than {MAX_POINTS:,}; sweep fewer values per axis")
    return grid


def _keys(table: dict, allowed: tuple[str, ...], where: str, prefix: str) -> None:
    for key in table:
        if key not in allowed:
            raise GridError(f"grid {where}: unknown key {prefix}{key}; the keys are {', '.join(allowed)}")


def _list(value, where: str, field: str) -> list:
    if not isinstance(value, list) or not value:
        raise GridError(f"grid {where}: {field} = {value!r}: give a non-empty list, e.g. {field.split('.')[-1]} = [...]")
    if len(set(map(repr, value))) != len(value):
        raise GridError(f"grid {where}: {field} lists a value twice; give each value once")
    return value


def _strings(value, where: str, field: str) -> tuple[str, ...]:
    items = _list(value, where, field)
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise GridError(f"grid {where}: {field} holds {item!r}; give names as strings")
    return tuple(items)


def _string(value, where: str, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise GridError(f"grid {where}: {field} = {value!r}; give a name as a string")
    return value


def _versions(value, where: str) -> tuple[str, ...]:
    from synth.model.nccl.names import NCCL_VERSIONS

    items = _list(value, where, "axes.nccl_version")
    for item in items:
        if item not in NCCL_VERSIONS or not isinstance(item, str):
            raise GridError(f"grid {where}: axes.nccl_version holds {item!r}; give NCCL releases the model has, as "
                            f"strings: {', '.join(repr(v) for v in NCCL_VERSIONS)}")
    return tuple(items)


def _booleans(value, where: str, field: str) -> tuple[bool, ...]:
    items = _list(value, where, field)
    for item in items:
        if not isinstance(item, bool):
            raise GridError(f"grid {where}: {field} holds {item!r}; give true and/or false")
    return tuple(items)


def _positive_ints(value, where: str, field: str) -> tuple[int, ...]:
    items = _list(value, where, field)
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or item < 1:
            raise GridError(f"grid {where}: {field} holds {item!r}; give positive integers, e.g. [1, 2, 4]")
    return tuple(items)


def _level_values(value, figure: str, where: str, field: str) -> tuple:
    from synth.units import parse_bandwidth, parse_time

    if figure in ("size", "nics"):
        return _positive_ints(value, where, field)
    items = _list(value, where, field)
    for item in items:
        if figure == "oversubscription":
            if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item) or item < 1:
                raise GridError(f"grid {where}: {field} holds {item!r}; give factors of at least 1, e.g. [1, 2, 4]")
            continue
        if not isinstance(item, str):
            raise GridError(f"grid {where}: {field} holds {item!r}; give quantities as strings, e.g. \"400 Gb/s\"")
        try:
            (parse_time if figure == "latency" else parse_bandwidth)(item, where=f"grid {where}: {field}")
        except ValueError as error:
            raise GridError(str(error)) from None
    return tuple(items)


def _plan_values(value, name: str, where: str) -> tuple:
    field = f"axes.plan.{name}"
    if name in PLAN_INTEGERS:
        return _positive_ints(value, where, field)
    items = _list(value, where, field)
    allowed = PLAN_CHOICES[name]
    for item in items:
        if allowed is not None:
            if item not in allowed or isinstance(item, bool) != isinstance(allowed[0], bool):
                raise GridError(f"grid {where}: {field} holds {item!r}; choose from {', '.join(map(str, allowed))}")
            continue
        if not isinstance(item, str):
            raise GridError(f"grid {where}: {field} holds {item!r}; give a comma-separated string, e.g. \"1,2\"")
        parts = [part.strip() for part in item.split(",")]
        known = {"recompute": ("none", "selective", "full"), "zero_stage": ("1", "2", "3")}.get(name)
        good = all(part in known for part in parts) if known else all(part.isascii() and part.isdigit() and int(part) > 0
                                                                       for part in parts)
        if not good:
            hint = ", ".join(known) if known else "positive integers"
            raise GridError(f"grid {where}: {field} holds {item!r}; give {hint}, comma-separated")
    return tuple(items)


def _budget(value, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise GridError(f"grid {where}: sweep.token_budget = {value!r}; give a positive number of tokens, e.g. 1e12")
    return float(value)


def _prices(value, where: str) -> tuple[tuple[str, float], ...]:
    if not isinstance(value, dict):
        raise GridError(f"grid {where}: sweep.prices = {value!r}; give a table, e.g. prices = {{ dgx-h100 = 3.0 }}")
    for name, price in value.items():
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price) or price <= 0:
            raise GridError(f"grid {where}: sweep.prices.{name} = {price!r}; give a positive price per device-hour")
    return tuple(sorted((name, float(price)) for name, price in value.items()))


def _max_len(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 8:
        raise GridError(f"grid {where}: sweep.max_len = {value!r}; give program steps from 1 to 8 (default 5)")
    return value


def _headroom(value, where: str) -> float:
    from synth.topology_file import parse_fraction

    if value in (0, "0", "0%"):
        return 0.0
    try:
        headroom = parse_fraction(value, where=f"grid {where}: sweep.memory_headroom")
    except ValueError as error:
        raise GridError(str(error)) from None
    if headroom >= 1:
        raise GridError(f"grid {where}: sweep.memory_headroom = {value!r}; keep less than all of the memory free")
    return headroom
