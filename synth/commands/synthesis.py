"""`synth topologies`, `synth placements`, `synth check`, `synth programs`."""

from __future__ import annotations

import sys
from contextlib import contextmanager

from rich.console import Console
from rich.table import Table

from synth.commands.common import (add_job_options, add_json_option, add_max_len_option, add_system_options, add_constraint_options,
                                   hierarchy_for, print_json, read_program_text, resolve_job, resolve_placements,
                                   resolve_reduce)
from synth.errors import NoSolutionError
from synth.language import parse_program
from synth.search import Enumerator, SearchOptions, semantics_for
from synth.search_budget import check_budget
from synth.semantics import Semantics
from synth.topology_file import builtin_topology_names, load_topology

# Explicit per-member states up to this many members; the quotient state beyond.
EXPLICIT_CHECK_LIMIT = 256


def register(subparsers) -> None:
    parser = subparsers.add_parser("topologies", help="list the built-in topologies")
    add_json_option(parser)
    parser.set_defaults(handler=run_topologies)

    parser = subparsers.add_parser("placements", help="list every placement of the axes on the system")
    add_system_options(parser)
    parser.add_argument("--axes", "-a", required=True, metavar="A", help="parallelism axes in order, e.g. data=8,model=4")
    add_constraint_options(parser)
    add_json_option(parser)
    parser.set_defaults(handler=run_placements)

    parser = subparsers.add_parser("check", help="check a program against the semantics")
    add_job_options(parser)
    parser.add_argument("program", help="program text, '-' for standard input, or @FILE")
    parser.set_defaults(handler=run_check)

    parser = subparsers.add_parser("programs", help="enumerate every valid program up to a length")
    add_job_options(parser)
    add_max_len_option(parser)
    parser.add_argument("--count", action="store_true", help="print only how many programs there are")
    add_json_option(parser)
    parser.set_defaults(handler=run_programs)


def run_topologies(args) -> int:
    rows = []
    for name in builtin_topology_names():
        topology = load_topology(name)
        rows.append({"name": name, "levels": {level.name: level.size for level in topology.levels},
                     "devices": topology.device_count, "description": topology.description})
    if args.json:
        print_json(rows)
        return 0
    table = Table("name", "levels", "devices", "description")
    for row in rows:
        table.add_row(row["name"], ",".join(f"{k}={v}" for k, v in row["levels"].items()), str(row["devices"]), row["description"])
    Console().print(table)
    return 0


def run_placements(args) -> int:
    job = resolve_job(args)
    placements = resolve_placements(args, job)
    if args.json:
        print_json([
            {"matrix": [list(row) for row in p.matrix],
             "groups": {name: p.axis_groups(name) for name in job.axis_names}}
            for p in placements
        ])
        return 0
    table = Table("#", "matrix", *(f"{name} groups" for name in job.axis_names),
                  title=f"{len(placements)} placement(s) of {args.axes} on {job.topology.name} "
                        f"(columns: {','.join(job.topology.level_names)})")
    for index, p in enumerate(placements):
        table.add_row(str(index), p.to_text(), *(_short_groups(p.axis_groups(name)) for name in job.axis_names))
    Console().print(table)
    return 0


def _short_groups(groups: list[list[int]], limit: int = 3) -> str:
    shown = " ".join("[" + ",".join(map(str, g)) + "]" for g in groups[:limit])
    return shown + (f" ... ({len(groups)} groups)" if len(groups) > limit else "")


def run_check(args) -> int:
    job = resolve_job(args)
    program = parse_program(read_program_text(args.program))
    reduce_axes = resolve_reduce(args, job)
    placements = resolve_placements(args, job)
    if len(placements) != 1:
        raise NoSolutionError(f"check needs one placement; {len(placements)} match: give --placement")
    hierarchy = hierarchy_for(placements[0], reduce_axes, args.hierarchy)
    quotient = hierarchy.group_size > EXPLICIT_CHECK_LIMIT
    semantics = Semantics(hierarchy.level_names, hierarchy.sizes, quotient=quotient)
    trace = semantics.run(program)
    levels = ", ".join(f"{level.name}={level.size}" for level in hierarchy.levels)
    print(f"valid: {program}")
    print(f"  {len(trace)} step(s) over the {hierarchy.kind} hierarchy ({levels}); "
          f"{len(hierarchy.groups)} reduction group(s) of {hierarchy.group_size} reach the full sum")
    return 0


@contextmanager
def search_progress(label: str):
    """A live line on stderr (only on a terminal) with the search's counters."""
    if not sys.stderr.isatty():
        yield None
        return
    console = Console(stderr=True)
    with console.status(label) as status:
        def update(stats):
            status.update(f"{label}: {stats.expanded} states expanded, {stats.programs} programs (Ctrl-C stops)")
        yield update


def run_programs(args) -> int:
    job = resolve_job(args)
    reduce_axes = resolve_reduce(args, job)
    hierarchies = [hierarchy_for(p, reduce_axes, args.hierarchy) for p in resolve_placements(args, job)]
    hierarchies = [h for h in hierarchies if h.group_size > 1]
    if not hierarchies:
        raise NoSolutionError(f"reducing over {args.reduce} involves one device per group: there is nothing to reduce")
    check_budget([(h.level_names, h.sizes) for h in hierarchies], args.max_len)  # all placements, before any output
    rows, total = [], 0
    try:
        with search_progress("synthesizing") as progress:
            for hierarchy in hierarchies:
                matrix = [list(row) for row in hierarchy.placement.matrix]
                enumerator = Enumerator(semantics_for(hierarchy), SearchOptions(max_len=args.max_len), on_progress=progress)
                if args.count:
                    count = enumerator.total()
                    total += count
                    rows.append({"matrix": matrix, "count": count})
                    if not args.json:
                        print(f"{_matrix_text(matrix)}  {count} program(s)", flush=True)
                    continue
                if not args.json:
                    print(f"# placement {_matrix_text(matrix)}  hierarchy {','.join(hierarchy.level_names)}", flush=True)
                for program in enumerator.programs():
                    total += 1
                    if args.json:
                        rows.append({"program": str(program), "matrix": matrix, "length": len(program),
                                     "hierarchy": list(hierarchy.level_names)})
                    else:
                        print(program, flush=True)
    except KeyboardInterrupt:
        raise KeyboardInterruptWithCount(total) from None
    if args.json:
        print_json(rows)
    else:
        print(f"# {total} program(s) up to {args.max_len} step(s)")
    if total == 0:
        raise NoSolutionError(f"no valid program of at most {args.max_len} step(s): raise --max-len")
    return 0


class KeyboardInterruptWithCount(KeyboardInterrupt):
    """Ctrl-C during a search: the CLI says how far it got."""

    def __init__(self, programs: int):
        super().__init__(f"interrupted after {programs} program(s)")


def _matrix_text(matrix) -> str:
    return "[" + ",".join("[" + ",".join(map(str, row)) + "]" for row in matrix) + "]"
