"""`synth rank`: programs ordered by predicted time on a topology, per placement and size."""

from __future__ import annotations

import sys

from synth.commands.common import (resolve_goal, add_job_options, check_search, add_json_option, add_model_options, add_size_options, add_top_option,
                                   hierarchy_for, iter_placements, parse_size, print_json, resolve_job, resolve_reduce,
                                   resolve_sizes)
from synth.commands.common import add_plot_option, resolve_routing
from synth.errors import NoSolutionError

__all__ = ["register", "run_rank", "parse_size", "resolve_sizes"]  # the last two: benchmarks/sweep.py's imports

# synth.model.estimate.ESTIMATES and DEFAULT_ESTIMATE, without importing the model for --help
# (tests/test_estimates.py checks they agree).
ESTIMATES = ("lockstep", "pipelined")
DEFAULT_ESTIMATE = "pipelined"
PIPED_WIDTH = 160


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "rank", help="rank programs by predicted time on a topology",
        description="Rank every valid program (or the --top K best) by the simulator's predicted time "
                    "for every reduction group at once; the default all-reduce is always listed and marked.")
    add_job_options(parser)
    add_size_options(parser)
    add_top_option(parser)
    add_model_options(parser)
    parser.add_argument("--estimate", choices=ESTIMATES, default=DEFAULT_ESTIMATE,
                        help="pipelined (default; it predicts the emulated cluster's measurements better, "
                             "results/estimate-choice/README.md): groups do not wait for each other between steps; "
                             "lockstep: a program is the sum of its steps, each step all groups at once")
    parser.add_argument("--pareto", action="store_true",
                        help="keep the programs no other beats on time, extra memory, communicators and calls")
    add_json_option(parser)
    add_plot_option(parser, "time or busbw against size: the flat call, the top programs and the model's error band")
    parser.add_argument("--plot-metric", choices=("time", "busbw"), default="time",
                        help="what --plot draws against size (default time)")
    parser.set_defaults(handler=run_rank)


def run_rank(args) -> int:
    from synth.commands.progress_bar import working
    from synth.model.network import check_costable

    job = resolve_job(args)
    goal = resolve_goal(args, routed=True)
    routing = resolve_routing(args, goal)
    sizes = resolve_sizes(args, None if routing is None else routing.buffer_bytes)
    reduce_axes = resolve_reduce(args, job)
    # Every hierarchy first, checked against the search's limits, before anything is costed:
    # a topology too deep to search is refused before its network is built.
    hierarchies = [hierarchy for placement in iter_placements(args, job)
                   for hierarchy in [hierarchy_for(placement, reduce_axes, args.hierarchy)] if hierarchy.group_size > 1]
    if routing is None:  # a routed goal's programs are orders of the levels: no search to refuse
        check_search(hierarchies, args.max_len, goal)
    else:
        args.routed, args.estimate = routing, "lockstep"  # a routed program's steps add up
    check_costable(job.topology)
    from synth.commands.plotting import check_plot

    check_plot(args)
    sections, done = [], 0
    try:
        with working(f"{len(hierarchies)} placement(s)", len(hierarchies)) as bar:
            for hierarchy in hierarchies:
                _rank_one(args, job, goal, sizes, hierarchy, sections)
                done += 1
                if bar is not None:
                    bar(done, len(hierarchies))
    except KeyboardInterrupt:  # show the placements ranked before it, then exit 130 saying so
        if not sections:
            raise
        interrupted = f"interrupted after {done} of {len(hierarchies)} placement(s); the output holds those"
    else:
        interrupted = None
    _print_sections(args, job, sections, reduce_axes, sizes, goal)
    if interrupted:
        raise KeyboardInterrupt(interrupted)
    return 0


def _rank_one(args, job, goal, sizes, hierarchy, sections: list) -> None:
    """One placement's sections (appended, so an interruption keeps those done): every program
    of the goal, or for --top K the K best by the best-first search (and the flat call)."""
    from synth.search.rank import Ranker, pareto_front
    from synth.model.context import cost_context

    context = cost_context(hierarchy, job.topology, args.backend)
    if goal.routed:
        sections += _routed_sections(context, goal, sizes, args)
        return
    ranker = Ranker(context, args.max_len, args.estimate, goal=goal)
    ranked = ([ranker.top(size, args.top) for size in sizes] if args.top is not None else ranker.rank(sizes))
    for size, rows in zip(sizes, ranked):
        if args.pareto:
            rows = pareto_front(rows)
        sections.append((size, hierarchy, (ranker.lower_bound(size), ranker.achievable_bound(size)), rows))


def _print_sections(args, job, sections, reduce_axes, sizes, goal) -> None:
    if not sections:
        raise NoSolutionError(f"reducing over {','.join(reduce_axes)} involves one device per group on every "
                              f"placement: there is nothing to rank")
    sections.sort(key=lambda section: section[0])  # per size, placements in their listed order
    held = {}
    if args.backend == "nccl" and goal.is_all_reduce:  # the held-out study is of all-reduces
        from synth.model.heldout import held_out_for_group  # the model's error on runs it was not built on (issue 16)

        held = {id(hierarchy): {size: held_out_for_group(job.topology, hierarchy.groups[0], size)
                                for size in sizes} for _, hierarchy, _, _ in sections}
    if args.json:
        print_json([dict(row.to_json(), lower_bound_s=bounds[0].time_s, **_achievable_json(bounds[1], row),
                         backend=args.backend, estimate=args.estimate,
                         **_held_out_json(held.get(id(hierarchy), {}).get(size), row))
                    for size, hierarchy, bounds, rows in sections for row in rows])
    else:
        _print_tables(args, job, sections, held, goal)
    if args.plot:
        from synth.commands.plotting import plot_rank

        sys.stdout.flush()  # the tables before the line saying where the picture went
        plot_rank(args, job.topology.name, sections, held, goal)


def _print_tables(args, job, sections, held, goal) -> None:
    from synth.commands.terminal import console as text_console

    console = text_console(piped_width=PIPED_WIDTH)  # piped or captured: wide enough that no figure is cut
    from synth.calibrate.confidence import model_error_for_group  # how sure the ranking is (issue 9)

    for size, hierarchy, bound, rows in sections:
        try:
            sure = model_error_for_group(job.topology, hierarchy.groups[0], goal.collective, size).describe(size)
        except (KeyError, ValueError):  # a collective the calibration does not fit (all-to-all)
            sure = ""
        error = held.get(id(hierarchy), {}).get(size)
        if error is not None:
            sure += ("\n" if sure else "") + error.describe()
        console.print(_table(job.topology.name, size, hierarchy, bound, rows, args, sure, error, goal))


def within_error(row, error) -> bool:
    """A predicted win no larger than the model's held-out median error: not told apart from none."""
    return error is not None and not row.baseline and 1.0 < row.speedup <= 1.0 + error.median


def _achievable_json(achievable, row) -> dict:
    if achievable is None:
        return {}
    return {"achievable_bound_s": achievable.time_s,
            "achievable_ratio": row.time_s / achievable.time_s if achievable.time_s > 0 else 1.0}


def _held_out_json(error, row) -> dict:
    if error is None:
        return {}
    return {"held_out_error": error.median, "within_model_error": within_error(row, error)}


def _routed_sections(context, goal, sizes, args) -> list:
    """Dispatch or combine programs for the --routing, with their routed lower bound (the one
    `Ranker`, synth/search/rank.py); sizes are bytes of tokens per member."""
    from synth.commands.common import flagged
    from synth.search.rank import Ranker, pareto_front

    with flagged("--routing"):
        ranker = Ranker(context, args.max_len, goal=goal, routing=args.routed)
    sections = []
    for size in sizes:
        with flagged("--bytes"):
            bound = ranker.lower_bound(size)
        rows = ranker.top(size, args.top) if args.top is not None else ranker.rank([size])[0]
        if args.pareto:
            rows = pareto_front(rows)
        sections.append((bound.bytes_per_device, context.hierarchy, (bound, None), rows))
    return sections


def _table(topology_name: str, size: int, hierarchy, bounds, rows, args, sure: str = "", error=None, goal=None):
    from rich.table import Table

    from synth.units import format_bandwidth, format_bytes, format_time

    levels = ",".join(f"{level.name}={level.size}" for level in hierarchy.levels)
    title = (f"{topology_name}  placement {hierarchy.placement.to_text()}  reduce {','.join(hierarchy.reduce_axes)} "
             f"({levels})  {format_bytes(size)} per device")
    bound, achievable = bounds
    flat = "default all-reduce" if goal is None or goal.is_all_reduce else f"one {goal.collective} call"
    caption = (f"lower bound {format_time(bound.time_s)} ({bound.bottleneck}); "
               + (f"achievable bound {format_time(achievable.time_s)} (each link at the rate NCCL reaches on it); "
                  if achievable is not None else "")
               + f"* {flat}; "
               + ("~ a win within the model's held-out error; " if error is not None else "")
               + f"backend {args.backend}; {args.estimate} estimate" + (f"\n{sure}" if sure else ""))
    table = Table(title=title, caption=caption)
    table.add_column("#", justify="right", no_wrap=True)
    widest_step = max((len(str(step)) for row in rows for step in row.program.steps), default=0)
    table.add_column("program", overflow="fold", min_width=widest_step + 1)
    for name in ("time", "algbw", "busbw", "speedup", "vs bound", "vs achievable"):
        table.add_column(name, justify="right", no_wrap=True)
    if args.pareto:
        for name in ("extra mem", "comms", "calls"):
            table.add_column(name, justify="right", no_wrap=True)
    for index, row in enumerate(rows, 1):
        cells = [f"{index}{' *' if row.baseline else ''}", ";\n".join(map(str, row.program.steps)), format_time(row.time_s),
                 format_bandwidth(row.algbw_GBps * 1e9), format_bandwidth(row.busbw_GBps * 1e9),
                 f"{row.speedup:.3f}x" + (" ~" if within_error(row, error) else ""), f"{row.bound_ratio:.2f}x",
                 f"{row.time_s / achievable.time_s:.2f}x" if achievable is not None and achievable.time_s > 0 else "-"]
        if args.pareto:
            cells += [format_bytes(row.extra_memory_bytes) if row.extra_memory_bytes else "0",
                      str(row.communicators), str(row.calls_per_device)]
        table.add_row(*cells, style="bold" if row.baseline else None)
    return table
