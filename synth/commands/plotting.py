"""`--plot FILE` on rank, plan, calibrate and topologies (the option: common.add_plot_option): its
checks before any work, and the step from what each command computed to the values a picture
draws (synth/plots/).

Nothing is computed again for a picture: each adapter takes the rows, results or errors the
command already has. matplotlib (the `plot` extra) is loaded only when --plot is given.
"""

from __future__ import annotations

import math
import os
import sys

from synth.commands.common import flagged
from synth.errors import UsageError
from synth.names import echo
from synth.text import escaped

RANK_PROGRAMS = 4  # programs drawn per placement without --top (with it: --top's, at most MAX_PROGRAMS)
MAX_PROGRAMS = 8
MAX_PANELS = 6
PLAN_BARS = 5  # the winner and the next candidates, side by side in the step-time bars


def check_plot(args) -> None:
    """Refuse a --plot file that cannot be written, before any work: its suffix, its directory,
    and matplotlib being there."""
    path = getattr(args, "plot", None)
    if path is None:
        return
    from synth.plots.figure import plot_format, pyplot

    with flagged("--plot"):
        plot_format(path)
        directory = os.path.dirname(path) or "."
        if not os.path.isdir(directory):
            raise UsageError(f"{echo(path)}: no directory {echo(directory)}; create it or give another file")
        if os.path.isdir(path):
            raise UsageError(f"{echo(path)} is a directory; give a file name such as {os.path.join(path, 'plot.png')!r}")
        pyplot()


def wrote(path: str) -> None:
    """Say where the picture went, on stderr (stdout stays the table or the JSON)."""
    print(f"wrote {escaped(path)}", file=sys.stderr)


# --- synth rank --------------------------------------------------------------------------------------


def plot_rank(args, topology_name: str, sections, held, goal) -> None:
    """The ranked sections (size, hierarchy, bounds, rows), grouped by placement, as time or busbw
    curves over the sizes; `held` the held-out error per hierarchy and size."""
    from synth.plots.rank import draw_rank

    by_hierarchy: dict[int, tuple] = {}
    for size, hierarchy, bounds, rows in sections:
        by_hierarchy.setdefault(id(hierarchy), (hierarchy, []))[1].append((size, bounds, rows))
    panels = [_rank_panel(args, hierarchy, ranked, held.get(id(hierarchy), {}))
              for hierarchy, ranked in list(by_hierarchy.values())[:MAX_PANELS]]
    what = "all-reduce" if goal.is_all_reduce else goal.collective
    title = (f"{topology_name}: {what} over {','.join(sections[0][1].reduce_axes)}, {args.backend} model, "
             f"{args.estimate} estimate")
    note = ""
    if len(by_hierarchy) > MAX_PANELS:
        note = f"the first {MAX_PANELS} of {len(by_hierarchy)} placements; pick one with --placement"
    with flagged("--plot"):
        draw_rank(panels, args.plot_metric, title, args.plot, note)
    wrote(args.plot)


def _rank_panel(args, hierarchy, ranked, errors):
    """One placement's panel from its (size, bounds, rows) in size order and its held-out
    `errors` by size (empty: none known)."""
    from synth.plots.figure import short_program
    from synth.plots.rank import Curve, RankPanel
    from synth.units import format_bytes

    sizes = tuple(size for size, _, _ in ranked)
    flats = [next(row for row in rows if row.baseline) for _, _, rows in ranked]
    value = (lambda row: row.time_s) if args.plot_metric == "time" else (lambda row: row.busbw_GBps)
    curves = []
    for program in _chosen_programs([rows for _, _, rows in ranked], min(args.top or RANK_PROGRAMS, MAX_PROGRAMS)):
        at = [next((row for row in rows if not row.baseline and str(row.program) == program), None)
              for _, _, rows in ranked]
        size, last = next((size, row) for size, row in zip(reversed(sizes), reversed(at)) if row is not None)
        curves.append(Curve(f"{short_program(last.program)}   x{last.speedup:.2f} at {format_bytes(size)}",
                            tuple(value(row) if row is not None else math.nan for row in at)))
    if args.plot_metric == "time":
        bound = tuple(bounds[0].time_s for _, bounds, _ in ranked)
    else:  # busbw is inversely proportional to time at one size: the bound's busbw by the flat call's
        bound = tuple(flat.busbw_GBps * flat.time_s / bounds[0].time_s if bounds[0].time_s > 0 else math.nan
                      for flat, (_, bounds, _) in zip(flats, ranked))
    error = tuple(errors[size].median if errors.get(size) is not None else math.nan for size in sizes)
    levels = ",".join(f"{level.name}={level.size}" for level in hierarchy.levels)
    return RankPanel(f"placement {hierarchy.placement.to_text()}  ({levels})", sizes,
                     Curve(f"flat call: {short_program(flats[0].program)}", tuple(value(flat) for flat in flats)),
                     tuple(curves), Curve("lower bound", bound), error if errors else ())


def _chosen_programs(rows_by_size, limit: int) -> list[str]:
    """The program fastest at each size (smallest first), then the next fastest at the largest
    size, up to `limit` (the flat call is drawn apart)."""
    chosen: list[str] = []
    for rows in rows_by_size:
        best = next((row for row in rows if not row.baseline), None)
        if best is not None and str(best.program) not in chosen:
            chosen.append(str(best.program))
    for row in rows_by_size[-1]:
        if not row.baseline and str(row.program) not in chosen:
            chosen.append(str(row.program))
    return chosen[:limit]


# --- synth plan --------------------------------------------------------------------------------------


def plot_plan(path: str, result, where_time_goes) -> None:
    """The plan's ranked rows and Pareto set against memory, and the step terms of the winner and
    the next candidates (`where_time_goes(prediction)`: the terms the table shows)."""
    from synth.plots.plan import Candidate, StepBar, draw_plan

    def candidate(prediction) -> Candidate:
        return Candidate(prediction.step_s, prediction.memory.peak,
                         f"{prediction.degrees.text} {prediction.settings.text}")

    request = result.request
    bars = [StepBar(f"{prediction.degrees.text}\n{prediction.settings.text}",
                    tuple((what, seconds) for what, seconds, _ in where_time_goes(prediction)))
            for prediction in result.ranked[:PLAN_BARS]]
    title = (f"{request.model.name} on {request.topology.name} ({request.topology.device_count} x "
             f"{request.topology.device.name}), {request.backend} model")
    note = (f"{len(result.ranked)} fastest candidates of {result.evaluated} evaluated and the Pareto set; "
            f"{result.dropped_memory} candidates did not fit in memory")
    with flagged("--plot"):
        draw_plan([candidate(p) for p in result.ranked], [candidate(p) for p in result.pareto], bars,
                  request.compute.memory_bytes, title, path, note)
    wrote(path)


# --- synth calibrate ---------------------------------------------------------------------------------


def plot_calibration(path: str, measurements, errors, topology_name: str, model: str) -> None:
    """Each measurement against what the written topology predicts for it (the replay's
    `errors`, predicted / measured - 1, in the measurements' order), one series per file and collective."""
    from synth.plots.calibration import Series, draw_calibration

    groups: dict[tuple[str, str], list] = {}
    for measurement, error in zip(measurements, errors):
        if math.isfinite(float(error)) and measurement.time_s > 0:
            groups.setdefault((measurement.file, measurement.collective), []).append((measurement, float(error)))
    series = []
    for (file, collective), points in groups.items():
        points.sort(key=lambda point: point[0].bytes)
        series.append(Series(escaped(f"{os.path.basename(file)} ({collective})"),
                             tuple(m.bytes for m, _ in points), tuple(m.time_s for m, _ in points),
                             tuple(m.time_s * (1 + e) for m, e in points)))
    finite = [float(e) for e in errors if math.isfinite(float(e))]
    rms = math.sqrt(sum(e * e for e in finite) / len(finite)) if finite else 0.0
    left = len(errors) - len(finite)
    note = f"{len(finite)} measurements" + (f"; {left} without a finite prediction left out" if left else "")
    with flagged("--plot"):
        if not series:
            raise UsageError("no measurement has a finite prediction: nothing to draw")
        draw_calibration(series, rms, f"{escaped(topology_name)}: fitted under the {model} model", path, note)
    wrote(path)


# --- synth topologies NAME ---------------------------------------------------------------------------


def plot_topology(path: str, topology) -> None:
    from synth.plots.topology import draw_topology

    with flagged("--plot"):
        draw_topology(topology, path)
    wrote(path)
