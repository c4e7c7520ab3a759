"""Sweep speed: how long `synth sweep` takes for 1000+ configurations, and where the time goes.

    python -m benchmarks.sweep [-o results]

Each case runs `synth sweep` as a fresh process (imports, Z3 start-up and file writing
included) and records its wall time and CPU time (the machine may be shared: CPU time is
what the sweep itself cost). Then the main case runs once more in-process under cProfile,
to split the time between enumerating programs, the simulator's step costs, the lower bound
and the sweep's own loop. Writes results/sweep-speed.md and .json.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

from benchmarks.index import write_index
from benchmarks.record import header, results_dir
from synth.commands.simulation import resolve_sizes
from synth.placement import enumerate_placements, parse_axes
from synth.analysis.sweep import configurations, run_sweep
from synth.topology_file import load_topology

COMMAND = "python -m benchmarks.sweep"
TARGET_S = 30.0
TARGET_CONFIGURATIONS = 1000


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
MAIN = Case("dgx-h100-2x8x8", "data=4,pipe=4,model=8", "1KiB", "1GiB", 4)
CASES = (
    MAIN,
    Case("dgx-h100-2x8x8", "data=4,pipe=4,model=8", "1KiB", "1GiB", 2),
    Case("dgx-h100-2x8x8", "data=16,model=8", "1KiB", "1GiB", 2),
    Case("dgx-a100-x4", "data=8,model=4", "1KiB", "1GiB", 2),
)


@dataclass(frozen=True)
class Timing:
    command: str
    configurations: int
    wall_s: float
    cpu_s: float
    load_before: float  # 1-minute load average when the run started (2 cores: above 2 means contention)

    @property
    def per_second(self) -> float:
        return self.configurations / self.wall_s


def time_case(case: Case) -> Timing:
    """One `synth sweep` in a fresh process; CPU time from the children's rusage."""
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as directory:
        command = [sys.executable, "-m", "synth", "sweep", *case.arguments, "-o", directory]
        started = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Timing("synth sweep " + " ".join(case.arguments), case.configurations(), wall, cpu, load)


# Where the time goes: (label, function name as pstats shows it, file suffix).
PARTS = (
    ("enumerating and walking programs (once per hierarchy shape)", "build_shape", "analysis/sweep.py"),
    ("simulator step costs (Simulator.step_time)", "step_time", "model/cost.py"),
    ("  of which compiling each call into flows, once per call (Simulator._compile)", "_compile", "model/cost.py"),
    ("  of which the link loads of each step's flows, once per step (Simulator._step_phases)", "_step_phases",
     "model/cost.py"),
    ("lower bound, once per configuration (lower_bound)", "lower_bound", "model/bound.py"),
    ("summing program times and picking the best (sweep_hierarchy minus the above)", "sweep_hierarchy",
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
    inner = sum(cumulative.get(PARTS[i][0], 0.0) for i in (1, 4))
    cumulative[own] = cumulative.get(own, 0.0) - inner
    return [(label, cumulative.get(label, 0.0), cumulative.get(label, 0.0) / total) for label, _, _ in PARTS] + [
        ("whole sweep under cProfile", total, 1.0)]


def render(timings: list[Timing], parts) -> str:
    lines = ["# Sweep speed", "", header(COMMAND), ""]
    lines.append(f"Target: {TARGET_CONFIGURATIONS} configurations or more in under {TARGET_S:.0f} s on this 2-core "
                 f"machine. Each run is `synth sweep` in a fresh process (imports, Z3 start-up and the CSV/JSON "
                 f"writes included). Wall time depends on what else the machine runs (the 1-minute load "
                 f"average at the start is given; above 2 the two cores are shared); CPU time is what the "
                 f"sweep itself used, one core.")
    lines += ["", "| command | configurations | wall (s) | CPU (s) | configurations / s (wall) | load | target |",
              "|---|---:|---:|---:|---:|---:|---|"]
    for timing in timings:
        verdict = "-"
        if timing.configurations >= TARGET_CONFIGURATIONS:
            verdict = "met" if timing.wall_s < TARGET_S else "missed"
        lines.append(f"| `{timing.command}` | {timing.configurations} | {timing.wall_s:.1f} | {timing.cpu_s:.1f} | "
                     f"{timing.per_second:.0f} | {timing.load_before:.1f} | {verdict} |")
    lines += ["", f"## Where the time goes (`{MAIN.topology}`, `{MAIN.axes}`, -f {MAIN.factor}, in-process under "
              f"cProfile, which slows Python calls, so shares rather than seconds)", "",
              "| part | seconds | share |", "|---|---:|---:|"]
    for label, seconds, share in parts:
        lines.append(f"| {label} | {seconds:.2f} | {100 * share:.0f}% |")
    lines += ["", "Programs are enumerated once per hierarchy shape (level sizes) and reused by every placement "
              "and request of that shape; each distinct step is costed once per (placement, request, size) and "
              "a program's time is a sum of gathered step times."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="results", help="directory for the figures (default results/)")
    args = parser.parse_args(argv)
    timings = []
    for case in CASES:
        timing = time_case(case)
        timings.append(timing)
        print(f"{timing.command}: {timing.configurations} configurations, {timing.wall_s:.1f} s wall, "
              f"{timing.cpu_s:.1f} s CPU (load {timing.load_before:.1f})", flush=True)
    parts = profile_case(MAIN)
    directory = results_dir(args.output)
    (directory / "sweep-speed.json").write_text(json.dumps(
        {"timings": [dict(asdict(t), per_second=t.per_second) for t in timings],
         "profile": [{"part": label, "seconds": seconds, "share": share} for label, seconds, share in parts]},
        indent=2) + "\n")
    (directory / "sweep-speed.md").write_text(render(timings, parts))
    print(f"wrote {directory / 'sweep-speed.md'} and {write_index(directory)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
