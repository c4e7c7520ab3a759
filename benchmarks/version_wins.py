"""The synthesis-wins study per NCCL version (writes results/synthesis-wins/by-version.md and
.json): on a few multi-level NCCL systems, for every `[nccl] version` the model documents and
with buffers registered as symmetric windows or not, how often the fastest program of each
goal beats the goal's flat call of that release (benchmarks/goal_wins.py, the same pairs,
sizes and held-out errors as the full study; `python -m benchmarks.results` is the full study
at the default version).

    python -m benchmarks.version_wins [-o results] [--topologies T,T]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import replace
from datetime import datetime, timezone

from benchmarks.goal_wins import goal_pairs, summary
from benchmarks.results import MAX_LEN, WIN_SIZES
from synth.model.nccl.names import NCCL_VERSIONS
from synth.output_files import write_text
from synth.topology_file import load_topology

TOPOLOGIES = ("dgx-h100-x2", "hgx-h100-ib-4x8", "aws-p6-b200-2x8")  # InfiniBand Hopper; EFA Blackwell
GOALS = ("reducescatter", "allgather", "allreduce")
COMMAND = "python -m benchmarks.version_wins"


def study(names, versions=NCCL_VERSIONS) -> list[dict]:
    rows = []
    for name in names:
        base = load_topology(name)
        for registered in (False, True):
            for version in versions:
                system = replace(base, nccl=replace(base.nccl, version=version, symmetric=registered))
                pairs = goal_pairs(system, GOALS, WIN_SIZES, MAX_LEN)
                for goal in GOALS:
                    rows.append({"topology": name, "registered": registered, "version": version, "goal": goal,
                                 **summary([pair for pair in pairs if pair.goal == goal])})
    return rows


def render(rows: list[dict], command: str, seconds: float) -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = ["# Synthesis wins per NCCL version", "", f"Command: `{command}`", "",
             f"Machine: {platform.node() or 'unknown'}, {platform.machine()}, {os.cpu_count()} cores, "
             f"Python {platform.python_version()}, {platform.system()} {platform.release()}; load {load:.1f} at the "
             f"start; {seconds:.0f} s", "", f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", "",
             "Per system, goal and `[nccl] version`, with buffers registered as symmetric windows (`symmetric = "
             "true`) or not: the pairs (job, placement, request, size) of benchmarks/goal_wins.py, the fastest "
             "program against the flat call of that release. `wins` counts wins beyond the held-out error; "
             "the flat call moves where the release does (synth/model/nccl/versions.py): unregistered buffers "
             "give the same flat call from 2.27 on; registered ones take the symmetric kernels inside a node from "
             "2.27 and the hierarchical ones across InfiniBand nodes from 2.29.", "",
             "| system | registered | goal | " + " | ".join(dict.fromkeys(r["version"] for r in rows)) + " |",
             "|---|---|---|" + "---:|" * len(dict.fromkeys(r["version"] for r in rows))]
    keys = dict.fromkeys((r["topology"], r["registered"], r["goal"]) for r in rows)
    for topology, registered, goal in keys:
        cells = [f"{r['wins']}/{r['pairs']} ({r['max_win_speedup']:.2f}x)" if r["wins"] else f"0/{r['pairs']}"
                 for r in rows if (r["topology"], r["registered"], r["goal"]) == (topology, registered, goal)]
        lines.append(f"| {topology} | {'yes' if registered else 'no'} | {goal} | " + " | ".join(cells) + " |")
    lines += ["", "Cells: wins beyond the held-out error / pairs (the largest such win)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="results", help="the results directory (default results/)")
    parser.add_argument("--topologies", metavar="T,T", help="these systems instead of the defaults")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.topologies.split(",")] if args.topologies else list(TOPOLOGIES)
    command = COMMAND + (f" --topologies {args.topologies}" if args.topologies else "")
    started = time.perf_counter()
    rows = study(names)
    seconds = time.perf_counter() - started
    folder = os.path.join(args.output, "synthesis-wins")
    write_text(os.path.join(folder, "by-version.json"), json.dumps({"command": command, "sizes": list(WIN_SIZES),
                                                                    "rows": rows}, indent=1) + "\n")
    write_text(os.path.join(folder, "by-version.md"), render(rows, command, seconds))
    print(f"wrote {folder}/by-version.md ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
