"""The probe: the few calls that fix a cluster's unknowns, as one script to run there.

Per level with more than one member, an all-reduce over one device of each of its units
(inside the first parent): that level's transport alone, at `PROBE_SIZES` (a floor at the
smallest, a bandwidth at the largest, the protocol switches between); and the flat call of
every collective over all devices at the same sizes. The script (`probe_script`) runs them
with torch.distributed (NCCL on GPUs; gloo on CPUs, for a dry run) under torchrun or Slurm's
srun, and writes our benchmark CSV (synth/calibrate/bench_csv.py), which `synth calibrate`
reads with the same topology; the script itself, its launch lines and the same calls as
nccl-tests command lines are the command's (synth/commands/probe_script.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from synth.errors import UsageError
from synth.topology import Topology

KiB, MiB = 1 << 10, 1 << 20
# four sizes, a factor 64 apart: what nccl-tests' -b 8K -e 2G -f 64 runs. The largest is where
# NCCL's busbw levels off across nodes (its pipelines full); 256 MiB, the first choice, was short
# of it (results/calibration-transfer)
PROBE_SIZES = (8 * KiB, 512 * KiB, 32 * MiB, 2048 * MiB)
FLAT_COLLECTIVES = ("AllReduce", "ReduceScatter", "AllGather", "Broadcast", "AllToAll")


@dataclass(frozen=True)
class ProbeCall:
    """One measured group: a collective over `ranks`, written as `level`, `group_size` and
    `ranks_per_unit` (the benchmark CSV's columns)."""

    collective: str
    level: str
    group_size: int
    ranks_per_unit: int
    ranks: tuple[int, ...]


def probe_calls(topology: Topology) -> tuple[ProbeCall, ...]:
    """Per level of more than one member, an all-reduce across it; then every flat call."""
    sizes = topology.sizes
    total = math.prod(sizes)
    if total < 2:
        raise UsageError(f"topology {topology.name} has one device: there is no collective to probe")
    calls = []
    for index, (name, size) in enumerate(zip(topology.level_names, sizes)):
        if size < 2:
            continue
        stride = math.prod(sizes[index + 1:])
        calls.append(ProbeCall("AllReduce", name, size, 1, tuple(u * stride for u in range(size))))
    outer = next(i for i, size in enumerate(sizes) if size > 1)
    per_unit = math.prod(sizes[outer + 1:])
    flat = tuple(range(sizes[outer] * per_unit))
    for collective in FLAT_COLLECTIVES:
        call = ProbeCall(collective, topology.level_names[outer], len(flat), per_unit, flat)
        if call.ranks_per_unit == 1 and any(c.ranks == flat and c.collective == collective for c in calls):
            continue  # a one-level system: the level's all-reduce is the flat one
        calls.append(call)
    return tuple(calls)


def devices_needed(topology: Topology) -> int:
    return max(max(call.ranks) for call in probe_calls(topology)) + 1


def launch_shape(topology: Topology) -> tuple[int, int]:
    """(nodes, devices per node) for launching: the innermost level is one node's devices, unless
    the topology has one level only."""
    sizes = topology.sizes
    total = math.prod(sizes)
    per_node = sizes[-1] if len(sizes) > 1 else total
    return total // per_node, per_node
