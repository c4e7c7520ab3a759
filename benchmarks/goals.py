"""Synthesis speed for every goal (--collective), and the search-size tables of its budget.

    python -m benchmarks.goals [-o results] [--before DIR]
    python -m benchmarks.goals --calibrate [-o results]
    python -m benchmarks.goals --top [-o results] [--before DIR]
    python -m benchmarks.goals --top-cli [--goal GOAL] [-o results] [--before DIR]
    python -m benchmarks.goals --top-profile [-o results]

Times the complete, pruned search (every valid program up to length 5) of each goal on
4096-member groups (a 3-level and a 4-level merged hierarchy) and on the 8-GPU node pairs the
issue names, counting programs and (state, steps left) pairs expanded, with the load before
and after. Target: under 1 s per goal at length 5 on a 4096-member group. Writes
results/synthesis-goals/README.md and synthesis-goals.json.

--calibrate measures what synth/search/budget.py's GOAL_EXPANSIONS and
GOAL_SECONDS_PER_EXPANSION hold: the pairs a complete search of each goal expands over
hierarchies of 1..6 levels of size 2, for every length up to 8 until a search takes more than
8 CPU seconds, and the CPU seconds per expansion of the largest search at each depth. Writes
results/synthesis-goals/goals-calibration.json and prints the tables.

--top times the best-first top-5 search (`synth rank --top 5 --collective GOAL`: the search
and the cost model's plans for every call it prices) of every goal on a 4096-member group
(pod=4,rack=8,node=16,gpu=8 with DGX H100 figures), 256 MiB per device, both estimates, each
search in a fresh interpreter (with --before, also with the synth package of DIR). Target:
under 2 s CPU per goal. Writes results/synthesis-goals/top-search.md and top-search.json.

--top-cli times the command itself, `synth rank --top 5 --collective GOAL --json` on that group
(its topology written to a temporary TOML file), in a fresh process per goal: interpreter
start, imports, the search, the pricing of the rows and the printing, CPU of the child
process, with the modules' bytecode compiled by an untimed run first; also dispatch and
combine with a uniform routing and a node-limited one (ROUTED_CASES). With --before DIR the same command runs with the synth package of DIR and its JSON
must be identical (with --model-changed, it may differ: the model's times changed between the
two, and the report says so). Writes results/synthesis-goals/top-cli.md and top-cli.json; with --goal GOAL,
that goal alone, in top-cli-GOAL.md and top-cli-GOAL.json.

--top-profile splits the CPU seconds of that command's work, per goal, in a fresh interpreter:
the imports, the `Ranker` (its state walker), the best-first search, and the rows (pricing the K
programs and the flat call); within the search, the seconds spent in the cost engine's
`CostEngine.call` (a call's site and plans, once per collective and member tuple) and how
many calls' coordinate sets were canonicalized (`canonical_labels`), how many of them distinct. Writes results/synthesis-goals/top-profile.md and top-profile.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from benchmarks.record import REPORT, header, study_dir
from synth.goals import GOALS
from synth.search import Enumerator, SearchOptions
from synth.semantics import Semantics

STUDY = "synthesis-goals"
MAX_LEN = 5
TARGET_S = 1.0
CASES = (
    ("4096 members: rack=8,node=64,gpu=8", ("rack", "node", "gpu"), (8, 64, 8)),
    ("4096 members: pod=4,rack=8,node=16,gpu=8", ("pod", "rack", "node", "gpu"), (4, 8, 16, 8)),
    ("16 members: node=2,gpu=8", ("node", "gpu"), (2, 8)),
)


def time_search(names, sizes, goal: str, max_len: int) -> dict:
    started, cpu = time.perf_counter(), time.process_time()
    enumerator = Enumerator(Semantics(names, sizes, goal=goal), SearchOptions(max_len=max_len, budget_s=None))
    programs = sum(1 for _ in enumerator.programs())
    return {"goal": goal, "programs": programs, "expanded": enumerator.stats.expanded,
            "wall_s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu}


_BEFORE_SCRIPT = """
import json, sys, time
from synth.search import Enumerator, SearchOptions
from synth.semantics import Semantics
rows = []
for names, sizes, goal, max_len in json.loads(sys.argv[1]):
    started, cpu = time.perf_counter(), time.process_time()
    enumerator = Enumerator(Semantics(names, sizes, goal=goal), SearchOptions(max_len=max_len, budget_s=None))
    programs = sum(1 for _ in enumerator.programs())
    rows.append({"programs": programs, "expanded": enumerator.stats.expanded,
                 "wall_s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu})
print(json.dumps(rows))
"""


def time_before(source: str, searches: list) -> list[dict]:
    """The same searches, in the same order and one fresh interpreter, with the synth package
    of `source` (a checkout of an earlier commit) first on the path."""
    import subprocess

    environment = {**os.environ, "PYTHONPATH": str(source)}
    done = subprocess.run([sys.executable, "-c", _BEFORE_SCRIPT, json.dumps(searches)], capture_output=True,
                          text=True, env=environment, cwd=source, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def _commit_of(source: str) -> str:
    """The commit a checkout is of: its git head, else its directory's name (an export named
    after its commit)."""
    import subprocess

    found = subprocess.run(["git", "-C", str(source), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else os.path.basename(os.path.normpath(source))


TOP_K = 5
TOP_BYTES = 256 << 20
TOP_TARGET_S = 2.0
TOP_LEVELS = "pod=4,rack=8,node=16,gpu=8"
TOP_ESTIMATES = ("pipelined", "lockstep")
TOP_CLI_POINTER = ("The whole `synth rank --top 5` command of every goal at 4096 members: [top-cli.md](top-cli.md) "
                   "(`python -m benchmarks.goals --top-cli`); the all-to-all's alone, before and after its flows were "
                   "priced by class: [top-cli-alltoall.md](top-cli-alltoall.md) (`--goal alltoall`).")
TOP_POINTER = ("The top-5 search of every goal at 4096 members, cost model included: "
               "[top-search.md](top-search.md) (`python -m benchmarks.goals --top`).")
ALL_TO_ALL_NOTE = ("The all-to-all's 4096 x 4095 pairwise flows are priced per class of equal flows "
                   "(`Network.pair_loads`), in time linear in the members, and its time alone is NCCL's point-to-point "
                   "schedule computed from the busiest member's two classes of peers (synth/model/nccl/p2p.py), not "
                   "per pair; what is left is mostly the search itself "
                   "(its states' permutations) and the interpreter's imports, which every goal shares.")

ROUTED_NOTE = ("A node-limited routing's traffic is estimated from 2^14 tokens drawn as the router draws them "
               "(synth/routing.py): a Gumbel key per token and expert, 2^14 x 8,192 = 134 M draws at 8,192 experts, "
               "which is most of that command's time; each token's top k is found by a partition, a block of tokens "
               "at a time (64 MB of keys, not a GiB), with the same experts as sorting every row.")

# One top-K search in a fresh interpreter; prints its CPU seconds and the times it found (the
# same script runs the checkout under test and an earlier one, so it uses only public names
# both have). The group: dgx-h100-2x8x8's levels with one more level of 4 pods (the rack
# level's figures) and 16 nodes per rack: 4096 GPUs, all one data-parallel group.
_GROUP_SCRIPT = """
base = load_topology("dgx-h100-2x8x8")
rack, node, gpu = base.levels
levels = (dataclasses.replace(rack, name="pod", size=4), dataclasses.replace(rack, size=8),
          dataclasses.replace(node, size=16), gpu)
topology = dataclasses.replace(base, name="dgx-h100-4x8x16x8", levels=levels)
hierarchy = build_hierarchy(enumerate_placements(topology, parse_axes("data=4096"))[0], ("data",), "merged")
"""  # the 4096-member group both scripts build
_TOP_SCRIPT = """
import dataclasses, itertools, json, sys, time
from synth.analysis.goal_rank import copy_rate
from synth.hierarchy import build_hierarchy
from synth.model import ESTIMATES, cost_context
from synth.model.engine import engine_for
from synth.placement import enumerate_placements, parse_axes
from synth.search import StateWalker, cheapest_programs
from synth.topology_file import load_topology
goal, estimate, k, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
""" + _GROUP_SCRIPT + """cpu, started = time.process_time(), time.perf_counter()
context = cost_context(hierarchy, topology)
found = list(itertools.islice(cheapest_programs(StateWalker(hierarchy, goal), engine_for(context), ESTIMATES[estimate],
                                                size, 5, copy_rate(context)), k))
print(json.dumps({"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - started,
                  "found": [[float(t).hex(), str(p)] for t, p in found]}))
"""


def time_top(source: str, goal: str, estimate: str) -> dict:
    """One top-K search with the synth package of `source` first on the path."""
    import subprocess

    environment = {**os.environ, "PYTHONPATH": str(source)}
    done = subprocess.run([sys.executable, "-c", _TOP_SCRIPT, goal, estimate, str(TOP_K), str(TOP_BYTES)],
                          capture_output=True, text=True, env=environment, cwd=source)
    if done.returncode != 0:
        raise SystemExit(f"{goal} {estimate} with {source} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def _write_top_json(output: str, name: str, command: str, loads: tuple[float, float], rows: list[dict]):
    """A top study's figures as JSON in the study's folder; the folder."""
    folder = study_dir(STUDY, output)
    (folder / name).write_text(json.dumps(
        {"command": command, "levels": TOP_LEVELS, "k": TOP_K, "bytes": TOP_BYTES, "load_before": loads[0],
         "load_after": loads[1], "rows": rows}, indent=1) + "\n")
    return folder


def _timing_lines(rows: list[dict], before: bool, keys: tuple[str, ...]) -> list[str]:
    """The timing table (with the earlier checkout's columns when there is one) and the rows over
    the target."""
    lines = ["| " + " | ".join(keys) + " | CPU s | wall s |" + (" CPU s before | wall s before |" if before else ""),
             "|" + "---|" * len(keys) + "---:|---:|" + ("---:|---:|" if before else "")]
    for row in rows:
        line = "| " + " | ".join(row[key] for key in keys) + f" | {row['cpu_s']:.2f} | {row['wall_s']:.2f} |"
        if before:
            line += f" {row['before']['cpu_s']:.2f} | {row['before']['wall_s']:.2f} |"
        lines.append(line)
    slow = [row for row in rows if row["cpu_s"] > TOP_TARGET_S]
    lines += ["", "Over the target (CPU s): " + (", ".join(f"{' '.join(r[key] for key in keys)} ({r['cpu_s']:.2f} s)"
                                                           for r in slow) or "none") + "."]
    if any(row["goal"] == "alltoall" for row in slow):
        lines += ["", ALL_TO_ALL_NOTE]
    if any("node-limit" in row["goal"] for row in slow):
        lines += ["", ROUTED_NOTE]
    return lines


def top(output: str, before: str | None) -> int:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    load_before = os.getloadavg()[0]
    rows = []
    for goal in GOALS:
        for estimate in TOP_ESTIMATES:
            row = {"goal": goal, "estimate": estimate, **time_top(here, goal, estimate)}
            if before:
                row["before"] = time_top(before, goal, estimate)
                if row["before"]["found"] != row["found"]:
                    raise SystemExit(f"{goal} {estimate}: the top {TOP_K} differ before and now")
            rows.append(row)
            print(f"{goal:14s} {estimate:9s} {row['cpu_s']:6.2f} s CPU"
                  + (f"  before {row['before']['cpu_s']:6.2f} s CPU" if before else ""), flush=True)
    load_after = os.getloadavg()[0]
    command = "python -m benchmarks.goals --top" + (" --before OLD" if before else "")
    folder = _write_top_json(output, "top-search.json", command, (load_before, load_after), rows)
    lines = [f"# Top-{TOP_K} search for every goal on a 4096-member group", "", header(command), "",
             f"Load average (1 min): {load_before:.2f} before, {load_after:.2f} after (2 cores shared with other work: "
             f"CPU time is the steadier figure).", "",
             f"The best-first search of `synth rank --top {TOP_K} --collective GOAL` (the search and the NCCL cost "
             f"model's plans for every call it prices) on one data-parallel group of 4096 GPUs, {TOP_LEVELS} "
             f"(dgx-h100-2x8x8's figures, its rack level's also for the pods), {TOP_BYTES >> 20} MiB per device, "
             f"programs up to 5 steps, each search in a fresh interpreter, engine construction included. "
             f"Target: under {TOP_TARGET_S:g} s CPU per goal.", ""]
    if before:
        lines += [f"`before`: the same search with the synth package of OLD, a checkout of commit "
                  f"{_commit_of(before)}, which found the same {TOP_K} programs with bit-identical times.", ""]
    lines += _timing_lines(rows, bool(before), ("goal", "estimate"))
    (folder / "top-search.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {folder / 'top-search.md'}")
    return 0


_TOPOLOGY_SCRIPT = """
import dataclasses, sys
from synth.topology_file import load_topology, render_topology
base = load_topology("dgx-h100-2x8x8")
rack, node, gpu = base.levels
levels = (dataclasses.replace(rack, name="pod", size=4), dataclasses.replace(rack, size=8),
          dataclasses.replace(node, size=16), gpu)
open(sys.argv[1], "w").write(render_topology(dataclasses.replace(base, name="dgx-h100-4x8x16x8", levels=levels)))
"""


def compiled_env(source: str, cache: str) -> dict:
    """The environment a timed child runs in: the synth package of `source` first on the path,
    bytecode written to and read from `cache` (as an installed package has its modules
    compiled; a caller's PYTHONDONTWRITEBYTECODE would have every run compile them again)."""
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    return {**environment, "PYTHONPATH": str(source), "PYTHONPYCACHEPREFIX": cache}


# The mixture-of-experts goals on the same group (`--routing`; 4,096 experts at least: they
# spread evenly over the members): uniform routing is priced exactly, a node limit from 2^14
# tokens drawn as the router draws them (synth/model/fanout.py).
ROUTED_CASES = (("dispatch", "tokens=4096,topk=8,experts=4096,hidden=7168"),
                ("combine", "tokens=4096,topk=8,experts=4096,hidden=7168"),
                ("dispatch", "tokens=4096,topk=8,experts=8192,node-limit=4,hidden=7168"),
                ("combine", "tokens=4096,topk=8,experts=8192,node-limit=4,hidden=7168"))


def time_cli(source: str, topology: str, goal: str, cache: str, routing: str | None = None) -> dict:
    """`synth rank --top K --collective GOAL --json` (with `--routing` for a routed goal, whose
    size is the routing's) with the synth package of `source`, in a fresh process with its
    bytecode in `cache`: (CPU seconds of the child, wall seconds, its JSON)."""
    import resource
    import subprocess

    command = [sys.executable, "-m", "synth", "rank", "--topology", topology, "--axes", "data=4096", "--reduce", "data",
               "--collective", goal, "--top", str(TOP_K), "--json"]
    command += ["--routing", routing] if routing else ["--bytes", str(TOP_BYTES)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=compiled_env(source, cache), cwd=source)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{goal} with {source} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": cpu, "wall_s": wall, "peak_rss_mib": after.ru_maxrss / 1024, "rows": json.loads(done.stdout)}


def top_cli(output: str, before: str | None, only: str | None = None, changed: bool = False) -> int:
    import subprocess
    import tempfile

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    load_before = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        topology = os.path.join(scratch, "dgx-h100-4x8x16x8.toml")
        subprocess.run([sys.executable, "-c", _TOPOLOGY_SCRIPT, topology], check=True, cwd=here,
                       env={**os.environ, "PYTHONPATH": here})
        caches = {source: os.path.join(scratch, f"bytecode-{i}") for i, source in enumerate((here, before)) if source}
        for source, cache in caches.items():  # untimed: compiles every module the command imports
            time_cli(source, topology, "broadcast", cache)
        cases = [(goal, None) for goal in ((only,) if only else GOALS)] + ([] if only else list(ROUTED_CASES))
        for goal, routing in cases:
            row = {"goal": goal if routing is None else f"{goal} --routing {routing}",
                   **time_cli(here, topology, goal, caches[here], routing)}
            if before:
                row["before"] = time_cli(before, topology, goal, caches[before], routing)
                if row["before"]["rows"] != row["rows"] and not changed:
                    raise SystemExit(f"{goal}: the printed rows differ before and now")
                row["before"]["same_rows"] = row["before"]["rows"] == row["rows"]
                del row["before"]["rows"]
            row["programs"] = [r["program"] for r in row.pop("rows")]
            rows.append(row)
            print(f"{row['goal']:14s} {row['cpu_s']:6.2f} s CPU" + (f"  before {row['before']['cpu_s']:6.2f} s CPU" if before
                                                              else ""), flush=True)
    load_after = os.getloadavg()[0]
    command = "python -m benchmarks.goals --top-cli" + (f" --goal {only}" if only else "") + (
        " --before OLD" if before else "") + (" --model-changed" if changed else "")
    name = f"top-cli-{only}" if only else "top-cli"
    folder = _write_top_json(output, f"{name}.json", command, (load_before, load_after), rows)
    lines = [f"# `synth rank --top {TOP_K}` for {only or 'every goal'} on a 4096-member group", "", header(command), "",
             f"Load average (1 min): {load_before:.2f} before, {load_after:.2f} after (2 cores shared with other work: "
             f"CPU time is the steadier figure, and contention inflates it too).", "",
             f"The whole command, `synth rank --topology T --axes data=4096 --reduce data --collective GOAL "
             f"--bytes {TOP_BYTES >> 20}MiB --top {TOP_K} --json`, in a fresh process per goal (interpreter start, "
             f"imports, the search, pricing the rows, printing), T {TOP_LEVELS} with dgx-h100-2x8x8's figures, "
             f"its modules' bytecode compiled by one untimed run first (as an installed package's are). "
             f"Pipelined estimate (the default); the routed goals (dispatch, combine) take the routing's tokens as "
             f"their size and add up their steps (lockstep). Target: under {TOP_TARGET_S:g} s CPU per goal.", ""]
    if before:
        differ = [row["goal"] for row in rows if not row["before"]["same_rows"]]
        same = [row["goal"] for row in rows if row["goal"] not in differ]
        said = "; ".join(part for part in (
            (f"JSON output was identical for {'every goal' if not differ else ', '.join(same)}" if same else ""),
            (f"printed programs or times differ for {', '.join(differ)} (the model changed between the two: "
             f"--model-changed)" if differ else "")) if part)
        lines += [f"`before`: the same command with the synth package of OLD (commit {_commit_of(before)}), whose "
                  f"{said}.", ""]
    lines += _timing_lines(rows, bool(before), ("goal",))
    (folder / f"{name}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {folder / name}.md")
    return 0


_PROFILE_SCRIPT = """
import dataclasses, itertools, json, sys, time
cpu = time.process_time()
import synth.cli
from synth.goals import GOALS
from synth.hierarchy import build_hierarchy
from synth.model import cost_context
import synth.model.engine as engine_module
from synth.placement import enumerate_placements, parse_axes
from synth.search.rank import Ranker
from synth.topology_file import load_topology
imports = time.process_time() - cpu
spent, seen, asked = [0.0], set(), [0]
call, canonical = engine_module.CostEngine.call, engine_module.canonical_labels
def timed_call(self, collective, members):
    started = time.process_time()
    try:
        return call(self, collective, members)
    finally:
        spent[0] += time.process_time() - started
def counted(coords):
    asked[0] += len(coords)
    seen.update(one.tobytes() for one in coords)
    return canonical(coords)
engine_module.CostEngine.call, engine_module.canonical_labels = timed_call, counted
""" + _GROUP_SCRIPT + """goal, k, size = GOALS[sys.argv[1]], int(sys.argv[2]), int(sys.argv[3])
cpu = time.process_time()
ranker = Ranker(cost_context(hierarchy, topology), 5, goal=goal)
ranker.walker
made = time.process_time() - cpu
cpu = time.process_time()
chosen = [program for _, program in itertools.islice(ranker.cheapest(size), k)]
search, in_calls, calls_asked, distinct = time.process_time() - cpu, spent[0], asked[0], len(seen)
cpu = time.process_time()
ranker.rank([size], ranker.programs(chosen))
rows = time.process_time() - cpu
print(json.dumps({"imports_s": imports, "ranker_s": made, "search_s": search, "engine_call_s": in_calls,
                  "canonical_asked": calls_asked, "canonical_distinct": distinct, "rows_s": rows}))
"""


def top_profile(output: str) -> int:
    """Where the CPU of `synth rank --top K` goes, per goal (see the module docstring)."""
    import subprocess

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    load_before = os.getloadavg()[0]
    rows = []
    import tempfile

    scratch = tempfile.TemporaryDirectory()
    environment = compiled_env(here, scratch.name)
    subprocess.run([sys.executable, "-c", "import synth.cli, synth.search.rank, synth.model.nccl.backend"], check=True,
                   cwd=here, env=environment)  # untimed: compiles the modules
    for goal in GOALS:
        done = subprocess.run([sys.executable, "-c", _PROFILE_SCRIPT, goal, str(TOP_K), str(TOP_BYTES)],
                              capture_output=True, text=True, cwd=here, env=environment)
        if done.returncode != 0:
            raise SystemExit(f"{goal} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        rows.append({"goal": goal, **json.loads(done.stdout.splitlines()[-1])})
        print(goal, rows[-1], flush=True)
    scratch.cleanup()
    load_after = os.getloadavg()[0]
    command = "python -m benchmarks.goals --top-profile"
    folder = _write_top_json(output, "top-profile.json", command, (load_before, load_after), rows)
    lines = [f"# Where `synth rank --top {TOP_K}` spends its CPU, per goal, at 4096 members", "", header(command), "",
             f"Load average (1 min): {load_before:.2f} before, {load_after:.2f} after (2 cores shared with other work).",
             "", f"The work of `synth rank --top {TOP_K}` on the group of [top-cli.md](top-cli.md) ({TOP_LEVELS}, "
             f"{TOP_BYTES >> 20} MiB), in a fresh interpreter per goal (modules' bytecode compiled first), CPU "
             "seconds: the imports, the `Ranker` with "
             "its state walker, the best-first search (of which the cost engine's `CostEngine.call`: a call's site "
             "and plans, once per collective and member tuple), and pricing the rows. `canonical_labels`: the "
             "calls' coordinate sets canonicalized (a step's calls not seen yet, those of one size in one pass), and "
             "how many distinct sets they were.", "",
             "| goal | imports | Ranker | search | of which CostEngine.call | rows | coordinate sets canonicalized / distinct |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['goal']} | {row['imports_s']:.2f} | {row['ranker_s']:.2f} | {row['search_s']:.2f} | "
                     f"{row['engine_call_s']:.2f} | {row['rows_s']:.2f} | {row['canonical_asked']} / "
                     f"{row['canonical_distinct']} |")
    (folder / "top-profile.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {folder / 'top-profile.md'}")
    return 0


def calibrate(output: str) -> int:
    tables = {}
    for goal in GOALS:
        if goal == "allreduce":
            continue  # benchmarks.synthesis --calibrate measures it
        rows = {}
        for depth in range(1, 7):
            names, sizes = tuple(f"l{i}" for i in range(depth)), (2,) * depth
            expansions, seconds = [], []
            for length in range(1, 9):
                found = time_search(names, sizes, goal, length)
                expansions.append(found["expanded"])
                seconds.append(found["cpu_s"])
                if found["cpu_s"] > 8:
                    break
            rows[depth] = {"expansions": expansions, "cpu_s": seconds,
                           "seconds_per_expansion": seconds[-1] / max(expansions[-1], 1)}
            print(goal, depth, expansions, [round(s, 2) for s in seconds], flush=True)
            if seconds[-1] > 8 and len(expansions) <= 3:
                break
        tables[goal] = rows
    path = study_dir(STUDY, output) / "goals-calibration.json"
    path.write_text(json.dumps({"command": "python -m benchmarks.goals --calibrate", "load": os.getloadavg(),
                                "tables": tables}, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="results", help="results directory (default results)")
    parser.add_argument("--calibrate", action="store_true", help="measure synth/search/budget.py's goal tables")
    parser.add_argument("--top", action="store_true", help=f"time the top-{TOP_K} search of every goal at 4096 members")
    parser.add_argument("--top-cli", action="store_true",
                        help=f"time `synth rank --top {TOP_K}` of every goal at 4096 members, the whole command")
    parser.add_argument("--top-profile", action="store_true",
                        help=f"split the CPU of `synth rank --top {TOP_K}` of every goal at 4096 members by phase")
    parser.add_argument("--goal", choices=GOALS, help="with --top-cli: this goal alone (its own files)")
    parser.add_argument("--before", metavar="DIR",
                        help="also run every search with the synth package of DIR (a checkout of an earlier commit)")
    parser.add_argument("--model-changed", action="store_true",
                        help="with --top-cli --before: the two may print different times (the model changed)")
    args = parser.parse_args(argv)
    if args.calibrate:
        return calibrate(args.output)
    if args.top:
        return top(args.output, args.before)
    if args.top_cli:
        return top_cli(args.output, args.before, args.goal, args.model_changed)
    if args.top_profile:
        return top_profile(args.output)
    load_before = os.getloadavg()[0]
    rows = []
    for label, names, sizes in CASES:
        for goal in GOALS:
            found = time_search(names, sizes, goal, MAX_LEN)
            found["case"] = label
            rows.append(found)
            print(f"{label:42s} {goal:14s} {found['programs']:6d} programs {found['expanded']:7d} expanded "
                  f"{found['wall_s']:6.2f} s wall {found['cpu_s']:6.2f} s CPU", flush=True)
    if args.before:
        searches = [(names, sizes, goal, MAX_LEN) for _, names, sizes in CASES for goal in GOALS]
        for row, before in zip(rows, time_before(args.before, searches)):
            if before["programs"] != row["programs"]:
                raise SystemExit(f"{row['case']} {row['goal']}: {before['programs']} programs before, "
                                 f"{row['programs']} now: the searches differ")
            row["before"] = before
    load_after = os.getloadavg()[0]
    command = "python -m benchmarks.goals" + (" --before OLD" if args.before else "")
    folder = study_dir(STUDY, args.output)
    (folder / "synthesis-goals.json").write_text(json.dumps(
        {"command": command, "max_len": MAX_LEN, "load_before": load_before, "load_after": load_after, "rows": rows},
        indent=1) + "\n")
    lines = ["# Synthesis speed for every goal (--collective)", "", header(command), "",
             f"Load average (1 min): {load_before:.2f} before, {load_after:.2f} after (2 cores shared with other work: "
             f"CPU time is the steadier figure).", "",
             f"Every valid program up to {MAX_LEN} steps, pruned, over the quotient state (each level shrunk to 2 "
             f"members: the search does not grow with the device count). Target: under {TARGET_S:g} s per goal on a "
             f"4096-member group.", "",
             ("CPU s is the search process's own CPU time (time.process_time): the machine's 2 cores are shared, "
              "so wall time also counts the time other work held the cores. The first search of the run (all-reduce "
              "on the first group) also pays for importing Z3."), ""]
    if args.before:
        lines += [f"`before`: the same searches, in the same order, with the synth package of OLD, a checkout of "
                  f"commit {_commit_of(args.before)} (run just after, in one fresh interpreter), which found the same "
                  f"programs.", ""]
        lines += ["| group | goal | programs | expanded | wall s | CPU s | expanded before | CPU s before |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
    else:
        lines += ["| group | goal | programs | expanded | wall s | CPU s |", "|---|---|---:|---:|---:|---:|"]
    for row in rows:
        line = (f"| {row['case']} | {row['goal']} | {row['programs']} | {row['expanded']} | {row['wall_s']:.2f} | "
                f"{row['cpu_s']:.2f} |")
        if args.before:
            line += f" {row['before']['expanded']} | {row['before']['cpu_s']:.2f} |"
        lines.append(line)
    slow = [row for row in rows if row["case"].startswith("4096") and row["cpu_s"] > TARGET_S]
    lines += ["", "Over the target (CPU s): " + (", ".join(f"{r['goal']} on {r['case']} ({r['cpu_s']:.2f} s)"
                                                           for r in slow) or "none") + "."]
    lines += ["", TOP_POINTER, "", TOP_CLI_POINTER]
    (folder / REPORT).write_text("\n".join(lines) + "\n")
    print(f"wrote {folder / REPORT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
