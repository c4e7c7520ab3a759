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

How NCCL runs on the system (synth/model/nccl.py reads it through synth/model/nccl_hardware.py):
a level's `link` kind (nvswitch, nvlink, pcie inside a node; infiniband, roce, ethernet,
loopback between nodes), the `transport` NCCL uses over a network level (ib, socket, plugin),
the `efficiency` NCCL reaches on the level's links (a fraction of the line rate, which stays
the fact in `bandwidth`), a per-call `overhead` NCCL's latency model does not have; and, for
the whole system, the GPU generation and NVLS (`Topology.nccl`). `calibration` records what a
calibrated file was fitted on and how well, so a ranking can say how sure it is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from synth.errors import UsageError
from synth.names import MAX_DEVICES, check_name, parse_sized_list, product


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
class LinkKind:
    """What a level's links are (a fact with its source): nvswitch, nvlink, pcie, infiniband,
    roce, ethernet or loopback."""

    kind: str
    source: str


@dataclass(frozen=True)
class Transport:
    """How NCCL moves data over a network level: `kind` ib (InfiniBand/RoCE verbs), socket
    (TCP) or plugin (an external net plugin such as GPUDirect-TCPXO); `gdr` whether the NIC
    reads and writes GPU memory; for sockets, `sockets` streams per connection (None: NCCL's
    default for the NIC `vendor`, aws / gcp / other) of at most `stream` bytes/s each; for a
    plugin, the `latency` it reports (added to every network step) and whether its receive side
    `unpack`s on the GPU."""

    kind: str
    source: str
    gdr: bool = True
    sockets: int | None = None
    vendor: str = "other"
    stream: Figure | None = None
    latency: Figure | None = None
    unpack: bool = False
    stages: Figure | None = None  # store-and-forward stages per network hop (fitted by synth calibrate)


@dataclass(frozen=True)
class NcclSystem:
    """What NCCL's tables key on for the whole system: the GPU generation (volta, ampere,
    hopper, blackwell), whether NVLink SHARP (NVLS) is there and enabled, the CPU vendor, and
    the algorithms and protocols NCCL may use (NCCL_ALGO / NCCL_PROTO; empty: all)."""

    generation: str
    source: str
    nvls: bool = False
    cpu: str = "intel"
    algorithms: tuple[str, ...] = ()
    protocols: tuple[str, ...] = ()
    buffsize: int | None = None  # NCCL_BUFFSIZE when the system sets it


@dataclass(frozen=True)
class CalibrationRecord:
    """One measured configuration a calibrated topology was fitted on, and the model's error on
    it after the fit: relative RMS and worst error over its sizes."""

    collective: str
    level: str
    nodes: int
    ranks_per_node: int
    min_bytes: int
    max_bytes: int
    points: int
    rms_error: float
    worst_error: float
    file: str


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
    # How NCCL runs over this level (synth/model/nccl_hardware.py):
    link: LinkKind | None = None
    transport: Transport | None = None
    efficiency: Figure | None = None  # fraction of the line rate NCCL moves data at
    overhead: Figure | None = None  # seconds per call spanning this level, beyond NCCL's latency model

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
    device: Device | None = None  # compute and memory of one device (synth/plan); None: not described
    nccl: NcclSystem | None = None
    calibration: tuple[CalibrationRecord, ...] = ()

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
            levels.append(replace(level, bandwidth=bandwidth, latency=latency, uplinks=uplinks, fabric=fabric))
        return replace(self, levels=tuple(levels))

    def level_index(self, name: str) -> int:
        for index, level in enumerate(self.levels):
            if level.name == name:
                return index
        raise UsageError(f"unknown level {name!r}: this system has levels {', '.join(self.level_names)}")


def check_levels(levels: tuple[Level, ...], where: str) -> None:
    """The structural rules of docs/model.md section 1 shared by every way of building a topology."""
    if not levels:
        raise UsageError(f"{where}: a system needs at least one level")
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


def topology_from_levels(text: str) -> Topology:
    """A bare hierarchy from `rack=2,node=4,gpu=8` (or `2,4,8`): sizes, no link figures."""
    sized = parse_sized_list(text, "level", "l")
    levels = tuple(Level(item.name, item.size) for item in sized)
    check_levels(levels, f"--levels {text}")
    return Topology(name=f"levels({text})", description="bare hierarchy from --levels", levels=levels)


# --- the device: compute rate and memory (read by the training-step planner, synth/plan) ---------

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")


@dataclass(frozen=True)
class Device:
    """One accelerator of the system: its memory, memory bandwidth, dense peak compute rate per
    precision (FLOP/s) and the fraction of that peak its matrix multiplications reach in a
    training step (`matmul_efficiency`), each a figure with its source.

    Peaks are dense (no structured sparsity), as datasheets list them beside the sparse ones.
    The efficiency is a dimensionless Figure (0 < value <= 1)."""

    name: str
    memory: Figure  # bytes
    peak: tuple[tuple[str, Figure], ...]  # precision -> FLOP/s, in PRECISIONS order
    memory_bandwidth: Figure | None = None  # bytes/s (HBM)
    matmul_efficiency: Figure | None = None  # achieved / peak

    def peak_for(self, precision: str) -> Figure:
        for name, figure in self.peak:
            if name == precision:
                return figure
        known = ", ".join(name for name, _ in self.peak) or "none"
        raise UsageError(f"device {self.name!r} has no peak compute rate for {precision}: it lists {known}; "
                         f"add [device.peak] {precision} = {{ value = \"...\", source = \"...\" }} to the topology")
