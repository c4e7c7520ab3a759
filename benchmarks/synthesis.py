"""Synthesis speed, the pruning ablation, and the calibration of the search-size estimate.

    python -m benchmarks.synthesis [-o results]
    python -m benchmarks.synthesis --calibrate [-o results]

Times complete enumeration (every valid program up to length 5) on the cases issues 2 and 8
name (among them a 5-level and a 6-level hierarchy), and the same with each pruning rule
switched off, counting (state, steps left) pairs expanded, instructions applied and Z3
queries, wall and CPU time. Writes results/synthesis-speed/README.md and synthesis-speed.json.

--calibrate measures what synth/search/budget.py estimates from: the pairs a complete search
expands over hierarchies of 1..8 levels of size 2, for every length until a search takes a
third of the time limit, and the CPU seconds per expansion at each depth. Writes
results/synthesis-speed/synthesis-calibration.md and .json and prints the tables to paste into
synth/search/budget.py (a test keeps the two equal).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass

from benchmarks.record import REPORT, header, study_dir
from synth.hierarchy import build_hierarchy
from synth.output_files import write_text
from synth.placement import enumerate_placements, make_placement, parse_axes
from synth.search.pruning import _first_steps
from synth.search import Enumerator, SearchOptions, brute_force_programs
from synth.semantics import Semantics
from synth.topology import topology_from_levels

COMMAND = "python -m benchmarks.synthesis"
STUDY = "synthesis-speed"  # results/synthesis-speed/: README.md (speed) and synthesis-calibration.md
TIME_LIMIT_S = 60.0
CALIBRATION_DEPTHS = range(1, 9)
CALIBRATION_LENGTHS = range(1, 9)


@dataclass(frozen=True)
class Case:
    name: str
    levels: str
    axes: str
    reduce: str
    placement: list | None
    max_len: int
    target_s: float | None


CASES = (
    Case("every placement, data=8,model=4 on rack=2,server=2,cpu=2,gpu=4, reduce data",
         "rack=2,server=2,cpu=2,gpu=4", "data=8,model=4", "data", None, 5, 5.0),
    Case("4096-member group on pod=4,rack=8,node=16,gpu=8, reduce data",
         "pod=4,rack=8,node=16,gpu=8", "data=4096", "data", None, 5, 10.0),
    Case("paper example: server=2,cpu=2,gpu=4, axes 4,4, [[1,2,2],[2,1,2]], reduce a0",
         "server=2,cpu=2,gpu=4", "a0=4,a1=4", "a0", [[1, 2, 2], [2, 1, 2]], 5, None),
    Case("5-level hierarchy: one 32-member group on a=2,b=2,c=2,d=2,e=2",
         "a=2,b=2,c=2,d=2,e=2", "data=32", "data", None, 5, 5.0),
    Case("6-level hierarchy: one 64-member group on a=2,b=2,c=2,d=2,e=2,f=2",
         "a=2,b=2,c=2,d=2,e=2,f=2", "data=64", "data", None, 5, 30.0),
)

CONFIGS = (
    ("all pruning (quotient state, Z3 dead prefixes, shared suffixes)", dict(quotient=True, prune_dead=True, share_suffixes=True)),
    ("without Z3 dead-prefix pruning", dict(quotient=True, prune_dead=False, share_suffixes=True)),
    ("without shared suffixes", dict(quotient=True, prune_dead=True, share_suffixes=False)),
    ("without both", dict(quotient=True, prune_dead=False, share_suffixes=False)),
    ("explicit per-member state instead of the quotient", dict(quotient=False, prune_dead=True, share_suffixes=True)),
)
# Members beyond which the explicit state (N members x N chunks of N-bit sets) is not attempted.
EXPLICIT_LIMIT = 64


class _OutOfTime(Exception):
    pass


@dataclass(frozen=True)
class Row:
    case: str
    config: str
    seconds: float | None
    programs: int | None
    expanded: int | None
    steps_applied: int | None
    z3_queries: int | None
    note: str = ""
    cpu_seconds: float | None = None


def hierarchies(case: Case):
    topology = topology_from_levels(case.levels)
    axes = parse_axes(case.axes)
    placements = ([make_placement(topology, axes, case.placement)] if case.placement
                  else enumerate_placements(topology, axes))
    return [build_hierarchy(p, (case.reduce,)) for p in placements]


def run_config(case: Case, config: dict) -> Row:
    quotient = config["quotient"]
    chosen = hierarchies(case)
    if not quotient and max(h.group_size for h in chosen) > EXPLICIT_LIMIT:
        return Row(case.name, "", None, None, None, None, None,
                   f"not attempted: {max(h.group_size for h in chosen)} members x as many chunks per state")
    _first_steps.cache_clear()
    started, cpu_started = time.perf_counter(), time.process_time()
    deadline = started + TIME_LIMIT_S

    def check_time(_stats):
        if time.perf_counter() > deadline:
            raise _OutOfTime

    programs = expanded = applied = queries = 0
    for hierarchy in chosen:
        semantics = Semantics(hierarchy.level_names, hierarchy.sizes, quotient=quotient)
        options = SearchOptions(max_len=case.max_len, prune_dead=config["prune_dead"], share_suffixes=config["share_suffixes"],
                                budget_s=None)  # the ablation runs what the estimate would refuse, under its own limit
        enumerator = Enumerator(semantics, options, on_progress=check_time)
        try:
            programs += sum(1 for _ in enumerator.programs())
        except _OutOfTime:
            return Row(case.name, "", None, None, expanded + enumerator.stats.expanded,
                       applied + enumerator.stats.steps_applied, queries + enumerator.stats.z3_queries,
                       f"stopped after {TIME_LIMIT_S:.0f} s (counts so far)")
        expanded += enumerator.stats.expanded
        applied += enumerator.stats.steps_applied
        queries += enumerator.stats.z3_queries
    return Row(case.name, "", time.perf_counter() - started, programs, expanded, applied, queries,
               cpu_seconds=time.process_time() - cpu_started)


def brute_force_row(case: Case, max_len: int) -> Row:
    hierarchy = hierarchies(case)[0]
    semantics = Semantics(hierarchy.level_names, hierarchy.sizes, quotient=False)
    started = time.perf_counter()
    programs = brute_force_programs(semantics, max_len)
    alphabet = len(semantics.alphabet)
    sequences = sum(alphabet ** length for length in range(1, max_len + 1))
    return Row(case.name, f"no pruning at all: every sequence up to {max_len} steps, checked one by one",
               time.perf_counter() - started, len(programs), None, sequences, 0,
               f"{sequences} sequences over {alphabet} instructions")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="results",
                        help="the results directory (default results/); writes its synthesis-speed/ folder")
    parser.add_argument("--calibrate", action="store_true", help="measure the search-size tables of synth/search/budget.py")
    parser.add_argument("--before", metavar="DIR",
                        help="also time the all-pruning runs with the synth package of DIR (a checkout of an earlier commit)")
    parser.add_argument("--cases", help="comma-separated case numbers to run (default all), e.g. 4,5")
    args = parser.parse_args(argv)
    if args.calibrate:
        return calibrate(args.output)
    chosen = [CASES[int(i) - 1] for i in args.cases.split(",")] if args.cases else list(CASES)
    rows, before = [], {}
    load_before = os.getloadavg()[0]
    for case in chosen:
        for label, config in CONFIGS:
            row = run_config(case, config)
            rows.append(Row(**{**asdict(row), "config": label}))
            print(f"{case.name} | {label}: {row.seconds if row.seconds is None else round(row.seconds, 2)} s, "
                  f"{row.programs} programs {row.note}", flush=True)
        if args.before:
            before[case.name] = time_before(case, args.before)
            print(f"{case.name} | before: {before[case.name]}", flush=True)
    if CASES[2] in chosen:
        rows.append(brute_force_row(CASES[2], 3))
    load_after = os.getloadavg()[0]
    directory = study_dir(STUDY, args.output)
    document = {"command": _command(argv), "load_before": load_before, "load_after": load_after,
                "rows": [asdict(r) for r in rows], "before": before}
    write_text(directory / "synthesis-speed.json", json.dumps(document, indent=2) + "\n")
    write_text(directory / REPORT, render(chosen, rows, before, load_before, load_after, _command(argv)))
    print(f"wrote {directory / REPORT}")
    return 0


def _command(argv) -> str:
    import sys

    return " ".join([COMMAND, *(sys.argv[1:] if argv is None else argv)])


_BEFORE_SCRIPT = """
import json, sys, time
from synth.hierarchy import build_hierarchy
from synth.placement import enumerate_placements, make_placement, parse_axes
from synth.search import Enumerator, SearchOptions
from synth.semantics import Semantics
from synth.topology import topology_from_levels
levels, axes, reduce, placement, max_len = json.loads(sys.argv[1])
topology = topology_from_levels(levels)
chosen = [make_placement(topology, parse_axes(axes), placement)] if placement else enumerate_placements(topology, parse_axes(axes))
started, cpu = time.perf_counter(), time.process_time()
programs = 0
for p in chosen:
    h = build_hierarchy(p, (reduce,))
    programs += sum(1 for _ in Enumerator(Semantics(h.level_names, h.sizes), SearchOptions(max_len=max_len)).programs())
print(json.dumps({"seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu, "programs": programs}))
"""


def time_before(case: Case, source: str) -> dict:
    """The all-pruning run of a case with an earlier synth (its package directory first on the
    path), in a fresh interpreter; its search has no size estimate, so it gets the time limit."""
    import subprocess
    import sys

    arguments = json.dumps([case.levels, case.axes, case.reduce, case.placement, case.max_len])
    environment = {**os.environ, "PYTHONPATH": str(source)}
    try:
        done = subprocess.run([sys.executable, "-c", _BEFORE_SCRIPT, arguments], capture_output=True, text=True,
                              env=environment, cwd=source, timeout=5 * TIME_LIMIT_S, check=True)
    except subprocess.TimeoutExpired:
        return {"seconds": None, "note": f"stopped after {5 * TIME_LIMIT_S:.0f} s"}
    return json.loads(done.stdout.splitlines()[-1])


def calibrate(output: str) -> int:
    """Expansions and CPU seconds of complete searches over 2-member levels, by depth and length."""
    expansions: dict[int, list[int]] = {}
    per_expansion: dict[int, float] = {}
    runs = []
    load_before = os.getloadavg()[0]
    for depth in CALIBRATION_DEPTHS:
        sizes = (2,) * depth
        semantics_args = (tuple(f"l{i}" for i in range(depth)), sizes)
        expansions[depth] = []
        for length in CALIBRATION_LENGTHS:
            _first_steps.cache_clear()
            started = time.process_time()

            def check_time(_stats, started=started):
                if time.process_time() - started > TIME_LIMIT_S:
                    raise _OutOfTime

            enumerator = Enumerator(Semantics(*semantics_args), SearchOptions(max_len=length, budget_s=None),
                                    on_progress=check_time)
            try:
                enumerator.total()
            except _OutOfTime:
                break
            seconds = time.process_time() - started
            expansions[depth].append(enumerator.stats.expanded)
            runs.append({"depth": depth, "length": length, "expanded": enumerator.stats.expanded, "cpu_seconds": seconds})
            print(f"depth {depth} length {length}: {enumerator.stats.expanded} expansions, {seconds:.2f} s", flush=True)
            if seconds > TIME_LIMIT_S / 3:
                break
        largest = max((r for r in runs if r["depth"] == depth), key=lambda r: r["expanded"])
        per_expansion[depth] = float(f"{largest['cpu_seconds'] / largest['expanded']:.2g}")
    # Seconds per expansion only grow with depth; small searches are dominated by fixed costs.
    for depth in sorted(per_expansion)[::-1][1:]:
        per_expansion[depth] = min(per_expansion[depth], per_expansion[depth + 1])
    load_after = os.getloadavg()[0]
    directory = study_dir(STUDY, output)
    document = {"command": f"{COMMAND} --calibrate", "load_before": load_before, "load_after": load_after,
                "expansions": {str(d): v for d, v in expansions.items()},
                "seconds_per_expansion": {str(d): v for d, v in per_expansion.items()}, "runs": runs}
    write_text(directory / "synthesis-calibration.json", json.dumps(document, indent=2) + "\n")
    lines = ["# Calibration of the search-size estimate", "", header(f"{COMMAND} --calibrate"), "",
             (f"1-minute load average: {load_before:.2f} before, {load_after:.2f} after (CPU seconds are less "
              "affected by other work than wall time, but not immune)."), "",
             ("Complete searches (every valid program up to the length) over hierarchies of 2-member levels: "
              "expanded (state, steps left) pairs and CPU seconds. synth/search/budget.py estimates every search "
              "from these tables (level sizes above 2 only add uneven splits, which end branches)."), "",
             "| depth | length | expanded | CPU s | s per expansion |", "|---:|---:|---:|---:|---:|"]
    for run in runs:
        lines.append(f"| {run['depth']} | {run['length']} | {run['expanded']} | {run['cpu_seconds']:.2f} | "
                     f"{run['cpu_seconds'] / run['expanded']:.2g} |")
    lines += ["", "Tables for synth/search/budget.py:", "", "```python",
              f"EXPANSIONS = {expansions!r}", f"SECONDS_PER_EXPANSION = {per_expansion!r}", "```"]
    write_text(directory / "synthesis-calibration.md", "\n".join(lines) + "\n")
    print("\n".join(lines[-4:]))
    return 0


def render(cases, rows, before, load_before: float, load_after: float, command: str) -> str:
    lines = ["# Synthesis speed and pruning ablation", "", header(command), "",
             (f"1-minute load average: {load_before:.2f} before the runs, {load_after:.2f} after "
              "(wall times grow with other work on the machine; CPU times less so)."), ""]
    lines.append("Complete enumeration of every valid program up to the length given (5 unless said). "
                 "`expanded`: (state, steps left) pairs whose successors were computed; `applied`: instructions applied "
                 "to a state; `Z3`: distinct Z3 dead-prefix questions answered.")

    def cell(value, digits=None):
        if value is None:
            return "-"
        return f"{value:.2f}" if digits else str(value)

    for case in cases:
        lines += ["", f"## {case.name}", ""]
        if case.target_s:
            lines.append(f"Target: under {case.target_s:.0f} s with all pruning.\n")
        if case.name in before:
            earlier = before[case.name]
            lines.append(f"Before (the earlier synth given by --before, all pruning, same machine and time): "
                         f"{cell(earlier.get('seconds'), 2)} s wall, {cell(earlier.get('cpu_seconds'), 2)} s CPU "
                         f"{earlier.get('note', '')}\n")
        lines.append("| configuration | wall time (s) | CPU time (s) | programs | expanded | applied | Z3 | note |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---|")
        for row in rows:
            if row.case != case.name:
                continue
            lines.append(f"| {row.config} | {cell(row.seconds, 2)} | {cell(row.cpu_seconds, 2)} | {cell(row.programs)} | "
                         f"{cell(row.expanded)} | {cell(row.steps_applied)} | {cell(row.z3_queries)} | {row.note} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
