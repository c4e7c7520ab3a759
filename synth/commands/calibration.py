"""`synth calibrate`: fit level latency and bandwidth (per collective) from measurements and
write a topology file the simulator reads (synth/calibrate)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from synth.commands.common import BACKEND_NAMES, add_plot_option, echo, flagged, print_json
from synth.errors import UsageError
from synth.text import escaped

if TYPE_CHECKING:
    from rich.table import Table

    from synth.calibrate import Calibration

PIPED_WIDTH = 160


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "calibrate", help="fit level latency and bandwidth from nccl-tests or benchmark measurements",
        description="Fit each measured level's latency and bandwidth, per collective, to measurements (nccl-tests "
                    "text or CSV output, or our benchmark CSV) under the simulator's own cost model, and write a "
                    "topology file with the fitted figures and their sources.")
    parser.add_argument("files", nargs="+", metavar="FILE", help="measurement files (formats: docs/calibrate.md)")
    parser.add_argument("--topology", "-t", metavar="BASE",
                        help="topology giving level names, sizes and uplinks (built-in name or TOML file); without "
                             "it, nccl-tests files define node and gpu levels from their hosts and ranks")
    parser.add_argument("--level", metavar="NAME",
                        help="the level every measured group spans, for files that do not say (default: one host "
                             "-> innermost level, several hosts -> the level above it)")
    parser.add_argument("-o", "--output", metavar="OUT.toml", help="write the topology here (default: print it)")
    parser.add_argument("--backend", choices=BACKEND_NAMES,
                        help="collective library that ran the measurements (default: what the files say, else nccl)")
    parser.add_argument("--json", action="store_true", help="print the fits as JSON instead of a table")
    add_plot_option(parser, "every measurement against its prediction (log-log, with y=x and the fit's error band)")
    parser.set_defaults(handler=run_calibrate)


def run_calibrate(args) -> int:
    from synth.calibrate import calibrate, infer_base, read_measurements
    from synth.commands.terminal import console as text_console
    from synth.model.backends import resolve_backend
    from synth.topology_file import load_topology, render_topology

    if args.level is not None and args.topology is None:
        raise UsageError("--level names a level of the base topology; give --topology BASE too")
    from synth.commands.plotting import check_plot

    check_plot(args)
    measurements, formats = [], {}
    for path in args.files:
        _check_readable(path)
    for path in args.files:
        kind, found = read_measurements(path, args.level, args.topology)
        formats[path] = kind
        measurements += found
    if args.topology is None:  # files made by synth (bench, exported programs) name their topology
        args.topology = _named_topology(formats)
    backend = resolve_backend(_backend(args.backend, measurements))
    if backend.name == "nccl":  # the NCCL model (synth/model/nccl/), fitted by synth/calibrate/nccl_fit.py
        return _run_nccl(args, measurements, formats)
    if args.topology:
        with flagged("--topology"):
            base = load_topology(args.topology)
    else:
        base = infer_base(measurements)
    result = calibrate(measurements, base, backend)
    header = (f"Written by synth calibrate (backend {backend.name}) from {', '.join(args.files)}\n"
              f"on the base topology {base.name}; every fitted figure's source gives its fit.")
    text = render_topology(result.topology, header)
    errors = _check_written(text, backend, measurements)
    if args.output:
        _write(args.output, text)
    if args.json:
        print_json(_json(result, formats, errors, args.output, text))
        _plot(args, measurements, errors, result.topology.name, backend.name)
        return 0
    if not args.output:
        sys.stdout.write(text)
    console = text_console(stderr=not args.output, piped_width=PIPED_WIDTH)
    console.print(_table(result, errors))
    for note in result.notes:
        console.print(f"note: {_plain(note)}")
    if args.output:
        console.print(f"wrote {_plain(args.output)}")
    _plot(args, measurements, errors, result.topology.name, backend.name)
    return 0


def _plot(args, measurements, errors, topology_name: str, model: str) -> None:
    if args.plot:
        from synth.commands.plotting import plot_calibration

        sys.stdout.flush()
        plot_calibration(args.plot, measurements, errors, topology_name, model)


CONTRADICTION_GAIN = 0.7  # the other setting's error at most this share of the base's: the base is wrong
CONTRADICTION_FLOOR = 0.08  # below this relative RMS the base fits well enough to leave alone


def _base_contradiction(base, spec: str | None, measurements, result, errors, assumptions) -> str | None:
    """When the fit is poor, whether the base's NVLS setting is what the measurements contradict:
    the fit again with `nvls` flipped, and a warning naming the field when that fits far better
    (a base without `nvls = true` costs an NVLS system's large sizes 25% slow and drops them as
    outliers; the poor-fit warning alone does not say the base is wrong)."""
    import numpy as np

    from synth.calibrate.all_to_all import calibrate_with_all_to_all as calibrate_nccl  # all-to-alls apart
    from synth.calibrate.all_to_all import replay_with_all_to_all as replay_nccl
    from synth.calibrate.nccl_fit import nvls_flipped

    rms = float(np.sqrt(np.mean(np.square(errors))))
    outliers = sum(group.outliers for fit in result.fits for group in fit.groups)
    if base.nccl is None or (rms < CONTRADICTION_FLOOR and not outliers):
        return None
    flipped = nvls_flipped(base, measurements)  # None: the other setting leaves no algorithm or changes nothing
    if flipped is None:
        return None
    try:
        other = calibrate_nccl(measurements, flipped, assumptions)
        other_errors = replay_nccl(other.topology, measurements)
    except UsageError:
        return None
    other_rms = float(np.sqrt(np.mean(np.square(other_errors))))
    if not other_rms <= CONTRADICTION_GAIN * rms:
        return None
    other_outliers = sum(group.outliers for fit in other.fits for group in fit.groups)
    where = f"the [nccl] table of {spec}" if spec else "the inferred base (give --topology BASE with it)"
    wanted = "true" if flipped.nccl.nvls else "false"
    return (f"the measurements contradict the base's nvls = {str(base.nccl.nvls).lower()}: with nvls = {wanted} the "
            f"fit reproduces them with relative RMS {other_rms:.1%} ({_count(other_outliers, 'outlier')}) instead of "
            f"{rms:.1%} ({_count(outliers, 'outlier')}); set nvls = {wanted} in {where} if the system "
            f"{'has' if wanted == 'true' else 'lacks'} NVLink SHARP (NVSwitch, NCCL 2.17+), and calibrate again")


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _named_topology(formats: dict[str, str]) -> str | None:
    """The one topology the files name when every file names one, else None (infer a base)."""
    from synth.calibrate.readers import NAMING_FORMATS, named_topology

    if not formats or any(kind not in NAMING_FORMATS for kind in formats.values()):
        return None
    names = {named_topology(path) for path in formats}
    if None in names:
        return None
    if len(names) > 1:
        raise UsageError(f"the files were made for different topologies ({', '.join(sorted(names))}); "
                         f"give the base with --topology")
    return names.pop()


def _plain(text: str) -> str:
    """User text (file names reach notes and titles) on one line, every unprintable character
    as an escape, so no escape sequence or line break in a file name reaches the terminal."""
    return escaped(text)


def _check_readable(path: str) -> None:
    """What the readers would not survive, refused in one line: a name the file system cannot
    take (too long, a NUL in it) or a file of many megabytes. A missing file or a directory the
    readers name themselves."""
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    except (OSError, ValueError) as error:
        reason = getattr(error, "strerror", None) or "not a file name"
        raise UsageError(f"cannot read measurement file {echo(path)}: {reason}") from None
    if info.st_size > 64 << 20:
        raise UsageError(f"measurement file {echo(path)} is {info.st_size >> 20} MiB: not a measurement file")


def _backend(option: str | None, measurements) -> str:
    """--backend, or the one backend the files name; a file naming another one is refused."""
    named = {m.backend for m in measurements if m.backend is not None}
    if option is not None:
        for measurement in measurements:
            if measurement.backend not in (None, option):
                raise UsageError(f"{measurement.where}: measured with {measurement.backend}, but --backend is "
                                 f"{option}; calibrate each backend from its own measurements")
        return option
    if len(named) > 1:
        raise UsageError(f"the files mix backends ({', '.join(sorted(named))}); calibrate one at a time with --backend")
    return named.pop() if named else "nccl"


def _check_written(text: str, backend, measurements):
    """Load the rendered file as any topology file is loaded, and replay the measurements on it."""
    from synth.calibrate import replay

    return replay(_load_written(text), backend, measurements)


def _load_written(text: str):
    """The rendered topology loaded back; a figure out of its range there comes from measurements
    no link produces (each in range, together absurd), so the error says so."""
    from synth.topology_file import topology_from_text

    try:
        return topology_from_text(text, "the fitted topology")
    except UsageError as error:
        raise UsageError(f"the measurements fit figures no hardware has ({error}); check the files' time and "
                         f"size columns") from None


def _write(path: str, text: str) -> None:
    from synth.output_files import write_text

    write_text(path, text, f"-o {path}")


def replay_text(errors) -> str:
    """The caption's figure, labelled apart from the rows' own: each row's relative RMS is its
    fit's on its measurements; this one replays the written (rounded) file over all of them."""
    rms = float((errors ** 2).mean() ** 0.5)
    return (f"replay of the written file over all {len(errors)} measurements: relative RMS error {rms:.2%} "
            f"(worst {abs(errors).max():.2%}); the fit columns are each fit's own on its measurements")


def _table(result: Calibration, errors) -> Table:
    from rich.table import Table

    from synth.units import format_bandwidth, format_bytes, format_time

    table = Table(title=f"{result.topology.name}: fitted under the {result.backend} model",
                  caption=f"* the level's own figures; {replay_text(errors)}")
    for name in ("level", "collective", "points", "sizes", "group", "bandwidth", "latency", "R^2", "fit rel. RMS",
                 "notes"):
        table.add_column(name, justify="right" if name in ("points", "bandwidth", "latency", "R^2", "fit rel. RMS")
                         else "left", overflow="fold")
    for fit in result.fits:
        solution = fit.solution
        table.add_row(fit.level, fit.collective + (" *" if fit.level_figure else ""), str(fit.points),
                      f"{format_bytes(fit.min_bytes)}-{format_bytes(fit.max_bytes)}", ", ".join(fit.groups),
                      format_bandwidth(solution.bandwidth), format_time(solution.latency_s),
                      f"{solution.r_squared:.5f}", f"{solution.relative_rms:.2%}", "; ".join(solution.notes))
    return table


def _json(result: Calibration, formats: dict[str, str], errors, output: str | None, text: str) -> dict:
    return {
        "topology": result.topology.name,
        "output": output,
        "toml": text,
        "backend": result.backend,
        "files": [{"path": path, "format": kind} for path, kind in formats.items()],
        "fits": [{
            "level": fit.level, "collective": fit.collective, "level_figure": fit.level_figure,
            "points": fit.points, "min_bytes": fit.min_bytes, "max_bytes": fit.max_bytes, "groups": list(fit.groups),
            "bandwidth_Bps": fit.solution.bandwidth, "bandwidth_GBps": fit.solution.bandwidth / 1e9,
            "latency_s": fit.solution.latency_s, "r_squared": fit.solution.r_squared,
            "relative_rms": fit.solution.relative_rms, "max_relative_error": fit.solution.max_relative_error,
            "algorithms": list(fit.solution.algorithms), "files": list(fit.files), "notes": list(fit.solution.notes),
            "sigma": fit.uncertainty.sigma if fit.uncertainty is not None else None,
            "standard_errors": {"log latency": fit.uncertainty.standard_errors[0],
                                "log inverse bandwidth": fit.uncertainty.standard_errors[1]}
            if fit.uncertainty is not None else None,
        } for fit in result.fits],
        "replay_relative_rms": float((errors ** 2).mean() ** 0.5),
        "replay_max_relative_error": float(abs(errors).max()),
        "notes": list(result.notes),
    }


# --- the NCCL model (issue 9) ------------------------------------------------------------------------


def _run_nccl(args, measurements, formats) -> int:
    """Fit the NCCL model's figures (efficiencies, overheads, pipeline stages), write the
    topology with what it was fitted on, and print every group's per-size error."""
    from rich.table import Table

    from synth.calibrate.infer import infer_nccl_base
    from synth.calibrate.all_to_all import calibrate_with_all_to_all as calibrate_nccl  # all-to-alls apart
    from synth.calibrate.all_to_all import replay_with_all_to_all as replay_nccl
    from synth.calibrate.report import nccl_fit_json, nccl_fit_rows, nccl_size_rows, uncertainty_line
    from synth.commands.terminal import console as text_console
    from synth.topology_file import load_topology, render_topology

    assumptions: tuple[str, ...] = ()
    if args.topology:
        with flagged("--topology"):
            base = load_topology(args.topology)
    else:
        inferred = infer_nccl_base(measurements)
        base, assumptions = inferred.topology, inferred.assumptions
    result = calibrate_nccl(measurements, base, assumptions)
    header = (f"Written by synth calibrate (NCCL model) from {', '.join(args.files)}\n"
              f"on the base topology {base.name}; every fitted figure's source gives its fit.")
    text = render_topology(result.topology, header)
    errors = replay_nccl(_load_written(text), measurements)
    contradiction = _base_contradiction(base, args.topology, measurements, result, errors, assumptions)
    if args.output:
        _write(args.output, text)
    if args.json:
        document = nccl_fit_json(result, formats, errors, args.output, text)
        document["base_contradictions"] = [contradiction] if contradiction else []
        print_json(document)
        _plot(args, measurements, errors, result.topology.name, "NCCL")
        return 0
    if not args.output:
        sys.stdout.write(text)
    console = text_console(stderr=not args.output, piped_width=PIPED_WIDTH)
    for line in assumptions + tuple(a for a in result.assumptions if a not in assumptions):
        console.print(f"assumed: {_plain(line)}")
    table = Table(title=f"{result.topology.name}: fitted under the NCCL model", caption=replay_text(errors))
    headers, rows = nccl_fit_rows(result)
    for name in headers:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for fit in result.fits:
        for group in fit.groups:
            sizes = Table(title=_plain(f"{group.file.rsplit('/', 1)[-1]} ({group.group}, {group.collective}): per-size error"),
                          title_justify="left")
            size_headers, size_rows = nccl_size_rows(group)
            for name in size_headers:
                sizes.add_column(name, justify="right" if name != "NCCL choice" else "left")
            for row in size_rows:
                sizes.add_row(*row)
            console.print(sizes)
        for note in fit.notes:
            console.print(f"{'warning' if note.startswith('poor fit') else 'note'}: {_plain(note)}")
        spread = uncertainty_line(fit)
        if spread:
            console.print(f"uncertainty: {spread}")
    if contradiction:
        console.print(f"warning: {_plain(contradiction)}")
    if args.output:
        console.print(f"wrote {_plain(args.output)}")
    _plot(args, measurements, errors, result.topology.name, "NCCL")
    return 0
