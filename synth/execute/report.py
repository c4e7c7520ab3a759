"""Benchmark rows from a torch script's report, and the CSV they are written to.

One row per program and buffer size, with the measured time, algbw and busbw (nccl-tests'
definitions, docs/model.md section 8), whether the check passed, and the rank by measured time among
the programs at that size (1 = fastest). The plain all_reduce baseline rows the script also
measures are kept, unranked. A row carries a simulator prediction when one was made: the
CSV then gains the predicted columns and the simulator's rank, side by side.
"""

from __future__ import annotations

import csv
import os
import platform
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from synth.analysis.goal_rank import goal_program_times
from synth.collectives import collective
from synth.export.plan import ITEMSIZE, PlanEntry, buffer_count
from synth.goals import DEFAULT_GOAL, parse_goal
from synth.lowering import lower
from synth.model.context import cost_context
from synth.model.cost import program_cost
from synth.model.engine import CostEngine
from synth.model.estimate import Estimate, resolve_estimate
from synth.topology import Topology


@dataclass(frozen=True)
class Prediction:
    seconds: float
    algbw: float  # bytes/s
    busbw: float  # bytes/s
    rank: int  # by predicted time among the programs at this size, 1 = fastest


@dataclass(frozen=True)
class BenchRow:
    placement: str
    hierarchy: str
    role: str  # "synthesized", "default all-reduce" (or "flat <Collective>"), "baseline all_reduce" (or the goal's call)
    program: str
    nbytes: int
    count: int
    seconds: float
    algbw: float  # bytes/s
    busbw: float  # bytes/s
    check: str  # "ok", "FAILED" or "not run"
    measured_rank: int | None = None
    prediction: Prediction | None = None


@dataclass(frozen=True)
class EntryInfo:
    """What the report cannot know about program i of the plan."""

    placement: str
    hierarchy: str
    role: str
    program: str


def predictions(entries: list[PlanEntry], topology: Topology, backend: str,
                sizes: list[int], estimate: str | Estimate | None = None) -> dict[tuple[int, int], Prediction]:
    """The model's figures for plan entry i at each size, keyed (i, bytes) with the bytes
    the script really runs (rounded up to whole chunks); ranked per size like the measurements."""
    estimate = resolve_estimate(estimate)
    engines: dict[int, CostEngine] = {}
    costs = {}
    for index, entry in enumerate(entries):
        key = id(entry.hierarchy)
        if key not in engines:
            engines[key] = CostEngine(cost_context(entry.hierarchy, topology, backend))
        engine = engines[key]
        if not entry.goal.is_all_reduce:  # costed as the Ranker costs them (synth/search/rank.py)
            goal = entry.goal
            group = entry.hierarchy.group_size
            counts = [buffer_count(size, group) * ITEMSIZE for size in sizes]
            times = goal_program_times(engine.context, goal, [entry.program], counts, estimate)[0]
            factor = collective(goal.collective).bus_factor(group)
            for nbytes, time in zip(counts, times):
                algbw = nbytes / float(time)
                costs[index, nbytes] = (float(time), algbw, algbw * factor)
            continue
        lowered = lower(entry.program, entry.hierarchy)
        for size in sizes:
            nbytes = buffer_count(size, entry.hierarchy.group_size) * ITEMSIZE
            cost = program_cost(engine.context, lowered, nbytes, estimate, engine)
            costs[index, nbytes] = (cost.time_s, cost.algbw, cost.busbw)
    result = {}
    for nbytes in {key[1] for key in costs}:
        order = sorted((key for key in costs if key[1] == nbytes), key=lambda key: (costs[key][0], key[0]))
        for rank, key in enumerate(order, start=1):
            result[key] = Prediction(*costs[key], rank)
    return result


def rows_from_report(report: dict, entries: list[EntryInfo],
                     predicted: dict[tuple[int, int], Prediction] | None = None) -> list[BenchRow]:
    rows = []
    for result in report["results"]:
        entry = entries[result["program"]]
        wrong = result["wrong"]
        prediction = (predicted or {}).get((result["program"], result["bytes"]))
        rows.append(BenchRow(entry.placement, entry.hierarchy, entry.role, entry.program, result["bytes"],
                             result["count"], result["time_us"] / 1e6, result["algbw_gbs"] * 1e9,
                             result["busbw_gbs"] * 1e9, "not run" if wrong is None else ("ok" if wrong == 0 else "FAILED"),
                             prediction=prediction))
    rows = _ranked(rows)
    for result in report["baselines"]:
        entry = entries[result["programs"][0]]
        call = parse_goal(result.get("goal", DEFAULT_GOAL)).torch_call  # the runtime's baseline (torch_runtime.flat_call)
        rows.append(BenchRow(entry.placement, entry.hierarchy, f"baseline {call}", f"torch.distributed.{call}",
                             result["bytes"], result["count"], result["time_us"] / 1e6, result["algbw_gbs"] * 1e9,
                             result["busbw_gbs"] * 1e9, "not run"))
    return rows


def _ranked(rows: list[BenchRow]) -> list[BenchRow]:
    """Rank by measured time among the rows of one buffer size."""
    result = list(rows)
    for nbytes in {row.nbytes for row in rows}:
        indices = sorted((i for i, row in enumerate(rows) if row.nbytes == nbytes), key=lambda i: rows[i].seconds)
        for rank, i in enumerate(indices, start=1):
            result[i] = replace(rows[i], measured_rank=rank)
    return result


def machine_lines() -> list[str]:
    processor = platform.processor() or platform.machine()
    return [f"machine: {platform.node()} ({processor}, {os.cpu_count()} cores, {platform.system()} {platform.release()})",
            f"python: {platform.python_version()}"]


def results_path(directory: Path, stem: str = "bench") -> Path:
    """A new file name under `directory` stamped with the local date and time."""
    directory.mkdir(parents=True, exist_ok=True)
    base = f"{stem}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    path, suffix = directory / f"{base}.csv", 1
    while path.exists():
        path, suffix = directory / f"{base}-{suffix}.csv", suffix + 1
    return path


def write_csv(path: Path, rows: list[BenchRow], header: list[str]) -> None:
    """Comment lines (`# ...`, read with pandas' comment='#'), then one row per measurement."""
    predicted = any(row.prediction is not None for row in rows)
    columns = ["placement", "hierarchy", "role", "program", "bytes", "count", "time_us", "algbw_gbs", "busbw_gbs",
               "check", "measured_rank"]
    if predicted:
        columns += ["predicted_time_us", "predicted_algbw_gbs", "predicted_busbw_gbs", "simulator_rank"]
    from synth.output_files import writing

    with writing(path, newline="") as handle:
        for line in header:
            handle.write(f"# {line}\n")
        writer = csv.writer(handle)
        writer.writerow(columns)
        for row in rows:
            values = [row.placement, row.hierarchy, row.role, row.program, row.nbytes, row.count,
                      f"{row.seconds * 1e6:.3f}", f"{row.algbw / 1e9:.6g}", f"{row.busbw / 1e9:.6g}", row.check,
                      "" if row.measured_rank is None else row.measured_rank]
            if predicted:
                p = row.prediction
                values += ["", "", "", ""] if p is None else [f"{p.seconds * 1e6:.3f}", f"{p.algbw / 1e9:.6g}",
                                                             f"{p.busbw / 1e9:.6g}", p.rank]
            writer.writerow(values)


# --- notes: predictions that do not apply ----------------------------------------------------

FAR_OFF = 2.0  # predicted / measured beyond this factor (either way): the figures are not this run's
SHARED_GPUS_NOTE = ("several ranks shared one GPU, so NCCL connected them over its socket transport: the predicted "
                    "columns are {topology}'s links, not this run's transport")


def calibrated_setup(topology: Topology) -> tuple[frozenset[str], str | None]:
    """(the backends the topology's figures were fitted for, the emulated cluster's scale when
    they were fitted there): from its [[calibration]] records and its figures' sources, and its
    description ("... on the emulated cluster ... at scale 1/256", as the shipped ones say)."""
    import re

    backends = {record.backend for record in topology.calibration if record.backend}
    for level in topology.levels:
        for figure in (level.bandwidth, level.latency):
            source = figure.source if figure is not None else ""
            found = re.match(r"fitted by synth calibrate \((?:backend (\w+)|(NCCL) model)", source)
            if found:
                backends.add((found.group(1) or found.group(2)).lower())
    scale = None
    if "emulated cluster" in topology.description:
        found = re.search(r"at scale ([0-9./]+[0-9])", topology.description)
        scale = found.group(1) if found else "?"
    return frozenset(backends), scale


def setup_notes(topology: Topology, backend: str, emulated: bool, scale: str | None) -> list[str]:
    """What makes the predicted columns not this run's: a calibration for another backend, or
    made on the emulated cluster when this run is not emulated (or the other way round)."""
    backends, calibrated_scale = calibrated_setup(topology)
    notes = []
    if backends and backend not in backends:
        notes.append(f"{topology.name} was calibrated with {'/'.join(sorted(backends))} measurements and this run uses "
                     f"{backend}: the predicted columns are another library's times; calibrate from this run's CSV "
                     f"(synth calibrate CSV -t {topology.name} -o mine.toml) and pass it with -t")
    if calibrated_scale is not None and not emulated:
        notes.append(f"{topology.name} was calibrated on the emulated cluster (synth emulate) at scale "
                     f"{calibrated_scale} and this run is not emulated: the predicted columns are the emulated links' "
                     f"times, not this machine's; run it on the emulated cluster, or calibrate from this run's CSV")
    elif calibrated_scale is not None and scale is not None and _fraction(scale) != _fraction(calibrated_scale):
        notes.append(f"{topology.name} was calibrated on the emulated cluster at scale {calibrated_scale}, this run "
                     f"emulates scale {scale}: emulate scale {calibrated_scale}")
    elif backends and calibrated_scale is None and emulated:
        notes.append(f"{topology.name} was not calibrated on the emulated cluster: the predicted columns are another "
                     f"system's times")
    return notes


def _fraction(text: str):
    from fractions import Fraction

    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return text


def far_off_note(rows: list[BenchRow], topology: Topology) -> str | None:
    """A note when the predictions are far from what was measured (median ratio over rows)."""
    ratios = sorted(row.prediction.seconds / row.seconds for row in rows
                    if row.prediction is not None and row.seconds > 0 and row.prediction.seconds > 0)
    if not ratios:
        return None
    median = ratios[len(ratios) // 2]
    if 1 / FAR_OFF <= median <= FAR_OFF:
        return None
    how = f"{median:.3g}x the measured times" if median > 1 else f"1/{1 / median:.3g} of the measured times"
    return (f"the predictions are {how} (median over {len(ratios)} rows, {ratios[0]:.3g}x to {ratios[-1]:.3g}x): "
            f"{topology.name}'s figures do not describe this run; the predicted columns rank the programs, they do "
            f"not time them here; calibrate from this CSV (synth calibrate CSV -t {topology.name} -o mine.toml)")
