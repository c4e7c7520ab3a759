"""Planning at scale: how `synth plan` grows with the cluster, and whether its own estimate knows.

    python -m benchmarks.plan_speed [-o results] [--nodes 8,64,512,2048,16384] [--pinned COMMIT | --before DIR]
    python -m benchmarks.plan_speed --units [-o results]
    python -m benchmarks.plan_speed --moe [-o results] [--moe-before OLD_MOE_JSON --before-label TEXT]

For each size, the whole user command (start-up, imports, search, JSON output)

    synth plan --topology selene --resize node=N --model gpt3-175b --json --budget 3600

runs in a fresh process; recorded are its wall time, its peak resident memory (the process's
own `ru_maxrss`, read by the process itself at exit), the search's own time (`elapsed_s`)
and what the search estimated before it started (time and, where the planner gives one,
memory). Then issue 15's case, `dgx-h100-2x8x8 --resize rack=256` (16,384 GPUs on three
levels), and four plans of other models and systems, through the same command. The same
commands then run on a pinned earlier commit (`--pinned`, exported with `git archive`:
benchmarks/pinned.py), in the same run, and the report puts both curves side by side;
`--before DIR` takes another checkout instead.

Writes results/plan-speed/README.md (the growth table, command, machine, load, date) and
plan-speed.json beside it.

`--units` times each unit of the search's work inside the same plans (benchmarks/plan_speed_units.py:
lower-bound predictions, placement listing, first costings of each group shape, full
predictions with their gradient schedules), derives the per-unit CPU costs from the Selene
GPT-3 175B series (least squares on relative error, each unit against the counts the estimate
makes), and checks them on the five other plans. Writes results/plan-speed/units.md and
units.json: the constants for synth/plan/search.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.pinned import exported, label
from benchmarks.record import REPORT, header, study_dir

STUDY = "plan-speed"
MODEL = "gpt3-175b"
DEFAULT_NODES = (8, 64, 512, 2048, 16384)  # 8 GPUs per Selene node: 64 to 131,072 GPUs
# issue 15's accepted-then-killed case, then other models and systems the estimate must hold on
EXTRA = (("gpt3-175b", "dgx-h100-2x8x8", "rack=256"), ("llama2-70b", "selene", "node=512"),
         ("llama2-70b", "selene", "node=16384"), ("gpt3-6.7b", "dgx-h100-2x8x8", "rack=16"),
         ("megatron-18.4b", "dgx-h100-2x8x8", "rack=64"))
# Mixture-of-experts plans (issue 24's case, Mixtral at 131,072 GPUs, DeepSeek-V3), then the other
# built-in MoE models at 131,072 GPUs on the built-in systems (a global batch of 16,384 sequences
# where the model's 1,024 cannot fill them: data parallelism divides the batch) and on GB200 NVL72
# racks (1,024 racks of 72: 73,728 GPUs, the most the models' batch fills with whole racks):
# `--moe` runs these alone and writes moe.md and moe.json beside the dense report
MOE = (("mixtral-8x7b", "dgx-h100-2x8x8", "rack=256"), ("mixtral-8x7b", "selene", "node=16384"),
       ("deepseek-v3", "selene", "node=256"), ("deepseek-v3", "dgx-h100-2x8x8", "rack=2048"),
       ("mixtral-8x7b", "dgx-h100-2x8x8", "rack=2048"), ("qwen3-235b-a22b", "selene", "node=16384"),
       ("llama4-maverick", "dgx-h100-2x8x8", "rack=2048"),
       ("qwen3-30b-a3b", "dgx-h100-2x8x8", "rack=2048", ("--global-batch", "16384")),
       ("dbrx", "selene", "node=16384", ("--global-batch", "16384")),
       ("gpt-oss-120b", "gb200-nvl72", "rack=1024"), ("mixtral-8x22b", "gb200-nvl72", "rack=1024"))
# MoE plans the units are checked on too (held out; the quicker ones of MOE)
UNITS_MOE = (("mixtral-8x7b", "selene", "node=16384"), ("deepseek-v3", "selene", "node=256"),
             ("mixtral-8x22b", "gb200-nvl72", "rack=1024"))
TIMEOUT_S = 600
# The earlier commit every run times beside this checkout (benchmarks/pinned.py): the code before
# the planning-at-scale round, the baseline of the README's scale figures.
PINNED = "f734474"

# The measured process: the command through synth's own entry point, its output kept, then its
# own peak RSS (bytes on Linux: ru_maxrss is in KiB). Runs in the checkout under test.
WORKER = r"""
import contextlib, io, json, resource, sys, time
started = time.perf_counter()
from synth.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(sys.argv[1:])
wall = time.perf_counter() - started
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"code": code, "stdout": out.getvalue(), "wall_in_process_s": wall,
                  "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_bytes": usage.ru_maxrss * 1024}))
"""


def command_for(topology: str, resize: str, model: str = MODEL, extra: tuple[str, ...] = ()) -> list[str]:
    return ["plan", "--topology", topology, "--resize", resize, "--model", model, *extra, "--json", "--budget", "3600"]


def measure(topology: str, resize: str, source: Path, model: str = MODEL, extra: tuple[str, ...] = ()) -> dict:
    """One command in a fresh process run from `source` (a checkout), timed from outside."""
    argv = command_for(topology, resize, model, extra)
    load_before = os.getloadavg()
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", WORKER, *argv], cwd=source, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"command": "synth " + " ".join(argv), "error": f"over {TIMEOUT_S} s"}
    wall = time.perf_counter() - started
    row = {"command": "synth " + " ".join(argv), "wall_s": wall, "load_before": load_before,
           "load_after": os.getloadavg()}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        row["error"] = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return row
    worker = json.loads(lines[-1])
    row.update(code=worker["code"], peak_rss_bytes=worker["peak_rss_bytes"], cpu_s=worker.get("cpu_s"))
    if worker["code"] != 0:
        row["error"] = done.stderr.strip()[-300:]
        return row
    result = json.loads(worker["stdout"])
    search = result["search"]
    row.update(devices=result["devices"], search_s=result["elapsed_s"], search_cpu_s=result.get("cpu_s"),
               evaluated=result["evaluated"],
               degree_choices=search["degrees"], placements=search["placements"], candidates=search["candidates"],
               estimated_s=search["estimated_s"], estimated_bytes=search.get("estimated_bytes"),
               winner=_degrees(result['ranked'][0]['degrees']) + " " + result['ranked'][0]['placement'],
               step_s=result["ranked"][0]["step_s"])
    return row


def _degrees(degrees: dict) -> str:
    return ",".join(f"{role}={degrees[role]}" for role in ("dp", "tp", "pp", "cp", "ep")
                    if role != "ep" or degrees.get(role, 1) > 1)


def series(nodes: tuple[int, ...], source: Path) -> list[dict]:
    rows = []
    for count in nodes:
        rows.append(measure("selene", f"node={count}", source))
        print(json.dumps(rows[-1]), file=sys.stderr)
    for model, topology, resize in EXTRA:
        rows.append(measure(topology, resize, source, model))
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def _size(value) -> str:
    return "" if value is None else f"{value / 2**20:,.0f} MiB"


def _ratio(estimate, real) -> str:
    return "" if not estimate or not real else f"{estimate / real:.3g}"


def _seconds(value) -> str:
    return "" if value is None else f"{value:.1f} s"


def table(rows: list[dict]) -> list[str]:
    lines = ["| command | GPUs | wall | CPU | search wall | search CPU | peak RSS | estimated search | "
             "estimated memory | est./search CPU | est./peak RSS | load before |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        load = "/".join(f"{x:.1f}" for x in row.get("load_before", ()))
        if "search_s" not in row:
            lines.append(f"| `{row['command']}` | | {_seconds(row.get('wall_s'))} | {_seconds(row.get('cpu_s'))} | | | "
                         f"{_size(row.get('peak_rss_bytes'))} | | | | | {load} (failed: {row.get('error', '')}) |")
            continue
        lines.append(
            f"| `{row['command']}` | {row['devices']:,} | {_seconds(row['wall_s'])} | {_seconds(row.get('cpu_s'))} | "
            f"{_seconds(row['search_s'])} | {_seconds(row.get('search_cpu_s'))} | {_size(row['peak_rss_bytes'])} | "
            f"{row['estimated_s']:.2f} s | {_size(row.get('estimated_bytes'))} | "
            f"{_ratio(row['estimated_s'], row.get('search_cpu_s') or row['search_s'])}"
            f"{'' if row.get('search_cpu_s') else ' (wall)'} | "
            f"{_ratio(row.get('estimated_bytes'), row['peak_rss_bytes'])} | {load} |")
    return lines


def summary(document: dict) -> list[str]:
    """The growth curve in one paragraph: the largest system, before and after, and how close the estimate is."""
    rows = [row for row in document["rows"] if "search_s" in row]
    if not rows:
        return []
    largest = max(rows, key=lambda row: (row["devices"], row["cpu_s"]))  # of several that large, the slowest
    time_ratios = [row["estimated_s"] / row["search_cpu_s"] for row in rows if row.get("search_cpu_s")]
    memory_ratios = [row["estimated_bytes"] / row["peak_rss_bytes"] for row in rows if row.get("estimated_bytes")]
    alike = sum(row["devices"] == largest["devices"] for row in rows)
    text = (f"Largest{' (the slowest of its ' + str(alike) + ' rows)' if alike > 1 else ''}: {largest['devices']:,} GPUs in {largest['wall_s']:.1f} s wall ({largest['cpu_s']:.1f} s CPU) "
            f"and {_size(largest['peak_rss_bytes'])} peak.")
    before = {row["command"]: row for row in document.get("before", ()) if "search_s" in row}
    if largest["command"] in before:
        old = before[largest["command"]]
        text += (f" Before: {old['wall_s']:.1f} s wall ({old['cpu_s']:.1f} s CPU) and {_size(old['peak_rss_bytes'])}, "
                 f"while its estimate said {old['estimated_s']:.2f} s.")
    if time_ratios and memory_ratios:
        text += (f" The estimate over the real figures, every row: CPU time {min(time_ratios):.2f}x to "
                 f"{max(time_ratios):.2f}x, memory {min(memory_ratios):.2f}x to {max(memory_ratios):.2f}x.")
    return [text]


def render(document: dict, title: str = "Planning at scale: time and memory of `synth plan` from 64 to 131,072 GPUs"
           ) -> str:
    lines = [f"# {title}", "",
             header(document["command"]), "",
             f"Each row is the user's whole command in a fresh process (start-up, imports, search, JSON output) on "
             f"this 2-core machine, shared with other work while it ran (the load average before each run is in "
             f"the last column). wall: the process, timed from outside; search: the planner's own time; peak RSS: "
             f"the process's `ru_maxrss` at exit; CPU: user + system time. The estimates are what the planner predicted "
             f"before starting (the figures it refuses a search on): the search's CPU time (wall time grows with the "
             f"machine's load, CPU time much less) and the process's peak memory; est./search CPU and est./peak RSS "
             f"compare them with what happened.", ""]
    lines += summary(document) + [""]
    lines += ["The estimate adds up units of work, each unit's CPU cost measured inside real plans: "
              "[units.md](units.md) (`python -m benchmarks.plan_speed --units`). Under load the wall "
              "time is several times the CPU time; the CPU time is what the estimate predicts and the figure "
              "comparable across loads.", ""]
    if document.get("before"):
        lines += [f"## Before ({document['before_label']})", ""] + table(document["before"]) + [""]
        lines += ["## After", ""]
    lines += table(document["rows"])
    return "\n".join(lines) + "\n"


UNIT_WORKER = "benchmarks.plan_speed_units"


def measure_units(topology: str, resize: str, model: str = MODEL) -> dict:
    """One plan in a fresh process with its units timed (benchmarks/plan_speed_units.py)."""
    argv = command_for(topology, resize, model)
    load = os.getloadavg()
    done = subprocess.run([sys.executable, "-m", UNIT_WORKER, *argv], cwd=Path(__file__).resolve().parent.parent,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    row = json.loads(lines[-1]) if lines else {"code": done.returncode, "error": done.stderr[-300:]}
    row.update(command="synth " + " ".join(argv), load_before=load, calibration=topology == "selene" and model == MODEL)
    return row


def _least_squares(rows: list[dict], unit: str, counts: tuple[str, ...], figure: str = "times") -> tuple[float, ...]:
    """Per-count costs of one unit: non-negative least squares on relative error over the rows
    (rows where the unit measured nothing left out)."""
    import numpy as np
    from scipy.optimize import nnls

    rows = [row for row in rows if row[figure][unit] > 0]
    if not rows:
        return tuple(0.0 for _ in counts)
    a = np.array([[row["search"][c] / row[figure][unit] for c in counts] for row in rows])
    return tuple(float(x) for x in nnls(a, np.ones(len(rows)))[0])


UNITS = (("bounds", ("bounds",)), ("placements", ("placements",)),
         ("group_shapes", ("searched_shapes", "searched_devices")),
         ("gradient_schedules", ("gradient_schedules", "schedule_devices")))


def _unit_cost(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} us"


def units_report(rows: list[dict], command: str) -> tuple[dict, str]:
    calibration = [row for row in rows if row.get("code") == 0 and row["calibration"]]
    constants = {unit: dict(zip(counts, _least_squares(calibration, unit, counts))) for unit, counts in UNITS}
    lines = ["# The plan search's CPU time by unit of work", "", header(command), "",
             "Each plan runs in a fresh process with the search's functions wrapped by process-time timers "
             "(benchmarks/plan_speed_units.py). Units: the first bounds (a lower-bound prediction per candidate "
             "bounded alone, one floor per (degree choice, settings) group and representative with data "
             "parallelism); listing the placements; the first costing of each group shape (a program search, a "
             "two-stage dispatch's forms or a call's estimate on its equivalent system); the full predictions and "
             "tighter bounds with their gradient schedules and gathers, per (degree choice, data-parallel span) "
             "pair of the space and, per distinct span, per device of its equivalent system. The per-unit costs "
             "come from the Selene GPT-3 175B rows (calibration) by non-negative least squares on relative error; "
             "the other rows, dense and MoE, are held out. Which groups and candidates the step-time bound stops is "
             "known only during the search, so the first bounds' and the schedules' units are averages over the "
             "space, the stopped ones included.", "", "Per-unit CPU costs (for synth/plan/search.py):", ""]
    for unit, per in constants.items():
        lines.append(f"- {unit}: " + ", ".join(f"{_unit_cost(seconds)} per {count}" for count, seconds in per.items()))
    lines += ["", "| command | GPUs-row | role | load | unit: measured / predicted by the units (CPU s) | "
                  "search CPU | units' total | ratio |", "|---|---|---|---|---|---:|---:|---:|"]
    for row in rows:
        if row.get("code") != 0:
            lines.append(f"| `{row['command']}` | | | | failed: {row.get('error', '')} | | | |")
            continue
        cells, total = [], 0.0
        for unit, counts in UNITS:
            predicted = sum(row["search"][c] * constants[unit][c] for c in counts)
            total += predicted
            cells.append(f"{unit} {row['times'][unit]:.2f}/{predicted:.2f}")
        load = "/".join(f"{x:.1f}" for x in row["load_before"])
        lines.append(f"| `{row['command']}` | {row['search']['candidates']:,} candidates | "
                     f"{'calibration' if row['calibration'] else 'held out'} | {load} | {'; '.join(cells)} | "
                     f"{row['cpu_s']:.2f} | {total:.2f} | {total / row['cpu_s']:.2f} |")
    return {"seconds": constants}, "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="results", help="results directory (default results)")
    parser.add_argument("--nodes", default=",".join(map(str, DEFAULT_NODES)),
                        help="Selene node counts (8 GPUs each), comma-separated")
    parser.add_argument("--pinned", default=PINNED, metavar="COMMIT",
                        help=f"the earlier commit run alike in the same run, exported with git archive ({PINNED}); "
                             f"'none' runs this checkout alone")
    parser.add_argument("--before", metavar="DIR", help="instead of --pinned: a checkout of the code before the change")
    parser.add_argument("--before-label", default="the code before this change", help="what --before is")
    parser.add_argument("--units", action="store_true", help="time the search's units of work instead")
    parser.add_argument("--moe", action="store_true", help="the mixture-of-experts plans alone (moe.md, moe.json)")
    parser.add_argument("--moe-before", metavar="JSON", help="with --moe: an earlier run's moe.json, shown as Before")
    args = parser.parse_args(argv)
    if args.moe:
        here = Path(__file__).resolve().parent.parent
        rows = []
        for model, topology, resize, *extra in MOE:
            rows.append(measure(topology, resize, here, model, *extra))
            print(json.dumps(rows[-1]), file=sys.stderr)
        document = {"command": "python -m benchmarks.plan_speed --moe", "rows": rows}
        if args.moe_before:
            earlier = json.loads(Path(args.moe_before).read_text())
            document.update(before=earlier["rows"], before_label=earlier.get("label", args.before_label))
        folder = study_dir(STUDY, args.output)
        (folder / "moe.json").write_text(json.dumps(document, indent=1) + "\n")
        (folder / "moe.md").write_text(render(document, "Planning mixture-of-experts models: time and memory of "
                                                        "`synth plan`"))
        print(f"wrote {folder / 'moe.md'}", file=sys.stderr)
        return 0
    if args.units:
        nodes = tuple(int(part) for part in args.nodes.split(","))
        rows = [measure_units("selene", f"node={count}") for count in nodes]
        rows += [measure_units(topology, resize, model) for model, topology, resize in EXTRA + UNITS_MOE]
        constants, text = units_report(rows, "python -m benchmarks.plan_speed --units")
        folder = study_dir(STUDY, args.output)
        (folder / "units.json").write_text(json.dumps({"constants": constants, "rows": rows}, indent=1) + "\n")
        (folder / "units.md").write_text(text)
        print(text)
        return 0
    nodes = tuple(int(part) for part in args.nodes.split(","))
    command = ("python -m benchmarks.plan_speed" + (f" --nodes {args.nodes}" if args.nodes != parser.get_default("nodes") else "")
               + (" --before OLD" if args.before else f" --pinned {args.pinned}" if args.pinned != PINNED else ""))
    here = Path(__file__).resolve().parent.parent
    document = {"command": command, "model": MODEL, "rows": series(nodes, here)}
    if args.before:
        document["before"] = series(nodes, Path(args.before))
        document["before_label"] = args.before_label
    elif args.pinned.lower() != "none":
        with exported(args.pinned) as source:  # the same commands on the pinned commit, in this run
            document["before"] = series(nodes, source)
        document["before_label"] = label(args.pinned)
    folder = study_dir(STUDY, args.output)
    (folder / f"{STUDY}.json").write_text(json.dumps(document, indent=1) + "\n")
    (folder / REPORT).write_text(render(document))
    print(f"wrote {folder / REPORT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
