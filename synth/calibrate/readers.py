"""Which format a measurement file is in, and its measurements.

A file is an exported program's output (synth/calibrate/export_results.py) when it has that
output's `# reduction groups:` lines, or is the JSON an exported torch script writes.
It is nccl-tests text when it has the `# nThread ... nGpus` header or `#  Rank` lines.
Otherwise it is CSV when its first line that is neither blank nor a `#` comment has a comma:
our benchmark CSV when the header has `group_size`/`time_s`, nccl-tests CSV when it has
`collective`, `size` and `time`. Anything else is refused in one line.
"""

from __future__ import annotations

import csv
from pathlib import Path

from synth.calibrate.bench_csv import looks_like_bench_csv, parse_bench_csv
from synth.calibrate.export_results import (looks_like_export_json, looks_like_export_text, parse_export_json,
                                            parse_export_text)
from synth.calibrate.export_results import named_topology as export_named_topology
from synth.calibrate.measurements import Measurement, check_rate
from synth.calibrate.nccl_csv import looks_like_nccl_csv, parse_nccl_csv
from synth.calibrate.nccl_text import is_nccl_text, parse_nccl_text
from synth.calibrate.synth_bench import looks_like_synth_bench, parse_synth_bench_csv
from synth.errors import UsageError

FORMATS = ("nccl-tests text", "nccl-tests CSV", "benchmark CSV", "synth bench CSV", "exported program output",
           "exported script JSON")


def read_text(path: str) -> str:
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"{path}: no such file" if not file.exists() else f"{path}: not a file")
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"{path}: cannot read it as UTF-8 text ({' '.join(str(error).split())})") from None


def detect_format(text: str, path: str) -> str:
    if looks_like_export_json(text):
        return "exported script JSON"
    if looks_like_export_text(text):  # before nccl-tests text: the same table, under our comment lines
        return "exported program output"
    if is_nccl_text(text):  # first: a captured command line or NCCL log line may hold commas
        return "nccl-tests text"
    first = next((line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")), None)
    if first is not None and "," in first and _looks_like_csv_header(first):
        header = next(csv.reader([first]))
        if looks_like_synth_bench(header):
            return "synth bench CSV"
        if looks_like_bench_csv(header):
            return "benchmark CSV"
        if looks_like_nccl_csv(header):
            return "nccl-tests CSV"
        raise UsageError(f"{path}: a CSV whose header ({first.strip()[:80]}) is neither our benchmark CSV "
                         f"(collective,level,group_size,bytes,time_s) nor nccl-tests CSV (collective, ..., size, ..., time)")
    if not text.strip():
        raise UsageError(f"{path}: the file is empty")
    raise UsageError(f"{path}: not a measurement file: expected nccl-tests output (with its '# nThread' header and "
                     f"'#  Rank' lines), nccl-tests CSV, our benchmark CSV (collective,level,group_size,bytes,time_s), "
                     f"synth bench CSV, or an exported program's output or JSON")


def _looks_like_csv_header(line: str) -> bool:
    """A header of names (collective,level,...), not a sentence that happens to hold a comma."""
    names = [name.strip() for name in next(csv.reader([line]))]
    return len(names) >= 3 and all(name and len(name.split()) <= 2 for name in names)


def read_measurements(path: str, level: str | None = None,
                      topology: str | None = None) -> tuple[str, list[Measurement]]:
    """(format, measurements) of one file; `level` is --level, applying to the whole file;
    `topology` is --topology, where exported programs' groups sit (default: the one they name)."""
    text = read_text(path)
    try:
        kind, measurements = _parse(text, path, level, topology)
    except csv.Error as error:  # a field over csv's limit (131,072 characters), a NUL byte: not a CSV of ours
        raise UsageError(f"{path}: not a measurement CSV ({' '.join(str(error).split())[:120]}); "
                         f"give the file synth bench, our benchmarks or nccl-tests wrote") from None
    for measurement in measurements:
        check_rate(measurement)
    return kind, measurements


def _parse(text: str, path: str, level: str | None, topology: str | None) -> tuple[str, list[Measurement]]:
    kind = detect_format(text, path)
    if kind == "exported script JSON":
        return kind, parse_export_json(text, path, level, topology)
    if kind == "exported program output":
        return kind, parse_export_text(text, path, level, topology)
    if kind == "benchmark CSV":
        return kind, parse_bench_csv(_without_comments(text), path, level)
    if kind == "synth bench CSV":
        return kind, parse_synth_bench_csv(text, path, level)[0]
    if kind == "nccl-tests CSV":
        return kind, parse_nccl_csv(_without_comments(text), path, level)
    return kind, parse_nccl_text(text, path, level)


NAMING_FORMATS = ("synth bench CSV", "exported program output", "exported script JSON")


def named_topology(path: str) -> str | None:
    """The topology a synth bench CSV or an exported program's output was made for, if it says."""
    return export_named_topology(read_text(path))


def _without_comments(text: str) -> str:
    """The CSV with `#` comment lines blanked (line numbers stay those of the file)."""
    return "\n".join("" if line.lstrip().startswith("#") else line for line in text.splitlines())
