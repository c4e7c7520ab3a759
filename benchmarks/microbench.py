"""Collective microbenchmarks on the emulated cluster, written as our benchmark CSV for
`synth calibrate` (docs/calibrate.md): one group at a time, since calibration models a group
running alone.

    python -m benchmarks.microbench --emulate emu-2x4 --scale 1/256 -o results/accuracy/microbench-emu-2x4.csv

Groups, per level l of the topology (outermost first):

* one rank in each of u units of level l inside one parent (u = every divisor >= 2 of the
  level's size): at the innermost level that is a group inside one node, above it one rank
  per node (per rack);
* the first p devices of each unit, for p every divisor >= 2 of the devices per unit: the
  full-level groups programs use (e.g. 2 nodes x 4 ranks).

The CSV rows are `collective,level,group_size,bytes,time_s,backend,ranks_per_unit`, one per
repetition (time_s = the slowest member's mean over --iters calls), so calibration fits every
repeat; a JSON file beside it keeps the command, machine, date, load average and raw times.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.record import machine_description
from synth.output_files import write_text, writing
from synth.topology import Topology
from synth.topology_file import load_topology
from synth.units import parse_bytes

COLLECTIVES = ("AllReduce", "ReduceScatter", "AllGather", "Reduce", "Broadcast")
WORKER = Path(__file__).with_name("microbench_worker.py")
COLUMNS = ("collective", "level", "group_size", "bytes", "time_s", "backend", "ranks_per_unit")


@dataclass(frozen=True)
class Group:
    level: str
    ranks: tuple[int, ...]
    ranks_per_unit: int


@dataclass(frozen=True)
class Row:
    collective: str
    level: str
    group_size: int
    nbytes: int
    time_s: float
    ranks_per_unit: int
    backend: str = "gloo"


def _divisors(n: int) -> list[int]:
    return [d for d in range(2, n + 1) if n % d == 0]


def groups(topology: Topology) -> list[Group]:
    """The groups measured on `topology`, each inside the first unit of its parent level."""
    sizes = topology.sizes
    result = []
    for index, level in enumerate(topology.level_names):
        stride = 1
        for size in sizes[index + 1:]:
            stride *= size
        for units in _divisors(sizes[index]):
            result.append(Group(level, tuple(u * stride for u in range(units)), 1))
        if index + 1 < len(sizes):
            for per_unit in _divisors(stride):
                ranks = tuple(u * stride + d for u in range(sizes[index]) for d in range(per_unit))
                result.append(Group(level, ranks, per_unit))
    return result


def cases(topology: Topology, sizes: list[int], collectives=COLLECTIVES) -> list[dict]:
    return [{"collective": c, "level": g.level, "ranks": list(g.ranks), "ranks_per_unit": g.ranks_per_unit,
             "sizes": sizes} for g in groups(topology) for c in collectives]


def rows_from_report(report: dict, backend: str = "gloo") -> list[Row]:
    rows = []
    for case in report["cases"]:
        for nbytes, times in case["times"].items():
            for seconds in times:
                rows.append(Row(case["collective"], case["level"], len(case["ranks"]), int(nbytes), seconds,
                                case["ranks_per_unit"], backend))
    return rows


def write_csv(path: Path, rows: list[Row]) -> None:
    with writing(path, newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([row.collective, row.level, row.group_size, row.nbytes, f"{row.time_s:.9g}", row.backend,
                             row.ranks_per_unit])


def medians(rows: list[Row]) -> dict[tuple, float]:
    """Median time per (collective, level, group_size, ranks_per_unit, bytes)."""
    grouped: dict[tuple, list[float]] = {}
    for row in rows:
        grouped.setdefault((row.collective, row.level, row.group_size, row.ranks_per_unit, row.nbytes), []).append(row.time_s)
    return {key: statistics.median(values) for key, values in grouped.items()}


def run(topology_name: str, scale: float | None, sizes: list[int], iters: int, warmup: int, reps: int,
        name: str, collectives=COLLECTIVES) -> tuple[dict, float]:
    """Bring the cluster up (or reuse it), run the worker once, return its report and the scale."""
    from synth.emulate.host import emulated_cluster, find_cluster
    from synth.emulate.ranks import run_ranks

    topology = load_topology(topology_name)
    with tempfile.TemporaryDirectory(prefix="synth-microbench-") as scratch:
        case_path = Path(scratch) / "cases.json"
        case_path.write_text(json.dumps(cases(topology, sizes, collectives)), encoding="utf-8")
        arguments = ["--cases", str(case_path), "--iters", str(iters), "--warmup", str(warmup), "--reps", str(reps)]
        existing = find_cluster(name)
        if existing is not None:
            result = run_ranks(existing, WORKER, existing.device_count, arguments, timeout=7200)
            used = existing.scale
        else:
            with emulated_cluster(topology_name, scale=scale, name=name) as cluster:
                result = run_ranks(cluster, WORKER, cluster.device_count, arguments, timeout=7200)
                used = cluster.scale
    if result.report is None or result.returncode != 0:
        raise SystemExit(f"microbenchmark failed (exit {result.returncode}):\n{result.log[-4000:]}")
    return result.report, used


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--emulate", required=True, metavar="T", help="emulated topology (emu-2x4, emu-2x2x2, ...)")
    parser.add_argument("--scale", help="bandwidth factor, e.g. 1/256 (default: the emulator's auto)")
    parser.add_argument("--sizes", default="16KiB,64KiB,256KiB,1MiB", help="comma-separated buffer sizes B")
    parser.add_argument("--collectives", default=",".join(COLLECTIVES))
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--name", default="synthmb", help="emulated cluster name (one already up is reused)")
    parser.add_argument("-o", "--output", required=True, help="the CSV to write (a .json with provenance beside it)")
    args = parser.parse_args(argv)
    from synth.emulate.layout import format_scale, parse_scale

    sizes = [parse_bytes(text.strip(), where="--sizes") for text in args.sizes.split(",")]
    load_before = os.getloadavg()
    started = datetime.now(timezone.utc)
    report, scale = run(args.emulate, parse_scale(args.scale), sizes, args.iters, args.warmup, args.reps, args.name,
                        tuple(args.collectives.split(",")))
    rows = rows_from_report(report)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_csv(output, rows)
    meta = {"command": "python -m benchmarks.microbench " + " ".join(sys.argv[1:] if argv is None else argv),
            "machine": machine_description(), "date": started.isoformat(timespec="seconds"),
            "seconds": (datetime.now(timezone.utc) - started).total_seconds(), "topology": args.emulate,
            "scale": scale, "scale_text": format_scale(scale), "load_before": load_before, "load_after": os.getloadavg(),
            "report": report}
    write_text(output.with_suffix(".json"), json.dumps(meta, indent=1))
    for key, value in sorted(medians(rows).items()):
        print(*key, f"{value * 1e3:.3f} ms")
    print(f"wrote {output} ({len(rows)} rows) at scale {format_scale(scale)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
