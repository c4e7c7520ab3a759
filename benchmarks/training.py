"""Training step time on the emulated cluster: plain DDP against DDP with synth's hook.

    python -m benchmarks.training                  # root: emu-2x4 at scale 1/256, results/training/
    python -m benchmarks.training --steps 10 -o results

One emulated cluster (synth/emulate: a network namespace per node, links shaped with tc),
8 ranks each in its node's namespace (gloo), benchmarks/training_worker.py on every rank: a
small MLP (301,156 parameters, so about 1.2 MB of gradients per step, in DDP buckets of 2 KiB
cap: 3150, 274788, 611 and 22607 elements) trained --steps steps with plain DDP, then from
the same start with DDP and the hook of each plan:

- best by size: at each bucket size the program the simulator ranks first on the topology
  calibrated on this emulated cluster (the built-in emu-2x4-gloo, gloo model), by the
  lockstep and by the pipelined estimate;
- the reduce-scatter / all-reduce / all-gather program and the reduce / master / broadcast one.

Two cases: data=8 over the 8 ranks (one group of 8), and data=4,model=2 placed [[2,2],[1,2]]
(two data groups of 4, each 2 nodes x 2 ranks, sharing the node uplinks; DDP over each).

Each step's time is the slowest rank's, after a barrier; the table gives the median and the
parameters' largest difference from plain DDP. The numbers say what the hook costs or saves
on this machine's emulated links, not on a GPU cluster. Writes results/training/README.md and
training.json with the command, machine, load and date.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.record import REPORT, machine_description
from synth.emulate.layout import format_scale, parse_scale
from synth.output_files import write_text

WORKER = Path(__file__).with_name("training_worker.py")
STUDY = "training"
CALIBRATED = "emu-2x4-gloo"  # the accuracy campaign's calibration of emu-2x4 (topologies/emu-2x4-gloo.toml)
PROGRAMS = {
    "RS/AR/AG": "ReduceScatter(InsideGroup(gpu)); AllReduce(Parallel(node)); AllGather(InsideGroup(gpu))",
    "Reduce/Master/Broadcast": "Reduce(InsideGroup(gpu)); AllReduce(Master(node)); Broadcast(InsideGroup(gpu))",
}


def problem() -> str | None:
    """Why the emulated cluster cannot run here, or None."""
    import shutil

    if os.geteuid() != 0:
        return "the emulated cluster needs root (network namespaces and tc)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    return f"the emulated cluster needs {' and '.join(missing)} (apt-get install iproute2)" if missing else None


CASES = (  # (name, axes, placement): data=8 over both levels; two data groups of 4 sharing the uplinks
    ("data=8 on 2 nodes x 4", "data=8", [[2, 4]]),
    ("data=4,model=2, placement [[2,2],[1,2]], reduce data", "data=4,model=2", [[2, 2], [1, 2]]),
)


def plans(directory: Path, topology: str, calibrated: str, axes: str, placement) -> dict[str, Path]:
    """The plans compared on one case, saved where the ranks can read them."""
    import synth.torch as st

    result = {}
    for estimate in ("lockstep", "pipelined"):
        best = st.plan_reduction(calibrated, axes, "data", placement, backend="gloo", max_len=4, estimate=estimate)
        result[f"best by size, {estimate} estimate (" + "; ".join(best.describe()) + ")"] = \
            best.save(directory / f"best-{estimate}.json")
    for name, text in PROGRAMS.items():
        try:
            plan = st.plan_reduction(topology, axes, "data", placement, programs=text)
        except Exception as error:  # not valid on this placement's hierarchy
            print(f"skipping {name} on {axes}: {error}", file=sys.stderr)
            continue
        result[name] = plan.save(directory / f"{name.replace('/', '-')}.json")
    return result


def run(topology: str, scale: float, steps: int, calibrated: str = CALIBRATED, cases=CASES) -> tuple[list[tuple], float]:
    """Per case: (name, the ranks' report, the plans by name); exits when a rank fails (a
    parameter mismatch included)."""
    from synth.emulate.host import emulated_cluster
    from synth.emulate.ranks import run_ranks

    results = []
    with tempfile.TemporaryDirectory(prefix="synth-training-") as scratch, \
            emulated_cluster(topology, scale=scale, name="synth-train") as cluster:
        for index, (name, axes, placement) in enumerate(cases):
            directory = Path(scratch) / str(index)
            directory.mkdir()
            saved = plans(directory, topology, calibrated, axes, placement)
            args = ["--plans", *map(str, saved.values()), "--steps", str(steps), "--warmup", "1"]
            result = run_ranks(cluster, WORKER, cluster.device_count, args, timeout=3600)
            if result.returncode != 0 or result.report is None:
                raise SystemExit(f"the ranks failed (exit code {result.returncode}):\n{result.log[-4000:]}")
            results.append((name, result.report, list(saved)))
        return results, cluster.scale


def write(results: list[tuple], command: str, topology: str, scale: float,
          load: tuple[tuple[float, ...], tuple[float, ...]], started: datetime, output: Path,
          calibrated: str = CALIBRATED) -> Path:
    """The report and its data in the study's folder under the results directory `output`."""
    output = output / STUDY
    output.mkdir(parents=True, exist_ok=True)
    sections = []
    for name, report, configurations in results:
        plain = report["plain"]["median_step_s"]
        rows = [f"### {name}", "",
                "| configuration | median step (ms) | vs plain DDP | max abs diff of parameters | programs run (buckets) |",
                "|---|---:|---:|---:|---|",
                f"| plain DDP (one all_reduce per bucket) | {plain * 1e3:.1f} | 1.00x | - | - |"]
        for configuration, hook in zip(configurations, report["hooks"]):
            used = "; ".join(line for line in hook["summary"] if "by program" in line)
            rows.append(f"| DDP + hook, {configuration} | {hook['median_step_s'] * 1e3:.1f} | "
                        f"{plain / hook['median_step_s']:.2f}x | {hook['max_abs_diff']:.1e} | {used} |")
        sections += rows + [""]
    torch_version = results[0][1]["torch"]
    text = "\n".join([
        "# Training step time: plain DDP against DDP with synth's communication hook",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine_description()}",
        "",
        f"Date: {started.strftime('%Y-%m-%d %H:%M UTC')}",
        "",
        f"Load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in load[0])}; after: "
        f"{', '.join(f'{x:.2f}' for x in load[1])} (the machine is shared: other jobs ran meanwhile)",
        "",
        f"Cluster: {topology} emulated at scale {format_scale(scale)} (synth emulate), 8 ranks each in its node's "
        f"namespace, gloo, torch {torch_version}; {results[0][1]['steps']} timed steps after 1 untimed; step time = "
        f"slowest rank's, after a barrier; DDP bucket cap {results[0][1]['bucket_cap_kb']} KiB, DDP's process group "
        "= the rank's reduction group. Model and buckets: benchmarks/training_worker.py. Plans ranked on "
        f"{calibrated} (calibrated on this emulated cluster at this scale).",
        "",
        *sections,
        "Parameters equal plain DDP's to float rounding in every configuration (the hook averages as DDP does: "
        "divide by the group size, then sum). On gloo the hook runs each bucket's program on a background "
        "thread, so backward continues meanwhile, as with DDP's own asynchronous all_reduce. These are CPU "
        "processes on shaped virtual links: the figures say what the hook costs or saves there, not on GPUs.",
        "",
    ])
    path = output / REPORT
    write_text(path, text)
    write_text(output / "training.json", json.dumps({"command": command, "machine": machine_description(),
                                                     "date": started.isoformat(timespec="seconds"),
                                                     "load_before": load[0], "load_after": load[1],
                                                     "topology": topology, "scale": scale,
                                                     "cases": [{"name": name, "configurations": configurations,
                                                                "report": report}
                                                               for name, report, configurations in results]},
                                                    indent=1))
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="emu-2x4", help="emulated topology (2 levels, 8 devices)")
    parser.add_argument("--scale", default="1/256", help="bandwidth scale of the emulated links (the calibration's)")
    parser.add_argument("--calibrated", default=CALIBRATED, help="topology the best-by-size plan is ranked on")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("-o", "--output", default="results",
                        help="the results directory (default results/); writes its training/ folder")
    args = parser.parse_args(argv)
    reason = problem()
    if reason:
        print(f"benchmarks.training: {reason}", file=sys.stderr)
        return 2
    command = "python -m benchmarks.training " + shlex.join(argv if argv is not None else sys.argv[1:])
    started = datetime.now(timezone.utc)
    before = os.getloadavg()
    results, scale = run(args.topology, parse_scale(args.scale), args.steps, args.calibrated)
    path = write(results, command.strip(), args.topology, scale, (before, os.getloadavg()), started, Path(args.output),
                 args.calibrated)
    print(path.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
