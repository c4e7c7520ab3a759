"""How long `synth calibrate` takes to read a large measurement file: reading must be linear in
its lines (it was quadratic: launcher-prefix detection counted the non-blank lines once per line,
60,000 rows took 102 s).

    python -m benchmarks.calibrate_read [-o results] [--lines 400000]

Builds nccl-tests text (the shipped docs/examples/all_reduce_perf-h100-ib-2x8.txt with its rows
repeated), the same behind srun's `0: ` labels, and our benchmark CSV, each with --lines lines
and with a tenth of them, and times `read_measurements` on each (best of 3; the ratio of the two
sizes shows the growth). Writes results/calibrate-read/README.md and calibrate-read.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.record import REPORT, header, study_dir
from synth.output_files import write_text

COMMAND = "python -m benchmarks.calibrate_read"
STUDY = "calibrate-read"
SOURCE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "all_reduce_perf-h100-ib-2x8.txt"


def files(directory: Path, lines: int) -> dict[str, Path]:
    text = SOURCE.read_text(encoding="utf-8").splitlines()
    rows = [line for line in text if line.strip()[:1].isdigit()]
    head = text[:text.index(rows[0])]
    body = head + [rows[i % len(rows)] for i in range(lines - len(head))]
    made = {
        "nccl-tests text": ("all_reduce_perf-plain.txt", body),
        "nccl-tests text behind srun labels": ("all_reduce_perf-labelled.txt", [f"0: {line}" for line in body]),
        "benchmark CSV": ("bench.csv", ["collective,level,group_size,bytes,time_s"] +
                          [f"AllReduce,node,2,{2 ** (10 + i % 20)},{1e-5 * (1 + i % 20)}" for i in range(lines - 1)]),
    }
    paths = {}
    for kind, (name, content) in made.items():
        path = directory / f"{lines}-{name}"
        path.write_text("\n".join(content) + "\n", encoding="utf-8")
        paths[kind] = path
    return paths


def best_of(path: Path, runs: int = 3) -> tuple[float, int]:
    from synth.calibrate import read_measurements

    times = []
    for _ in range(runs):
        start = time.perf_counter()
        _, measurements = read_measurements(str(path))
        times.append(time.perf_counter() - start)
    return min(times), len(measurements)


def render(document: dict) -> str:
    rows, load_before, load_after = document["rows"], document["load_before"], document["load_after"]
    lines = ["# Reading large measurement files (`synth calibrate`)", "", header(document["command"]), "",
             f"Load average (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in load_before)} before, "
             f"{', '.join(f'{x:.2f}' for x in load_after)} after, on {os.cpu_count()} cores shared with other jobs.",
             "", "Best of 3 runs of `read_measurements` (parsing only, not the fit).", "",
             "| format | lines | measurements | time | per 100,000 lines |", "|---|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['format']} | {row['lines']:,} | {row['measurements']:,} | {row['seconds']:.2f} s | "
                     f"{row['seconds'] / row['lines'] * 1e5:.2f} s |")
    growth = [large["seconds"] / small["seconds"] for small, large in zip(rows[:len(rows) // 2], rows[len(rows) // 2:])]
    lines += ["", f"Ten times the lines took {min(growth):.1f}x to {max(growth):.1f}x the time (a linear reader: "
              f"about 10x; a quadratic one: 100x). The load of other jobs on this machine moves single figures by "
              f"2x or more, so compare the orders of magnitude. Before, launcher-prefix detection counted the "
              f"file's non-blank lines once per line (60,000 rows: 102 s; 400,000 lines: over 300 s)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="results", help="the results directory (default results/)")
    parser.add_argument("--lines", type=int, default=400_000, help="lines of the large files (default 400000)")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for lines in (args.lines // 10, args.lines):
            for kind, path in files(Path(scratch), lines).items():
                seconds, count = best_of(path)
                rows.append({"format": kind, "lines": lines, "measurements": count, "seconds": seconds})
                print(f"{kind}, {lines} lines: {seconds:.2f} s ({count} measurements)")
    load_after = os.getloadavg()
    document = {"command": f"{COMMAND} --lines {args.lines}", "load_before": load_before, "load_after": load_after,
                "rows": rows}
    directory = study_dir(STUDY, args.output)
    write_text(directory / REPORT, render(document))
    write_text(directory / f"{STUDY}.json", json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
