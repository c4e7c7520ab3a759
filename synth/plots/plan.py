"""`synth plan` as a picture: the candidates' step time against memory with the Pareto set, and
where the step time of the winner (and the next candidates) goes, one stacked bar each."""

from __future__ import annotations

from dataclasses import dataclass

from synth.plots.figure import footer, pyplot, save, style, time_axis

GIB = float(1 << 30)


@dataclass(frozen=True)
class Candidate:
    """One planned layout: its step time, peak memory per device and a short name."""

    step_s: float
    memory_bytes: float
    label: str


@dataclass(frozen=True)
class StepBar:
    """One candidate's step time split into its terms, (what, seconds), as the plan reports them."""

    label: str
    terms: tuple[tuple[str, float], ...]


def draw_plan(candidates: list[Candidate], pareto: list[Candidate], bars: list[StepBar], memory_bytes: float,
              title: str, path: str, note: str = "") -> None:
    """Write the two panels to `path` (PNG or SVG): the first of `candidates` and of `bars` is
    the winner; `memory_bytes` is the device's memory, drawn as a line."""
    with style():
        plt = pyplot()
        figure, (scatter, split) = plt.subplots(1, 2, figsize=(13.5, 5.6), layout="constrained",
                                                gridspec_kw={"width_ratios": [1.0, 1.15]})
        scatter.scatter([c.memory_bytes / GIB for c in candidates], [c.step_s for c in candidates], s=18,
                        color="lightgrey", edgecolor="grey", linewidth=0.5, label="candidates shown", zorder=2)
        front = sorted(pareto, key=lambda c: c.memory_bytes)
        scatter.step([c.memory_bytes / GIB for c in front], [c.step_s for c in front], where="post",
                     color="tab:blue", linewidth=1.4, zorder=3)
        scatter.scatter([c.memory_bytes / GIB for c in front], [c.step_s for c in front], s=22, color="tab:blue",
                        zorder=4, label="Pareto set: none both faster and smaller")
        winner = candidates[0]
        scatter.scatter([winner.memory_bytes / GIB], [winner.step_s], marker="*", s=220, color="tab:red",
                        edgecolor="black", linewidth=0.6, zorder=5, label=f"winner: {winner.label}")
        scatter.axvline(memory_bytes / GIB, color="black", linestyle="--", linewidth=1,
                        label=f"device memory {memory_bytes / GIB:.0f} GiB")
        times = [c.step_s for c in candidates + pareto]
        time_axis(scatter, "y", log=max(times) > 4 * min(times), values=times)
        scatter.set_xlim(left=0)
        scatter.set_xlabel("peak memory per device (GiB)")
        scatter.set_ylabel("predicted step time")
        scatter.grid(True, alpha=0.3)
        scatter.set_title("step time against memory", fontsize=9)
        scatter.legend(fontsize=7, loc="upper right")
        _bars(plt, split, bars)
        figure.suptitle(title, fontsize=10)
        footer(figure, note)
        save(figure, path)


def _bars(plt, axis, bars: list[StepBar]) -> None:
    """Horizontal stacked bars, the winner on top, each term a colour kept across the bars."""
    from synth.units import format_time

    terms = list(dict.fromkeys(what for bar in bars for what, _ in bar.terms))
    colours = {what: plt.get_cmap("tab10").colors[index % 10] for index, what in enumerate(terms)}
    total = max((sum(seconds for _, seconds in bar.terms) for bar in bars), default=0.0)
    labelled: set[str] = set()
    for row, bar in enumerate(bars):
        left = 0.0
        for what, seconds in bar.terms:
            axis.barh(row, seconds, left=left, color=colours[what], edgecolor="white", linewidth=0.5,
                      label=None if what in labelled else what)
            labelled.add(what)
            if total and seconds / total > 0.07:
                axis.text(left + seconds / 2, row, f"{what}\n{format_time(seconds, 3)}", ha="center", va="center",
                          fontsize=6.5, color="white")
            left += seconds
        axis.text(left, row, f"  {format_time(left, 4)}", va="center", fontsize=7)
    axis.set_yticks(range(len(bars)), [("winner\n" if row == 0 else f"#{row + 1}\n") + bar.label
                                       for row, bar in enumerate(bars)], fontsize=7)
    axis.invert_yaxis()
    axis.set_xlim(0, total * 1.15 if total else 1)
    time_axis(axis, "x")
    axis.set_xlabel("step time, split into its terms (overlapped work not counted)")
    axis.set_title("where the step time goes", fontsize=9)
    axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncols=4, frameon=False)
