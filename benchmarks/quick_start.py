"""The README's quick start plan, timed against a pinned earlier commit in the same run.

    python -m benchmarks.quick_start [-o results] [--pinned COMMIT] [--runs N]

Runs `synth plan --topology selene --model gpt3-2.7b --top 5` (the README's quick start) as a
user does, a fresh process each time, alternately on this checkout and on the pinned commit
(benchmarks/pinned.py), N times each, and records each run's wall and CPU time (the child's
rusage) and the load before it. The README's figure is this checkout's median CPU time, with
the machine and load beside it; the pinned commit's, measured in the same run, is what a
regression is judged against. Writes results/quick-start/README.md and quick-start.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.index import write_index
from benchmarks.pinned import environment, exported, label
from benchmarks.record import REPORT, header, study_dir
from synth.output_files import write_text

COMMAND = "python -m benchmarks.quick_start"
STUDY = "quick-start"
ARGUMENTS = ["plan", "--topology", "selene", "--model", "gpt3-2.7b", "--top", "5"]
# The commit before the planner priced every reduce-scatter, all-gather and all-to-all by
# synthesis (099064c): the quick start's "about a second" was measured on that code.
PINNED = "0241a4d"


def run_once(source) -> dict:
    """One quick start plan in a fresh process, from an empty directory."""
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as directory, tempfile.TemporaryFile("w+") as out:
        started = time.perf_counter()
        process = subprocess.Popen([sys.executable, "-m", "synth", *ARGUMENTS], stdout=out, stderr=subprocess.PIPE,
                                   env=environment(source), cwd=directory)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"synth {' '.join(ARGUMENTS)} failed on {source or 'this checkout'}: "
                             f"{process.stderr.read().decode()[-500:]}")
        out.seek(0)
        lines = out.read().splitlines()
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "load_before": load,
            "first_row": next((line for line in lines if line.strip().startswith("1 ")), "")}


def summary(runs: list[dict]) -> dict:
    return {"runs": len(runs), "median_cpu_s": statistics.median(r["cpu_s"] for r in runs),
            "median_wall_s": statistics.median(r["wall_s"] for r in runs),
            "min_cpu_s": min(r["cpu_s"] for r in runs), "loads": [round(r["load_before"], 1) for r in runs]}


def render(pinned: str, this: dict, before: dict) -> str:
    ratio = before["median_cpu_s"] / this["median_cpu_s"]
    lines = ["# Quick start plan speed", "", header(COMMAND), "",
             f"`synth {' '.join(ARGUMENTS)}`, the README's quick start, each run a fresh process from an empty "
             f"directory (start-up, imports, the search, the tables), alternately on this checkout and on the "
             f"pinned {label(pinned)}. CPU is the process's user+system time, which load inflates less than the "
             f"wall time; the 1-minute load average before each run is listed (2 cores: above 2 the cores are "
             f"shared).", "",
             "| code | runs | median CPU (s) | min CPU (s) | median wall (s) | loads before |",
             "|---|---:|---:|---:|---:|---|"]
    for name, row in (("this checkout", this), (label(pinned), before)):
        lines.append(f"| {name} | {row['runs']} | {row['median_cpu_s']:.2f} | {row['min_cpu_s']:.2f} | "
                     f"{row['median_wall_s']:.2f} | {', '.join(map(str, row['loads']))} |")
    lines += ["", f"This checkout takes {1 / ratio:.2f}x the pinned commit's CPU time in the same run."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="results", help="the results directory (default results/)")
    parser.add_argument("--pinned", default=PINNED, help=f"the earlier commit timed beside this checkout ({PINNED})")
    parser.add_argument("--runs", type=int, default=5, help="runs of each code, alternated (default 5)")
    args = parser.parse_args(argv)
    this, before = [], []
    with exported(args.pinned) as source:
        for _ in range(args.runs):
            before.append(run_once(source))
            this.append(run_once(None))
            print(f"pinned {before[-1]['cpu_s']:.2f} s CPU, this checkout {this[-1]['cpu_s']:.2f} s CPU "
                  f"(load {this[-1]['load_before']:.1f})", flush=True)
    directory = study_dir(STUDY, args.output)
    document = {"command": COMMAND, "arguments": ARGUMENTS, "pinned": args.pinned,
                "this_checkout": {**summary(this), "each": this}, "pinned_commit": {**summary(before), "each": before}}
    write_text(directory / "quick-start.json", json.dumps(document, indent=1) + "\n")
    write_text(directory / REPORT, render(args.pinned, summary(this), summary(before)))
    print(f"wrote {directory / REPORT} and {write_index(args.output)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
