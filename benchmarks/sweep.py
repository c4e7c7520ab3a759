"""Sweep speed: how long `synth sweep` takes for 1000+ configurations, and where the time goes.

    python -m benchmarks.sweep [-o results]

Each case runs `synth sweep` as a fresh process, as a user runs it, and records what the
user waits for: the process's wall time from start to exit (imports, the sweep, the files),
with its CPU time, peak memory and the load (the machine may be shared), beside the sweep's
own time as the command prints it. The main case also runs, in the same run and alternately,
on a pinned earlier commit (`--pinned`, exported with `git archive`: benchmarks/pinned.py;
`--baseline DIR` takes another checkout instead), so the figure is judged against code timed
on the same machine at the same load. Then the main case runs once more in-process under cProfile, to
split the time between enumerating programs, the costing engine, the lower bound and the
sweep's own loop. Writes results/sweep-speed/README.md and sweep-speed.json.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

from benchmarks.index import write_index
from benchmarks.pinned import environment as pinned_environment
from benchmarks.pinned import exported, label
from benchmarks.record import REPORT, header, study_dir
from synth.commands.simulation import resolve_sizes
from synth.output_files import write_text
from synth.placement import enumerate_placements, parse_axes
from synth.analysis.sweep import configurations, run_sweep
from synth.topology_file import load_topology

COMMAND = "python -m benchmarks.sweep"
STUDY = "sweep-speed"
# The earlier commit timed beside this checkout in every run (benchmarks/pinned.py): the code
# before the one costing engine. A figure is judged against it, measured on the same machine at
# the same load, not against a number from another day.
PINNED = "9aa345d"
TARGET_PER_SECOND = 1000  # configurations per second on MAIN end to end, met at a load near 1 (kept for reference)
TARGET_RATIO = 0.6  # the main case's CPU time over the pinned commit's, in the same run (0.49 when 1000/s was met)


@dataclass(frozen=True)
class Case:
    topology: str
    axes: str
    minbytes: str
    maxbytes: str
    factor: int

    @property
    def arguments(self) -> list[str]:
        return ["--topology", self.topology, "--axes", self.axes, "-b", self.minbytes, "-e", self.maxbytes,
                "-f", str(self.factor)]

    def configurations(self) -> int:
        axes = parse_axes(self.axes)
        placements = enumerate_placements(load_topology(self.topology), axes)
        return configurations(len(placements), axes, len(self.sizes()))

    def sizes(self) -> list[int]:
        return resolve_sizes(argparse.Namespace(bytes=None, minbytes=self.minbytes, maxbytes=self.maxbytes,
                                                stepfactor=self.factor))


# Two axes give at most 7 placements x 3 requests on the built-in systems (441 configurations
# at 21 sizes), so the 1000+ case uses three axes: 19 placements x 7 requests x 11 sizes.
MAIN = Case("dgx-h100-2x8x8", "data=4,pipe=4,model=8", "1KiB", "1GiB", 2)
CASES = (
    MAIN,
    Case("dgx-h100-2x8x8", "data=4,pipe=4,model=8", "1KiB", "1GiB", 4),
    Case("dgx-h100-2x8x8", "data=16,model=8", "1KiB", "1GiB", 2),
    Case("dgx-a100-x4", "data=8,model=4", "1KiB", "1GiB", 2),
)


@dataclass(frozen=True)
class Timing:
    command: str
    code: str  # "this checkout" or the baseline checkout timed beside it
    configurations: int
    sweep_s: float  # the sweep's own time, as `synth sweep` prints it (no imports, no file writing)
    wall_s: float  # the whole process, start to exit: what the user waits for
    cpu_s: float
    load_before: float  # 1-minute load average when the run started (2 cores: above 2 means contention)
    max_rss_mb: float = 0.0  # the process's peak resident memory

    @property
    def per_second(self) -> float:
        """End to end: configurations over the command's whole wall time."""
        return self.configurations / self.wall_s

    @property
    def per_cpu_second(self) -> float:
        """Configurations over the command's CPU time, which other work on the machine inflates less."""
        return self.configurations / self.cpu_s


_SWEEP_SECONDS = re.compile(r"configurations .* in ([0-9.]+) s")


def time_case(case: Case, baseline: str | None = None, baseline_label: str = "") -> Timing:
    """One `synth sweep` in a fresh process (of this checkout, or with `baseline`, a checkout
    directory, first on the path); CPU time from the children's rusage."""
    load = os.getloadavg()[0]
    environment = pinned_environment(baseline)
    with tempfile.TemporaryDirectory() as directory, tempfile.TemporaryFile("w+") as out:
        command = [sys.executable, "-m", "synth", "sweep", *case.arguments, "-o", directory]
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL, env=environment, cwd=directory)
        _, status, usage = os.wait4(process.pid, 0)  # this child's own CPU time and peak memory
        wall = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            raise subprocess.CalledProcessError(process.returncode, command)
        out.seek(0)
        stdout = out.read()
    cpu = usage.ru_utime + usage.ru_stime
    sweep = float(_SWEEP_SECONDS.search(stdout)[1])
    return Timing("synth sweep " + " ".join(case.arguments), (baseline_label or f"baseline {baseline}") if baseline else "this checkout",
                  case.configurations(), sweep, wall, cpu, load, usage.ru_maxrss / 1024)


@dataclass(frozen=True)
class SweepCpu:
    """The sweep alone (run_sweep, no imports, no files) in a fresh process: its CPU time."""

    code: str
    estimate: str
    configurations: int
    cpu_s: float
    wall_s: float
    load_before: float

    @property
    def per_cpu_second(self) -> float:
        return self.configurations / self.cpu_s


_IN_PROCESS = """
import json, os, time
from synth.placement import enumerate_placements, parse_axes
from synth.analysis.sweep import run_sweep
from synth.topology_file import load_topology
system, axes = load_topology({topology!r}), parse_axes({axes!r})
placements = enumerate_placements(system, axes)
options = {options}
load = os.getloadavg()[0]
cpu, wall = time.process_time(), time.perf_counter()
rows = run_sweep(system, placements, axes, {sizes!r}, **options).rows
print(json.dumps([len(rows), time.process_time() - cpu, time.perf_counter() - wall, load]))
"""


def sweep_cpu(case: Case, estimate: str | None, baseline: str | None = None, baseline_label: str = "") -> SweepCpu:
    """`run_sweep` of the case in a fresh process (this checkout with `estimate`, or the
    `baseline` checkout with its own default), caches cold."""
    environment = pinned_environment(baseline)
    options = {"estimate": estimate} if estimate else {}
    code = _IN_PROCESS.format(topology=case.topology, axes=case.axes, sizes=case.sizes(), options=options)
    with tempfile.TemporaryDirectory() as directory:
        done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                              env=environment, cwd=directory)
    count, cpu, wall, load = json.loads(done.stdout.strip().splitlines()[-1])
    return SweepCpu((baseline_label or f"baseline {baseline}") if baseline else "this checkout", estimate or "its default (lockstep)",
                    count, cpu, wall, load)


# Where the time goes: (label, function name as pstats shows it, file suffix).
PARTS = (
    ("enumerating programs, once per quotient shape (_enumerated)", "_enumerated", "search/programs.py"),
    ("walking them into step tables, once per level sizes (_walked)", "_walked", "search/programs.py"),
    ("costing: program times for every size (Estimate.program_times)", "program_times", "model/estimate.py"),
    ("  of which step figures, steps x sizes (CostEngine.figures)", "figures", "model/engine.py"),
    ("  of which each call's plans and flows, once per call shape (CostEngine.call)", "call", "model/engine.py"),
    ("  of which the link loads of each step, once per step and choice (CostEngine.regime)", "regime",
     "model/engine.py"),
    ("lower bound, one line per configuration (bound_line)", "bound_line", "model/bound.py"),
    ("picking the best per size and writing rows (sweep_hierarchy minus costing)", "sweep_hierarchy",
     "analysis/sweep.py"),
)


def profile_case(case: Case) -> list[tuple[str, float, float]]:
    """(part, seconds under cProfile, share of the sweep) for the parts above."""
    system, axes = load_topology(case.topology), parse_axes(case.axes)
    placements = enumerate_placements(system, axes)
    profiler = cProfile.Profile()
    profiler.enable()
    run_sweep(system, placements, axes, case.sizes())
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    cumulative = {}
    for (filename, _, name), (_, _, _, cum, _) in stats.items():
        for label, function, suffix in PARTS:
            if name == function and filename.endswith(suffix):
                cumulative[label] = cumulative.get(label, 0.0) + cum
    total = next(cum for (filename, _, name), (_, _, _, cum, _) in stats.items()
                 if name == "run_sweep" and filename.endswith("analysis/sweep.py"))
    own = PARTS[-1][0]
    cumulative[own] = cumulative.get(own, 0.0) - cumulative.get(PARTS[2][0], 0.0)
    return [(label, cumulative.get(label, 0.0), cumulative.get(label, 0.0) / total) for label, _, _ in PARTS] + [
        ("whole sweep under cProfile", total, 1.0)]


def render(timings: list[Timing], cpus: list[SweepCpu], parts) -> str:
    lines = ["# Sweep speed", "", header(COMMAND), ""]
    lines.append(f"Each run is `synth sweep` in a fresh process as a user runs it: 'command wall' is its whole time "
                 f"from start to exit (imports, the sweep, writing the files), 'CPU' its user+system time, 'memory' "
                 f"its peak resident size; 'sweep' is the part the command itself reports. Wall times depend on what "
                 f"else the machine runs: the 1-minute load average at the start is given (2 cores: above 2 the cores "
                 f"are shared, the wall time grows and the CPU time grows less). So the figures are judged against "
                 f"the pinned commit's, timed alternately in the same run on the same machine: the target is at most "
                 f"{TARGET_RATIO}x its CPU time on the 3-axis sweep; {TARGET_PER_SECOND} configurations per second "
                 f"end to end was met at a load near 1 (2026-11-26).")
    lines += ["", "| command | code | configurations | command wall (s) | configurations / s (wall) | CPU (s) | "
              "configurations / CPU s | memory (MB) | sweep (s) | load |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for timing in timings:
        lines.append(f"| `{timing.command}` | {timing.code} | {timing.configurations} | {timing.wall_s:.1f} | "
                     f"{timing.per_second:.0f} | {timing.cpu_s:.1f} | {timing.per_cpu_second:.0f} | "
                     f"{timing.max_rss_mb:.0f} | {timing.sweep_s:.1f} | {timing.load_before:.1f} |")
    mains = [t for t in timings if t.command == "synth sweep " + " ".join(MAIN.arguments)]
    if len(mains) == 2 and mains[0].code != "this checkout":
        before, after = mains
        ratio = after.cpu_s / before.cpu_s
        lines += ["", f"Against {before.code}, timed alternately in this run: {ratio:.2f}x its CPU time "
                      f"(target {TARGET_RATIO}x or less: {'met' if ratio <= TARGET_RATIO else 'missed'}) and "
                      f"{after.wall_s / before.wall_s:.2f}x its wall time (loads {before.load_before:.1f} and "
                      f"{after.load_before:.1f})."]
    lines += ["", f"## The sweep alone (`run_sweep` of `{MAIN.axes}` on `{MAIN.topology}`, -f {MAIN.factor}, fresh "
              f"process, caches cold, imports excluded): CPU time, which the load does not inflate", "",
              "| code | estimate | configurations | CPU (s) | configurations per CPU second | wall (s) | load |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for cpu in cpus:
        lines.append(f"| {cpu.code} | {cpu.estimate} | {cpu.configurations} | {cpu.cpu_s:.2f} | {cpu.per_cpu_second:.0f} | "
                     f"{cpu.wall_s:.2f} | {cpu.load_before:.1f} |")
    lines += ["", f"## Where the time goes (`{MAIN.topology}`, `{MAIN.axes}`, -f {MAIN.factor}, in-process under "
              f"cProfile, which slows Python calls, so shares rather than seconds)", "",
              "| part | seconds | share |", "|---|---:|---:|"]
    for label, seconds, share in parts:
        lines.append(f"| {label} | {seconds:.2f} | {100 * share:.0f}% |")
    lines += ["", "Programs are enumerated once per quotient shape (every level of size >= 2 shrunk to 2) and "
              "walked once per level sizes (synth/search/programs.py); placements whose groups sit on the "
              "system alike share one costing engine (synth/model/engine.py), which costs each distinct step once "
              "for every size; the lower bound is a line in the size."]
    return "\n".join(lines) + "\n"


def _timed(baseline: str, baseline_label: str) -> tuple[list[Timing], list[SweepCpu]]:
    """The main case on the baseline code and on this checkout, alternately, then every case on
    this checkout; the sweep alone on both."""
    timings = []
    for case, source in [(MAIN, baseline), (MAIN, None)] + [(case, None) for case in CASES[1:]]:
        timing = time_case(case, source, baseline_label)
        timings.append(timing)
        print(f"{timing.command} [{timing.code}]: {timing.configurations} configurations, command {timing.wall_s:.1f} s "
              f"wall ({timing.per_second:.0f}/s), {timing.cpu_s:.1f} s CPU, {timing.max_rss_mb:.0f} MB, sweep "
              f"{timing.sweep_s:.1f} s (load {timing.load_before:.1f})", flush=True)
    cpus = [sweep_cpu(MAIN, None, baseline, baseline_label)]
    cpus += [sweep_cpu(MAIN, estimate) for estimate in ("lockstep", "pipelined")]
    return timings, cpus


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="results",
                        help="the results directory (default results/); writes its sweep-speed/ folder")
    parser.add_argument("--pinned", default=PINNED, metavar="COMMIT",
                        help=f"the earlier commit whose main case is timed beside this checkout's in the same run, "
                             f"exported with git archive (default {PINNED})")
    parser.add_argument("--baseline", metavar="DIR",
                        help="instead of --pinned: another checkout (a directory holding its synth/)")
    args = parser.parse_args(argv)
    if args.baseline:
        timings, cpus = _timed(args.baseline, f"baseline {args.baseline}")
    else:
        with exported(args.pinned) as source:
            timings, cpus = _timed(str(source), label(args.pinned))
    for cpu in cpus:
        print(f"run_sweep [{cpu.code}, {cpu.estimate}]: {cpu.cpu_s:.2f} s CPU, {cpu.per_cpu_second:.0f} "
              f"configurations per CPU second", flush=True)
    parts = profile_case(MAIN)
    directory = study_dir(STUDY, args.output)
    write_text(directory / "sweep-speed.json", json.dumps(
        {"command": COMMAND, "timings": [dict(asdict(t), per_second=t.per_second, per_cpu_second=t.per_cpu_second)
                                         for t in timings],
         "sweep_cpu": [dict(asdict(c), per_cpu_second=c.per_cpu_second) for c in cpus],
         "profile": [{"part": label, "seconds": seconds, "share": share} for label, seconds, share in parts]},
        indent=2) + "\n")
    write_text(directory / REPORT, render(timings, cpus, parts))
    print(f"wrote {directory / REPORT} and {write_index(args.output)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
