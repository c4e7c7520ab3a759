"""What a sweep found: the Pareto front of cost per token against time to train, and how step
time moves with each swept figure (matplotlib, imported only when a plot is asked for)."""

from __future__ import annotations

import statistics
from collections import defaultdict

from synth.codesign.errors import MissingExtraError


def fronts_by_model(rows: list[dict]) -> list[dict]:
    """Each model's Pareto front, the models in the grid's order (a front across models would
    compare different trainings)."""
    return [row for model in dict.fromkeys(row["model"] for row in rows)
            for row in pareto_front([row for row in rows if row["model"] == model])]


def pareto_front(rows: list[dict]) -> list[dict]:
    """The rows no other row beats on both cost per token and time to train, fastest first."""
    priced = sorted((row for row in rows if row.get("cost_per_token") is not None
                     and row.get("time_to_train_s") is not None),
                    key=lambda row: (row["time_to_train_s"], row["cost_per_token"], row["index"]))
    front, cheapest = [], float("inf")
    for row in priced:
        if row["cost_per_token"] < cheapest:
            front.append(row)
            cheapest = row["cost_per_token"]
    return front


def sensitivity(rows: list[dict], axis_names: tuple[str, ...]) -> dict[str, list[tuple[object, float]]]:
    """For each axis with more than one value: (value, median over the points with that value of
    the step time relative to the same point at the axis's first value). 1 means no effect."""
    ok = [row for row in rows if row.get("status") == "ok"]
    result = {}
    for axis in axis_names:
        values = list(dict.fromkeys(row[axis] for row in rows))
        if len(values) < 2 or axis == "model":
            continue
        others = [name for name in axis_names if name != axis]
        by_rest: dict[tuple, dict] = defaultdict(dict)
        for row in ok:
            by_rest[tuple(row[name] for name in others)][row[axis]] = row["step_s"]
        series = []
        for value in values:
            ratios = [times[value] / times[values[0]] for times in by_rest.values()
                      if value in times and values[0] in times]
            if ratios:
                series.append((value, statistics.median(ratios)))
        if len(series) > 1:
            result[axis] = series
    return result


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise MissingExtraError("plots need matplotlib, which is not installed: install the benchmarks extra "
                                "(pip install 'hierarchical-collectives-synth[benchmarks]')", extra="benchmarks") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(rows: list[dict], axis_names: tuple[str, ...], path: str, title: str = "") -> None:
    """One PNG: left, every priced point and the Pareto front (cost per token against time to
    train, by model); right, step time relative to each swept axis's first value."""
    plt = _pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    priced = [row for row in rows if row.get("cost_per_token") is not None and row.get("time_to_train_s") is not None]
    for model in dict.fromkeys(row["model"] for row in priced):
        mine = [row for row in priced if row["model"] == model]
        dots = left.scatter([row["time_to_train_s"] / 86400 for row in mine],
                            [row["cost_per_token"] * 1e6 for row in mine], s=12, alpha=0.5, label=model)
        front = pareto_front(mine)
        left.plot([row["time_to_train_s"] / 86400 for row in front], [row["cost_per_token"] * 1e6 for row in front],
                  "-o", color=dots.get_facecolor()[0][:3], markersize=4)
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    left.set_xscale("log")
    left.set_yscale("log")
    for axis in (left.xaxis, left.yaxis):
        axis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axis.set_minor_formatter(NullFormatter())
    left.set_xlabel("time to train the token budget (days)")
    left.set_ylabel("cost per million tokens")
    left.set_title("every point, and each model's Pareto front")
    if priced:
        left.legend(fontsize=8)
    for axis, series in sensitivity(rows, axis_names).items():
        line, = right.plot(range(len(series)), [ratio for _, ratio in series], "-o", label=axis)
        for position, (value, ratio) in enumerate(series):
            right.annotate(str(value), (position, ratio), textcoords="offset points", xytext=(4, 4), fontsize=7,
                           color=line.get_color())
    right.axhline(1.0, color="grey", linewidth=0.5)
    right.set_xlabel("the swept figure's values, in the grid's order (each labelled)")
    right.set_ylabel("step time / step time at the first value (median)")
    right.set_title("sensitivity of step time to each swept figure")
    if right.lines[:-1]:
        right.legend(fontsize=8)
    right.set_xticks([])
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
