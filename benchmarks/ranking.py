"""Ranking speed: `synth rank --top 5` against the full ranking where the program set is large.

    python -m benchmarks.ranking [-o results] [--baseline DIR]

Each case runs `synth rank ... --json` as a fresh process, once ranking every program and
once with `--top 5` (the best-first search), with both estimates, and records wall and CPU
time and the load before the run; both runs must agree on the five first programs (checked
here). `--baseline DIR` also times the same commands with another checkout first on the path
(the code before a change; its `--estimate` default may differ, so the estimate is always
given). Writes results/rank-speed.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

from benchmarks.index import write_index
from benchmarks.record import header, results_dir

COMMAND = "python -m benchmarks.ranking"
TOP = 5

CASES = (  # (arguments, programs ranked)
    ("--topology paper-fig3 --axes data=4,model=4 --placement [[1,2,2],[2,1,2]] --reduce data,model "
     "--hierarchy split --max-len 7", "4 levels, 110081 programs"),
    ("--topology paper-fig3 --axes data=4,model=4 --placement [[1,2,2],[2,1,2]] --reduce data,model "
     "--hierarchy split --max-len 6", "4 levels, 18101 programs"),
    ("--topology dgx-h100-2x8x8 --axes data=128 --reduce data --max-len 7", "3 levels, 13230 programs"),
)
SIZES = ("64KiB", "1GiB")
ESTIMATES = ("lockstep", "pipelined")


@dataclass(frozen=True)
class Run:
    arguments: str
    programs: str
    size: str
    estimate: str
    code: str
    full_wall_s: float
    full_cpu_s: float
    top_wall_s: float
    top_cpu_s: float
    load_before: float

    @property
    def speedup(self) -> float:
        """Full ranking over --top, CPU time (what the command itself cost)."""
        return self.full_cpu_s / self.top_cpu_s


def timed(argv: list[str], baseline: str | None) -> tuple[float, float, list]:
    environment = dict(os.environ)
    if baseline:
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, (baseline, environment.get("PYTHONPATH"))))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as directory:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "synth", *argv], check=True, capture_output=True, text=True,
                              env=environment, cwd=directory)
        wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), json.loads(done.stdout)


def run_case(arguments: str, programs: str, size: str, estimate: str, baseline: str | None) -> Run:
    argv = ["rank", *arguments.split(), "--bytes", size, "--estimate", estimate, "--json"]
    load = os.getloadavg()[0]
    full_wall, full_cpu, full = timed(argv, baseline)
    top_wall, top_cpu, top = timed([*argv, "--top", str(TOP)], baseline)
    head = [row for row in top if not (row["baseline"] and row not in full[:TOP])]
    if [(r["program"], r["time_s"]) for r in head] != [(r["program"], r["time_s"]) for r in full[:TOP]]:
        raise SystemExit(f"--top {TOP} is not the head of the full ranking: {arguments} {size} {estimate}")
    return Run(arguments, programs, size, estimate, f"baseline {baseline}" if baseline else "this checkout",
               full_wall, full_cpu, top_wall, top_cpu, load)


def render(runs: list[Run]) -> str:
    lines = ["# Ranking speed: --top 5 against the full ranking", "", header(COMMAND), "",
             f"Each cell is `synth rank ARGS --bytes SIZE --estimate E --json` in a fresh process (imports "
             f"included), without and with `--top {TOP}`; both agree on the {TOP} first programs (checked). CPU "
             f"time is what the command cost; wall time also depends on the load (1-minute load average before "
             f"the pair; 2 cores). Speedup: full CPU over --top CPU.", "",
             "| case | size | estimate | code | full: wall / CPU (s) | --top 5: wall / CPU (s) | speedup | load |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    for run in runs:
        lines.append(f"| `{run.arguments}` ({run.programs}) | {run.size} | {run.estimate} | {run.code} | "
                     f"{run.full_wall_s:.1f} / {run.full_cpu_s:.1f} | {run.top_wall_s:.1f} / {run.top_cpu_s:.1f} | "
                     f"{run.speedup:.1f}x | {run.load_before:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="results", help="directory for the figures (default results/)")
    parser.add_argument("--baseline", metavar="DIR", help="also time another checkout (a directory holding its synth/)")
    args = parser.parse_args(argv)
    runs = []
    for arguments, programs in CASES:
        for size in SIZES:
            for estimate in ESTIMATES:
                for baseline in ([args.baseline] if args.baseline and estimate == "lockstep" else []) + [None]:
                    run = run_case(arguments, programs, size, estimate, baseline)
                    runs.append(run)
                    print(f"{arguments} {size} {estimate} [{run.code}]: full {run.full_cpu_s:.1f} s CPU, --top "
                          f"{run.top_cpu_s:.1f} s CPU, {run.speedup:.1f}x (load {run.load_before:.1f})", flush=True)
    directory = results_dir(args.output)
    (directory / "rank-speed.json").write_text(json.dumps(
        {"command": COMMAND, "runs": [dict(asdict(run), speedup=run.speedup) for run in runs]}, indent=1) + "\n")
    (directory / "rank-speed.md").write_text(render(runs))
    print(f"wrote {directory / 'rank-speed.md'} and {write_index(directory)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
