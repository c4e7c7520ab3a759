"""Systems: a tree of levels, outermost first, with the link figures the cost model needs.

A `Topology` is a value: levels with sizes and, optionally, per-level link figures (each a
number with its source). It is built from a TOML file (synth/topology_file.py, which also
documents every key), from a bare `--levels` list (`topology_from_levels`: sizes only,
enough for placements and synthesis, not for costs), or in code, e.g. for tests and for
users of the Python API.

`bandwidth` of a level is what one device gets when it alone talks to a device in another
unit of this level (inside the same parent); `latency` is the per-message latency of that
path; `uplinks` are the links each unit of the level shares to reach the rest of the
system; `fabric` is a shared medium all of a level's traffic inside one parent crosses;
`collectives` replaces bandwidth and latency for single collectives (what `synth calibrate`
measures per collective).
"""

from __future__ import annotations

from dataclasses import dataclass

from synth.errors import UsageError
from synth.names import MAX_DEVICES, MAX_NAMES, check_name, echo, parse_sized_list, product

# Figures outside these ranges are typos, and would make every time infinite or zero: a
# latency of 1e308 s turns every sum into inf and every speedup into nan.
LATENCY_RANGE = (1e-12, 60.0)  # seconds: a picosecond to a minute
BANDWIDTH_RANGE = (1.0, 1e16)  # bytes/s: a byte per second to 10 PB/s
MAX_UPLINKS = 1 << 20


@dataclass(frozen=True)
class Figure:
    """A number in SI base units (bytes/s, seconds) and where it comes from."""

    value: float
    source: str


@dataclass(frozen=True)
class Uplinks:
    """The shared links through which every unit of a level reaches the rest of the system
    (a node's NICs, a rack's uplinks to the spine): `count` links of `bandwidth` each."""

    count: int
    bandwidth: Figure  # bytes/s, per link, one direction


@dataclass(frozen=True)
class CollectiveFigures:
    """A level's bandwidth and latency as one collective sees them (measured per collective)."""

    bandwidth: Figure  # bytes/s, per device, one direction
    latency: Figure  # seconds


@dataclass(frozen=True)
class Level:
    """One level of the system tree: `size` children per parent.

    `bandwidth` (bytes/s, per device, one direction) and `latency` (seconds) describe the
    interconnect that joins the units of this level inside their parent, i.e. the links a
    message crosses when its endpoints differ at this level but agree on every outer one.
    `uplinks`, when given, are the links each unit of this level shares to reach units
    outside it (a node's NICs on the `node` level).
    `collectives` replaces bandwidth and latency for the collectives it names, in the order
    of the language's collectives.
    """

    name: str
    size: int
    bandwidth: Figure | None = None
    latency: Figure | None = None
    uplinks: Uplinks | None = None
    collectives: tuple[tuple[str, CollectiveFigures], ...] = ()
    fabric: Figure | None = None  # bytes/s, the level's whole traffic inside one parent

    def figures_for(self, collective: str) -> tuple[Figure | None, Figure | None]:
        """(bandwidth, latency) that a call of `collective` sees on this level."""
        for name, figures in self.collectives:
            if name == collective:
                return figures.bandwidth, figures.latency
        return self.bandwidth, self.latency


@dataclass(frozen=True)
class Topology:
    name: str
    description: str
    levels: tuple[Level, ...]
    source_path: str | None = None

    @property
    def level_names(self) -> tuple[str, ...]:
        return tuple(level.name for level in self.levels)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(level.size for level in self.levels)

    @property
    def device_count(self) -> int:
        return product(self.sizes)

    @property
    def has_link_figures(self) -> bool:
        """True when every level has bandwidth and latency, so costs can be computed."""
        return all(level.bandwidth is not None and level.latency is not None for level in self.levels)

    def for_collective(self, collective: str) -> Topology:
        """This system as one collective sees it: each level's per-collective figures, where it
        has them, in place of its bandwidth and latency, its uplinks scaled alike (itself when no
        level has any)."""
        if not any(name == collective for level in self.levels for name, _ in level.collectives):
            return self
        levels = []
        for level in self.levels:
            bandwidth, latency = level.figures_for(collective)
            uplinks, fabric = level.uplinks, level.fabric
            if bandwidth is not level.bandwidth:
                factor = bandwidth.value / level.bandwidth.value
                if uplinks is not None:
                    uplinks = Uplinks(uplinks.count, Figure(uplinks.bandwidth.value * factor, uplinks.bandwidth.source))
                if fabric is not None:
                    fabric = Figure(fabric.value * factor, fabric.source)
            levels.append(Level(level.name, level.size, bandwidth, latency, uplinks, level.collectives, fabric))
        return Topology(self.name, self.description, tuple(levels), self.source_path)

    def level_index(self, name: str) -> int:
        for index, level in enumerate(self.levels):
            if level.name == name:
                return index
        raise UsageError(f"unknown level {name!r}: this system has levels {', '.join(self.level_names)}")


def check_levels(levels: tuple[Level, ...], where: str) -> None:
    """The structural rules of SPEC section 1 shared by every way of building a topology."""
    if not levels:
        raise UsageError(f"{where}: a system needs at least one level")
    if len(levels) > MAX_NAMES:
        raise UsageError(f"{where}: {len(levels)} levels; this tool handles at most {MAX_NAMES}")
    seen = set()
    for level in levels:
        check_name(level.name, "level")
        if level.name in seen:
            raise UsageError(f"{where}: level name {level.name!r} appears twice; level names must be unique")
        seen.add(level.name)
        if not isinstance(level.size, int) or isinstance(level.size, bool) or level.size < 1:
            raise UsageError(f"{where}: level {level.name!r} has size {level.size!r}; sizes must be positive integers")
    devices = product(level.size for level in levels)
    if devices > MAX_DEVICES:
        raise UsageError(
            f"{where}: {devices} devices is more than this tool handles ({MAX_DEVICES}); describe a smaller system"
        )
    for index, level in enumerate(levels):
        check_figures(level, f"{where}: levels[{index}] ({level.name})")


def check_figures(level: Level, where: str) -> None:
    """Every figure of a level inside the range a real link has, so no time is inf or nan."""
    def check(figure: Figure | None, field: str, bounds: tuple[float, float], unit: str) -> None:
        if figure is None:
            return
        low, high = bounds
        value = figure.value
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
            raise UsageError(f"{where}.{field}: {value!r} {unit} is outside the range a link has "
                             f"({low:g} to {high:g} {unit}); check the figure and its unit")

    check(level.bandwidth, "bandwidth", BANDWIDTH_RANGE, "B/s")
    check(level.latency, "latency", LATENCY_RANGE, "s")
    check(level.fabric, "fabric", BANDWIDTH_RANGE, "B/s")
    if level.uplinks is not None:
        count = level.uplinks.count
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_UPLINKS:
            raise UsageError(f"{where}.uplinks.count: {count!r} is not a count from 1 to {MAX_UPLINKS}")
        check(level.uplinks.bandwidth, "uplinks.bandwidth", BANDWIDTH_RANGE, "B/s")
    for name, figures in level.collectives:
        check(figures.bandwidth, f"collectives.{name}.bandwidth", BANDWIDTH_RANGE, "B/s")
        check(figures.latency, f"collectives.{name}.latency", LATENCY_RANGE, "s")


def topology_from_levels(text: str) -> Topology:
    """A bare hierarchy from `rack=2,node=4,gpu=8` (or `2,4,8`): sizes, no link figures."""
    sized = parse_sized_list(text, "level", "l")
    levels = tuple(Level(item.name, item.size) for item in sized)
    check_levels(levels, echo(text))
    return Topology(name=f"levels({text})", description="bare hierarchy (level sizes only)", levels=levels)
