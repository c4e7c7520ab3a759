"""The fix for stock NCCL: where the model's fastest (algorithm, protocol) for a flat call differs
from the one NCCL's own tables pick, the override, as the CSV NCCL's example tuner plugin reads
and, where one setting covers every size, as NCCL_ALGO / NCCL_PROTO.

The model (synth/model/nccl) says both what NCCL picks (its tuning tables, `tables.choose`) and
how long each pair NCCL enables takes on the hardware (`timing.estimate_for`: the links'
efficiencies, protocol factors and overheads a calibration fitted). Where the two disagree,
forcing the model's pair is the predicted gain; nothing is written where they agree.

The CSV is the format of NVIDIA/nccl plugins/tuner/example (README.md and plugin.c
loadConfig): one row per override,
`collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff`,
lower-case names (allreduce; tree, ring, nvls, nvls_tree, pat; ll, ll128, simple), -1 for
"any" / "NCCL's default". The plugin applies the first row whose collective, byte range
(inclusive) and communicator match, so rows here are disjoint. Lines starting with '#' are
comments (a header row without '#' would be read as a configuration). Sizes are the call's
bytes as NCCL's tuning sees them (nccl-tests' size: the output of AllGather, the input of
ReduceScatter; enqueue.cc ncclGetAlgoInfo: elementSize x ncclFuncMaxSendRecvCount). Channels are
written: the most the pair runs on in the range by NCCL's own rule (tables.channels_used), since
the example plugin answers 1 channel for a row that says -1 (plugin.c pluginGetCollInfo sets
`*nChannels = 1` before matching) and NCCL takes the plugin's count over its own (enqueue.cc
ncclGetAlgoInfo: "nChannels will be overriden by the plugin setting").

Sizes are evaluated at powers of two; the range [2^k, 2^(k+1) - 1] takes the pair of 2^k.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from synth.model.nccl import tables, timing
from synth.model.nccl.hardware import call_for, nccl_view
from synth.topology import Topology

COLLECTIVES = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce")
LARGEST_EXPONENT = 32  # the example's "all sizes": 0 to 4294967295 (its README)
HEADER = "collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff"


@dataclass(frozen=True)
class Override:
    """One CSV row: for `collective` calls of min_bytes..max_bytes (inclusive) on a communicator
    of `nodes` nodes (as NCCL counts them) and `ranks` ranks, run `algorithm`/`protocol`;
    NCCL's own pick there, and both predicted times at the range's lower size."""

    collective: str
    min_bytes: int
    max_bytes: int
    algorithm: str
    protocol: str
    channels: int
    nodes: int
    ranks: int
    nccl_algorithm: str
    nccl_protocol: str
    model_s: float
    nccl_s: float

    def csv(self) -> str:
        return ",".join(str(field) for field in (self.collective.lower(), self.min_bytes, self.max_bytes,
                                                 self.algorithm, self.protocol.lower(), self.channels, self.nodes,
                                                 self.ranks,
                                                 -1, -1))


def _best(hardware, call) -> tuple[timing.Estimate, timing.Estimate]:
    """(NCCL's pick, the model's fastest of the pairs NCCL enables), each timed on the hardware."""
    table = tables.tuning(hardware, call)
    picked = timing.timed(hardware, call, tables.choose(hardware, call, table), table)
    best = picked
    for algorithm, protocol, _, bandwidth, _ in table.entries:
        if bandwidth <= 0:
            continue
        candidate = timing.estimate_for(hardware, call, algorithm, protocol)
        if candidate.time_s < best.time_s * (1 - 1e-9):
            best = candidate
    return picked, best


def groups_of(topology: Topology) -> tuple[tuple[int, ...], ...]:
    """One flat communicator per level: the first unit of each level, outermost first (the whole
    system, then one of its parts, ...), skipping single devices and repeats of a shape."""
    groups, seen = [], set()
    view = nccl_view(topology)
    count = topology.device_count
    for level in range(len(topology.levels)):
        size = count
        for outer in topology.levels[:level]:
            size //= outer.size
        if size < 2:
            continue
        devices = tuple(range(size))
        _, call = call_for(topology, view, devices, "AllReduce", 1.0)
        if (call.nodes, call.ranks_per_node) in seen:
            continue
        seen.add((call.nodes, call.ranks_per_node))
        groups.append(devices)
    return tuple(groups)


@dataclass(frozen=True)
class TunerExport:
    """The overrides, and the model's fastest algorithms and protocols over every size,
    communicator and collective evaluated (for the NCCL_ALGO / NCCL_PROTO simple case)."""

    rows: tuple[Override, ...]
    algorithms: frozenset[str]
    protocols: frozenset[str]


def overrides(topology: Topology, collectives: tuple[str, ...] = COLLECTIVES,
              groups: tuple[tuple[int, ...], ...] | None = None) -> TunerExport:
    """Every range where the model's fastest pair is not NCCL's pick (module docstring)."""
    view = nccl_view(topology)
    rows: list[Override] = []
    algorithms: set[str] = set()
    protocols: set[str] = set()
    for devices in groups if groups is not None else groups_of(topology):
        for collective in collectives:
            run: Override | None = None
            for exponent in range(LARGEST_EXPONENT):
                low, high = (0 if exponent == 0 else 1 << exponent), (1 << (exponent + 1)) - 1
                hardware, call = call_for(topology, view, devices, collective, float(1 << exponent))
                hardware = replace(hardware, symmetric=False)  # a tuner picks among NCCL's table, not its kernels
                picked, best = _best(hardware, call)
                algorithms.add(best.choice.algorithm)
                protocols.add(best.choice.protocol)
                if (best.choice.algorithm, best.choice.protocol) == (picked.choice.algorithm, picked.choice.protocol):
                    run = _flush(rows, run)
                    continue
                key = (best.choice.algorithm, best.choice.protocol, picked.choice.algorithm, picked.choice.protocol)
                if run is not None and (run.algorithm, run.protocol, run.nccl_algorithm, run.nccl_protocol) == key:
                    run = replace(run, max_bytes=high, channels=max(run.channels, best.choice.channels))
                    continue
                run = _flush(rows, run)
                run = Override(collective, low, high, best.choice.algorithm, best.choice.protocol,
                               best.choice.channels, call.nodes,
                               call.ranks, picked.choice.algorithm, picked.choice.protocol, best.time_s,
                               picked.time_s)
            _flush(rows, run)
    return TunerExport(tuple(rows), frozenset(algorithms), frozenset(protocols))


def _flush(rows: list[Override], run: Override | None) -> None:
    """Keep the override being built, if any; None, for the caller to start afresh."""
    if run is not None:
        rows.append(run)
    return None


def render_csv(rows: tuple[Override, ...], title: str) -> str:
    """The tuner file: comment lines, then one row per override."""
    lines = [f"# {line}" for line in title.splitlines()]
    lines.append(f"# {HEADER}")
    for row in rows:
        lines.append(f"# {row.collective} {row.min_bytes}-{row.max_bytes} B on {row.nodes} node(s), {row.ranks} "
                     f"ranks: NCCL picks {row.nccl_algorithm}/{row.nccl_protocol} "
                     f"({row.nccl_s * 1e6:.4g} us at {max(row.min_bytes, 1)} B), the model "
                     f"{row.algorithm}/{row.protocol} ({row.model_s * 1e6:.4g} us)")
        lines.append(row.csv())
    return "\n".join(lines) + "\n"


ALGO_NAMES = {"tree": "Tree", "ring": "Ring", "nvls": "NVLS", "nvls_tree": "NVLSTree", "pat": "PAT"}  # NCCL_ALGO


def environment(export: TunerExport) -> dict[str, str]:
    """The simple case as environment settings (NCCL user guide, NCCL_ALGO and NCCL_PROTO; they
    hold for every call of the process): NCCL_ALGO where the model's fastest algorithm is one
    and the same at every size, communicator and collective evaluated, NCCL_PROTO likewise;
    only when some override is needed at all. Empty when no single setting is right
    everywhere: the tuner file is the fix then."""
    found: dict[str, str] = {}
    if not export.rows:
        return found
    if len(export.algorithms) == 1:
        found["NCCL_ALGO"] = ALGO_NAMES[next(iter(export.algorithms))]
    if len(export.protocols) == 1:
        found["NCCL_PROTO"] = next(iter(export.protocols))
    return found
