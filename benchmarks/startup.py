"""Start-up time of the command line: what a user waits before a command does anything.

    python -m benchmarks.startup [-o results] [--runs 15]

Runs each command as a fresh process (`python -m synth ...`, so an installed console script's
own overhead is not counted twice) several times, interleaved, and reports the median and
the fastest wall time, with the load average before and after: on a shared machine the
fastest run is the one least disturbed. For scale it also times the bare interpreter and
what every command used to import before parsing its arguments. Writes results/startup/README.md
and startup.json. The target (issue 12): `synth --help` and `synth topologies` under 0.3 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks.record import REPORT, header, study_dir
from synth.output_files import write_text

COMMAND = "python -m benchmarks.startup"
STUDY = "startup"
TITLE = "Start-up time of the command line"
TARGET_S = 0.3
CASES = (
    ("python -c pass (the interpreter alone)", ["-c", "pass"]),
    ("synth --help", ["-m", "synth", "--help"]),
    ("synth topologies", ["-m", "synth", "topologies"]),
    ("synth rank --help", ["-m", "synth", "rank", "--help"]),
    ("synth check (a 3-step program on 16 devices)",
     ["-m", "synth", "check", "--levels", "server=2,cpu=2,gpu=4", "--axes", "4,4", "--placement", "[[1,2,2],[2,1,2]]",
      "--reduce", "a0", "Reduce(InsideGroup(gpu)); AllReduce(Master(cpu)); Broadcast(InsideGroup(gpu))"]),
    ("numpy, networkx, z3, rich and the grammar imported (what every command paid up front before issue 12)",
     ["-c", "import numpy, networkx, z3, rich.console, rich.table, rich.progress, synth.language, synth.cli"]),
)


def time_once(arguments: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, *arguments], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def measure(runs: int) -> list[dict]:
    for _, arguments in CASES:  # warm the file cache and the bytecode
        time_once(arguments)
    samples: dict[str, list[float]] = {label: [] for label, _ in CASES}
    for _ in range(runs):
        for label, arguments in CASES:
            samples[label].append(time_once(arguments))
    return [{"case": label, "median_s": statistics.median(times), "fastest_s": min(times), "runs": len(times)}
            for label, times in samples.items()]


def report(rows: list[dict], load_before: tuple, load_after: tuple, runs: int) -> str:
    lines = [f"# {TITLE}", "", header(f"{COMMAND} --runs {runs}"), "",
             f"Load average (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in load_before)} before, "
             f"{', '.join(f'{x:.2f}' for x in load_after)} after; the machine has {os.cpu_count()} cores and was "
             "shared with other jobs, so the fastest of the runs is the figure least disturbed by them.", "",
             f"Each case run {runs} times as a new process, interleaved; wall time. Target: `synth --help` and "
             f"`synth topologies` under {TARGET_S} s.", "",
             "| case | median | fastest |", "|---|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['case']} | {row['median_s']:.3f} s | {row['fastest_s']:.3f} s |")
    lines += ["", "Commands import only their own module and, inside it, what their handler needs: `--help` "
              "and `topologies` never load numpy, networkx, z3 or the grammar (tests/test_cli_startup.py checks "
              "which modules each command loads)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="results",
                        help="the results directory (default results/); writes its startup/ folder")
    parser.add_argument("--runs", type=int, default=15, help="runs per case (default 15)")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    rows = measure(args.runs)
    load_after = os.getloadavg()
    directory = study_dir(STUDY, args.output)
    write_text(directory / REPORT, report(rows, load_before, load_after, args.runs))
    write_text(directory / "startup.json", json.dumps({"command": f"{COMMAND} --runs {args.runs}",
                                                       "load_before": load_before, "load_after": load_after,
                                                       "rows": rows}, indent=1) + "\n")
    for row in rows:
        print(f"{row['case']}: median {row['median_s']:.3f} s, fastest {row['fastest_s']:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
