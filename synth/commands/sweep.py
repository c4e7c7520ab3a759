"""`synth sweep`: the best program of every placement x request x size, as CSV and JSON files."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from synth.commands.common import add_model_options, add_system_options, resolve_job
from synth.commands.simulation import resolve_sizes
from synth.errors import UsageError
from synth.hierarchy import HIERARCHY_KINDS
from synth.placement import enumerate_placements
from synth.search import MAX_PROGRAM_LENGTH
from synth.model.network import check_costable
from synth.analysis.sweep import FIELDS, Sweep, configurations, run_sweep


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "sweep", help="best program of every placement x reduction x size, written as CSV and JSON",
        description="For every placement of the axes, every non-empty set of axes to reduce over and every size "
                    "MIN, MIN*F, ... up to MAX: the fastest program under the model, its time, algbw and busbw, the "
                    "default all-reduce's time, the speedup, the ratio to the lower bound and how many programs "
                    "were ranked. Writes DIR/sweep-<topology>-<axes>-<backend>.csv and .json.")
    add_system_options(parser)
    parser.add_argument("--axes", "-a", required=True, metavar="A", help="parallelism axes in order, e.g. data=8,model=4")
    parser.add_argument("-b", "--minbytes", metavar="MIN", required=True, help="smallest size per device, e.g. 1KiB or 1K")
    parser.add_argument("-e", "--maxbytes", metavar="MAX", required=True, help="largest size per device, e.g. 1GiB or 1G")
    parser.add_argument("-f", "--stepfactor", metavar="F", type=int, default=None,
                        help="multiply the size by F between MIN and MAX (integer >= 2, default 2)")
    add_model_options(parser)
    parser.add_argument("--hierarchy", default="merged", choices=HIERARCHY_KINDS, help="synthesis hierarchy (default merged)")
    parser.add_argument("-o", "--output", metavar="DIR", default="results", help="directory for the files (default results/)")
    parser.set_defaults(handler=run_sweep_command, bytes=None)


def output_stem(sweep: Sweep) -> str:
    """sweep-<topology>-<axes>-<backend>[-<hierarchy>]: one file pair per distinct sweep."""
    axes = "-".join(part.replace("=", "") for part in sweep.axes.split(","))
    suffix = "" if sweep.hierarchy == "merged" else f"-{sweep.hierarchy}"
    return f"sweep-{sweep.topology}-{axes}-{sweep.backend}{suffix}"


def command_text(sweep: Sweep, args) -> str:
    """The command that regenerates the files, recorded in the JSON."""
    parts = ["synth sweep", f"--topology {args.topology}", f"--axes {sweep.axes}", f"-b {args.minbytes}",
             f"-e {args.maxbytes}"]
    if args.stepfactor is not None:
        parts.append(f"-f {args.stepfactor}")
    parts += [f"--max-len {sweep.max_len}", f"--backend {sweep.backend}"]
    if sweep.hierarchy != "merged":
        parts.append(f"--hierarchy {sweep.hierarchy}")
    return " ".join(parts)


def write_csv(sweep: Sweep, path: Path) -> None:
    """One row per configuration; floats as Python's shortest round-trip text, so the CSV and
    the JSON hold the same numbers."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(FIELDS)
        for row in sweep.rows:
            record = row.to_json()
            writer.writerow([repr(record[name]) if isinstance(record[name], float) else record[name] for name in FIELDS])


def write_json(sweep: Sweep, path: Path, command: str) -> None:
    path.write_text(json.dumps({"command": command, **sweep.to_json()}, indent=1) + "\n", encoding="utf-8")


def run_sweep_command(args) -> int:
    job = resolve_job(args)
    check_costable(job.topology)
    sizes = resolve_sizes(args)
    if not 1 <= args.max_len <= MAX_PROGRAM_LENGTH:
        raise UsageError(f"--max-len {args.max_len}: give a length from 1 to {MAX_PROGRAM_LENGTH}")
    directory = Path(args.output)
    try:  # before the sweep: a bad DIR should not cost the whole run
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"-o {args.output}: cannot create the directory ({error.strerror})") from None
    placements = enumerate_placements(job.topology, job.axes)
    total = configurations(len(placements), job.axes, len(sizes))
    started = time.perf_counter()
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TimeRemainingColumn(), console=Console(stderr=True), transient=False)
    with progress:
        task = progress.add_task("sweep", total=total)

        def advance(placement, request, done):
            progress.update(task, advance=done, description=f"{placement.to_text()} {','.join(request)}")

        sweep = run_sweep(job.topology, placements, job.axes, sizes, backend=args.backend, max_len=args.max_len,
                          hierarchy_kind=args.hierarchy, on_pair=advance)
        progress.update(task, description="sweep")
    elapsed = time.perf_counter() - started
    try:
        stem = output_stem(sweep)
        csv_path, json_path = directory / f"{stem}.csv", directory / f"{stem}.json"
        write_csv(sweep, csv_path)
        write_json(sweep, json_path, command_text(sweep, args))
    except OSError as error:
        raise UsageError(f"cannot write to {directory}: {error.strerror}") from None
    wins = sum(row.beats_baseline for row in sweep.rows)
    skipped = f"; skipped {', '.join(sweep.skipped)} (one member per group)" if sweep.skipped else ""
    print(f"{len(sweep.rows)} configurations ({sweep.placements} placements x {len(sweep.requests)} requests x "
          f"{len(sizes)} sizes) in {elapsed:.1f} s; a synthesized program beats the default all-reduce on "
          f"{wins}{skipped}")
    print(csv_path)
    print(json_path)
    return 0
