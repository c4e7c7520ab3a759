"""Our own benchmark CSV: what issue 5's microbenchmarks write, one timed call per row.

    collective,level,group_size,bytes,time_s[,backend][,ranks_per_unit]
    AllGather,node,2,1048576,0.00123,gloo

* `collective`: AllReduce, ReduceScatter, AllGather, Reduce or Broadcast;
* `level`: the topology level the group spans (its outermost level with two members apart);
  may be empty when --level names it for the whole file;
* `group_size`: members of the group; with `ranks_per_unit` p (default 1) they are the first
  p devices of each of group_size / p units of that level, inside one parent;
* `bytes`: B, the call's range (input of ReduceScatter, output of AllGather, the buffer
  otherwise); a whole number of bytes, or with a unit ("1MiB");
* `time_s`: seconds per call (a median of repeats is best);
* `backend`: nccl or gloo, what ran the call (must match --backend when both are given).

Repeated rows (several runs of one size) are all fitted. Unknown columns are refused, so a
misspelt optional column is not silently dropped.
"""

from __future__ import annotations

import csv
import difflib
import io

from synth.calibrate.measurements import Measurement, Span, check_time, collective_from_name, parse_count, parse_float
from synth.errors import UsageError
from synth.model.backends import BACKENDS
from synth.units import parse_bytes

REQUIRED = ("collective", "level", "group_size", "bytes", "time_s")
OPTIONAL = ("backend", "ranks_per_unit")


def looks_like_bench_csv(header: list[str]) -> bool:
    names = {name.strip().lower() for name in header}
    return "group_size" in names or "time_s" in names or ("level" in names and "bytes" in names)


def parse_bench_csv(text: str, path: str, level: str | None) -> list[Measurement]:
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    header_line, header_text = lines[0]
    header = [name.strip().lower() for name in next(csv.reader([header_text]))]
    for name in header:
        if name not in REQUIRED + OPTIONAL:
            close = difflib.get_close_matches(name, REQUIRED + OPTIONAL, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"columns are {', '.join(REQUIRED + OPTIONAL)}"
            raise UsageError(f"{path}:{header_line}: unknown column {name!r}; {hint}")
    missing = [name for name in REQUIRED if name not in header]
    if missing:
        raise UsageError(f"{path}:{header_line}: missing column(s) {', '.join(missing)}; the header is "
                         f"{','.join(REQUIRED)}[,backend][,ranks_per_unit]")
    measurements = []
    for number, line in lines[1:]:
        where = f"{path}:{number}"
        values = [value.strip() for value in next(csv.reader(io.StringIO(line)))]
        if len(values) != len(header):
            raise UsageError(f"{where}: {len(values)} fields where the header has {len(header)}")
        row = dict(zip(header, values))
        collective = collective_from_name(row["collective"], where)
        row_level = row["level"] or level
        if not row_level:
            raise UsageError(f"{where}: empty level; name the topology level the group spans (or give the level)",
                             inputs=("level",))
        if level is not None and row_level != level:
            raise UsageError(f"{where}: the row names level {row_level!r} but the level given is {level!r}; give "
                             f"none (this CSV names its levels)", inputs=("level",))
        size = parse_count(row["group_size"], "group_size", where, 2)
        per_unit = parse_count(row["ranks_per_unit"], "ranks_per_unit", where, 1) if row.get("ranks_per_unit") else 1
        if size % per_unit or size // per_unit < 2:
            raise UsageError(f"{where}: group_size {size} is not at least two units of ranks_per_unit {per_unit}")
        nbytes = parse_bytes(row["bytes"], where=f"{where}: bytes")
        time_s = check_time(parse_float(row["time_s"], "time_s", where), row["time_s"], where)
        backend = row.get("backend") or None
        if backend is not None and backend not in BACKENDS:
            raise UsageError(f"{where}: unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
        span = Span(row_level, units=size // per_unit, per_unit=per_unit)
        measurements.append(Measurement(collective, nbytes, time_s, span, path, number, backend))
    if not measurements:
        raise UsageError(f"{path}: a header and no rows; add one row per measured call")
    return measurements
