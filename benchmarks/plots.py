"""Time-vs-size curves of the top programs against the default all-reduce, as PNG figures.

For one job on one system, at the placement `torch.distributed.init_device_mesh` gives (the
axes in order, the last innermost: rank = row-major index over the axes, docs/model.md section 2),
one column per reduction request: the programs that are fastest at some size of the sweep,
topped up with the next best at the largest size, each costed at every size, the default
all-reduce and the lower bound. The top row is time (log-log); the bottom row is each
program's time over the default all-reduce's, where a program below 1 beats it.

matplotlib runs on the Agg backend, so no display is ever needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402

from synth.hierarchy import build_hierarchy  # noqa: E402
from synth.language import parse_program  # noqa: E402
from synth.placement import Axis, Placement, enumerate_placements  # noqa: E402
from synth.search.programs import ProgramSets  # noqa: E402
from synth.search.rank import Ranker  # noqa: E402
from synth.analysis.sweep import reduction_requests, sweep_hierarchy  # noqa: E402
from synth.model.context import cost_context  # noqa: E402
from synth.plots.figure import ABBREVIATION_KEY, short_program  # noqa: E402
from synth.topology import Topology  # noqa: E402
from synth.units import format_bytes  # noqa: E402

TOP = 4  # programs per panel besides the default all-reduce
KEY = f"{ABBREVIATION_KEY}; x1.00 = speedup over the default all-reduce at the largest size"


def mesh_placement(topology: Topology, axes: tuple[Axis, ...]) -> Placement:
    """The placement init_device_mesh(mesh_shape=axis sizes) gives: rank = row-major axis index.
    When the axes do not nest into the levels no placement does that; the first is used."""
    placements = enumerate_placements(topology, axes)
    sizes = [axis.size for axis in axes]
    for placement in placements:
        if np.array_equal(np.ravel_multi_index(tuple(placement.axis_coordinates.T), sizes),
                          np.arange(placement.device_count)):
            return placement
    return placements[0]


def short(program: str) -> str:
    """`ReduceScatter(InsideGroup(gpu)); ...` as `RS(IG gpu) > ...` for legends."""
    return short_program(parse_program(program))


@dataclass(frozen=True)
class Curves:
    """Times at every size for the chosen programs of one (placement, request)."""

    reduce: str
    sizes: tuple[int, ...]
    baseline: str
    baseline_s: tuple[float, ...]
    bound_s: tuple[float, ...]
    programs: tuple[tuple[str, tuple[float, ...]], ...]  # (program, times), fastest at the largest size first

    def to_json(self) -> dict:
        return {"reduce": self.reduce, "sizes": list(self.sizes), "baseline": self.baseline,
                "baseline_s": list(self.baseline_s), "bound_s": list(self.bound_s),
                "programs": [{"program": p, "time_s": list(t)} for p, t in self.programs]}


def curves(topology: Topology, placement: Placement, request: tuple[str, ...], sizes: list[int],
           backend: str = "nccl", max_len: int = 5, top: int = TOP,
           program_sets: ProgramSets | None = None) -> Curves:
    hierarchy = build_hierarchy(placement, request)
    context = cost_context(hierarchy, topology, backend)
    program_sets = program_sets or ProgramSets()
    rows = sweep_hierarchy(context, sizes, program_sets.get(hierarchy, max_len))
    chosen = []
    for row in rows:  # the fastest program at each size, in order of size
        if row.best_length > 1 and row.best_program not in chosen:
            chosen.append(row.best_program)
    ranker = Ranker(context, max_len, sets=program_sets)
    for ranked in ranker.top(sizes[-1], top + 1):
        if len(chosen) >= top:
            break
        if not ranked.baseline and str(ranked.program) not in chosen:
            chosen.append(str(ranked.program))
    chosen = chosen[:top]
    times = {program: [] for program in chosen}
    baseline_s, baseline = [], ""
    subset = ranker.programs([parse_program(text) for text in chosen])
    for rows in ranker.rank(sizes, subset):
        for ranked in rows:
            if ranked.baseline:
                baseline = str(ranked.program)
                baseline_s.append(ranked.time_s)
            else:
                times[str(ranked.program)].append(ranked.time_s)
    order = sorted(chosen, key=lambda p: (times[p][-1], p))
    return Curves(",".join(request), tuple(sizes), baseline, tuple(baseline_s),
                  tuple(float(t) for t in ranker.bound_times(sizes)),
                  tuple((p, tuple(times[p])) for p in order))


def job_curves(topology: Topology, axes: tuple[Axis, ...], sizes: list[int], backend: str = "nccl",
               program_sets: ProgramSets | None = None) -> tuple[Placement, list[Curves]]:
    placement = mesh_placement(topology, axes)
    program_sets = program_sets or ProgramSets()
    return placement, [curves(topology, placement, request, sizes, backend, program_sets=program_sets)
                       for request in reduction_requests(axes)]


def plot(topology: Topology, axes: tuple[Axis, ...], placement: Placement, panels: list[Curves], backend: str,
         path: Path) -> None:
    """One column per request: time (log-log) above, time over the default all-reduce below,
    and the column's legend under both."""
    columns = len(panels)
    figure, grid = plt.subplots(3, columns, figsize=(5.4 * columns, 9.6), squeeze=False,
                                gridspec_kw={"height_ratios": [3.0, 1.8, 1.0], "hspace": 0.22, "wspace": 0.28})
    colours = plt.get_cmap("tab10").colors
    job = ",".join(f"{axis.name}={axis.size}" for axis in axes)
    for column, panel in enumerate(panels):
        top, bottom, key = grid[0][column], grid[1][column], grid[2][column]
        sizes = np.array(panel.sizes, dtype=float)
        baseline = np.array(panel.baseline_s)
        top.plot(sizes, baseline, color="black", linewidth=2.4, label=f"default: {short(panel.baseline)}")
        top.plot(sizes, panel.bound_s, color="grey", linestyle=":", linewidth=1.5, label="lower bound")
        bottom.axhline(1.0, color="black", linewidth=2.4)
        ratios = [1.0]
        for index, (program, times) in enumerate(panel.programs):
            colour = colours[index % len(colours)]
            speedup = panel.baseline_s[-1] / times[-1]
            top.plot(sizes, times, color=colour, linewidth=1.4, marker="o", markersize=2.5,
                     label=f"{short(program)}   x{speedup:.2f}")
            relative = np.array(times) / baseline
            ratios += relative.tolist()
            bottom.plot(sizes, relative, color=colour, linewidth=1.4, marker="o", markersize=2.5)
        for axis in (top, bottom):
            axis.set_xscale("log", base=2)
            axis.set_xlim(sizes[0], sizes[-1])
            axis.grid(True, which="major", alpha=0.3)
        top.set_yscale("log")
        top.tick_params(labelbottom=False)
        top.set_title(f"reduce {panel.reduce.replace(',', ' + ')}", fontsize=11)
        top.set_ylabel("time per run (s)")
        bottom.set_ylabel("time / default all-reduce")
        bottom.set_xlabel("bytes per device")
        ticks = sizes[:: max(1, len(sizes) // 5)]
        bottom.set_xticks(ticks, [format_bytes(int(t)).replace(" ", "") for t in ticks])
        bottom.set_ylim(max(0.0, min(ratios) - 0.05), min(max(ratios) + 0.05, 3.0))
        key.axis("off")
        handles, labels = top.get_legend_handles_labels()
        key.legend(handles, labels, loc="upper left", bbox_to_anchor=(0, 1.02), fontsize=8, frameon=False, handlelength=2.2)
    figure.suptitle(f"{topology.name}: {job}, placement {placement.to_text()} (init_device_mesh order), "
                    f"{backend} model", fontsize=12)
    figure.text(0.5, 0.01, KEY, ha="center", fontsize=8, color="dimgrey")
    figure.subplots_adjust(left=0.06, right=0.99, top=0.93, bottom=0.035)
    figure.savefig(path, dpi=110)
    plt.close(figure)
