"""The CSV `synth bench` writes (synth/execute/report.py): one row per program and size, with
the command that made it in a `# command:` comment.

Only rows that are one collective call per group are measurements of a call: the baseline
rows (`torch.distributed.all_reduce`, or the goal's own call: `reduce_scatter_tensor` is a
ReduceScatter, ...), and programs of one step `Collective(InsideGroup(L))`
over the outermost level L of their hierarchy (one call over the whole reduction group, the
default all-reduce among them). The group comes from the command's --topology (or
--emulate), --axes and --reduce and the row's placement; the backend from the `# backend:`
comment. Multi-step programs and steps of several concurrent groups are skipped (a note says
how many): they are programs, not calls.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shlex

from synth.calibrate.measurements import Measurement, Span, check_time, collective_from_name, parse_count, parse_float
from synth.errors import UsageError
from synth.names import echo

COLUMNS = ("placement", "hierarchy", "role", "program", "bytes", "time_us")
ONE_STEP = re.compile(r"^\s*(\w+)\(\s*InsideGroup\(\s*([\w.]+)\s*\)\s*\)\s*;?\s*$")


def _baseline_collective(call: str, where: str) -> str:
    """The collective of a baseline row's torch call (each goal's `torch_call`, what the runtime times)."""
    from synth.goals import GOALS

    for goal in GOALS.values():
        if goal.torch_call == call:
            return goal.collective
    raise UsageError(f"{where}: a baseline of torch.distributed.{call}, which synth does not time; give the file "
                     f"as synth bench wrote it")


def looks_like_synth_bench(header: list[str]) -> bool:
    names = {name.strip().lower() for name in header}
    return "program" in names and "time_us" in names and "placement" in names


def command_options(text: str, path: str) -> dict[str, str]:
    """The --options of the `# command:` line (shell words, or `argv [JSON list]` as
    synth/export/provenance.py writes a command that is not plain ASCII)."""
    for line in text.splitlines():
        if line.startswith("# command:"):
            command = line[len("# command:"):].strip()
            try:
                words = json.loads(command[5:]) if command.startswith("argv [") else shlex.split(command)
            except ValueError:
                break
            if not isinstance(words, list) or not all(isinstance(word, str) for word in words):
                break
            options, key = {}, None
            for word in words:
                if word.startswith("--"):
                    key, _, value = word[2:].partition("=")
                    if value:
                        options[key], key = value, None
                    else:
                        options[key] = ""
                elif key is not None:
                    options[key], key = word, None
            return options
    raise UsageError(f"{path}: a synth bench CSV without its '# command:' line: the topology, axes and reduced axes "
                     f"of the rows are unknown; give the file as synth bench wrote it")


def _backend(text: str) -> str | None:
    found = re.search(r"^# backend:\s*(\w+)", text, re.MULTILINE)
    return found.group(1) if found else None


def parse_synth_bench_csv(text: str, path: str, level: str | None) -> tuple[list[Measurement], list[str]]:
    """(measurements, notes) of a synth bench CSV."""
    from synth.hierarchy import build_hierarchy
    from synth.placement import make_placement, parse_axes
    from synth.topology_file import load_topology

    options = command_options(text, path)
    topology_name = options.get("topology") or options.get("emulate")
    if not topology_name or "axes" not in options:
        raise UsageError(f"{path}: the '# command:' line names no topology (or emulated cluster) or no axes; give "
                         f"the file as synth bench wrote it")
    topology = load_topology(topology_name)
    axes = parse_axes(options["axes"])
    reduced = tuple(options.get("reduce", ",".join(axis.name for axis in axes)).split(","))
    backend = _backend(text)
    rows = [(number, line) for number, line in enumerate(text.splitlines(), 1)
            if line.strip() and not line.lstrip().startswith("#")]
    header = [name.strip().lower() for name in next(csv.reader([rows[0][1]]))]
    missing = [name for name in COLUMNS if name not in header]
    if missing:
        raise UsageError(f"{path}:{rows[0][0]}: a synth bench CSV without column(s) {', '.join(missing)}")
    measurements, skipped = [], 0
    spans: dict[str, tuple[Span, str]] = {}
    for number, line in rows[1:]:
        where = f"{path}:{number}"
        values = next(csv.reader(io.StringIO(line)))
        if len(values) != len(header):
            raise UsageError(f"{where}: {len(values)} fields where the header has {len(header)}")
        row = dict(zip(header, (value.strip() for value in values)))
        program = row["program"]
        if row["role"].startswith("baseline"):  # the goal's torch call: "baseline reduce_scatter_tensor", ...
            collective = _baseline_collective(row["role"][len("baseline"):].strip(), where)
        else:
            step = ONE_STEP.match(program)
            hierarchy_levels = row["hierarchy"].split(",")
            if not step or not hierarchy_levels or step.group(2) != hierarchy_levels[0]:
                skipped += 1
                continue
            collective = collective_from_name(step.group(1), where)
        key = row["placement"]
        if key not in spans:
            try:
                matrix = json.loads(key)
            except (ValueError, RecursionError):  # ValueError: also an integer past 4,300 digits
                raise UsageError(f"{where}: placement {echo(key)} is not a matrix like [[2,4]]") from None
            placement = make_placement(topology, axes, matrix)
            group = build_hierarchy(placement, reduced).groups[0]
            spans[key] = _span(topology, group, level)
        span, _ = spans[key]
        nbytes = parse_count(row["bytes"], "bytes", where, 1)
        time_s = check_time(parse_float(row["time_us"], "time_us", where), row["time_us"], where, 1e-6)
        measurements.append(Measurement(collective, nbytes, time_s, span, path, number, backend))
    notes = [f"{path}: skipped {skipped} row(s) of programs that are not one call per group"] if skipped else []
    if not measurements:
        raise UsageError(f"{path}: no row is one collective call per group (the baseline all_reduce or a one-step "
                         f"InsideGroup program); run synth bench with its baseline")
    return measurements, notes


def _span(topology, group, level: str | None) -> tuple[Span, str]:
    """The group as units of its outermost spanned level, each with its first members."""
    import numpy as np

    coords = np.stack(np.unravel_index(np.array(group), topology.sizes), axis=1)
    spanned = [l for l in range(coords.shape[1]) if len(set(coords[:, l].tolist())) > 1]
    index = spanned[0] if spanned else len(topology.sizes) - 1
    units = len({tuple(row[:index + 1]) for row in coords.tolist()})
    name = level or topology.levels[index].name
    return Span(name, units=units, per_unit=len(group) // units), topology.name
