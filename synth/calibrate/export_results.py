"""What exported programs print, read back as measurements: the torch script's table and its
`--json-out` JSON (synth/export/torch_runtime.py), and the NCCL C program's table
(synth/export/nccl_runtime.c). Both tables are nccl-tests' columns under comment lines:

    # command: synth export --topology dgx-a100-2x8 --axes data=16 --format torch ...
    # 1 program(s) on 16 ranks, backend nccl, type float, ...        (torch; the C file: # program: TEXT)
    # program 0: AllReduce(InsideGroup(node))
    # 2 reduction group(s) of n = 8 ranks; the buffer is cut into 8 chunks
    # reduction groups: [[0,2,4,...],[1,3,5,...]]
    #       size   count   type  redop  root   time  algbw  busbw #wrong   time  algbw  busbw #wrong
    ...rows...
    # baseline: one all_reduce over each reduction group
    ...rows...   (programs 0)

A measurement is one collective call per group: every baseline row (one call of the goal's
collective over each reduction group: torch's all_reduce, reduce_scatter_tensor,
all_gather_into_tensor, all_to_all_single, broadcast or reduce, or NCCL's), and the rows of
programs of one step of that collective over the whole group. Multi-step programs are
programs, not calls, and are skipped. The goal is the `--collective` of the `# command:` line
(all-reduce without one), the C program's baseline line names its NCCL call, the JSON's
baselines their "goal"; the baseline rows measure that goal's collective, never an all-reduce
unless the goal is one. The group is the first reduction group, placed on the topology that
`--topology` names, else the one the `# command:` line exported for.
"""

from __future__ import annotations

import json
import re

from synth.calibrate.measurements import (Measurement, Span, check_time, collective_from_name, parse_count,
                                         parse_float)
from synth.calibrate.nccl_text import TABLE_END, _table_columns, strip_prefixes
from synth.calibrate.synth_bench import ONE_STEP, _span, command_options
from synth.errors import UsageError
from synth.names import echo

GROUPS = re.compile(r"^#\s*reduction groups:\s*(\[.*\])\s*$")
PROGRAM = re.compile(r"^#\s*program(?: ([0-9]{1,9}))?(?: \(.*?\))?: (.*)$")  # torch: "program 0 (label): T"; C: "program: T"
BASELINE = re.compile(r"^#\s*baseline:")
NCCL_BASELINE = re.compile(r"\bnccl([A-Z]\w*)")  # the C program's baseline line names its NCCL call
BACKEND = re.compile(r"^#\s*\d+ program\(s\) on \d+ ranks, backend (\w+)")
OLDER = re.compile(r"^#\s*(\d+ program\(s\) on \d+ ranks, backend|\d+ ranks, reduction groups of n = )")
PROGRAMS_SUFFIX = re.compile(r"\s+\(programs ([0-9]{1,9}(?:,[0-9]{1,9})*)\)\s*$")
FORMAT = "synth-export-results"


def looks_like_export_text(text: str) -> bool:
    """An exported program's output: its `# reduction groups:` lines (or an older output's first lines)."""
    head = strip_prefixes("\n".join(text.splitlines()[:400]))
    return any(GROUPS.match(line.strip()) or OLDER.match(line.strip()) for line in head.splitlines())


def looks_like_export_json(text: str) -> bool:
    return text.lstrip().startswith("{") and '"baselines"' in text and '"results"' in text


def parse_export_text(text: str, path: str, level: str | None, topology: str | None) -> list[Measurement]:
    text = strip_prefixes(text)  # as captured through a launcher (torchrun --tee, srun --label, mpirun)
    lines = text.splitlines()
    if not any(GROUPS.match(line) for line in lines):
        raise UsageError(f"{path}: an exported program's output without its '# reduction groups:' lines (an older "
                         f"synth wrote the program): export it again with this synth and rerun it")
    backend, programs, groups = "nccl", {}, {}
    current, baseline, columns, rows = 0, False, None, []
    options = _options(text, path, topology)
    goal = _goal_collective(options.get("collective"), path)  # the collective every program computes
    measured = goal  # what the rows being read measure
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        found = BACKEND.match(line)
        if found:
            backend = found.group(1)
        found = PROGRAM.match(line)
        if found and columns is None:
            current, baseline = int(found.group(1) or 0), False
            programs[current] = found.group(2).strip()
            continue
        found = GROUPS.match(line)
        if found:
            groups[current] = _groups(found.group(1), f"{path}:{number}")
            continue
        if BASELINE.match(line):
            baseline, columns = True, None
            named = NCCL_BASELINE.search(line)  # the C program: "one ncclReduceScatter over ..."
            measured = collective_from_name(named.group(1), f"{path}:{number}") if named else goal
            continue
        if line.startswith("#"):
            names = _table_columns(line.lstrip("#").split())
            if names is not None:
                columns = names
            elif TABLE_END.match(line):
                columns = None
            continue
        if columns is None or not line[:1].isdigit():
            continue
        suffix = PROGRAMS_SUFFIX.search(line)
        owner = int(suffix.group(1).split(",")[0]) if suffix else current
        if suffix:
            line = line[:suffix.start()]
        if not baseline and not _one_call(programs.get(current, ""), goal):
            continue
        tokens = line.split()
        where = f"{path}:{number}"
        if len(tokens) != len(columns):
            raise UsageError(f"{where}: a result row with {len(tokens)} fields where the header has {len(columns)}; "
                             f"give the output as the program printed it")
        rows.append((number, tokens, columns, owner, measured if baseline else goal))
    return _measurements(rows, groups, path, level, topology, options, backend)


def parse_export_json(text: str, path: str, level: str | None, topology: str | None) -> list[Measurement]:
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as error:  # ValueError: also an integer past 4,300 digits
        raise UsageError(f"{path}: not JSON ({' '.join(str(error).split())[:80]})") from None
    if not isinstance(document, dict) or not isinstance(document.get("programs"), list):
        raise UsageError(f"{path}: an exported script's JSON without its 'programs' (an older synth wrote the script): "
                         f"export it again with this synth and rerun it")
    options = _options("", path, topology, document.get("command"))
    goal = _goal_collective(options.get("collective"), path)
    backend = document.get("backend") if document.get("backend") in ("nccl", "gloo") else None
    groups, rows = {}, []
    for index, program in enumerate(document["programs"]):
        where = f"{path}: programs[{index}]"
        if not isinstance(program, dict):
            raise UsageError(f"{where} is not an object")
        groups[index] = _groups(json.dumps(program.get("reduction_groups")), where)
    entries = []
    for key, baseline in (("baselines", True), ("results", False)):
        listed = document.get(key)
        if not isinstance(listed, list):
            raise UsageError(f"{path}: '{key}' is not a list of rows; give the JSON as the script wrote it")
        entries += [(key, entry, baseline) for entry in listed]
    for number, (key, entry, baseline) in enumerate(entries, 1):
        if not isinstance(entry, dict):
            raise UsageError(f"{path}: an entry of {key} is not an object")
        owners = entry.get("programs") if baseline else [entry.get("program")]
        owner = owners[0] if isinstance(owners, list) and owners else None
        if type(owner) is not int or owner not in groups:
            raise UsageError(f"{path}: an entry of {key} names program {echo(owner)}, which the file does not list")
        if not baseline and not _one_call(str(document["programs"][owner].get("text", "")), goal):
            continue
        measured = _goal_collective(entry.get("goal"), path) if baseline and "goal" in entry else goal
        tokens = [str(entry.get("bytes")), str(entry.get("time_us"))]
        rows.append((number, tokens, ["size", "time"], owner, measured))
    return _measurements(rows, groups, path, level, topology, options, backend)


def named_topology(text: str) -> str | None:
    """The topology the `# command:` line (or the JSON's "command") exported or ran for."""
    command = None
    if looks_like_export_json(text):
        try:
            command = json.loads(text).get("command")
        except (ValueError, RecursionError, AttributeError):
            return None
        if not isinstance(command, str):
            return None
    try:
        options = command_options(f"# command: {command}" if command is not None else strip_prefixes(text), "")
    except UsageError:
        return None
    return options.get("topology") or options.get("emulate") or None


def _one_call(program: str, collective: str = "AllReduce") -> bool:
    """A program of one step of the goal's collective: one call per reduction group, like the baseline."""
    step = ONE_STEP.match(program)
    return bool(step) and step.group(1) == collective


def _goal_collective(name, path: str) -> str:
    """The collective a goal's name computes ('reducescatter' -> 'ReduceScatter'); all-reduce
    when nothing names one."""
    from synth.goals import parse_goal

    if name in (None, ""):
        return "AllReduce"
    try:
        return parse_goal(str(name)).collective
    except UsageError:
        raise UsageError(f"{path}: the export names collective {echo(name)}, which synth does not know; "
                         f"give the output of an export of this synth") from None


def _groups(text: str, where: str) -> list[tuple[int, ...]]:
    try:
        groups = json.loads(text)
    except (ValueError, RecursionError):  # ValueError: also an integer past 4,300 digits
        groups = None
    if (not isinstance(groups, list) or not groups or
            not all(isinstance(g, list) and len(g) >= 2 and all(type(r) is int and r >= 0 for r in g) for g in groups)):
        raise UsageError(f"{where}: the reduction groups are not lists of two or more ranks, e.g. [[0,1],[2,3]]")
    return [tuple(group) for group in groups]


def _options(text: str, path: str, topology: str | None, command: str | None = None) -> dict[str, str]:
    if command is not None:
        text = f"# command: {command}"
    try:
        return command_options(text, path)
    except UsageError:
        if topology is not None:
            return {}
        raise UsageError(f"{path}: no '# command:' line naming the topology the program was exported for; "
                         f"give the topology", inputs=("topology",)) from None


def _measurements(rows, groups, path, level, topology, options, backend) -> list[Measurement]:
    from synth.topology_file import load_topology

    if not rows:
        raise UsageError(f"{path}: no row is one collective call per group (a baseline call or a program of one step "
                         f"over the whole group); give the whole output")
    name = topology or options.get("topology") or options.get("emulate")
    if not name:
        raise UsageError(f"{path}: the '# command:' line names no topology; give the topology", inputs=("topology",))
    base = load_topology(name)
    spans: dict[int, Span] = {}
    measurements = []
    for number, tokens, columns, owner, collective in rows:
        where = f"{path}:{number}"
        if owner not in groups:
            raise UsageError(f"{where}: a row of program {owner}, whose '# reduction groups:' line is missing")
        if owner not in spans:
            group = groups[owner][0]
            if max(group) >= base.device_count:
                raise UsageError(f"{where}: the reduction groups name rank {max(group)}, but {base.name} has "
                                 f"{base.device_count} devices; give the topology the program was exported for")
            spans[owner] = _span(base, group, level)[0]
        size = parse_count(tokens[columns.index("size")], "size", where, 1)
        times = [i for i, column in enumerate(columns) if column == "time"]
        text = tokens[times[-1]]
        if text.upper() == "N/A" and len(times) > 1:
            text = tokens[times[0]]
        time_s = check_time(parse_float(text, "time", where), text, where, 1e-6)
        measurements.append(Measurement(collective, size, time_s, spans[owner], path, number, backend))
    return measurements
