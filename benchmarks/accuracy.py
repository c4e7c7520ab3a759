"""The simulator measured against the emulated cluster (issue 5): every valid program up to
length 4 (and the default all-reduce) on every placement and reduction request of the
campaign's emulated topologies, run with gloo, predicted by the simulator, compared.

    python -m benchmarks.accuracy run [--only emu-2x4] [--reps 3]   # measure (resumable)
    python -m benchmarks.accuracy prepare [--only emu-2x4]          # calibrate from the microbenchmarks
    python -m benchmarks.accuracy report [--only emu-2x4]

`run` writes one JSON per (topology, axes, placement, request, repetition) under
results/accuracy/raw/ and skips those already there, so a crash loses only the batch that was
running; repetitions go round the whole campaign (repetition 1 of everything first) so
partial results are usable. Each batch is one script holding all programs of the case (one
launch, communicators made once; written to a temporary directory, never under results/),
run with --check; a repetition's time is the slowest rank's
mean over --iters runs after --warmup, and a program's time is the median over repetitions.

`prepare` writes, per emulated topology, its figures as emulated and calibrates them from the
microbenchmarks in results/accuracy/ (`python -m benchmarks.microbench`): the chosen calibration
is the built-in topology topologies/<topology>-gloo.toml; the variants compared with it (the
emulated figures, other calibrations) go to topologies/calibrated/, which is neither listed
by `synth topologies` nor shipped in the wheel.

`report` predicts every program with the simulator (by default on the calibrated topology of
each emulated one, and for comparison on the variants), computes the figures of
accuracy_metrics per case and overall, and writes the study's folder results/accuracy/: the
report README.md, measurements.csv, summary.json and predicted-vs-measured.png.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.accuracy_metrics import CaseMetrics, Measured, case_metrics, summarize
from benchmarks.record import REPORT, machine_description
from synth.hierarchy import SynthesisHierarchy, build_hierarchy
from synth.language import Program, Step, parse_program
from synth.output_files import write_text, writing
from synth.placement import enumerate_placements, parse_axes
from synth.search import enumerate_programs
from synth.topology import Topology
from synth.topology_file import load_topology

MAX_LEN = 4
STUDY = Path("results") / "accuracy"  # the report README.md, the microbenchmarks, the measurements
RAW = STUDY / "raw"
FIRST_RAW = STUDY / "raw-first"  # the first campaign (before the estimate was chosen), kept
TOPOLOGIES = Path("topologies")  # the chosen calibration ships as the built-in <topology>-gloo
CALIBRATED = TOPOLOGIES / "calibrated"  # the variants compared with it: not built-in, not shipped
CHOSEN = "gloo"  # the suffix of the chosen calibration


@dataclass(frozen=True)
class Setup:
    """One emulated topology of the campaign: its scale and the jobs (axes, reduced axes) on it."""

    topology: str
    scale: str
    jobs: tuple[tuple[str, tuple[str, ...]], ...]


CAMPAIGN = (
    Setup("emu-2x4", "1/256", (("data=8", ("data",)), ("data=4,model=2", ("data", "model")))),
    Setup("emu-2x2x2", "1/128", (("data=4,model=2", ("data", "model")), ("data=8", ("data",)))),
)
SIZES = (65536,)  # at these link rates 64 KiB is network-bound: microbenchmark times scale with bytes from 64 KiB up


@dataclass(frozen=True)
class Case:
    topology: str
    axes: str
    placement: str
    request: str
    hierarchy: SynthesisHierarchy

    @property
    def key(self) -> str:
        text = f"{self.topology}__{self.axes}__{self.placement}__{self.request}"
        return "".join(c if c.isalnum() or c in "=_-." else "_" for c in text.replace(",", "+"))


def cases(setup: Setup) -> list[Case]:
    topology = load_topology(setup.topology)
    result = []
    for axes_text, requests in setup.jobs:
        axes = parse_axes(axes_text)
        for placement in enumerate_placements(topology, axes):
            for request in requests:
                hierarchy = build_hierarchy(placement, (request,), "merged")
                if hierarchy.group_size >= 2:
                    result.append(Case(setup.topology, axes_text, placement.to_text(), request, hierarchy))
    return result


def default_program(hierarchy: SynthesisHierarchy) -> Program:
    return Program((Step("AllReduce", "InsideGroup", hierarchy.level_names[0]),))


def programs(hierarchy: SynthesisHierarchy) -> list[Program]:
    """Every valid program up to MAX_LEN steps, in the enumerator's order, the default included."""
    found = list(enumerate_programs(hierarchy, max_len=MAX_LEN))
    default = default_program(hierarchy)
    return found if default in found else [*found, default]


# --- measuring ---------------------------------------------------------------------------------


def _raw_path(case: Case, rep: int, sizes=SIZES) -> Path:
    """rep<k>.json at the campaign's size, rep<k>-b<bytes>.json at others."""
    suffix = "" if tuple(sizes) == SIZES else "-b" + "-".join(map(str, sizes))
    return RAW / case.key / f"rep{rep}{suffix}.json"


def cpu_busy(seconds: float = 2.0) -> float:
    """The fraction of CPU time not idle over `seconds` (/proc/stat), while we run nothing."""
    import time

    def sample():
        fields = [float(v) for v in open("/proc/stat").readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    total0, idle0 = sample()
    time.sleep(seconds)
    total1, idle1 = sample()
    return 1.0 - (idle1 - idle0) / max(total1 - total0, 1e-9)


def _wait_for_quiet(max_busy: float, max_wait: float) -> tuple[tuple[float, float, float], float]:
    """Other jobs on 2 cores slow the ranks: wait (up to max_wait s) until the CPU is mostly
    idle between our launches, then go on regardless; the load average and the busy share just
    before the launch are recorded either way. (The load average itself lags a minute behind,
    so it would mostly measure our own previous launch.)"""
    import time

    deadline = time.monotonic() + max_wait
    busy = cpu_busy()
    while busy > max_busy and time.monotonic() < deadline:
        busy = cpu_busy(5.0)
    return os.getloadavg(), busy


def measure(setups, reps: int, iters: int, warmup: int, sizes, name: str, only_cases=(),
            max_busy: float = 0.3, max_wait: float = 120.0) -> None:
    with tempfile.TemporaryDirectory(prefix="synth-accuracy-") as scratch:  # the generated scripts, not results/
        for rep in range(reps):
            for setup in setups:
                todo = [case for case in cases(setup) if not _raw_path(case, rep, sizes).exists()
                        and (not only_cases or case.key in only_cases)]
                if todo:
                    _measure_cases(setup, todo, rep, iters, warmup, sizes, name, max_busy, max_wait, Path(scratch))


def _measure_cases(setup: Setup, todo: list[Case], rep: int, iters: int, warmup: int, sizes, name: str,
                   max_busy: float, max_wait: float, scratch: Path) -> None:
    """One repetition of the cases `todo` on one emulated cluster; each case's script, which
    carries the torch runtime, is written to `scratch` and removed after its launch."""
    from synth.emulate.host import emulated_cluster
    from synth.emulate.layout import parse_scale
    from synth.emulate.ranks import run_ranks
    from synth.export import torch_script
    from synth.export.plan import PlanEntry, build_plan
    from synth.export.provenance import Provenance

    with emulated_cluster(setup.topology, scale=parse_scale(setup.scale), name=name) as cluster:
        for case in todo:
            listed = programs(case.hierarchy)
            plan = build_plan(PlanEntry(case.hierarchy, program) for program in listed)
            argv = ("python", "-m", "benchmarks.accuracy", "run", "--case", case.key)
            path = _raw_path(case, rep, sizes)
            path.parent.mkdir(parents=True, exist_ok=True)
            script = scratch / f"{case.key}-rep{rep}.py"
            script.write_text(torch_script.render(plan, Provenance(argv)), encoding="utf-8")
            arguments = ["--backend", "gloo", "--iters", str(iters), "--warmup", str(warmup)]
            arguments += ["--check"] if rep == 0 else []  # checked once; later repetitions only time
            for nbytes in sizes:
                arguments += ["--bytes", str(nbytes)]
            load, busy = _wait_for_quiet(max_busy, max_wait)
            started = datetime.now(timezone.utc)
            print(f"[{started:%H:%M:%S}] rep {rep} {case.key}: {len(listed)} programs, load {load[0]:.2f}, "
                  f"CPU busy before {busy:.0%}",
                  flush=True)
            result = run_ranks(cluster, script, cluster.device_count, arguments, timeout=3600)
            script.unlink()
            if result.report is None or result.returncode != 0:
                write_text(path.with_suffix(".log"), result.log)
                print(f"  FAILED (exit {result.returncode}); log in {path.with_suffix('.log')}", flush=True)
                continue
            record = {"topology": case.topology, "scale": cluster.scale, "axes": case.axes,
                      "placement": case.placement, "request": case.request, "rep": rep,
                      "programs": [str(p) for p in listed], "default": str(default_program(case.hierarchy)),
                      "date": started.isoformat(timespec="seconds"), "load_before": load, "cpu_busy_before": busy,
                      "load_after": os.getloadavg(), "machine": machine_description(),
                      "seconds": (datetime.now(timezone.utc) - started).total_seconds(),
                      "report": result.report}
            write_text(path, json.dumps(record))


# --- the topologies predictions use ----------------------------------------------------------------

CALIBRATION_MIN_BYTES = 65536  # below, a call rides the tbf burst (16 KiB on veths, 128 KiB on loopback)


def calibration_rows(setup: Setup, rows: list[dict]) -> list[dict]:
    """The microbenchmark rows calibration uses: 64 KiB and up, and not the outermost level of
    a 3-level system, whose one-group tests push every flow through a node uplink slower than
    the level's own (so its uplink is not identified; it keeps the emulated rate)."""
    topology = load_topology(setup.topology)
    skip = {topology.level_names[0]} if len(topology.levels) > 2 else set()
    return [row for row in rows if int(row["bytes"]) >= CALIBRATION_MIN_BYTES and row["level"] not in skip]


def variant_path(topology: str, suffix: str) -> Path:
    """Where a topology variant of the campaign lives: the chosen calibration is the built-in
    topologies/<topology>-gloo.toml, the others sit in topologies/calibrated/."""
    return TOPOLOGIES / f"{topology}-{suffix}.toml" if suffix == CHOSEN else CALIBRATED / f"{topology}-{suffix}.toml"


def prepare(setups) -> None:
    """Write, per emulated topology, the base files (as shaped, with and without the fabric)
    and calibrate each from results/accuracy/microbench-<topology>.csv with `synth calibrate`;
    the chosen calibration becomes the built-in topology <topology>-gloo."""
    import subprocess

    from synth.topology_file import render_topology
    from synth.emulate.layout import emulated_figures, parse_scale, shaped_topology

    directory = STUDY
    CALIBRATED.mkdir(parents=True, exist_ok=True)
    for setup in setups:
        topology, scale = load_topology(setup.topology), parse_scale(setup.scale)
        name = setup.topology
        bases = {"emulated": (emulated_figures(topology, scale), "synth.emulate.layout.emulated_figures"),
                 "shaped": (shaped_topology(topology, scale), "synth.emulate.layout.shaped_topology")}
        for suffix, (figures, how) in bases.items():
            write_text(variant_path(name, suffix), render_topology(figures, f"{name} at scale {setup.scale} ({how})"))
        with (directory / f"microbench-{name}.csv").open(encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            rows, columns = list(reader), reader.fieldnames
        selected = calibration_rows(setup, rows)
        data = directory / f"microbench-{name}-calibration.csv"
        with writing(data, newline="") as handle:
            writer = csv.DictWriter(handle, columns)
            writer.writeheader()
            writer.writerows(selected)
        for suffix, base in ((CHOSEN, "emulated"), ("gloo-all", "emulated"), ("shaped-gloo", "shaped")):
            source = directory / f"microbench-{name}.csv" if suffix == "gloo-all" else data
            target = variant_path(name, suffix)
            subprocess.run([sys.executable, "-m", "synth", "calibrate", str(source), "-t",
                            str(variant_path(name, base)), "--backend", "gloo", "-o", str(target)],
                           check=True, stdout=subprocess.DEVNULL)
            if suffix == CHOSEN:
                ship(target, name, setup.scale, source)
            print(f"wrote {target} from {source.name}")


def ship(path: Path, name: str, scale: str, source: Path) -> None:
    """Make the calibration at `path` the built-in topology <name>-gloo: its name, a description
    that says where it was calibrated, and a header saying how to use it."""
    from dataclasses import replace

    from synth.topology_file import render_topology

    calibrated = load_topology(path)
    description = calibrated.description.replace(
        "Emulated at scale", "Calibrated for gloo on the emulated cluster (synth emulate) at scale")
    header = (f"{name} as the emulated cluster runs it at scale {scale} with gloo, calibrated there by the\n"
              f"accuracy campaign (docs/accuracy.md): `synth calibrate` on the microbenchmarks in\n"
              f"{source.as_posix()}, by `python -m benchmarks.accuracy prepare`.\n"
              f"Predict emulated runs with it:\n"
              f"  synth bench --emulate {name} --scale {scale} -t {name}-{CHOSEN} ...\n"
              f"  synth rank --topology {name}-{CHOSEN} --backend gloo ...")
    write_text(path, render_topology(replace(calibrated, name=f"{name}-{CHOSEN}", description=description), header))


# --- reporting ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    case: Case
    program: str
    default: bool
    nbytes: int
    measured_s: float  # median over repetitions
    spread: float  # (max - min) / median over repetitions
    reps: int
    wrong: int


def observations(setups, raw: Path = RAW) -> list[Observation]:
    """Every measured program, the median of its repetitions, with its case."""
    result = []
    for setup in setups:
        for case in cases(setup):
            records = [json.loads(path.read_text()) for path in sorted((raw / case.key).glob("rep*.json"))]
            if not records:
                continue
            times: dict[tuple[str, int], list[float]] = {}
            wrong: dict[tuple[str, int], int] = {}
            for record in records:
                for row in record["report"]["results"]:
                    key = (record["programs"][row["program"]], row["bytes"])
                    times.setdefault(key, []).append(row["time_us"] / 1e6)
                    wrong[key] = wrong.get(key, 0) + (row["wrong"] or 0)
            default = records[0]["default"]
            for (program, nbytes), values in sorted(times.items()):
                median = statistics.median(values)
                result.append(Observation(case, program, program == default, nbytes, median,
                                          (max(values) - min(values)) / median, len(values), wrong[program, nbytes]))
    return result


def predict(observed: list[Observation], topologies: dict[str, Topology],
            pipelined: bool = False) -> dict[tuple[str, str, int], float]:
    """Predicted seconds per (case key, program, bytes) on the given topology of each case's:
    the lockstep sum of step times, or with `pipelined` the pipelined estimate
    (synth/model/estimate.py), through the costing engine as synth rank costs them."""
    from synth.search.rank import Ranker
    from synth.model.context import cost_context

    rankers: dict[str, Ranker] = {}
    wanted: dict[tuple[str, int], list[Observation]] = {}
    for obs in observed:
        if obs.case.key not in rankers:
            context = cost_context(obs.case.hierarchy, topologies[obs.case.topology], "gloo")
            rankers[obs.case.key] = Ranker(context, MAX_LEN, "pipelined" if pipelined else "lockstep")
        wanted.setdefault((obs.case.key, obs.nbytes), []).append(obs)
    result = {}
    for (key, nbytes), rows in wanted.items():
        ranker = rankers[key]
        programs = ranker.programs([parse_program(obs.program) for obs in rows])
        times = ranker.times(programs, [nbytes])[:, 0]
        for i, obs in enumerate(rows):
            result[key, obs.program, nbytes] = float(times[i])
    return result


def evaluate(observed, predicted, k: int = 10) -> list[tuple[Case, int, CaseMetrics]]:
    grouped: dict[tuple[str, int], list[Observation]] = {}
    for obs in observed:
        grouped.setdefault((obs.case.key, obs.nbytes), []).append(obs)
    result = []
    for (key, nbytes), rows in grouped.items():
        table = [Measured(o.program, predicted[key, o.program, nbytes], o.measured_s, o.default) for o in rows]
        result.append((rows[0].case, nbytes, case_metrics(table, k)))
    return result


def _fmt(value: float, digits: int = 2) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _summary_rows(label: str, metrics: list[CaseMetrics]) -> str:
    s = summarize(metrics)
    return (f"| {label} | {s.cases} | {sum(m.programs for m in metrics)} | {s.top1:.0%} | {s.top1_within_5pct:.0%} | "
            f"{s.topk:.0%} | {_fmt(s.spearman_mean)} / {_fmt(s.spearman_median)} | {_fmt(s.slowdown_geomean, 3)} / "
            f"{_fmt(s.slowdown_max, 3)} | {_fmt(s.speedup_geomean)} / {_fmt(s.speedup_min)} | "
            f"{_fmt(s.possible_speedup_geomean)} / {_fmt(s.possible_speedup_max)} |")


SUMMARY_HEADER = ("| predicted on | cases | (program, placement) pairs | top-1 | first within 5% | top-10 | "
                  "Spearman mean / median | top-10 slowdown geomean / max | speedup of 1st choice over default, "
                  "geomean / min | speedup of the measured best over default, geomean / max |\n"
                  "|---|---|---|---|---|---|---|---|---|---|")


def plot(observed, panels: dict[str, dict], path: Path, title: str) -> None:
    """Predicted vs measured, log-log, one panel per prediction variant, same axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, ScalarFormatter

    figure, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 6.2), squeeze=False)
    colors = {"emu-2x4": "tab:blue", "emu-2x2x2": "tab:orange", "emu-4x2": "tab:green"}
    values = [o.measured_s * 1e3 for o in observed]
    values += [v * 1e3 for predicted in panels.values() for v in predicted.values()]
    low, high = min(values) / 1.3, max(values) * 1.3
    for axis, (label, predicted) in zip(axes[0], panels.items()):
        for topology, nbytes in sorted({(o.case.topology, o.nbytes) for o in observed}):
            rows = [o for o in observed if o.case.topology == topology and o.nbytes == nbytes]
            defaults = [o for o in rows if o.default]
            axis.scatter([predicted[o.case.key, o.program, o.nbytes] * 1e3 for o in rows],
                         [o.measured_s * 1e3 for o in rows], s=10, alpha=0.45, color=colors.get(topology),
                         marker="o" if nbytes == SIZES[0] else "s", label=f"{topology}, {nbytes // 1024} KiB ({len(rows)})")
            axis.scatter([predicted[o.case.key, o.program, o.nbytes] * 1e3 for o in defaults],
                         [o.measured_s * 1e3 for o in defaults], s=60, marker="*", edgecolor="black", linewidth=0.5,
                         color=colors.get(topology))
        axis.plot([low, high], [low, high], color="gray", linewidth=1, label="measured = predicted")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlim(low, high)
        axis.set_ylim(low, high)
        for ticks in (axis.xaxis, axis.yaxis):
            ticks.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ticks.set_major_formatter(ScalarFormatter())
            ticks.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axis.set_xlabel("predicted time (ms)")
        axis.set_ylabel("measured time, median of repetitions (ms)")
        axis.set_title(label, fontsize=10)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8, loc="upper left", title="stars: default all-reduce", title_fontsize=8)
    figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


VARIANTS = (  # label, file suffix (<topology>-<suffix>.toml, see variant_path), pipelined; the first is the main one
    ("calibrated (>= 64 KiB), fabric, pipelined (the chosen estimate)", "gloo", True),
    ("calibrated (>= 64 KiB), fabric, lockstep sum", "gloo", False),
    ("calibrated (all sizes), fabric, lockstep sum", "gloo-all", False),
    ("emulated rates, fabric, lockstep sum", "emulated", False),
    ("emulated rates, fabric, pipelined", "emulated", True),
    ("calibrated (>= 64 KiB), per-device links, lockstep sum (before)", "shaped-gloo", False),
    ("emulated rates, per-device links, lockstep sum (before)", "shaped", False),
)


def variant_topologies(setups, suffix: str) -> dict[str, Topology] | None:
    paths = {s.topology: variant_path(s.topology, suffix) for s in setups}
    if not all(path.exists() for path in paths.values()):
        return None
    return {name: load_topology(path) for name, path in paths.items()}


def report(setups, output: Path, extra: dict[str, str]) -> None:
    observed = observations(setups)
    if not observed:
        raise SystemExit("no measurements under results/accuracy/raw: run 'python -m benchmarks.accuracy run'")
    variants = {label: (topologies, pipelined) for label, suffix, pipelined in VARIANTS
                if (topologies := variant_topologies(setups, suffix)) is not None}
    predictions = {label: predict(observed, *variant) for label, variant in variants.items()}
    evaluated = {label: evaluate(observed, predicted) for label, predicted in predictions.items()}
    main_label = VARIANTS[0][0]
    lines = ["# The simulator against the emulated cluster", "",
             "Command: `python -m benchmarks.accuracy report` (measurements: `python -m benchmarks.accuracy run`)",
             "", "How to reproduce, what the variants mean and why the misses happen: docs/accuracy.md.",
             "", f"Machine: {machine_description()}", "", f"Report date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}", ""]
    records = [json.loads(p.read_text()) for p in sorted(RAW.glob("*/rep*.json"))]
    loads = [r["load_before"][0] for r in records]
    busy = [r.get("cpu_busy_before", float("nan")) for r in records]
    dates = sorted(r["date"] for r in records)
    lines += [f"Measured {dates[0]} to {dates[-1]}: {len(records)} launches, "
              f"{sum(r['seconds'] for r in records) / 60:.1f} min of runs; 1-minute load average before a launch "
              f"{min(loads):.2f} to {max(loads):.2f} (median {statistics.median(loads):.2f}); gloo, "
              f"{records[0]['report']['iters']} timed iteration(s) after {records[0]['report']['warmup']} warm-up run(s) "
              f"per repetition; every program passed --check: {all(o.wrong == 0 for o in observed)}. The load average "
              f"includes the previous launch's own ranks; the CPU share busy with other work in the 2+ s before a "
              f"launch (nothing of ours running) was median {statistics.median(busy):.0%}, max {max(busy):.0%}.", ""]
    reps = sorted({o.reps for o in observed})
    spreads = sorted(o.spread for o in observed)
    lines += [f"Repetitions per program: {', '.join(map(str, reps))}; spread (max-min)/median over repetitions: "
              f"median {statistics.median(spreads):.1%}, 90th percentile {spreads[int(0.9 * (len(spreads) - 1))]:.1%}.", ""]
    lines += [f"## Overall, at the campaign's size ({', '.join(f'{n // 1024} KiB' for n in SIZES)} per device)", "",
              SUMMARY_HEADER]
    for label, results in evaluated.items():
        lines.append(_summary_rows(label, [m for _, n, m in results if n in SIZES]))
        big = [m for _, n, m in results if m.programs >= 10 and n in SIZES]
        if big:
            lines.append(_summary_rows(f"{label}, cases with >= 10 programs", big))
    others = sorted({n for _, n, _ in evaluated[main_label]} - set(SIZES))
    for nbytes in others:
        lines += ["", f"## The cases also run at {nbytes // 1024} KiB per device", "", SUMMARY_HEADER]
        for label, results in evaluated.items():
            keys = {c.key for c, n, _ in results if n == nbytes}
            for size in (*SIZES, nbytes):
                subset = [m for c, n, m in results if n == size and c.key in keys]
                lines.append(_summary_rows(f"{label}, {size // 1024} KiB", subset))
    lines += ["", "## Per topology and size (calibrated, pipelined)", "", SUMMARY_HEADER]
    results = evaluated[main_label]
    for topology in sorted({c.topology for c, _, _ in results}):
        for nbytes in sorted({n for _, n, _ in results}):
            subset = [m for c, n, m in results if c.topology == topology and n == nbytes]
            if subset:
                lines.append(_summary_rows(f"{topology}, {nbytes // 1024} KiB", subset))
    lines += ["", "## Per case (calibrated, pipelined)", "",
              "| topology | axes | placement | request | bytes | programs | top-1 | top-10 | Spearman | top-10 slowdown | "
              "speedup 1st/default | speedup best/default | measured best | simulator's first (measured / best) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for case, nbytes, m in sorted(results, key=lambda item: (item[0].key, item[1])):
        lines.append(f"| {case.topology} | {case.axes} | `{case.placement}` | {case.request} | {nbytes} | {m.programs} | "
                     f"{'yes' if m.top1 else 'no'} | {'yes' if m.topk else 'no'} | {_fmt(m.spearman)} | "
                     f"{m.slowdown_topk:.3f} | {_fmt(m.speedup_first_over_default)} | {_fmt(m.speedup_best_over_default)} | "
                     f"`{m.best_program}` | "
                     f"`{m.first_program}` ({m.first_within:.3f}) |")
    first = observations(setups, FIRST_RAW) if FIRST_RAW.exists() else []
    if first:
        first_records = [json.loads(p.read_text()) for p in sorted(FIRST_RAW.glob("*/rep*.json"))]
        first_dates = sorted(r["date"] for r in first_records)
        lines += ["", "## The first campaign, re-predicted", "",
                  f"The measurements of the first campaign ({first_dates[0][:10]} to {first_dates[-1][:10]}, "
                  f"{len(first_records)} launches, `{FIRST_RAW}`), predicted by each variant on today's calibrated "
                  "topologies (fitted on today's microbenchmarks).", "", SUMMARY_HEADER]
        for label, variant in variants.items():
            first_evaluated = evaluate(first, predict(first, *variant))
            for nbytes in sorted({n for _, n, _ in first_evaluated}):
                lines.append(_summary_rows(f"{label}, {nbytes // 1024} KiB",
                                           [m for _, n, m in first_evaluated if n == nbytes]))
    for label, text in extra.items():
        lines += ["", f"## {label}", "", text]
    lines += ["", "![predicted vs measured](predicted-vs-measured.png)", ""]
    write_text(output, "\n".join(lines))

    with writing(STUDY / "measurements.csv", newline="") as handle:
        writer = csv.writer(handle)
        labels = list(predictions)
        writer.writerow(["topology", "axes", "placement", "request", "program", "default", "bytes", "measured_s",
                         "spread", "reps", "wrong", *[f"predicted_s[{label}]" for label in labels]])
        for o in observed:
            writer.writerow([o.case.topology, o.case.axes, o.case.placement, o.case.request, o.program, o.default,
                             o.nbytes, f"{o.measured_s:.6g}", f"{o.spread:.3f}", o.reps, o.wrong,
                             *[f"{predictions[label][o.case.key, o.program, o.nbytes]:.6g}" for label in labels]])
    summary = {label: {"overall": asdict(summarize([m for _, _, m in res])),
                       "cases": [dict(topology=c.topology, axes=c.axes, placement=c.placement, request=c.request,
                                      bytes=n, **asdict(m)) for c, n, m in res]}
               for label, res in evaluated.items()}
    write_text(STUDY / "summary.json", json.dumps(summary, indent=1))
    shown = [label for label in (VARIANTS[6][0], VARIANTS[1][0], VARIANTS[0][0]) if label in predictions]
    plot(observed, {label: predictions[label] for label in shown}, STUDY / "predicted-vs-measured.png",
         f"gloo on the emulated cluster: {len(observed)} (program, placement, size) medians")
    print(f"wrote {output}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="measure (skips what results/accuracy/raw already holds)")
    run.add_argument("--only", action="append", default=[], help="a topology of the campaign (repeatable)")
    run.add_argument("--reps", type=int, default=3)
    run.add_argument("--iters", type=int, default=3)
    run.add_argument("--warmup", type=int, default=1)
    run.add_argument("--name", default="synthacc", help="emulated cluster name")
    run.add_argument("--max-busy", type=float, default=0.3, help="wait until the CPU is busier than this only with others")
    run.add_argument("--max-wait", type=float, default=120.0, help="seconds to wait for that before each launch")
    run.add_argument("--case", action="append", default=[],
                     help="only the case with this key (the directory name under results/accuracy/raw); repeatable")
    run.add_argument("--bytes", action="append", type=int, help=f"sizes per device (default {SIZES[0]})")
    sub.add_parser("prepare", help="write the base topologies and calibrate them from the microbenchmarks")
    rep = sub.add_parser("report", help="predict, compare, write results/accuracy/README.md and its data")
    for command in (rep, sub.choices["prepare"]):
        command.add_argument("--only", action="append", default=[])
    rep.add_argument("--notes", help="a Markdown file appended to the report")
    args = parser.parse_args(argv)
    setups = [s for s in CAMPAIGN if not args.only or s.topology in args.only]
    if args.command == "prepare":
        prepare(setups)
    elif args.command == "run":
        measure(setups, args.reps, args.iters, args.warmup, tuple(args.bytes or SIZES), args.name, args.case, args.max_busy,
                args.max_wait)
    else:
        extra = {"Notes": Path(args.notes).read_text(encoding="utf-8")} if args.notes else {}
        report(setups, STUDY / REPORT, extra)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
