"""`synth rank` over sizes as a picture: time (or bus bandwidth) against message size.

One panel per placement: the flat call (the goal's one collective, NCCL's own), the chosen
programs and the lower bound, on a log size axis; the model's held-out error is shaded around
the flat call, so a program inside the band is a win the model cannot tell apart from none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from synth.plots.figure import ABBREVIATION_KEY, footer, pyplot, save, style, time_axis, unit_axis

METRICS = {"time": "predicted time per call", "busbw": "predicted bus bandwidth"}


@dataclass(frozen=True)
class Curve:
    """One line: a label and a value per size (nan where the command did not rank it)."""

    label: str
    values: tuple[float, ...]


@dataclass(frozen=True)
class RankPanel:
    """One placement's curves over the sizes; `error` is the model's relative held-out error at
    each size (nan: not known there), shaded around the flat call."""

    title: str
    sizes: tuple[int, ...]
    flat: Curve
    programs: tuple[Curve, ...]
    bound: Curve | None = None
    error: tuple[float, ...] = ()


def draw_rank(panels: list[RankPanel], metric: str, title: str, path: str, note: str = "") -> None:
    """Write the panels side by side (at most three a row) to `path` (PNG or SVG)."""
    from synth.units import format_bandwidth, format_bytes

    with style():
        plt = pyplot()
        columns = min(3, len(panels))
        rows = math.ceil(len(panels) / columns)
        figure, grid = plt.subplots(rows, columns, figsize=(max(7.5, 6.4 * columns), 6.4 * rows + 0.6),
                                    squeeze=False, layout="constrained")
        colours = plt.get_cmap("tab10").colors
        for index, panel in enumerate(panels):
            axis = grid[index // columns][index % columns]
            sizes = [float(size) for size in panel.sizes]
            flat = list(panel.flat.values)
            axis.plot(sizes, flat, color="black", linewidth=2.2, marker="o", markersize=3, label=panel.flat.label)
            if panel.error and any(math.isfinite(e) for e in panel.error):
                # t/(1+e) to t*(1+e): an error of 120% is a factor of 2.2 either way, never below zero
                low = [value / (1 + e) if math.isfinite(e) else math.nan for value, e in zip(flat, panel.error)]
                high = [value * (1 + e) if math.isfinite(e) else math.nan for value, e in zip(flat, panel.error)]
                axis.fill_between(sizes, low, high, color="black", alpha=0.12, linewidth=0,
                                  label="the model's held-out error around the flat call")
            for number, curve in enumerate(panel.programs):
                axis.plot(sizes, curve.values, color=colours[number % len(colours)], linewidth=1.3, marker="o",
                          markersize=3, label=curve.label)
            if panel.bound is not None:
                axis.plot(sizes, panel.bound.values, color="grey", linestyle=":", linewidth=1.4, label=panel.bound.label)
            axis.set_xscale("log", base=2)
            values = [v for curve in (panel.flat, *panel.programs) for v in curve.values]
            if metric == "time":
                time_axis(axis, "y", log=True, values=values)
            else:  # GB/s
                unit_axis(axis, "y", lambda value: format_bandwidth(value * 1e9, 3), log=True, values=values)
            if len(sizes) > 1:
                axis.set_xlim(sizes[0], sizes[-1])
            ticks = sizes[:: max(1, math.ceil(len(sizes) / 7))]
            axis.set_xticks(ticks, [format_bytes(int(size)).replace(" ", "") for size in ticks], rotation=30)
            axis.xaxis.set_minor_locator(plt.NullLocator())
            axis.grid(True, which="major", alpha=0.3)
            axis.set_title(panel.title, fontsize=9)
            axis.set_xlabel("bytes per device")
            axis.set_ylabel(METRICS[metric])
            axis.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(0, -0.13), frameon=False)
        for index in range(len(panels), rows * columns):
            grid[index // columns][index % columns].axis("off")
        figure.suptitle(title, fontsize=10)
        footer(figure, note, ABBREVIATION_KEY)
        save(figure, path)
