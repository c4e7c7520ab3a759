"""Synthesis speed and the pruning ablation.

    python -m benchmarks.synthesis [-o results]

Times complete enumeration (every valid program up to length 5) on the cases issue 2 names,
and the same with each pruning rule switched off, counting (state, steps left) pairs
expanded, instructions applied and Z3 queries. Writes results/synthesis-speed.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass

from synth.hierarchy import build_hierarchy
from synth.placement import enumerate_placements, make_placement, parse_axes
from synth.pruning import _first_steps
from synth.search import Enumerator, SearchOptions, brute_force_programs
from synth.semantics import Semantics
from benchmarks.record import header, results_dir
from synth.topology import topology_from_levels

COMMAND = "python -m benchmarks.synthesis"
TIME_LIMIT_S = 60.0


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
    started = time.perf_counter()
    deadline = started + TIME_LIMIT_S

    def check_time(_stats):
        if time.perf_counter() > deadline:
            raise _OutOfTime

    programs = expanded = applied = queries = 0
    for hierarchy in chosen:
        semantics = Semantics(hierarchy.level_names, hierarchy.sizes, quotient=quotient)
        options = SearchOptions(max_len=case.max_len, prune_dead=config["prune_dead"], share_suffixes=config["share_suffixes"])
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
    return Row(case.name, "", time.perf_counter() - started, programs, expanded, applied, queries)


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
    parser.add_argument("-o", "--output", default="results", help="directory for the figures (default results/)")
    args = parser.parse_args(argv)
    rows = []
    load_before = os.getloadavg()[0]
    for case in CASES:
        for label, config in CONFIGS:
            row = run_config(case, config)
            rows.append(Row(**{**asdict(row), "config": label}))
            print(f"{case.name} | {label}: {row.seconds if row.seconds is None else round(row.seconds, 2)} s, "
                  f"{row.programs} programs {row.note}", flush=True)
    rows.append(brute_force_row(CASES[2], 3))
    directory = results_dir(args.output)
    (directory / "synthesis-speed.json").write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    (directory / "synthesis-speed.md").write_text(render(rows, load_before))
    print(f"wrote {directory / 'synthesis-speed.md'}")
    return 0


def render(rows, load_before: float) -> str:
    lines = ["# Synthesis speed and pruning ablation", "", header(COMMAND), "",
             f"1-minute load average before the runs: {load_before:.2f} (wall times grow with other work on the machine).", ""]
    lines.append("Complete enumeration of every valid program up to the length given (5 unless said). "
                 "`expanded`: (state, steps left) pairs whose successors were computed; `applied`: instructions applied to a state; "
                 "`Z3`: distinct Z3 dead-prefix formulas solved.")
    for case in CASES:
        lines += ["", f"## {case.name}", ""]
        if case.target_s:
            lines.append(f"Target: under {case.target_s:.0f} s with all pruning.\n")
        lines.append("| configuration | wall time (s) | programs | expanded | applied | Z3 | note |")
        lines.append("|---|---:|---:|---:|---:|---:|---|")
        for row in rows:
            if row.case != case.name:
                continue
            def cell(value, digits=None):
                if value is None:
                    return "-"
                return f"{value:.2f}" if digits else str(value)
            lines.append(f"| {row.config} | {cell(row.seconds, 2)} | {cell(row.programs)} | {cell(row.expanded)} | "
                         f"{cell(row.steps_applied)} | {cell(row.z3_queries)} | {row.note} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
