"""`synth calibrate` as a picture: every measurement's predicted time (the written topology's,
replayed) against its measured time, log-log, with the line where they agree and the fit's
relative RMS error as a band around it; beside it, each measurement's error against its size."""

from __future__ import annotations

from dataclasses import dataclass

from synth.plots.figure import footer, pyplot, save, style, time_axis, unit_axis


@dataclass(frozen=True)
class Series:
    """One measured group (a file's collective): sizes, measured and predicted seconds."""

    label: str
    sizes: tuple[int, ...]
    measured_s: tuple[float, ...]
    predicted_s: tuple[float, ...]


def draw_calibration(series: list[Series], rms: float, title: str, path: str, note: str = "") -> None:
    """Write the two panels to `path` (PNG or SVG); `rms` is the replay's relative RMS error."""
    from synth.units import format_bytes

    with style():
        plt = pyplot()
        figure, (agree, error) = plt.subplots(1, 2, figsize=(12.5, 5.8), layout="constrained",
                                              gridspec_kw={"width_ratios": [1.0, 1.1]})
        times = [t for s in series for t in s.measured_s + s.predicted_s if t > 0]
        low, high = min(times) / 1.5, max(times) * 1.5
        line = [low, high]
        agree.fill_between(line, [low * max(1 - rms, 0.05), high * max(1 - rms, 0.05)], [low * (1 + rms), high * (1 + rms)],
                           color="tab:blue", alpha=0.12, linewidth=0, label=f"relative RMS error of the fit, {rms:.1%}")
        agree.plot(line, line, color="black", linewidth=1, label="predicted = measured")
        colours = plt.get_cmap("tab10").colors
        for index, one in enumerate(series):
            colour = colours[index % len(colours)]
            agree.scatter(one.measured_s, one.predicted_s, s=14, color=colour, label=one.label, zorder=3)
            relative = [100 * (p / m - 1) for m, p in zip(one.measured_s, one.predicted_s)]
            error.scatter(one.sizes, relative, s=12, color=colour, alpha=0.85, label=one.label)
        time_axis(agree, "x", log=True, values=line)
        time_axis(agree, "y", log=True, values=line)
        agree.set_xlim(low, high)
        agree.set_ylim(low, high)
        agree.set_aspect("equal")
        agree.set_xlabel("measured time")
        agree.set_ylabel("predicted time (the written topology)")
        agree.set_title("predicted against measured", fontsize=9)
        agree.grid(True, alpha=0.3)
        agree.legend(fontsize=7, loc="upper left")
        error.axhspan(-100 * rms, 100 * rms, color="tab:blue", alpha=0.12, linewidth=0)
        error.axhline(0, color="black", linewidth=1)
        sizes = sorted({size for one in series for size in one.sizes})
        error.set_xscale("log", base=2)
        unit_axis(error, "x", lambda value: format_bytes(int(value)).replace(" ", ""))
        ticks = sizes[:: max(1, -(-len(sizes) // 8))]
        error.set_xticks(ticks)
        error.xaxis.set_minor_locator(plt.NullLocator())
        error.tick_params(axis="x", labelrotation=30)
        error.set_xlabel("bytes per call")
        error.set_ylabel("predicted / measured - 1 (%)")
        error.set_title("error at each size", fontsize=9)
        error.grid(True, alpha=0.3)
        figure.suptitle(title, fontsize=10)
        footer(figure, note)
        save(figure, path)
