"""`synth rank`: programs ordered by predicted time on a topology, per placement and size."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from synth.commands.common import (add_job_options, add_json_option, add_model_options, hierarchy_for, print_json, resolve_job,
                                   resolve_placements, resolve_reduce)
from synth.errors import NoSolutionError, UsageError
from synth.model.bound import lower_bound
from synth.model.cost import Simulator
from synth.model.network import check_costable
from synth.search import enumerate_programs
from synth.analysis.rank import ESTIMATES, ProgramWalker, pareto_front, rank_programs, rerank_pipelined
from synth.units import format_bandwidth, format_bytes, format_time, parse_bytes

MAX_SIZES = 64
PIPED_WIDTH = 160


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "rank", help="rank programs by predicted time on a topology",
        description="Rank every valid program (or the --top K best) by the simulator's predicted time "
                    "for every reduction group at once; the default all-reduce is always listed and marked.")
    add_job_options(parser)
    parser.add_argument("--bytes", "-B", metavar="S", help="buffer size per device, e.g. 256MiB")
    parser.add_argument("-b", "--minbytes", metavar="MIN", help="smallest size of a sweep, e.g. 1KiB or 8M (nccl-tests style)")
    parser.add_argument("-e", "--maxbytes", metavar="MAX", help="largest size of a sweep, e.g. 1GiB or 1G")
    parser.add_argument("-f", "--stepfactor", metavar="F", type=int, default=None,
                        help="multiply the size by F between MIN and MAX (integer >= 2, default 2)")
    parser.add_argument("--top", "-k", metavar="K", type=int, help="only the K best programs, found by a cost-guided search")
    add_model_options(parser)
    parser.add_argument("--estimate", choices=ESTIMATES, default="lockstep",
                        help="lockstep (default): a program is the sum of its steps, each step all groups at once; "
                             "pipelined: groups do not wait for each other between steps (closer to measurements where "
                             "groups share links; times every program, then keeps --top K)")
    parser.add_argument("--pareto", action="store_true",
                        help="keep the programs no other beats on time, extra memory, communicators and calls")
    add_json_option(parser)
    parser.set_defaults(handler=run_rank)


def parse_size(text: str, option: str) -> int:
    """A byte size as synth.units.parse_bytes reads it (nccl-tests' `8M`/`1G` binary included)."""
    return parse_bytes(text, where=option)


def resolve_sizes(args) -> list[int]:
    """--bytes S, or the sweep MIN, MIN*F, ... up to MAX (as nccl-tests' -b/-e/-f)."""
    sweep = args.minbytes is not None or args.maxbytes is not None or args.stepfactor is not None
    if args.bytes is not None:
        if sweep:
            raise UsageError("give either --bytes S or a sweep -b MIN -e MAX [-f F], not both")
        return [parse_size(args.bytes, "--bytes")]
    if args.minbytes is None or args.maxbytes is None:
        raise UsageError("give the size: --bytes 256MiB, or a sweep -b 1KiB -e 1GiB [-f 2]")
    low, high = parse_size(args.minbytes, "-b"), parse_size(args.maxbytes, "-e")
    factor = 2 if args.stepfactor is None else args.stepfactor
    if factor < 2:
        raise UsageError(f"-f {factor}: the step factor must be an integer of at least 2")
    if low > high:
        raise UsageError(f"-b {args.minbytes} is larger than -e {args.maxbytes}: give MIN <= MAX")
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= factor
    if len(sizes) > MAX_SIZES:
        raise UsageError(f"the sweep has {len(sizes)} sizes; use a larger -f or a narrower -b/-e (at most {MAX_SIZES})")
    return sizes


def run_rank(args) -> int:
    job = resolve_job(args)
    check_costable(job.topology)
    sizes = resolve_sizes(args)
    if args.top is not None and args.top < 1:
        raise UsageError(f"--top {args.top}: give a positive number of programs")
    reduce_axes = resolve_reduce(args, job)
    placements = resolve_placements(args, job)
    sections = []
    for placement in placements:
        hierarchy = hierarchy_for(placement, reduce_axes, args.hierarchy)
        if hierarchy.group_size == 1:
            continue
        simulator, walker = Simulator(hierarchy, job.topology, args.backend), ProgramWalker(hierarchy)
        # Without --top (or with the pipelined estimate) every program is ranked: enumerate them once for all sizes.
        pipelined = args.estimate == "pipelined"
        programs = (None if args.top is not None and not pipelined
                    else list(enumerate_programs(hierarchy, max_len=args.max_len)))
        for size in sizes:
            rows = rank_programs(hierarchy, job.topology, size, max_len=args.max_len,
                                 top=None if pipelined else args.top,
                                 simulator=simulator, programs=programs, walker=walker)
            if pipelined:
                rows = rerank_pipelined(rows, hierarchy, simulator, size)
                if args.top is not None:
                    rows = rows[:args.top] + [row for row in rows[args.top:] if row.baseline]
            if args.pareto:
                rows = pareto_front(rows)
            sections.append((size, hierarchy, lower_bound(hierarchy, job.topology, size), rows))
    if not sections:
        raise NoSolutionError(f"reducing over {','.join(reduce_axes)} involves one device per group on every "
                              f"placement: there is nothing to rank")
    sections.sort(key=lambda section: section[0])  # per size, placements in their listed order
    if args.json:
        print_json([dict(row.to_json(), lower_bound_s=bound.time_s, backend=args.backend, estimate=args.estimate)
                    for _, _, bound, rows in sections for row in rows])
        return 0
    console = Console()
    if not console.is_terminal:  # piped or captured: wide enough that no figure is cut
        console = Console(width=PIPED_WIDTH)
    from synth.calibrate.confidence import model_error_for_group  # how sure the ranking is (issue 9)

    for size, hierarchy, bound, rows in sections:
        sure = model_error_for_group(job.topology, hierarchy.groups[0], "AllReduce", size).describe()
        console.print(_table(job.topology.name, size, hierarchy, bound, rows, args, sure))
    return 0


def _table(topology_name: str, size: int, hierarchy, bound, rows, args, sure: str = "") -> Table:
    levels = ",".join(f"{level.name}={level.size}" for level in hierarchy.levels)
    title = (f"{topology_name}  placement {hierarchy.placement.to_text()}  reduce {','.join(hierarchy.reduce_axes)} "
             f"({levels})  {format_bytes(size)} per device")
    caption = (f"lower bound {format_time(bound.time_s)} ({bound.bottleneck}); * default all-reduce; "
               f"backend {args.backend}; {args.estimate} estimate" + (f"\n{sure}" if sure else ""))
    table = Table(title=title, caption=caption)
    table.add_column("#", justify="right", no_wrap=True)
    widest_step = max((len(step) for row in rows for step in row.program.split("; ")), default=0)
    table.add_column("program", overflow="fold", min_width=widest_step + 1)
    for name in ("time", "algbw", "busbw", "speedup", "vs bound"):
        table.add_column(name, justify="right", no_wrap=True)
    if args.pareto:
        for name in ("extra mem", "comms", "calls"):
            table.add_column(name, justify="right", no_wrap=True)
    for index, row in enumerate(rows, 1):
        cells = [f"{index}{' *' if row.baseline else ''}", row.program.replace("; ", ";\n"), format_time(row.time_s),
                 format_bandwidth(row.algbw_GBps * 1e9), format_bandwidth(row.busbw_GBps * 1e9),
                 f"{row.speedup:.3f}x", f"{row.bound_ratio:.2f}x"]
        if args.pareto:
            cells += [format_bytes(row.extra_memory_bytes) if row.extra_memory_bytes else "0",
                      str(row.communicators), str(row.calls_per_device)]
        table.add_row(*cells, style="bold" if row.baseline else None)
    return table
