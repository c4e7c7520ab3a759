"""`synth codesign`: the planner over a grid of systems, models and planner choices (docs/codesign.md)."""

from __future__ import annotations

import json
import sys
from collections import Counter
import time
from pathlib import Path

from synth.commands.common import positive_int, positive_seconds, search_memory_bytes
from synth.errors import UsageError
from synth.names import echo

DEFAULT_BUDGET_S = 3600.0
TASK_S = 1.0  # estimated CPU seconds of one task when --chunk is not given (progress stays fine-grained)
MAX_CHUNK = 64


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "codesign", help="plan every point of a grid of systems x models x planner choices; cost, time, Pareto front",
        description="Every point of the grid (a TOML file: base systems, devices, level sizes and figures, NICs, "
                    "oversubscription, models, global batch, sequence length, planner choices) planned as `synth "
                    "plan` would: the best plan's step time, memory, MFU, tokens/s and, with prices per device-hour "
                    "and a token budget, cost per token and time to train. Rows are appended to a CSV results file "
                    "as points finish; a sweep run again on the same file skips the finished points. The sweep is "
                    "estimated before it starts and refused over its budget. docs/codesign.md has the grid's form.")
    parser.add_argument("grid", metavar="GRID.toml", help="the grid file")
    parser.add_argument("--out", "-o", metavar="FILE.csv",
                        help="results file, appended to and resumed from (default: GRID-results.csv here)")
    parser.add_argument("--executor", choices=("serial", "local", "ray", "dask"), default="local",
                        help="where points run: this process, a local process pool (default), Ray or Dask "
                             "(extras codesign-ray, codesign-dask)")
    parser.add_argument("--address", metavar="ADDR",
                        help="a running Ray or Dask cluster to attach to (default: start a local one)")
    parser.add_argument("--workers", "-j", type=positive_int, metavar="N",
                        help="workers (default: the CPUs here; with --address, the tasks kept in flight per 4)")
    parser.add_argument("--chunk", type=positive_int, metavar="N",
                        help=f"consecutive points per task (default: about {TASK_S:g} estimated CPU second per task, "
                             f"at most {MAX_CHUNK} points)")
    parser.add_argument("--budget", metavar="S",
                        help=f"refuse sweeps estimated to take longer (wall seconds on the workers, default {DEFAULT_BUDGET_S:g})")
    parser.add_argument("--search-memory", metavar="SIZE",
                        help="refuse sweeps estimated to need more memory, all workers together, e.g. 16GiB "
                             "(default: 80%% of what this machine has available)")
    parser.add_argument("--point-budget", metavar="S", default="300",
                        help="a point whose plan is estimated over this many CPU seconds fails (recorded; default 300)")
    parser.add_argument("--estimate", action="store_true", help="print the sweep's estimate and exit")
    parser.add_argument("--parquet", metavar="FILE", help="also write the results as Parquet (extra codesign-parquet)")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="draw the Pareto front of cost per token against time to train and the step time's "
                             "sensitivity to each swept figure")
    parser.add_argument("--top", "-k", type=positive_int, default=10, metavar="K", help="rows to show (default 10)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(handler=run_codesign)


def _memory_budget(text: str | None) -> float:
    from synth.plan.search import MEMORY_SHARE, available_memory

    if text is None:
        available = available_memory()
        return float(1 << 40) if available is None else MEMORY_SHARE * available
    return float(search_memory_bytes(text, "16GiB"))


def _flagged(error, executor: str, address: str | None):
    from synth.codesign.errors import MissingExtraError, UnreachableClusterError

    if isinstance(error, MissingExtraError):
        return UsageError(f"--executor {executor}: {error}, or choose --executor local")
    if isinstance(error, UnreachableClusterError):
        fix = f"check --address {echo(address)} (start the cluster first) or drop it for a local one" if address \
            else "choose --executor local"
        return UsageError(f"--executor {executor}: {error}; {fix}")
    return error


def run_codesign(args) -> int:
    from synth.codesign.estimate import estimate_sweep
    from synth.codesign.executors import default_workers
    from synth.codesign.grid import load_grid
    from synth.codesign.results import columns_for, finished_keys
    from synth.codesign.sweep import options_for, results_file, run_sweep, unfinished
    from synth.units import format_bytes

    if args.address is not None and args.executor not in ("ray", "dask"):
        raise UsageError(f"--address {echo(args.address)} is for --executor ray or dask; drop it or choose one")
    grid = load_grid(args.grid)
    workers = args.workers or default_workers()
    budget = positive_seconds(args.budget, "--budget") if args.budget is not None else DEFAULT_BUDGET_S
    memory = _memory_budget(args.search_memory)
    point_budget = positive_seconds(args.point_budget, "--point-budget")
    options = options_for(grid, point_budget, memory / workers)
    out = Path(args.out) if args.out else Path(f"{Path(args.grid).stem}-results.csv")
    done = finished_keys(out, columns_for(tuple(axis.name for axis in grid.axes)))
    finished = len(done)
    sweep = estimate_sweep(unfinished(grid, done), options)
    wall = sweep.wall_s(workers)
    summary = {"grid": args.grid, "points": grid.size, "finished_before": finished, "to_plan": sweep.points,
               "workers": workers, "executor": args.executor, "estimate": sweep.to_json(),
               "estimated_wall_s": wall}
    line = (f"{grid.size:,} points, {finished:,} already in {out}; {sweep.points:,} to plan on {sweep.systems:,} "
            f"systems ({sweep.failing:,} refused by the planner, recorded as errors): estimated {sweep.cpu_s:,.0f} "
            f"CPU s ({sweep.shared_s:,.0f} s of shared collectives, {sweep.unshared_s:,.0f} s unshared), "
            f"{wall:,.0f} s on {workers} worker(s), {format_bytes(int(sweep.worker_bytes))} per worker")
    if args.estimate:  # nothing written
        print(json.dumps(summary, indent=1) if args.json else line)
        return 0
    results = results_file(grid, out)
    try:
        print(line, file=sys.stderr)
        if wall > budget:
            raise UsageError(f"the sweep is estimated at {wall:,.0f} s on {workers} worker(s), over the --budget of "
                             f"{budget:g} s: sweep fewer values, fix degrees ([axes.plan] tp = [...]), add workers "
                             f"(--workers, or --executor ray/dask --address), or raise --budget")
        if sweep.worker_bytes * workers > memory:
            raise UsageError(f"the sweep is estimated to need {format_bytes(int(sweep.worker_bytes * workers))} on "
                             f"{workers} worker(s), over the {format_bytes(int(memory))} memory budget: fewer "
                             f"workers, fewer systems per sweep, or raise --search-memory")
        started = time.perf_counter()
        progress = _progress(sweep.points, started)
        try:
            chunk = args.chunk or max(1, min(MAX_CHUNK, int(TASK_S * sweep.points / max(sweep.cpu_s, 1e-9))))
            counts = run_sweep(grid, results, options, args.executor, workers, args.address, chunk, progress)
        except Exception as error:
            raise _flagged(error, args.executor, args.address) from None
        finally:
            progress.stop()
    finally:
        results.close()
    summary.update({"planned": counts.planned, "failed": counts.failed, "wall_s": time.perf_counter() - started,
                    "cpu_s": counts.cpu_s, "memo_hits": counts.memo_hits, "memo_misses": counts.memo_misses,
                    "memo_hit_rate": counts.hit_rate, "results": str(out)})
    _outputs(args, grid, out, summary)
    return 0


def _outputs(args, grid, out, summary) -> None:
    from synth.codesign.report import fronts_by_model, plot
    from synth.codesign.results import columns_for, read_rows, write_parquet

    rows = read_rows(out)
    axis_names = tuple(axis.name for axis in grid.axes)
    if args.parquet:
        from synth.codesign.errors import MissingExtraError

        try:
            write_parquet(rows, columns_for(axis_names), args.parquet)
        except MissingExtraError as error:
            raise UsageError(f"--parquet: {error}") from None
    if args.plot:
        plot(rows, axis_names, args.plot, f"{Path(args.grid).name}: {len(rows):,} points")
    front = fronts_by_model(rows)
    summary["pareto"] = [{name: row[name] for name in (*axis_names, "devices", "degrees", "step_s", "mfu",
                                                        "cost_per_token", "time_to_train_s", "cost_to_train")}
                         for row in front]
    if args.json:
        print(json.dumps(summary, indent=1))
        return
    print(f"{summary['planned']:,} points planned in {summary['wall_s']:.1f} s ({summary['failed']:,} failed, "
          f"recorded); memo hit rate {100 * summary['memo_hit_rate']:.1f}%; results in {out}")
    errors = Counter(row["error"] for row in rows if row["status"] != "ok")
    for message, count in errors.most_common(3):
        print(f"  failed x{count}: {message}")
    if len(errors) > 3:
        print(f"  ... {len(errors) - 3} other errors (the error column of {out})")
    if any(row["status"] == "ok" for row in rows):
        _table(rows, front, axis_names, args.top)


def _table(rows, front, axis_names, top) -> None:
    from rich.table import Table

    from synth.commands.terminal import console
    from synth.units import format_bytes, format_time

    swept = [name for name in axis_names if len({row[name] for row in rows}) > 1]
    shown = front[:top] if front else sorted((row for row in rows if row["status"] == "ok"),
                                             key=lambda row: row["step_s"])[:top]
    title = ("Each model's Pareto front: no other point of the model is both cheaper per token and faster to train"
             if front
             else "Fastest points (no prices or token budget: no cost)")
    table = Table(title=title)
    for name in (*swept, "devices", "step", "MFU", "memory", "degrees", "cost/Mtok", "time to train"):
        table.add_column(name, no_wrap=True)
    for row in shown:
        cost = "" if row["cost_per_token"] is None else f"{row['cost_per_token'] * 1e6:.3g}"
        days = "" if row["time_to_train_s"] is None else f"{row['time_to_train_s'] / 86400:,.1f} d"
        table.add_row(*(str(row[name]) for name in swept), str(row["devices"]), format_time(row["step_s"]),
                      f"{100 * row['mfu']:.1f}%", format_bytes(int(row["memory_bytes"])), row["degrees"], cost, days)
    console(piped_width=200).print(table)


class _Progress:
    """Points done, failed, rate and time left: a bar on a terminal, a line every 10 s otherwise."""

    def __init__(self, total: int, started: float):
        self.total, self.started, self.last = total, started, started
        self.bar = None
        if sys.stderr.isatty() and total:
            from rich.progress import Progress

            from synth.commands.terminal import console

            self.bar = Progress(transient=True, console=console(stderr=True, piped_width=200))
            self.task = self.bar.add_task(f"{total:,} points", total=total)
            self.bar.start()

    def __call__(self, counts) -> None:
        now = time.perf_counter()
        if self.bar is not None:
            self.bar.update(self.task, completed=counts.planned)
        elif now - self.last >= 10 or counts.planned == self.total:
            rate = counts.planned / max(now - self.started, 1e-9)
            left = (self.total - counts.planned) / rate if rate else 0
            print(f"{counts.planned:,}/{self.total:,} points ({counts.failed:,} failed), {rate:.1f}/s, "
                  f"about {left:,.0f} s left", file=sys.stderr, flush=True)
            self.last = now

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _progress(total: int, started: float) -> _Progress:
    return _Progress(total, started)
