"""nccl-tests results as CSV: the file rccl-tests writes with `--output_file F
--output_format csv` (upstream nccl-tests prints text only), or any CSV with these columns.

Header (case and spaces ignored), one row per size and in/out-of-place run:

    collective, gpus, size, type, redop, inplace, time, algbw, busbw, #wrong
    collective, ranks, rankspernode, gpusperrank, size, type, redop, inplace, time, algbw, busbw, #wrong

Required: `collective` (or `name`: AllReduce, ReduceScatter, AllGather, Broadcast, Reduce),
`size` (bytes), `time` (microseconds), and the group: `gpus` (one process, one host), or
`ranks` with optional `gpusperrank` (default 1), `rankspernode` and `nodes`. The group has
ranks x gpusperrank members on nodes hosts (ranks / rankspernode when `nodes` is absent; one
host when both are). rccl-tests' MPI rows carry a `nodes` value its header does not name;
such a row (one field more than the header, right after the collective) is read that way.
Optional `inplace` (0/1): in-place rows are used when there are any, as for the text. The
size is what rccl-tests records, the receive buffer; for ReduceScatter that is one rank's
block, B / n, so it is multiplied by n, unless `algbw` (GB/s) shows it already is B.
"""

from __future__ import annotations

import csv
import io

from synth.calibrate.measurements import Measurement, Span, check_time, collective_from_name, parse_count, parse_float
from synth.errors import UsageError

ALIASES = {"name": "collective", "wrong": "#wrong", "inPlace": "inplace"}
KNOWN = ("collective", "gpus", "nodes", "ranks", "rankspernode", "gpusperrank", "size", "count", "type", "redop",
         "root", "inplace", "time", "algbw", "busbw", "#wrong")


def normalize(name: str) -> str:
    key = name.strip().lower().replace(" ", "").replace("_", "")
    return ALIASES.get(key, key)


def looks_like_nccl_csv(header: list[str]) -> bool:
    names = {normalize(name) for name in header}
    return {"collective", "size", "time"} <= names


def parse_nccl_csv(text: str, path: str, level: str | None) -> list[Measurement]:
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    header = [normalize(name) for name in next(csv.reader([lines[0][1]]))]
    unknown = [name for name in header if name not in KNOWN]
    if unknown:
        raise UsageError(f"{path}:{lines[0][0]}: unknown column(s) {', '.join(unknown)}; nccl-tests CSV columns are "
                         f"{', '.join(KNOWN)}")
    rows = []
    for number, line in lines[1:]:
        values = [value.strip() for value in next(csv.reader(io.StringIO(line)))]
        names = header
        if len(values) == len(header) + 1 and "ranks" in header and "nodes" not in header:
            names = header[:1] + ["nodes"] + header[1:]  # rccl-tests MPI rows: an unnamed nodes value
        if len(values) != len(names):
            raise UsageError(f"{path}:{number}: {len(values)} fields where the header has {len(header)}; "
                             f"give the CSV as written")
        rows.append((number, dict(zip(names, values))))
    if not rows:
        raise UsageError(f"{path}: a header and no result rows; give the CSV of a run that finished")
    if any(row.get("inplace", "").strip() == "1" for _, row in rows):
        rows = [(number, row) for number, row in rows if row.get("inplace", "1").strip() != "0"]
    measurements = []
    for number, row in rows:
        where = f"{path}:{number}"
        collective = collective_from_name(row["collective"], where)
        span = _span(row, where, level)
        size = parse_count(row["size"], "size", where)
        time_s = check_time(parse_float(row["time"], "time", where), row["time"], where, 1e-6)
        if size == 0:
            continue  # NCCL returns from an empty call without communicating
        size = _call_bytes(collective, size, time_s, span.size, row.get("algbw"), where)
        measurements.append(Measurement(collective, size, time_s, span, path, number, "nccl"))
    if not measurements:
        raise UsageError(f"{path}: no rows with a size above 0 bytes")
    return measurements


def _span(row: dict[str, str], where: str, level: str | None) -> Span:
    if "ranks" in row:
        ranks = parse_count(row["ranks"], "ranks", where, 1)
        per_rank = parse_count(row["gpusperrank"], "gpusperrank", where, 1) if "gpusperrank" in row else 1
        if "nodes" in row:
            hosts = parse_count(row["nodes"], "nodes", where, 1)
        elif "rankspernode" in row:
            per_node = parse_count(row["rankspernode"], "rankspernode", where, 1)
            if ranks % per_node:
                raise UsageError(f"{where}: {ranks} ranks do not split into nodes of {per_node}")
            hosts = ranks // per_node
        else:
            hosts = 1
        total = ranks * per_rank
    elif "gpus" in row:
        hosts, total = 1, parse_count(row["gpus"], "gpus", where, 1)
    else:
        raise UsageError(f"{where}: no gpus or ranks column: cannot tell the group; add gpus (one host) or ranks")
    if total % hosts:
        raise UsageError(f"{where}: {total} ranks do not split evenly over {hosts} nodes")
    if total < 2:
        raise UsageError(f"{where}: a run of one rank measures no communication")
    if hosts == 1:
        return Span(level, units=total)
    return Span(level, units=hosts, per_unit=total // hosts, hosts=hosts)


def _call_bytes(collective: str, size: int, time_s: float, n: int, algbw: str | None, where: str) -> int:
    """B from the recorded size: algbw = B / t decides when given, else rccl-tests' convention."""
    per_rank = collective == "ReduceScatter"
    if algbw not in (None, ""):
        bandwidth = parse_float(algbw, "algbw", where) * 1e9
        if bandwidth > 0:
            implied = bandwidth * time_s
            per_rank = abs(implied / (size * n) - 1) < abs(implied / size - 1)
    return size * n if per_rank else size
