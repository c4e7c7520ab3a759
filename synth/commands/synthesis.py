"""`synth topologies`, `synth placements`, `synth check`, `synth programs`."""

from __future__ import annotations

import itertools
import json
import sys
from contextlib import contextmanager

from synth.commands.terminal import interrupt_in_native_call
from synth.commands.common import add_plot_option
from synth.commands.common import (add_axes_option, add_constraint_options, add_job_options, add_json_option,
                                   add_max_len_option, add_system_options, constraints_of, hierarchy_for, iter_placements, one_placement,
                                   print_json, read_program_text, resolve_goal, resolve_job, resolve_reduce)
from synth.errors import NoSolutionError, UsageError

# Explicit per-member states up to this many members; the quotient state beyond.
EXPLICIT_CHECK_LIMIT = 256


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "topologies", help="list the built-in topologies",
        description="List the built-in topologies, or show one (a built-in name or a TOML file): its levels, "
                    "links and figures with their sources.")
    parser.add_argument("name", nargs="?", metavar="NAME", help="show this topology (built-in name or TOML file)")
    add_json_option(parser)
    add_plot_option(parser, "the topology's hierarchy with its links and figures (needs NAME)")
    parser.set_defaults(handler=run_topologies)

    parser = subparsers.add_parser("placements", help="list every placement of the axes on the system")
    add_system_options(parser)
    add_axes_option(parser)
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
    from rich.table import Table

    from synth.commands.terminal import console as text_console
    from synth.topology_file import builtin_topology_names, load_topology

    if args.name is not None:
        return _show_topology(args)
    if args.plot is not None:
        raise UsageError("--plot draws one topology: name it, e.g. synth topologies dgx-a100-x4 --plot topology.png")

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
    text_console(piped_width=None).print(table)
    return 0


def _show_topology(args) -> int:
    """One topology: as JSON (the file's tables and keys), or its levels and every figure's source;
    --plot draws it."""
    from synth.commands.plotting import check_plot
    from synth.topology_file import load_topology, topology_document

    topology = load_topology(args.name)
    check_plot(args)
    if args.json:
        document = topology_document(topology)
        print_json({"name": document.pop("name"), "description": document.pop("description"),
                    "devices": topology.device_count, **document})
    else:
        _print_topology(topology)
    if args.plot is not None:
        from synth.commands.plotting import plot_topology

        sys.stdout.flush()
        plot_topology(args.plot, topology)
    return 0


def _print_topology(topology) -> None:
    from rich.table import Table

    from synth.commands.terminal import console as text_console
    from synth.plots.topology import figure_lines, system_line

    console = text_console(piped_width=160)
    table = Table("level", "size", "figures", title=f"{topology.name}: {topology.device_count} devices",
                  caption=topology.description)
    for level in topology.levels:
        table.add_row(level.name, str(level.size), "\n".join(figure_lines(level)))
    console.print(table)
    line = system_line(topology)
    if line:
        console.print(line, highlight=False, soft_wrap=True)
    sources = Table("figure", "source", title="sources", title_justify="left")
    for what, source in figure_sources(topology):
        sources.add_row(what, source)
    console.print(sources)


def figure_sources(topology) -> list[tuple[str, str]]:
    """(which figure, its source) for every figure of the topology that has one."""
    rows = []
    for level in topology.levels:
        for key in ("bandwidth", "latency", "fabric", "efficiency", "overhead"):
            figure = getattr(level, key)
            if figure is not None:
                rows.append((f"{level.name} {key}", figure.source))
        if level.uplinks is not None:
            rows.append((f"{level.name} uplinks", level.uplinks.bandwidth.source))
        for key in ("link", "transport"):
            value = getattr(level, key)
            if value is not None:
                rows.append((f"{level.name} {key}", value.source))
        for name, figures in level.collectives:
            rows.append((f"{level.name} {name} bandwidth", figures.bandwidth.source))
            rows.append((f"{level.name} {name} latency", figures.latency.source))
    if topology.nccl is not None:
        rows.append(("nccl", topology.nccl.source))
    if topology.device is not None:
        rows.append(("device memory", topology.device.memory.source))
        rows += [(f"device peak {precision}", figure.source) for precision, figure in topology.device.peak]
    return rows


def run_placements(args) -> int:
    """One row per placement, printed as it is made: a system with many placements of many
    devices is never held whole (each placement's rank groups are computed, shown, dropped)."""
    job = resolve_job(args)
    placements = iter_placements(args, job)
    if args.json:
        first = next(placements)  # errors (no placement, a bad constraint) before any output
        _check_json_size(args, job)
        sys.stdout.write("[")
        for index, p in enumerate(itertools.chain([first], placements)):
            sys.stdout.write(("\n" if index == 0 else ",\n") + json.dumps(
                {"matrix": [list(row) for row in p.matrix],
                 "groups": {name: p.axis_groups(name) for name in job.axis_names}}))
        sys.stdout.write("\n]\n")
        return 0
    from rich.table import Table

    from synth.commands.terminal import console as text_console

    table = Table("#", "matrix", *(f"{name} groups" for name in job.axis_names))
    for index, p in enumerate(placements, 1):
        table.add_row(str(index), p.to_text(), *(_short_groups(p, name) for name in job.axis_names))
    table.title = (f"{table.row_count} placement(s) of {args.axes} on {job.topology.name} "
                   f"(columns: {','.join(job.topology.level_names)})")
    text_console(piped_width=None).print(table)
    return 0


MAX_JSON_BYTES = 256 << 20  # 21 MB took 4 s


def _check_json_size(args, job) -> None:
    """--json lists every group of every axis of every placement: refuse, before writing, a
    listing of gigabytes (406 placements of 262,144 devices ran for minutes)."""
    from synth.placement import count_matching
    from synth.units import format_bytes

    count = 1 if getattr(args, "placement", None) else count_matching(job.topology, job.axes, constraints_of(args))
    devices = job.topology.device_count
    size = count * len(job.axes) * devices * (len(str(devices)) + 1)
    if size > MAX_JSON_BYTES:
        raise UsageError(f"--json would list every group of {count:,} placement(s) of {devices:,} devices: about "
                         f"{format_bytes(size)} (at most {format_bytes(MAX_JSON_BYTES)}); drop --json for the table, "
                         f"or narrow the placements with --inside/--factor")


def _short_groups(placement, axis: str, limit: int = 3, members: int = 8) -> str:
    """The first groups of an axis (each cut to `members` ranks) and how many there are,
    computed without the per-device arrays."""
    count = placement.device_count // placement.axis_sizes[placement.axis_index(axis)]
    shown = []
    for index in range(min(limit, count)):
        head = placement.group_head(axis, index, members + 1)
        shown.append("[" + ",".join(map(str, head[:members])) + (",..." if len(head) > members else "") + "]")
    return " ".join(shown) + (f" ... ({count} groups)" if count > limit else "")


def run_check(args) -> int:
    from synth.language import parse_program
    from synth.semantics import Semantics

    job = resolve_job(args)
    program = parse_program(read_program_text(args.program))
    reduce_axes = resolve_reduce(args, job)
    goal = resolve_goal(args, routed=True)
    placement = one_placement(args, job, "check")
    hierarchy = hierarchy_for(placement, reduce_axes, args.hierarchy)
    if goal.routed:  # valid for every routing (synth/routed.py): --routing is not read
        from synth.routed import RoutedSemantics

        semantics = RoutedSemantics(hierarchy.level_names, hierarchy.sizes, goal)
    else:
        quotient = hierarchy.group_size > EXPLICIT_CHECK_LIMIT
        semantics = Semantics(hierarchy.level_names, hierarchy.sizes, quotient=quotient, goal=goal)
    trace = semantics.run(program)
    levels = ", ".join(f"{level.name}={level.size}" for level in hierarchy.levels)
    reached = "reach the full sum" if goal.is_all_reduce else f"complete the {goal.title}"
    print(f"valid: {program}")
    print(f"  {len(trace)} step(s) over the {hierarchy.kind} hierarchy ({levels}); "
          f"{len(hierarchy.groups)} reduction group(s) of {hierarchy.group_size} {reached}")
    return 0


@contextmanager
def search_progress(label: str):
    """A live line on stderr (only on a terminal) with the search's counters."""
    if not sys.stderr.isatty():
        yield None
        return
    from synth.commands.terminal import console as text_console

    console = text_console(stderr=True, piped_width=None)
    with console.status(label) as status:
        def update(stats):
            status.update(f"{label}: {stats.expanded} states expanded, {stats.programs} programs (Ctrl-C stops)")
        yield update


def run_programs(args) -> int:
    from synth.search import Enumerator, SearchOptions, semantics_for
    from synth.search.budget import check_budget

    job = resolve_job(args)
    reduce_axes = resolve_reduce(args, job)
    goal = resolve_goal(args, routed=True)
    hierarchies = [hierarchy_for(p, reduce_axes, args.hierarchy) for p in iter_placements(args, job)]
    hierarchies = [h for h in hierarchies if h.group_size > 1]
    if not hierarchies:
        raise NoSolutionError(f"reducing over {args.reduce} involves one device per group: there is nothing to reduce")
    if goal.routed:  # orders and groupings of the levels (synth/routed.py): nothing to budget
        from synth.routed import RoutedSemantics

        def listing(hierarchy, progress):
            return _Listed(RoutedSemantics(hierarchy.level_names, hierarchy.sizes, goal).programs(args.max_len))
    else:
        check_budget([(h.level_names, h.sizes) for h in hierarchies], args.max_len, goal=goal)  # before any output

        def listing(hierarchy, progress):
            return Enumerator(semantics_for(hierarchy, goal=goal), SearchOptions(max_len=args.max_len),
                              on_progress=progress)
    rows, total = [], 0
    try:
        with search_progress("synthesizing") as progress:
            for hierarchy in hierarchies:
                matrix = [list(row) for row in hierarchy.placement.matrix]
                enumerator = listing(hierarchy, progress)
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
    except Exception as error:  # Ctrl-C inside a native (Z3) call reaches here as ctypes' ArgumentError
        if not interrupt_in_native_call(error):
            raise
        if args.json:
            print_json(rows)
        raise KeyboardInterruptWithCount(total, "the JSON holds them" if args.json else "") from None
    except KeyboardInterrupt:
        if args.json:  # what was found stays usable: a complete JSON document
            print_json(rows)
        raise KeyboardInterruptWithCount(total, "the JSON holds them" if args.json else "") from None
    if args.json:
        print_json(rows)
    else:
        print(f"# {total} program(s) up to {args.max_len} step(s)")
    if total == 0:
        raise NoSolutionError(f"no valid program of at most {args.max_len} step(s): raise --max-len")
    return 0


class _Listed:
    """Programs already listed (a routed goal's: synth/routed.py), read as an Enumerator is."""

    def __init__(self, programs):
        self._programs = programs

    def total(self) -> int:
        return len(self._programs)

    def programs(self):
        return iter(self._programs)


class KeyboardInterruptWithCount(KeyboardInterrupt):
    """Ctrl-C during a search: the CLI says how far it got."""

    def __init__(self, programs: int, note: str = ""):
        super().__init__(f"interrupted after {programs} program(s)" + (f"; {note}" if note else ""))


def _matrix_text(matrix) -> str:
    return "[" + ",".join("[" + ",".join(map(str, row)) + "]" for row in matrix) + "]"
