"""`synth sweep`: the best program of every placement x request x size, as CSV and JSON files."""

from __future__ import annotations

import csv
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from synth.commands.common import (add_axes_option, check_search, hierarchy_for, add_hierarchy_option, add_model_options, add_output_option,
                                   add_size_options, add_system_options, output_directory, resolve_job, resolve_sizes)
from synth.errors import UsageError

if TYPE_CHECKING:
    from synth.analysis.sweep import Sweep


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "sweep", help="best program of every placement x reduction x size, written as CSV and JSON",
        description="For every placement of the axes, every non-empty set of axes to reduce over and every size "
                    "MIN, MIN*F, ... up to MAX: the fastest program under the model, its time, algbw and busbw, the "
                    "default all-reduce's time, the speedup, the ratio to the lower bound and how many programs "
                    "were ranked. Writes DIR/sweep-<topology>-<axes>-<backend>.csv and .json.")
    add_system_options(parser)
    add_axes_option(parser)
    add_size_options(parser, sweep_required=True)
    add_model_options(parser)
    add_hierarchy_option(parser)
    add_output_option(parser, "directory for the two files (default: a new directory under the system's temporary "
                              "directory, printed at the end; nothing is written into the current directory unasked)")
    parser.set_defaults(handler=run_sweep_command)


def output_stem(sweep: Sweep) -> str:
    """sweep-<topology>-<axes>-<backend>[-<hierarchy>]: one file pair per distinct sweep."""
    axes = "-".join(part.replace("=", "") for part in sweep.axes.split(","))
    suffix = "" if sweep.hierarchy == "merged" else f"-{sweep.hierarchy}"
    return f"sweep-{sweep.topology}-{axes}-{sweep.backend}{suffix}"


def command_text(sweep: Sweep, args) -> str:
    """The command that regenerates the files, recorded in the JSON."""
    system = f"--topology {args.topology}" if args.topology else f"--levels {args.levels}"
    parts = ["synth sweep", system, f"--axes {sweep.axes}", f"-b {args.minbytes}",
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
    from synth.analysis.sweep import FIELDS

    from synth.output_files import writing

    with writing(path, newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(FIELDS)
        for row in sweep.rows:
            record = row.to_json()
            writer.writerow([repr(record[name]) if isinstance(record[name], float) else record[name] for name in FIELDS])


def write_json(sweep: Sweep, path: Path, command: str, interrupted: bool = False) -> None:
    extra = {"interrupted": True} if interrupted else {}
    from synth.output_files import write_text

    write_text(path, json.dumps({"command": command, **extra, **sweep.to_json()}, indent=1) + "\n")


def run_sweep_command(args) -> int:
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from synth.search.programs import ProgramSets
    from synth.analysis.sweep import configurations, has_members, reduction_requests, run_sweep
    from synth.commands.terminal import console as text_console
    from synth.model.network import check_costable
    from synth.placement import enumerate_placements
    from synth.search import MAX_PROGRAM_LENGTH

    job = resolve_job(args)
    check_costable(job.topology)
    sizes = resolve_sizes(args)
    if not 1 <= args.max_len <= MAX_PROGRAM_LENGTH:
        raise UsageError(f"--max-len {args.max_len}: give a length from 1 to {MAX_PROGRAM_LENGTH}")
    directory = output_directory(args.output, "sweep")  # before the sweep: a bad DIR should not cost the whole run
    placements = enumerate_placements(job.topology, job.axes)
    requests = [request for request in reduction_requests(job.axes) if has_members(request, job.axes)]
    check_search([hierarchy_for(p, request, args.hierarchy) for p in placements for request in requests], args.max_len)
    total = configurations(len(placements), job.axes, len(sizes))
    started = time.perf_counter()
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TimeRemainingColumn(), console=text_console(stderr=True, piped_width=None), transient=False)
    # One placement at a time, so Ctrl-C keeps every placement finished so far.
    program_sets, times_cache, parts, interrupted = ProgramSets(), {}, [], False
    try:
        with progress:
            task = progress.add_task("sweep", total=total)

            def advance(placement, request, done):
                progress.update(task, advance=done, description=f"{placement.to_text()} {','.join(request)}")

            for placement in placements:
                parts.append(run_sweep(job.topology, [placement], job.axes, sizes, backend=args.backend,
                                       max_len=args.max_len, hierarchy_kind=args.hierarchy, program_sets=program_sets,
                                       on_pair=advance, times_cache=times_cache))
            progress.update(task, description="sweep")
    except KeyboardInterrupt:
        interrupted = True
    template = parts[0] if parts else run_sweep(job.topology, [], job.axes, sizes, backend=args.backend,
                                                max_len=args.max_len, hierarchy_kind=args.hierarchy)
    sweep = replace(template, placements=len(parts), rows=tuple(row for part in parts for row in part.rows))
    elapsed = time.perf_counter() - started
    try:
        stem = output_stem(sweep)
        csv_path, json_path = directory / f"{stem}.csv", directory / f"{stem}.json"
        write_csv(sweep, csv_path)
        write_json(sweep, json_path, command_text(sweep, args), interrupted)
    except OSError as error:
        raise UsageError(f"-o {directory}: cannot write the files ({error.strerror or error})") from None
    wins = sum(row.beats_baseline for row in sweep.rows)
    skipped = f"; skipped {', '.join(sweep.skipped)} (one member per group)" if sweep.skipped else ""
    print(f"{len(sweep.rows)} configurations ({sweep.placements} placements x {len(sweep.requests)} requests x "
          f"{len(sizes)} sizes) in {elapsed:.1f} s; a synthesized program beats the default all-reduce on "
          f"{wins} of the {len(sweep.rows)} configurations ({100 * wins / max(len(sweep.rows), 1):.1f}%){skipped}")
    print(csv_path)
    print(json_path)
    if interrupted:
        raise KeyboardInterrupt(f"interrupted after {len(parts)} of {len(placements)} placement(s); the files hold "
                                f"those (the JSON says \"interrupted\": true)")
    return 0
