"""nccl-tests text output (all_reduce_perf, reduce_scatter_perf, all_gather_perf,
broadcast_perf, reduce_perf, alltoall_perf), as printed by nccl-tests 2.x and rccl-tests:

    # nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 ...
    #  Rank  0 Group  0 Pid  12345 on     node01 device  0 [0x07] NVIDIA A100-SXM4-80GB
    #       size         count      type   redop    root     time   algbw   busbw #wrong     time ...
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us) ...
         1048576        262144     float     sum      -1    35.21   29.78   52.12      0    34.90 ...

The rank lines give the group: how many ranks, on how many hosts (older versions print no
`Group`; a run split into several groups is refused). The table header gives the columns
(older versions have no `root` and call `#wrong` `error`); the in-place time is used (it is
what programs run), the out-of-place one when there is no other. Rows of 0 bytes are
skipped: NCCL returns from them without communicating. NCCL log lines, and other messages
printed into the table that do not start with a number, are ignored.

The output does not name the collective, so it is read from a `<test>_perf` name in the
file (a captured command line) or in the file name, and from the table itself: the `redop`
(`none` for AllGather, Broadcast and AllToAll), the `root` (-1 for AllReduce, ReduceScatter,
AllGather and AllToAll), the `count` (one rank's share for ReduceScatter, AllGather and AllToAll,
the whole buffer otherwise) and busbw / algbw (nccl-tests' bus factors 2(n-1)/n, (n-1)/n, 1;
alltoall_perf's is (n-1)/n, as all_gather_perf's, so an all-to-all table is told apart by its
name only). When both name and table tell, they must agree.

Output captured through a launcher is read as printed: `mpirun --tag-output` prefixes
(`[1,0]<stdout>:`; `<stderr>` lines are dropped), `srun --label` prefixes (`0: `), markdown
quoting (`> `), several runs in one file, `-g N` runs (one process drives N GPUs), runs of
one size. The rank lines also give the GPU names, how many GPUs a process drives and whether
ranks share a GPU, and an `NCCL version` line the version (`RunInfo`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from synth.calibrate.launcher import bound_cores, is_launch_line
from synth.calibrate.measurements import (CALIBRATED, Measurement, RunInfo, Span, check_time, collective_from_name, parse_count,
                                         parse_float)
from synth.collectives import RECORDS
from synth.errors import UsageError
from synth.language import collective_names

HEADER = re.compile(r"#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)")
RANK = re.compile(r"#\s*Rank\s+([0-9]+)\s+(?:Group\s+([0-9]+)\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+([0-9]+)"
                  r"(?:\s+\[[^\]]*\]\s+(.*\S))?")
TABLE_HEADER = re.compile(r"#\s*size\s+count\s+type", re.IGNORECASE)
VERSION = re.compile(r"\bNCCL version (\d+\.\d+\.\d+)")
# NCCL_ALGO on the command line (`NCCL_ALGO=NVLS ./build/...`, `export ...`, mpirun `-x ...`) or
# in NCCL's INFO log (`NCCL_ALGO set by environment to NVLS`)
ALGO = re.compile(r"\bNCCL_ALGO(?:=|\s+set by environment to\s+)['\"]?([^\s'\"]+)")
# Launcher prefixes: mpirun --tag-output "[1,0]<stdout>:", srun --label "0: ", markdown "> ".
TAG = re.compile(r"^\[\d+,\d+\]<(stdout|stderr|stddiag)>:")
LABEL = re.compile(r"^\s*\d+:\s")
TORCHRUN = re.compile(r"^\[(?:default|rank)\d+\]:")  # torchrun --tee / --local-ranks-filter prefixes
TEST_NAME = re.compile(r"(?<![A-Za-z])(all_reduce|reduce_scatter|all_gather|broadcast|reduce|alltoallv?|sendrecv|"
                       r"scatter|gather|hypercube)_perf(?![A-Za-z])")
# The nccl-tests binary of each collective (<name>_perf).
TEST_OF = {"AllReduce": "all_reduce", "ReduceScatter": "reduce_scatter", "AllGather": "all_gather",
           "Broadcast": "broadcast", "Reduce": "reduce", "AllToAll": "alltoall"}
# nccl-tests' busbw / algbw per collective for n ranks (doc/PERFORMANCE.md).
BUS_FACTOR = {record.name: record.bus_factor for record in RECORDS.values()}
# Bytes per element of nccl-tests' `-d` type names (its test_typenames).
WORD_BYTES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "half": 2, "float": 4,
              "double": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1}
LOG_LINE = re.compile(r"\bNCCL\b|\bRCCL\b")
TABLE_END = re.compile(r"#\s*(Out of bounds|Avg bus bandwidth)")


@dataclass
class _Run:
    """One nccl-tests invocation inside the file: its ranks, its table, the test it names."""

    line: int
    named: tuple[str, int] | None  # (test name, line) mentioned before or in this run
    ranks: dict[int, tuple[str, int]] = field(default_factory=dict)  # rank -> (host, group)
    columns: list[str] | None = None
    open: bool = False  # inside the table: between its header and its trailer
    rows: list[tuple[int, list[str]]] = field(default_factory=list)
    devices: dict[int, tuple[str, int, str]] = field(default_factory=dict)  # rank -> (pid, device, name)
    version: str | None = None
    algo: str | None = None
    command: str | None = None  # the launcher's command line before the run (launcher.py)


def strip_prefixes(text: str) -> str:
    """The output without launcher prefixes, line for line (so line numbers stay the file's):
    mpirun --tag-output's `[1,0]<stdout>:` (stderr lines become blank), srun --label's `0: ` when
    most lines carry it, torchrun's `[default0]:` (the exported scripts' output), markdown's `> `."""
    lines = text.splitlines()
    tagged = any(TAG.match(line) for line in lines)
    labelled = sum(1 for line in lines if LABEL.match(line))
    strip_labels = not tagged and labelled > sum(1 for line in lines if line.strip()) / 2  # counted once: linear
    out = []
    for line in lines:
        found = TAG.match(line)
        label = None if found or not strip_labels else LABEL.match(line)
        if found:
            line = "" if found.group(1) != "stdout" else line[found.end():]
        elif label:
            line = line[label.end():]
        else:
            prefixed = TORCHRUN.match(line)
            line = line[prefixed.end():] if prefixed else line
        if line.startswith("> "):
            line = line[2:]
        out.append(line)
    return "\n".join(out)


def is_nccl_text(text: str) -> bool:
    """nccl-tests output, even damaged: its header, a rank line, its table header or trailer."""
    for line in strip_prefixes(text).splitlines():
        line = line.strip()
        if HEADER.match(line) or RANK.match(line) or TABLE_HEADER.match(line) or TABLE_END.match(line):
            return True
    return False


def _table_columns(tokens: list[str]) -> list[str] | None:
    names = [token.lower() for token in tokens]
    if "size" in names and "count" in names and "time" in names:
        return names
    return None


def parse_nccl_text(text: str, path: str, level: str | None) -> list[Measurement]:
    runs: list[_Run] = []
    named = _name_in_path(path)
    current: _Run | None = None
    version = algo = command = None
    continued = False
    for number, raw in enumerate(strip_prefixes(text).splitlines(), 1):
        line = raw.strip()
        if continued or (line[:1] != "#" and is_launch_line(line)):  # a launch line, and its `\` continuations
            command = f"{command} {line}" if continued and command else line
            continued = line.endswith("\\")
        found_version = VERSION.search(line) if "version" in line else None  # cheap tests first: 10^5 rows
        if found_version:
            version = found_version.group(1)
            if current is not None:
                current.version = version
        found_algo = ALGO.search(line) if "NCCL_ALGO" in line else None
        if found_algo:
            algo = found_algo.group(1)
            if current is not None and not current.rows:  # NCCL's log during this run's setup
                current.algo = algo
        if current is not None and current.open and line and not line.startswith("#"):
            if "CCL" not in line or not LOG_LINE.search(line):
                current.rows.append((number, line.split()))
            continue
        found = TEST_NAME.search(line)
        if found and not RANK.match(line):
            named = (found.group(1), number)
            if current is not None and not current.rows:
                current.named = named
        if HEADER.match(line):
            current = _Run(number, named, version=version, algo=algo, command=command)
            runs.append(current)
            continue
        rank = RANK.match(line)
        if rank:
            if current is None or current.columns is not None:
                current = _Run(number, named, version=version, algo=algo, command=command)
                runs.append(current)
            if max(len(rank.group(i) or "") for i in (1, 2, 5)) > 9:  # no int() of 5,000 digits
                raise UsageError(f"{path}:{number}: a rank line whose rank, group or device number has more than "
                                 f"9 digits; give nccl-tests output as printed")
            index = int(rank.group(1))
            if index in current.ranks:
                raise UsageError(f"{path}:{number}: rank {index} appears twice in one run (several single-process runs "
                                 f"mixed, e.g. nccl-tests built without MPI under mpirun?); give one run per file")
            current.ranks[index] = (rank.group(4), int(rank.group(2) or 0))
            current.devices[index] = (rank.group(3), int(rank.group(5)), rank.group(6) or "")
            continue
        if line.startswith("#"):
            columns = _table_columns(line.lstrip("#").split())
            if columns is not None and current is not None:
                current.columns, current.open = columns, True
            elif columns is not None:
                raise UsageError(f"{path}:{number}: a result table before any '# nThread' header or '#  Rank' line: "
                                 f"cannot tell the ranks; give the whole nccl-tests output")
            elif TABLE_END.match(line) and current is not None:
                current.open = False
    measurements = []
    for run in runs:
        measurements += _measurements(run, path, level)
    if not measurements:
        seen = ("a '# nThread' header" if any(r.line for r in runs) else "no '# nThread' header",
                f"{sum(len(r.ranks) for r in runs)} rank line(s)",
                "a table header" if any(r.columns for r in runs) else "no table header (# size count type ...)")
        raise UsageError(f"{path}: looks like nccl-tests output ({', '.join(seen)}) but has no result rows "
                         f"(nccl-tests rows of size, count, type, ..., time); give the output of a run that finished")
    return measurements


def _run_info(run: _Run) -> RunInfo:
    names = tuple(sorted({name for _, _, name in run.devices.values() if name}))
    per_pid: dict[tuple[str, str], int] = {}
    per_device: dict[tuple[str, int], int] = {}
    for rank, (pid, device, _) in run.devices.items():
        host = run.ranks[rank][0]
        per_pid[(host, pid)] = per_pid.get((host, pid), 0) + 1
        per_device[(host, device)] = per_device.get((host, device), 0) + 1
    return RunInfo(names, max(per_pid.values(), default=1), any(count > 1 for count in per_device.values()),
                   run.version, run.algo, bound_cores(run.command, len(per_pid)))


def _name_in_path(path: str) -> tuple[str, int] | None:
    found = TEST_NAME.search(path.replace("\\", "/").rsplit("/", 1)[-1])
    return (found.group(1), 0) if found else None


def _group(run: _Run, path: str, level: str | None) -> Span:
    if not run.ranks:
        raise UsageError(f"{path}:{run.line}: a run without '#  Rank N ... on HOST device D' lines: "
                         f"cannot tell the ranks and hosts; give the whole nccl-tests output")
    if sorted(run.ranks) != list(range(len(run.ranks))):
        raise UsageError(f"{path}:{run.line}: the rank lines do not number 0..{len(run.ranks) - 1}; give the whole output")
    groups = {group for _, group in run.ranks.values()}
    if len(groups) > 1:
        raise UsageError(f"{path}:{run.line}: the run split its ranks into {len(groups)} groups running at once; "
                         f"calibrate from runs of one group")
    per_host: dict[str, int] = {}
    for host, _ in run.ranks.values():
        per_host[host] = per_host.get(host, 0) + 1
    counts = set(per_host.values())
    if len(counts) > 1:
        listed = ", ".join(f"{host}: {count}" for host, count in per_host.items())
        raise UsageError(f"{path}:{run.line}: hosts run different numbers of ranks ({listed}); "
                         f"calibrate from runs with the same ranks on every host")
    hosts, ranks = len(per_host), counts.pop()
    if hosts * ranks < 2:
        raise UsageError(f"{path}:{run.line}: a run of one rank measures no communication")
    if hosts == 1:
        return Span(level, units=ranks)
    return Span(level, units=hosts, per_unit=ranks, hosts=hosts)


def _measurements(run: _Run, path: str, level: str | None) -> list[Measurement]:
    if not run.rows:
        return []
    columns = run.columns
    span = _group(run, path, level)
    times = [i for i, name in enumerate(columns) if name == "time"]
    size_at = columns.index("size")
    parsed = []
    for number, tokens in run.rows:
        where = f"{path}:{number}"
        if len(tokens) != len(columns) and not tokens[0][:1].isdigit():
            continue  # a message printed into the table (MPI, a launcher), not a row
        if len(tokens) != len(columns):
            raise UsageError(f"{where}: a result row with {len(tokens)} fields where the header has {len(columns)} "
                             f"({' '.join(columns)}); give nccl-tests output as printed")
        size = parse_count(tokens[size_at], "size", where)
        time_text = tokens[times[-1]]
        if time_text.upper() == "N/A" and len(times) > 1:
            time_text = tokens[times[0]]
        time_s = check_time(parse_float(time_text, "time", where), time_text, where, 1e-6)
        parsed.append((number, tokens, size, time_s))
    if not parsed:
        return []
    collective = _collective(run, columns, parsed, span.size, path)
    info = _run_info(run)
    return [Measurement(collective, size, time_s, span, path, number, "nccl", info)
            for number, _, size, time_s in parsed if size > 0]


def _collective(run: _Run, columns: list[str], parsed, n: int, path: str) -> str:
    """The collective the run measured: named by the test, and consistent with the table."""
    possible = _possible_from_table(columns, parsed, n)
    if run.named is not None:
        name, line = run.named
        named = collective_from_name(name, f"{path}:{line}" if line else path)
        if named not in possible:
            table = ", ".join(c for c in CALIBRATED if c in possible) or "no collective"
            raise UsageError(f"{path}:{run.line}: the run is named {name}_perf but its table (redop, root, count, busbw/algbw) "
                             f"fits {table}; check the file")
        return named
    if len(possible) == 1:
        return next(iter(possible))
    fits = " or ".join(c for c in CALIBRATED if c in possible)
    if fits:
        example = " or ".join(f"{TEST_OF[c]}_perf.txt" for c in CALIBRATED if c in possible)
        raise UsageError(f"{path}:{run.line}: cannot tell which collective this run measured: its table fits {fits} "
                         f"(nccl-tests output does not name it); name the file after the test, e.g. {example}")
    raise UsageError(f"{path}:{run.line}: cannot tell which collective this run measured (nccl-tests output does "
                     f"not name it); name the file after the test, e.g. all_reduce_perf.txt")


def _possible_from_table(columns: list[str], parsed, n: int) -> set[str]:
    """The collectives whose nccl-tests table looks like this one: `redop` none or not, `root`
    -1 or a rank, and busbw / algbw the collective's bus factor for n ranks."""
    def values(name: str) -> set[str]:
        if name not in columns:
            return set()
        at = columns.index(name)
        return {tokens[at].lower() for _, tokens, _, _ in parsed}

    possible = set(CALIBRATED)
    redops, roots = values("redop"), values("root")
    if len(redops) == 1:
        possible &= ({"AllGather", "Broadcast", "AllToAll"} if redops == {"none"}
                     else {"AllReduce", "ReduceScatter", "Reduce"})
    if len(roots) == 1:
        possible &= ({"AllReduce", "ReduceScatter", "AllGather", "AllToAll"} if roots == {"-1"}
                     else {"Reduce", "Broadcast"})
    per_rank = _count_per_rank(columns, parsed, n)
    if per_rank is not None:
        possible &= {"ReduceScatter", "AllGather", "AllToAll"} if per_rank else {"AllReduce", "Broadcast", "Reduce"}
    factor = _bus_factor(columns, parsed)
    if factor is not None:
        possible = {c for c in possible if abs(factor / BUS_FACTOR[c](n) - 1) < 0.03}
    return possible


def _count_per_rank(columns: list[str], parsed, n: int) -> bool | None:
    """Whether the `count` column is one rank's share: nccl-tests prints `size` as the larger
    buffer and `count` as the call's own count argument, so `size = count x word` for
    all_reduce, broadcast and reduce, and `size = count x word x n` for reduce_scatter,
    all_gather and alltoall (their getCollByteCount). None when the rows do not tell (an
    unknown type, no row with a count, rows that disagree)."""
    if "type" not in columns or "count" not in columns:
        return None
    type_at, count_at, size_at = columns.index("type"), columns.index("count"), columns.index("size")
    answers = set()
    for _, tokens, size, _ in parsed:
        word = WORD_BYTES.get(tokens[type_at].lower())
        count = tokens[count_at]
        if word is None or not re.fullmatch(r"[0-9]{1,20}", count) or not int(count) or not size:
            continue
        if size == int(count) * word:
            answers.add(False)
        elif size == int(count) * word * n:
            answers.add(True)
        else:
            return None
    return answers.pop() if len(answers) == 1 else None


def _bus_factor(columns: list[str], parsed) -> float | None:
    """Median busbw / algbw over rows whose printed algbw (two decimals) is precise enough."""
    if "algbw" not in columns or "busbw" not in columns:
        return None
    alg_at, bus_at = columns.index("algbw"), columns.index("busbw")
    ratios = []
    for _, tokens, _, _ in parsed:
        try:
            alg, bus = float(tokens[alg_at]), float(tokens[bus_at])
        except ValueError:
            continue
        if alg >= 0.5:
            ratios.append(bus / alg)
    if not ratios:
        return None
    ratios.sort()
    return ratios[len(ratios) // 2]
