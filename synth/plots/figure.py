"""What every picture shares: the file formats, matplotlib loaded on demand, and the write.

matplotlib is an extra (`pip install '.[plot]'`): it is imported only when a picture is drawn,
on the Agg backend, so no display is needed and no command that draws nothing pays for it.
Text is drawn as given (no TeX-like `$...$` parsing: a topology or file name with a `$` in it
is a name, not a formula), and an SVG carries no date, so the same picture writes the same bytes.
"""

from __future__ import annotations

import io
from pathlib import PurePath

from synth.errors import UsageError
from synth.names import echo
from synth.output_files import write_bytes

FORMATS = {".png": "png", ".svg": "svg"}
INSTALL = "pip install '.[plot]'"
STYLE = {"text.parse_math": False, "svg.hashsalt": "synth", "font.size": 9}
DPI = 110
ABBREVIATIONS = {"ReduceScatter": "RS", "AllReduce": "AR", "AllGather": "AG", "Reduce": "R", "Broadcast": "B",
                 "AllToAll": "A2A", "InsideGroup": "IG", "Parallel": "P", "Master": "M"}
ABBREVIATION_KEY = ("RS ReduceScatter, AR AllReduce, AG AllGather, R Reduce, B Broadcast, A2A AllToAll; "
                    "IG InsideGroup, P Parallel, M Master")


class PlotLibraryMissingError(UsageError):
    """Drawing was asked for where matplotlib is not installed (exit 2: install the extra)."""


class PlotFormatError(UsageError):
    """A picture file whose suffix names no format the pictures are written in."""


def plot_format(path: str) -> str:
    """'png' or 'svg', from the file name's suffix (either case)."""
    suffix = PurePath(path).suffix.lower()
    if suffix not in FORMATS:
        shown = f"suffix {suffix!r}" if suffix else "no suffix"
        raise PlotFormatError(f"{echo(path)} has {shown}: give a .png or .svg file, e.g. plot.png")
    return FORMATS[suffix]


def pyplot():
    """matplotlib.pyplot on the Agg backend, or one line saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise PlotLibraryMissingError(f"drawing needs matplotlib, which is not installed: {INSTALL} "
                                      f"(or pip install 'matplotlib>=3.7')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def style():
    """The rc settings every picture is drawn under (a context manager)."""
    return pyplot().rc_context(STYLE)


def footer(figure, *lines: str) -> None:
    """Small grey lines under the panels (keys, notes), wrapped to the figure's width."""
    import textwrap

    width = int(figure.get_figwidth() * 16)  # characters of 7-point text per inch, about
    text = "\n".join(textwrap.fill(line, width) for line in lines if line)
    if text:
        figure.supxlabel(text, fontsize=7, color="dimgrey")


def time_axis(axis, which: str = "y", log: bool = False, values=()) -> None:
    """Seconds on an axis, written as `2.5 ms`."""
    from synth.units import format_time

    unit_axis(axis, which, lambda value: format_time(value, 3) if value else "0", log, values)


def unit_axis(axis, which: str, label, log: bool = False, values=()) -> None:
    """An axis whose ticks are written by `label(value)` (a time, a bandwidth); on a log axis
    ticks at 1, 2 and 5 of each decade `values` span (matplotlib's own log labels are TeX-like
    text, which is drawn as given here)."""
    import math

    plt = pyplot()
    target = axis.yaxis if which == "y" else axis.xaxis
    if log:
        (axis.set_yscale if which == "y" else axis.set_xscale)("log")
        positive = [value for value in values if value > 0 and math.isfinite(value)]
        if positive:
            low, high = min(positive), max(positive)
            ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
                     for m in (1, 2, 5)]
            inside = [t for t in ticks if low / 1.5 <= t <= high * 1.5]
            target.set_ticks(inside[::max(1, math.ceil(len(inside) / 8))])
        target.set_minor_formatter(plt.NullFormatter())
    target.set_major_formatter(plt.FuncFormatter(lambda value, _: label(value)))


def save(figure, path: str, what: str | None = None) -> None:
    """Render `figure` in the format its suffix names and write it whole (synth/output_files.py:
    an interrupted run leaves the old file), then free it."""
    fmt = plot_format(path)
    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, format=fmt, dpi=DPI, metadata={"Date": None} if fmt == "svg" else None)
    finally:
        pyplot().close(figure)
    write_bytes(path, buffer.getvalue(), what)


def short_program(program) -> str:
    """`ReduceScatter(InsideGroup(gpu)); ...` (a language Program) as `RS(IG gpu) > ...` for legends."""
    steps = []
    for step in program.steps:
        if step.is_permute:
            steps.append(f"Perm({step.level})")
        else:
            steps.append(f"{ABBREVIATIONS.get(step.collective, step.collective)}"
                         f"({ABBREVIATIONS.get(step.form, step.form)} {step.level})")
    return " > ".join(steps)
