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
measures per collective); `nvlink_domain` marks a level whose units are separate hosts joined
by an NVLink switch fabric (the compute trays of a GB200 NVL72 rack).

How NCCL runs on the system (synth/model/nccl/ reads it through synth/model/nccl/hardware.py):
a level's `link` kind (nvswitch, nvlink, pcie inside a node; infiniband, roce, ethernet,
loopback between nodes), the `transport` NCCL uses over a network level (ib, socket, plugin),
the `efficiency` NCCL reaches on the level's links (a fraction of the line rate, which stays
the fact in `bandwidth`), a per-call `overhead` NCCL's latency model does not have; and, for
the whole system, the GPU generation and NVLS (`Topology.nccl`). `calibration` records what a
calibrated file was fitted on and how well, so a ranking can say how sure it is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from synth.frozen import cached_hash, state_without_hash
from synth.errors import UsageError
from synth.units import parse_bandwidth, parse_time
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
    floor: Figure | None = None  # least time of a call crossing the level (s; None: the kind's default, fitted by calibrate)
    message_rate: Figure | None = None  # messages/s one NIC processes (p2p posts; None: a default per NIC kind)
    # the share of the NICs' rate a call over more than two hosts keeps across a multi-level fabric
    # with one queue pair per connection (synth/model/nccl/fabric_share.py; None: the default, fitted by
    # synth calibrate)
    fabric_share: Figure | None = None


@dataclass(frozen=True)
class ProtocolFactors:
    """What NCCL reaches with one protocol (LL, LL128, Simple) on calls spanning a level,
    relative to the NCCL model (synth/model/nccl/system.py ProtocolFigures): `bandwidth`, the achieved
    rate over the modelled one, and `latency`, the achieved latency over NCCL's own; each a
    dimensionless figure with its source, or None for NCCL's own (1)."""

    bandwidth: Figure | None = None
    latency: Figure | None = None


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
    # How calls are launched (synth/model/nccl/launch.py): GPUs one host thread drives (1: one
    # process per GPU, as torchrun and Megatron launch; N: nccl-tests -g N, a single-process
    # multi-GPU program), and whether the calls are captured in CUDA graphs.
    gpus_per_thread: int = 1
    cuda_graphs: bool = False
    # NCCL_MIN_CTAS / NCCL_MAX_CTAS (ncclConfig_t minCTAs / maxCTAs): bounds on the channels every
    # communicator runs on (src/graph/connect.cc:480-484, src/transport/nvls.cc:178); None: NCCL's
    # defaults (1 and MAXCHANNELS)
    min_ctas: int | None = None
    max_ctas: int | None = None
    # The NCCL release whose behaviour applies (synth/model/nccl/names.py NCCL_VERSIONS; None: the
    # newest documented there) and whether the program registers its buffers as symmetric windows
    # (ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC), which 2.27+ runs on symmetric kernels
    version: str | None = None
    symmetric: bool = False
    # host time per GPU a thread launches a call on (s; synth/model/nccl/launch.py; None: its
    # default), a per-cluster figure synth calibrate fits on runs driving several GPUs per thread
    launch_per_gpu: Figure | None = None
    # NCCL_IB_QPS_PER_CONNECTION: InfiniBand queue pairs per connection (synth/model/nccl/fabric_share.py)
    ib_qps: int = 1
    # CPU cores the launcher binds each process to (mpirun's binding), which the proxy threads of
    # the GPUs one process drives share (synth/model/nccl/proxy.py cpu_share); None: not bound
    cpu_cores: int | None = None


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
    backend: str | None = None  # the collective library measured (nccl, gloo), when the file says
    bands: tuple[tuple[str, float, float, int], ...] = ()  # per size band: (band, rms, worst, points)
    sigma: float | None = None  # standard deviation of log(time) of a prediction from this fit (its interval)


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
    # How NCCL runs over this level (synth/model/nccl/hardware.py):
    link: LinkKind | None = None
    transport: Transport | None = None
    efficiency: Figure | None = None  # fraction of the line rate NCCL moves data at
    overhead: Figure | None = None  # seconds per call spanning this level, beyond NCCL's latency model
    protocols: tuple[tuple[str, ProtocolFactors], ...] = ()  # per NCCL protocol, for calls spanning this level
    # The level's units are separate hosts (compute trays) that an NVLink switch fabric joins into
    # one NVLink domain (GB200/GB300 NVL72, NVL36x2): NCCL's multi-node NVLink (MNNVL) fuses the
    # domain into one node, so its algorithms run at NVLink rates across the trays and only
    # calls leaving the domain use the network (synth/model/nccl/hardware.py).
    nvlink_domain: bool = False

    def figures_for(self, collective: str) -> tuple[Figure | None, Figure | None]:
        """(bandwidth, latency) that a call of `collective` sees on this level."""
        for name, figures in self.collectives:
            if name == collective:
                return figures.bandwidth, figures.latency
        return self.bandwidth, self.latency


@dataclass(frozen=True)
class Topology:
    __hash__ = cached_hash  # (synth/frozen.py) it keys many caches
    __getstate__ = state_without_hash

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
        raise UsageError(f"unknown level {echo(name)}: this system has levels {', '.join(self.level_names)}")


def check_levels(levels: tuple[Level, ...], where: str) -> None:
    """The structural rules of docs/model.md section 1 shared by every way of building a topology."""
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


# --- systems from a few figures, without TOML (for tests and users of the Python API) ----------

Quantity = float | int | str  # SI base units (bytes/s, seconds) or text with a unit: "25 GB/s", "5 us"
GENERATED = "given in code"


def _figure(value: Quantity, parse, source: str, what: str) -> Figure:
    if isinstance(value, str):
        return Figure(parse(value, where=what), source)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{what}: {echo(value)} is not a number or a text with a unit")
    return Figure(float(value), source)


def _per_level(values, names: tuple[str, ...], what: str) -> tuple:
    """One value per level: a sequence outermost first, a mapping by level name, or one value
    for every level."""
    if isinstance(values, dict):
        unknown = sorted(set(values) - set(names))
        missing = [name for name in names if name not in values]
        if unknown or missing:
            raise UsageError(f"{what}: give one per level ({', '.join(names)})"
                             + (f"; unknown {', '.join(unknown)}" if unknown else "")
                             + (f"; missing {', '.join(missing)}" if missing else ""))
        return tuple(values[name] for name in names)
    if isinstance(values, (list, tuple)):
        if len(values) != len(names):
            raise UsageError(f"{what}: {len(values)} value(s) for {len(names)} level(s) ({', '.join(names)})")
        return tuple(values)
    return (values,) * len(names)


def uniform_topology(levels, bandwidths, latencies, uplinks=None, name: str = "custom", description: str = "",
                     source: str = GENERATED) -> Topology:
    """A system from its level sizes and one bandwidth and latency per level.

    `levels` is `"rack=2,node=4,gpu=8"` or `[("rack", 2), ("node", 4), ("gpu", 8)]`, outermost
    first; `bandwidths` and `latencies` one value per level (a list outermost first, a dict by
    level name, or one value for all), numbers in bytes/s and seconds or text with units;
    `uplinks` optionally maps a level name to `(count, bandwidth)` of the links each of its
    units shares (a node's NICs). Every figure gets `source` as its source.

        uniform_topology("node=4,gpu=8", ["25 GB/s", "300 GB/s"], ["10 us", "3 us"],
                         uplinks={"node": (8, "25 GB/s")})
    """
    if isinstance(levels, str):
        pairs = tuple((item.name, item.size) for item in parse_sized_list(levels, "level", "l"))
    else:
        pairs = tuple((str(level), size) for level, size in levels)
    names = tuple(level for level, _ in pairs)
    bandwidths = _per_level(bandwidths, names, "bandwidths")
    latencies = _per_level(latencies, names, "latencies")
    links = dict(uplinks or {})
    unknown = sorted(set(links) - set(names))
    if unknown:
        raise UsageError(f"uplinks: unknown level {unknown[0]!r}; the levels are {', '.join(names)}")
    built = []
    for (level, size), bandwidth, latency in zip(pairs, bandwidths, latencies):
        shared = None
        if level in links:
            count, link_bandwidth = links[level]
            shared = Uplinks(count, _figure(link_bandwidth, parse_bandwidth, source, f"uplinks of {level}"))
        built.append(Level(level, size, _figure(bandwidth, parse_bandwidth, source, f"bandwidth of {level}"),
                           _figure(latency, parse_time, source, f"latency of {level}"), shared))
    levels_tuple = tuple(built)
    check_levels(levels_tuple, f"topology {name!r}")
    shape = ",".join(f"{level}={size}" for level, size in pairs)
    return Topology(name, description or f"{shape}, figures {source}", levels_tuple)


def two_level(nodes: int, gpus: int, gpu_bandwidth: Quantity = "300 GB/s", node_bandwidth: Quantity = "25 GB/s",
              gpu_latency: Quantity = "3 us", node_latency: Quantity = "10 us", nics: int | None = None,
              nic_bandwidth: Quantity | None = None, name: str | None = None, source: str = GENERATED) -> Topology:
    """`nodes` nodes of `gpus` GPUs: levels `node` and `gpu`. The defaults are of the order of a
    DGX-class node (NVLink inside, one 200 Gb/s NIC per GPU across); give `nics` (and
    `nic_bandwidth`, default `node_bandwidth`) for NICs each node shares.

        two_level(4, 8)                      # 4 nodes x 8 GPUs
        two_level(2, 4, nics=1, nic_bandwidth="12.5 GB/s")
    """
    uplinks = {"node": (nics, node_bandwidth if nic_bandwidth is None else nic_bandwidth)} if nics else None
    return uniform_topology([("node", nodes), ("gpu", gpus)], [node_bandwidth, gpu_bandwidth],
                            [node_latency, gpu_latency], uplinks, name or f"two-level-{nodes}x{gpus}", source=source)


def three_level(racks: int, nodes: int, gpus: int, gpu_bandwidth: Quantity = "300 GB/s",
                node_bandwidth: Quantity = "25 GB/s", rack_bandwidth: Quantity = "12.5 GB/s",
                gpu_latency: Quantity = "3 us", node_latency: Quantity = "10 us", rack_latency: Quantity = "15 us",
                rack_uplinks: tuple[int, Quantity] | None = None, name: str | None = None,
                source: str = GENERATED) -> Topology:
    """`racks` racks of `nodes` nodes of `gpus` GPUs (levels `rack`, `node`, `gpu`); `rack_uplinks`
    = (count, bandwidth) of the links each rack shares to the spine, for an oversubscribed one.

        three_level(2, 4, 8, rack_uplinks=(4, "50 GB/s"))
    """
    uplinks = {"rack": rack_uplinks} if rack_uplinks else None
    return uniform_topology([("rack", racks), ("node", nodes), ("gpu", gpus)],
                            [rack_bandwidth, node_bandwidth, gpu_bandwidth], [rack_latency, node_latency, gpu_latency],
                            uplinks, name or f"three-level-{racks}x{nodes}x{gpus}", source=source)


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
    described: str = ""  # the built-in description (synth/devices.py) the name selects, if any
    taken: tuple[str, ...] = ()  # the figures the topology left out and the description supplied
    reserve: tuple[tuple[str, Figure], ...] = ()  # [device.reserve]: its own figures for synth/plan/reserve.py

    def peak_for(self, precision: str) -> Figure:
        for name, figure in self.peak:
            if name == precision:
                return figure
        known = ", ".join(name for name, _ in self.peak) or "none"
        raise UsageError(f"device {self.name!r} has no peak compute rate for {precision}: it lists {known}; "
                         f"add [device.peak] {precision} = {{ value = \"...\", source = \"...\" }} to the topology")
