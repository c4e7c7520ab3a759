"""`synth explore`, `synth workload`, `synth fusion`: placements and buckets chosen by predicted time."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from synth.commands.common import (resolve_goal, add_bytes_option, check_search, echo, read_text, add_job_options, add_json_option, add_model_options,
                                   hierarchy_for, one_placement, parse_size, print_json, resolve_job,
                                   resolve_placements, resolve_reduce)
from synth.errors import NoSolutionError, UsageError

if TYPE_CHECKING:
    from rich.table import Table

    from synth.analysis.explore import ExploreResult
    from synth.analysis.fusion import FusionPlan, Schedule
    from synth.analysis.workload import WorkloadResult

PIPED_WIDTH = 160
DEFAULT_COMPUTE_RATE_TEXT = "30GB/s"  # synth.analysis.fusion.DEFAULT_COMPUTE_RATE, derived there
DDP_BUCKET_CAP_TEXT, DDP_FIRST_BUCKET_CAP_TEXT = "25MiB", "1MiB"  # synth.analysis.fusion's, a test keeps them equal
INFINITE_RATES = ("inf", "infinite", "infinity")
MAX_REDUCTIONS = 64


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "explore", help="the best program on every placement, and the spread between placements",
        description="For one request and size: per placement, the fastest program, the default all-reduce, the "
                    "speedup and the ratio to the lower bound; sorted by best time, with the placement spread.")
    add_job_options(parser)
    add_bytes_option(parser, required=True)
    add_model_options(parser)
    add_json_option(parser)
    parser.set_defaults(handler=run_explore)

    parser = subparsers.add_parser(
        "workload", help="placements ranked by a step's total reduction time over several reductions",
        description="Each --reduction is AXES:BYTES[xCOUNT]: axes joined by '+', bytes per device per call, calls "
                    "per step (default 1), e.g. --reduction data:1GiB --reduction model:64MiBx96. Placements are "
                    "ranked by the sum over reductions of count x the fastest program's time.")
    add_job_options(parser, reduce=False)
    parser.add_argument("--reduction", "-R", action="append", required=True, metavar="AXES:BYTES[xCOUNT]",
                        help="one reduction of the step, e.g. data:1GiB or model:64MiBx96 or data+model:8MiB; end it "
                             "in @overlap when it runs behind compute (data:1GiB@overlap); repeatable")
    add_model_options(parser)
    add_json_option(parser)
    parser.set_defaults(handler=run_workload)

    parser = subparsers.add_parser(
        "fusion", help="fuse gradients into buckets and pick each bucket's program; compare with DDP's 25 MiB buckets",
        description="Gradient tensors in the order backward produces them are fused into buckets of consecutive "
                    "tensors, each running its fastest program, so that the step's reduction finishes first (one "
                    "communication stream; a bucket starts when its last tensor is ready and the previous bucket "
                    "is done). Compared with PyTorch DDP's default buckets (bucket_cap_mb=25, first bucket 1 MiB) "
                    "running the default all-reduce.")
    add_job_options(parser)
    sizes = parser.add_mutually_exclusive_group(required=True)
    sizes.add_argument("--tensors", metavar="S,S,...", help="gradient sizes per device in backward order, e.g. 4MiB,16MiB,8KiB")
    sizes.add_argument("--tensors-file", metavar="F", help="a file with one gradient size per line ('#' comments)")
    parser.add_argument("--compute-rate", metavar="RATE", default=DEFAULT_COMPUTE_RATE_TEXT,
                        help=f"bytes of gradient backward produces per second, or 'inf' for all at once "
                             f"(default {DEFAULT_COMPUTE_RATE_TEXT}: an A100 at 125 TFLOP/s, 4096 tokens, fp32 gradients)")
    parser.add_argument("--bucket-cap", metavar="S", default=DDP_BUCKET_CAP_TEXT,
                        help="the baseline's bucket cap (default 25MiB, DDP's bucket_cap_mb=25)")
    parser.add_argument("--first-bucket-cap", metavar="S", default=DDP_FIRST_BUCKET_CAP_TEXT,
                        help="the baseline's first bucket cap (default 1MiB, DDP's kDefaultFirstBucketBytes)")
    parser.add_argument("--exact", action="store_true",
                        help="search the fastest program at every bucket size (slower) instead of costing the "
                             "candidates found on a power-of-two grid of sizes")
    add_model_options(parser)
    add_json_option(parser)
    parser.set_defaults(handler=run_fusion)


def _console():
    from synth.commands.terminal import console

    return console(piped_width=PIPED_WIDTH)  # piped: never cut a figure


def _multiline(program) -> str:
    return ";\n".join(map(str, program.steps))


# --- explore ---------------------------------------------------------------------------------------


def run_explore(args) -> int:
    from synth.analysis.explore import explore_placements
    from synth.commands.progress_bar import working
    from synth.model.network import check_costable

    job = resolve_job(args)
    check_costable(job.topology)
    size = parse_size(args.bytes, "--bytes")
    reduce_axes = resolve_reduce(args, job)
    goal = resolve_goal(args)
    placements = resolve_placements(args, job)
    check_search([hierarchy_for(p, reduce_axes, args.hierarchy) for p in placements], args.max_len, goal=goal)
    try:
        with working(f"{len(placements)} placement(s)"):
            result = explore_placements(job.topology, job.axes, reduce_axes, size, placements=placements,
                                        max_len=args.max_len, backend=args.backend, hierarchy_kind=args.hierarchy,
                                        goal=goal)
    except UsageError:
        raise
    except ValueError as error:  # the analysis found no answer (no placement with a group to reduce)
        raise NoSolutionError(str(error)) from None
    if args.json:
        print_json([dict(row.to_json(), bytes=size, reduce=list(reduce_axes), backend=result.backend,
                         collective=goal.name, ignores=_explore_ignores(reduce_axes, args.axes))
                    for row in result.rows])
    else:
        _console().print(_explore_table(result, args.axes, goal))
    _partial(result, placements)
    return 0


def _partial(result, placements) -> None:
    """After the output of an interrupted run (rows for the placements done), exit 130 saying so."""
    if result.interrupted:
        raise KeyboardInterrupt(f"interrupted after {len(result.rows)} of {len(placements)} placement(s); "
                                f"the output holds those")


def _explore_table(result: ExploreResult, axes_text: str, goal=None) -> Table:
    from rich.table import Table

    from synth.units import format_bandwidth, format_bytes, format_time

    default = "default all-reduce" if goal is None else goal.role
    what = "" if goal is None or goal.is_all_reduce else f"  {goal.title}"
    title = (f"{result.topology}  {axes_text}  reduce {','.join(result.reduce_axes)}{what}  "
             f"{format_bytes(result.bytes)} per device: {len(result.rows)} placement(s)")
    caption = (f"spread between placements: best programs {result.best_spread:.3g}x, {default} "
               f"{result.baseline_spread:.3g}x (slowest / fastest); vs fastest: this placement's best time over the "
               f"fastest placement's; backend {result.backend}\nignores: {', '.join(_explore_ignores(result.reduce_axes, axes_text))} "
               f"(synth plan ranks placements by the whole training step)")
    table = Table(title=title, caption=caption)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("placement", no_wrap=True)
    table.add_column("levels", no_wrap=True)
    widest_step = max((len(str(step)) for row in result.rows for step in row.best_program.steps), default=0)
    table.add_column("best program", overflow="fold", min_width=widest_step + 1)
    for name in ("time", "busbw", "default", "speedup", "vs bound", "vs fastest"):
        table.add_column(name, justify="right", no_wrap=True)
    for index, row in enumerate(result.rows, 1):
        table.add_row(str(index), row.placement, row.hierarchy, _multiline(row.best_program),
                      format_time(row.best_time_s), format_bandwidth(row.best_busbw_GBps * 1e9),
                      format_time(row.baseline_time_s), f"{row.speedup:.3f}x", f"{row.bound_ratio:.2f}x",
                      f"{row.spread_vs_best:.3g}x")
    return table


def _explore_ignores(reduce_axes, axes_text: str) -> list[str]:
    """The traffic and work an exploration of one reduction leaves out."""
    others = [part.split("=")[0].strip() for part in str(axes_text).split(",")]
    others = [name for name in others if name and name not in reduce_axes]
    ignored = [f"the {name} axis's own collectives" for name in others]
    return ignored + ["compute and its overlap with this reduction", "memory", "pipeline point-to-point"]


# --- workload --------------------------------------------------------------------------------------


def run_workload(args) -> int:
    from synth.analysis.workload import evaluate_workload, parse_reduction
    from synth.commands.progress_bar import working
    from synth.model.network import check_costable

    job = resolve_job(args)
    check_costable(job.topology)
    if len(args.reduction) > MAX_REDUCTIONS:
        raise UsageError(f"{len(args.reduction)} --reduction options; a step is described by at most {MAX_REDUCTIONS}")
    reductions = []
    for text in args.reduction:
        if len(text) > 200:
            raise UsageError(f"--reduction {text[:40]!r}... ({len(text)} characters): write AXES:BYTES[xCOUNT], "
                             f"e.g. data:1GiB")
        try:
            reductions.append(parse_reduction(text, job.axis_names))
        except UsageError as error:  # the library names the value; the option is the command's
            raise UsageError(f"--{error}") from None
    placements = resolve_placements(args, job)
    check_search([hierarchy_for(p, reduction.axes, args.hierarchy) for p in placements for reduction in reductions],
                 args.max_len)
    try:
        with working(f"{len(placements)} placement(s)"):
            result = evaluate_workload(job.topology, job.axes, reductions, placements=placements,
                                       max_len=args.max_len, backend=args.backend, hierarchy_kind=args.hierarchy)
    except UsageError:
        raise
    except ValueError as error:  # the analysis found no answer (no placement with a group to reduce)
        raise NoSolutionError(str(error)) from None
    if args.json:
        print_json([dict(row.to_json(), backend=result.backend) for row in result.rows])
    else:
        _console().print(_workload_table(result, args.axes))
    _partial(result, placements)
    return 0


def _workload_table(result: WorkloadResult, axes_text: str) -> Table:
    from rich.table import Table

    from synth.analysis.workload import IGNORED
    from synth.units import format_time

    reductions = ", ".join(reduction.text for reduction in result.reductions)
    title = f"{result.topology}  {axes_text}  one step: {reductions}  ({len(result.rows)} placement(s))"
    caption = (f"total = sum of count x one call of the fastest program (each reduction's cell: count x time, then "
               f"the program); exposed = the reductions on the critical path, ranked first; overlapped = those marked "
               f"@overlap (behind compute); default = the total with the default all-reduce; spread between placements: "
               f"{result.spread:.3g}x, default all-reduce {result.baseline_spread:.3g}x; backend {result.backend}\n"
               f"ignores: {', '.join(IGNORED)} (synth plan models the whole training step)")
    table = Table(title=title, caption=caption)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("placement", no_wrap=True)
    for name in ("exposed", "overlapped", "total", "default", "speedup", "vs fastest"):
        table.add_column(name, justify="right", no_wrap=True)
    for reduction in result.reductions:
        table.add_column(reduction.text, overflow="fold")
    for index, row in enumerate(result.rows, 1):
        cells = [str(index), row.placement, format_time(row.exposed_s), format_time(row.overlapped_s),
                 format_time(row.total_s), format_time(row.baseline_total_s),
                 f"{row.speedup:.3f}x", f"{row.spread_vs_best:.3g}x"]
        cells += [f"{format_time(term.total_s)}\n{_multiline(term.program)}" for term in row.terms]
        table.add_row(*cells)
    return table


# --- fusion ----------------------------------------------------------------------------------------


def parse_tensor_sizes(items: list[tuple[str, str]]) -> list[int]:
    """(text, where) pairs of sizes; each a positive whole byte count, units allowed."""
    from synth.analysis.fusion import MAX_TENSORS
    from synth.units import parse_bytes

    if not items:
        raise UsageError("no tensor sizes given: list them, e.g. --tensors 4MiB,16MiB,8KiB")
    if len(items) > MAX_TENSORS:
        raise UsageError(f"{len(items)} tensors: the planner handles at most {MAX_TENSORS}; fuse some first")
    return [parse_bytes(text, where=where) for text, where in items]


def _tensor_items(args) -> list[tuple[str, str]]:
    if args.tensors is not None:
        parts = [part.strip() for part in args.tensors.split(",")]
        if not any(parts):
            return []
        for index, part in enumerate(parts):
            if not part:
                raise UsageError(f"--tensors: size {index + 1} is empty; give e.g. 4MiB,16MiB,8KiB")
        return [(part, f"--tensors size {index + 1}") for index, part in enumerate(parts)]
    lines = read_text(args.tensors_file, "tensors file").splitlines()
    items = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if text:
            items.append((text, f"{echo(args.tensors_file)} line {number}"))
    return items


def parse_compute_rate(text: str) -> float:
    from synth.units import parse_bandwidth

    if text.strip().lower() in INFINITE_RATES:
        return math.inf
    return parse_bandwidth(text, where="--compute-rate")


def run_fusion(args) -> int:
    from synth.analysis.explore import hierarchy_text
    from synth.analysis.fusion import plan_fusion
    from synth.model.context import cost_context
    from synth.model.cost import baseline_program
    from synth.model.network import check_costable
    from synth.units import format_bandwidth, format_bytes, format_time, parse_bytes

    job = resolve_job(args)
    check_costable(job.topology)
    tensors = parse_tensor_sizes(_tensor_items(args))
    rate = parse_compute_rate(args.compute_rate)
    bucket_cap = parse_bytes(args.bucket_cap, where="--bucket-cap")
    first_cap = parse_bytes(args.first_bucket_cap, where="--first-bucket-cap")
    reduce_axes = resolve_reduce(args, job)
    from synth.analysis.fusion import GRADIENT_GOALS

    goal = resolve_goal(args, supported=GRADIENT_GOALS)
    placement = one_placement(args, job, "fusion")
    hierarchy = hierarchy_for(placement, reduce_axes, args.hierarchy)
    if hierarchy.group_size == 1:
        raise NoSolutionError(f"reducing over {','.join(reduce_axes)} involves one device per group: nothing to fuse")
    check_search([hierarchy], args.max_len, goal)
    try:
        plan = plan_fusion(cost_context(hierarchy, job.topology, args.backend), tensors, compute_rate=rate,
                           max_len=args.max_len, exact=args.exact, bucket_cap=bucket_cap, first_bucket_cap=first_cap,
                           goal=goal)
    except KeyboardInterrupt:
        # Nothing partial is worth printing: the buckets come from one optimization over all the
        # tensors (a prefix's optimum is no plan for the step), and the comparison with DDP needs
        # the same bucket costs, found by the search the interrupt stopped.
        raise KeyboardInterrupt("interrupted before the plan was complete (its buckets come from one optimization "
                                "over all the tensors): nothing to show") from None
    if args.json:
        print_json(_fusion_json(plan, hierarchy, args))
        return 0
    console = _console()
    rate_text = "all at once" if math.isinf(rate) else format_bandwidth(rate)
    head = (f"{job.topology.name}  placement {hierarchy.placement.to_text()}  reduce {','.join(reduce_axes)} "
            f"({hierarchy_text(hierarchy)}): {len(tensors)} tensors, {format_bytes(sum(tensors))} per device, "
            f"gradients {rate_text} (backward ends at {format_time(plan.plan.compute_end_s)})")
    console.print(_schedule_table(f"{head}\nplanned buckets", plan.plan, programs=True))
    flat = plan.baseline.buckets[0].program if plan.baseline.buckets else baseline_program(hierarchy)
    baseline_title = (f"DDP default: buckets of {format_bytes(plan.bucket_cap)} (first {format_bytes(plan.first_bucket_cap)}) "
                      f"running {flat}")
    console.print(_schedule_table(baseline_title, plan.baseline, programs=False))
    console.print(
        f"planned: reduction finishes at {format_time(plan.plan.finish_s)} ({format_time(plan.plan.exposed_s)} after "
        f"backward, {_buckets(plan.plan)})\n"
        f"DDP default: finishes at {format_time(plan.baseline.finish_s)} ({format_time(plan.baseline.exposed_s)} after "
        f"backward, {_buckets(plan.baseline)})\n"
        f"gain: {plan.gain:.3f}x, {format_time(plan.saved_s)} saved per step; the planned buckets with the flat "
        f"{goal.collective} call finish at {format_time(plan.buckets_only.finish_s)}, DDP's buckets with the fastest programs at "
        f"{format_time(plan.programs_only.finish_s)}\n"
        f"bucket times: {'exact search per size' if plan.times == 'exact' else 'best of the grid candidates'}; "
        f"backend {args.backend}", highlight=False)
    return 0


def _buckets(schedule: Schedule) -> str:
    count = len(schedule.buckets)
    return f"{count} bucket{'' if count == 1 else 's'}"


def _schedule_table(title: str, schedule: Schedule, programs: bool) -> Table:
    from rich.table import Table

    from synth.units import format_bytes, format_time

    table = Table(title=title)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("tensors", justify="right", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    if programs:
        widest = max(len(str(step)) for bucket in schedule.buckets for step in bucket.program.steps)
        table.add_column("program", overflow="fold", min_width=widest + 1)
    for name in ("ready", "start", "time", "end"):
        table.add_column(name, justify="right", no_wrap=True)
    for index, bucket in enumerate(schedule.buckets, 1):
        span = str(bucket.first) if bucket.first == bucket.last else f"{bucket.first}-{bucket.last}"
        cells = [str(index), span, format_bytes(bucket.bytes)]
        if programs:
            cells.append(_multiline(bucket.program))
        cells += [format_time(bucket.ready_s), format_time(bucket.start_s), format_time(bucket.time_s),
                  format_time(bucket.end_s)]
        table.add_row(*cells)
    return table


def _fusion_json(plan: FusionPlan, hierarchy, args) -> dict:
    from synth.analysis.explore import hierarchy_text

    return {
        "matrix": [list(row) for row in hierarchy.placement.matrix], "placement": hierarchy.placement.to_text(),
        "reduce": list(hierarchy.reduce_axes), "hierarchy": hierarchy_text(hierarchy), "backend": args.backend,
        "collective": getattr(args, "collective", None) or "allreduce",
        "tensors": len(plan.tensors), "bytes": sum(plan.tensors),
        "compute_rate_Bps": None if math.isinf(plan.compute_rate) else plan.compute_rate,
        "compute_end_s": plan.plan.compute_end_s, "times": plan.times,
        "plan": plan.plan.to_json(),
        "baseline": dict(plan.baseline.to_json(), bucket_cap_bytes=plan.bucket_cap,
                         first_bucket_cap_bytes=plan.first_bucket_cap),
        "gain": plan.gain, "saved_s": plan.saved_s,
        "buckets_only_finish_s": plan.buckets_only.finish_s, "programs_only_finish_s": plan.programs_only.finish_s,
    }
