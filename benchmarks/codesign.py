"""Co-design sweeps: how fast `synth codesign` plans points, and whether every executor agrees.

    python -m benchmarks.codesign [-o results] [--executors local,ray,dask] [--skip-10k] [--small N]

Measured on cheap points (models of 1-3 B parameters on 4 to 32 devices of Selene's and H100's
kinds, the planner's settings fixed; benchmarks/grids/codesign-10k.toml):

* points per CPU-second on one core: the serial executor (this process) over the first `--small`
  points of the grid, with the per-worker memo of priced collectives and without it (each point
  its own CommunicationCosts), and the memo's hit rate;
* the speed-up of 2 local workers over 1 (the process pool, wall time, same points);
* the engine's overhead per point: wall time x workers less the points' own CPU time, per point,
  for each executor with one worker (task transport, process start-up, the results file);
* the whole grid (at least 10,000 points) run to completion through each executor asked for,
  and the digest of its rows without the measured columns (CPU time, memo counts): equal digests
  are identical results point for point.

The machine is shared: its load average (`uptime`) is recorded before and after each run. Writes
results/codesign/README.md and codesign.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from benchmarks.record import REPORT, header, study_dir

STUDY = "codesign"
SMALL_FIXED = ("global_batch", "seq_len", "node.bandwidth")
GRID = Path(__file__).parent / "grids" / "codesign-10k.toml"


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def digest(path: Path) -> str:
    from synth.codesign.results import read_rows
    from synth.codesign.run import MEASURED

    rows = read_rows(path)
    text = json.dumps([{k: v for k, v in row.items() if k not in MEASURED} for row in rows], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def sweep(grid, executor: str, workers: int, path: Path, limit: int | None = None, share: bool = True,
          chunk: int = 16) -> dict:
    """One run into a fresh results file: wall, this process's CPU, the points' CPU, memo counts."""
    import dataclasses

    from synth.codesign.sweep import options_for, results_file, run_sweep

    options = dataclasses.replace(options_for(grid, 300.0, float(1 << 36)), share=share)
    path.unlink(missing_ok=True)
    before = load()
    wall, cpu = time.perf_counter(), time.process_time()
    with results_file(grid, path) as results:
        counts = run_sweep(grid, results, options, executor, workers, chunk=chunk, limit=limit)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"executor": executor, "workers": workers, "points": counts.planned, "failed": counts.failed,
            "share": share, "wall_s": wall, "driver_cpu_s": cpu, "points_cpu_s": counts.cpu_s,
            "memo_hit_rate": counts.hit_rate, "overhead_per_point_s": (wall * workers - counts.cpu_s) / counts.planned
            if executor != "serial" else (cpu - counts.cpu_s) / counts.planned,
            "load_before": before, "load_after": load(), "digest": digest(path)}


# One fresh process planning consecutive points of the grid serially, the memo on or off: no cache
# of an earlier run (the planner's own lru_caches included) helps either side.
MEMO_WORKER = r"""
import dataclasses, itertools, json, sys, time
from synth.codesign.grid import load_grid
from synth.codesign.points import points
from synth.codesign.sweep import options_for
from synth.codesign.run import plan_point, POOL
share, start, count = sys.argv[1] == "on", int(sys.argv[2]), int(sys.argv[3])
grid = load_grid(sys.argv[4])
options = dataclasses.replace(options_for(grid, 300.0, 2.0 ** 36), share=share)
chosen = list(itertools.islice(points(grid), start, start + count))
plan_point(chosen[0], dataclasses.replace(options, share=False))  # imports and first-plan set-up, not counted
POOL.hits = POOL.misses = 0
cpu = time.process_time()
rows = [plan_point(point, options) for point in chosen]
print(json.dumps({"share": share, "cpu_s": time.process_time() - cpu, "hits": POOL.hits, "misses": POOL.misses}))
"""
MEMO_START, MEMO_POINTS, MEMO_REPEATS = 5760, 240, 2


def memo_runs() -> list[dict]:
    """The memo against none, each in a fresh process, alternated `MEMO_REPEATS` times."""
    import subprocess
    import sys

    runs = []
    for _ in range(MEMO_REPEATS):
        for share in ("off", "on"):
            before = load()
            done = subprocess.run([sys.executable, "-c", MEMO_WORKER, share, str(MEMO_START), str(MEMO_POINTS), str(GRID)],
                                  capture_output=True, text=True, check=True)
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]) | {"load_before": before, "load_after": load()})
            print(f"  memo {runs[-1]}", flush=True)
    return runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="results")
    parser.add_argument("--executors", default="local,ray,dask")
    parser.add_argument("--small", type=int, help="points of the short runs (per core, speed-up, overhead; default all "
                                                    "of the grid with its batch, length and NIC bandwidth fixed)")
    parser.add_argument("--skip-10k", action="store_true")
    parser.add_argument("--memo-only", action="store_true",
                        help="only the memo's runs in fresh processes, added to the existing codesign.json")
    args = parser.parse_args(argv)
    import dataclasses

    from synth.codesign.estimate import estimate_sweep
    from synth.codesign.grid import Axis, load_grid
    from synth.codesign.points import points
    from synth.codesign.sweep import options_for

    grid = load_grid(GRID)
    out = study_dir(STUDY, args.output)
    if args.memo_only:
        record = json.loads((out / "codesign.json").read_text())
        record["memo"] = memo_runs()
        started = time.process_time()  # the estimate again, with the estimate's constants as they are now
        estimate = estimate_sweep(points(grid), options_for(grid, 300.0, float(1 << 36)))
        record["estimate"] = estimate.to_json() | {"estimate_cpu_s": time.process_time() - started}
        (out / "codesign.json").write_text(json.dumps(record, indent=1) + "\n")
        (out / REPORT).write_text(report(record, record.get("argv", [])))
        return 0
    # the short runs: every system kind, one batch, sequence length and NIC bandwidth
    small = dataclasses.replace(grid, axes=tuple(Axis(axis.name, axis.values[:1]) if axis.name in SMALL_FIXED else axis
                                                 for axis in grid.axes))
    executors = [name for name in args.executors.split(",") if name]
    work = Path(tempfile.mkdtemp(prefix="codesign-bench-"))
    record: dict = {"grid": str(GRID.relative_to(Path(__file__).parent.parent)), "grid_points": grid.size,
                    "cpus": len(os.sched_getaffinity(0)), "runs": {}, "argv": list(argv or [])}
    record["memo"] = memo_runs()

    started = time.process_time()
    estimate = estimate_sweep(points(grid), options_for(grid, 300.0, float(1 << 36)))
    record["estimate"] = estimate.to_json() | {"estimate_cpu_s": time.process_time() - started}
    print(f"estimate {record['estimate']}", flush=True)

    def run(name, *a, which=small, **k):
        print(f"{name} ...", flush=True)
        record["runs"][name] = result = sweep(which, *a, **k)
        print(f"  {json.dumps(result)}", flush=True)
        (out / "codesign.json").write_text(json.dumps(record, indent=1) + "\n")
        (out / REPORT).write_text(report(record, argv))  # after every run: a cut-off benchmark keeps its figures
        return result

    # warm: imports and the first plan's one-off costs are not the steady rate
    sweep(small, "serial", 1, work / "warm.csv", limit=8)
    run("serial_shared", "serial", 1, work / "serial.csv", limit=args.small)
    run("serial_fresh", "serial", 1, work / "fresh.csv", limit=args.small, share=False)
    run("local_1", "local", 1, work / "local1.csv", limit=args.small)
    run("local_2", "local", 2, work / "local2.csv", limit=args.small)
    for name in executors:
        if name != "local":
            run(f"{name}_1", name, 1, work / f"{name}1.csv", limit=args.small)
    if not args.skip_10k:
        for name in executors:
            run(f"full_{name}", name, 2, work / f"full-{name}.csv", which=grid)
            if name == executors[0]:  # the rows themselves, compressed (6 MB of CSV)
                import gzip

                (out / "codesign-10k-results.csv.gz").write_bytes(gzip.compress((work / f"full-{name}.csv").read_bytes(),
                                                                                 mtime=0))
    (out / REPORT).write_text(report(record, argv))
    return 0


def report(record: dict, argv) -> str:
    runs = record["runs"]
    argv = [arg for arg in (argv or []) if arg != "--memo-only"]
    command = "python -m benchmarks.codesign" + (" " + " ".join(argv) if argv else "")
    lines = ["# Co-design sweeps: speed and agreement\n", header(command),
             f"Grid: `{record['grid']}` ({record['grid_points']:,} points: models of 1-3 B parameters on 4 to "
             f"32 devices, the planner's settings fixed); {record['cpus']} CPUs, shared with other jobs (load "
             f"average at each run's start and end below).\n",
             "| run | executor | workers | points | failed | wall s | points' CPU s | points / CPU-s | memo hits "
             "| overhead / point | driver's own CPU / point | load (1, 5, 15 min) before -> after | rows' digest |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, run in runs.items():
        rate = run["points"] / run["points_cpu_s"] if run["points_cpu_s"] else 0
        # the serial driver plans the points itself: its own part is what is left
        driver = run["driver_cpu_s"] - (run["points_cpu_s"] if run["executor"] == "serial" else 0.0)
        lines.append(f"| {name} | {run['executor']} | {run['workers']} | {run['points']:,} | {run['failed']:,} | "
                     f"{run['wall_s']:.1f} | {run['points_cpu_s']:.1f} | {rate:.1f} | {100 * run['memo_hit_rate']:.0f}% | "
                     f"{1000 * run['overhead_per_point_s']:.2f} ms | {1000 * driver / run['points']:.2f} ms | "
                     f"{run['load_before']} -> {run['load_after']} | "
                     f"`{run['digest']}` |")
    lines.append("")
    if "serial_shared" in runs and "serial_fresh" in runs:
        shared, fresh = runs["serial_shared"], runs["serial_fresh"]
        whole = next((run for name, run in runs.items() if name.startswith("full_")), None)
        over = (f"{whole['points'] / whole['points_cpu_s']:.1f} over the whole grid (60 points per system, "
                f"{100 * whole['memo_hit_rate']:.0f}% memo hits), " if whole else "")
        lines.append(f"Points per CPU-second on one core: {over}{shared['points'] / shared['points_cpu_s']:.1f} on "
                     f"the short grid (serial, in this process; 5 points per system, "
                     f"{100 * shared['memo_hit_rate']:.0f}% memo hits), {fresh['points'] / fresh['points_cpu_s']:.1f} "
                     f"there without the memo (same rows: digests "
                     f"{'equal' if shared['digest'] == fresh['digest'] else 'DIFFER'}).\n")
    memo = record.get("memo")
    if memo:
        off = [run["cpu_s"] for run in memo if not run["share"]]
        on = [run["cpu_s"] for run in memo if run["share"]]
        hits = memo[-1]["hits"] / max(1, memo[-1]["hits"] + memo[-1]["misses"])
        lines.append(f"The memo of priced collectives, each run in a fresh process ({MEMO_POINTS} consecutive points "
                     f"from point {MEMO_START} of the grid, 4 systems, serial): "
                     f"{', '.join(f'{value:.2f}' for value in off)} CPU s without it, "
                     f"{', '.join(f'{value:.2f}' for value in on)} CPU s with it ({100 * hits:.0f}% of its lookups "
                     f"hit): {sum(off) / sum(on):.2f}x fewer CPU seconds. (In the table, serial_fresh runs after "
                     f"serial_shared in the same process and inherits the planner's own caches: not a fair "
                     f"comparison, kept as measured.)\n")
    if "local_1" in runs and "local_2" in runs:
        one, two = runs["local_1"], runs["local_2"]
        lines.append(f"Speed-up of 2 local workers over 1 (process pool, wall): {one['wall_s'] / two['wall_s']:.2f}x "
                     f"({one['wall_s']:.1f} s -> {two['wall_s']:.1f} s for {one['points']:,} points), on a machine "
                     f"of {record['cpus']} CPUs whose load average was {two['load_before']} at the start: other jobs "
                     f"share the two cores, so this is a floor, not the speed-up of an idle machine.\n")
    full = {name: run for name, run in runs.items() if name.startswith("full_")}
    if full:
        estimate = record["estimate"]
        first = next(iter(full.values()))
        lines.append(f"The sweep's own estimate of the whole grid (synth/codesign/estimate.py, whose constant per "
                     f"point was set from the short runs here: partly a fit on this grid): {estimate['cpu_s']:,.0f} CPU s "
                     f"({estimate['shared_s']:,.0f} s of it shared collectives, {estimate['unshared_s']:,.0f} s were "
                     f"they priced point by point), made in {estimate['estimate_cpu_s']:.1f} CPU s; measured: "
                     f"{first['points_cpu_s']:,.0f} CPU s in the points.\n")
        digests = {run["digest"] for run in full.values()}
        lines.append(f"The whole grid through {', '.join(run['executor'] for run in full.values())} with 2 workers: "
                     f"{'identical rows point for point (one digest)' if len(digests) == 1 else 'rows DIFFER'}; "
                     f"the first executor's rows are in codesign-10k-results.csv.gz.\n")
    lines.append("Overhead per point: wall time x workers less the points' own CPU time (the planner's work), per "
                 "point; for the serial run, this process's CPU less the points'. It holds process start-up (spawn "
                 "imports synth in each worker), task transport and the results file; on a loaded machine it also "
                 "holds the time other jobs took from the workers, so the driver's CPU per point (making points and "
                 "tasks, sending them, writing rows) is given beside it: the part that does not depend on the load.\n")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
