"""The synthesis-wins study for every goal (part of `python -m benchmarks.results`).

For each goal collective (docs/model.md section 7) on every built-in multi-level NCCL system,
every data x model job filling it, every placement and every reduction request (data, model,
both) with more than one member, at each study size: the fastest valid program of the goal
(synth.analysis.goal_rank.GoalPrograms, the programs `synth rank --collective` ranks) against
the goal's flat call (one NCCL call over the whole group, what a framework runs), both through
the tool's default estimate. The all-reduce rows are the study's default variant (the same
definitions, computed once).

A pair is a *predicted win* when the program is faster than the flat call by more than float
rounding. Beside each predicted win is the model's held-out median error for the call's class
(one node; across nodes by transport) and size band (synth/model/heldout.py, results/fidelity:
figures measured on published nccl-tests logs the model was not built on, of all-reduces and
all-gathers). A predicted win no larger than that error is *inside the error* (what `synth rank`
marks `~`) and is not counted as a win; a win where no held-out figure exists for the class
and band is listed apart (no figure to tell it from the error) and not counted either.
"""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from synth.analysis.findings import data_model_jobs, job_text
from synth.analysis.goal_rank import GoalPrograms
from synth.analysis.sweep import WIN_MARGIN, has_members, reduction_requests
from synth.goals import GOALS
from synth.hierarchy import build_hierarchy
from synth.model.context import cost_context
from synth.model.engine import CostEngine
from synth.model.heldout import held_out_for_group
from synth.placement import enumerate_placements
from synth.topology import Topology
from synth.units import format_bytes

OTHER_GOALS = tuple(name for name in GOALS if name != "allreduce")  # reducescatter, allgather, alltoall, ...


@dataclass(frozen=True)
class GoalPair:
    """One (placement, request, size) of one goal: the fastest program against the flat call."""

    goal: str
    topology: str
    axes: str
    matrix: str
    reduce: str
    group_size: int
    bytes: int
    best_program: str
    best_time_s: float
    flat_program: str
    flat_time_s: float
    held_out_error: float | None  # the model's held-out median |error| for the call's class and band

    @property
    def speedup(self) -> float:
        return self.flat_time_s / self.best_time_s if self.best_time_s > 0 else 1.0

    @property
    def predicted_win(self) -> bool:
        return self.speedup > 1 + WIN_MARGIN

    @property
    def verdict(self) -> str:
        """'win' (beyond the held-out error), 'inside error', 'no error figure', or 'flat' (none)."""
        if not self.predicted_win:
            return "flat"
        if self.held_out_error is None:
            return "no error figure"
        return "win" if self.speedup > 1 + self.held_out_error else "inside error"


def goal_pairs(system: Topology, goals, sizes, max_len: int, backend: str = "nccl") -> list[GoalPair]:
    """Every (placement, request, size) of every goal on one system."""
    sizes = [int(size) for size in sizes]
    pairs = []
    for axes in data_model_jobs(system):
        for placement in enumerate_placements(system, axes):
            for request in reduction_requests(axes):
                if not has_members(request, axes):
                    continue
                hierarchy = build_hierarchy(placement, request, "merged")
                context = cost_context(hierarchy, system, backend)
                engine = CostEngine(context)
                held = {size: held_out_for_group(system, hierarchy.groups[0], size) for size in sizes}
                for goal in goals:
                    programs = GoalPrograms(context, goal, max_len, engine=engine)
                    times = programs.times(sizes)
                    for z, size in enumerate(sizes):
                        column = times[:, z]
                        best = min(range(len(programs.programs)), key=lambda i: (column[i], programs.texts[i]))
                        error = held[size]
                        pairs.append(GoalPair(
                            programs.goal.name, system.name, job_text(axes), placement.to_text(), ",".join(request),
                            hierarchy.group_size, size, programs.texts[best], float(column[best]),
                            programs.texts[programs.baseline_index], float(column[programs.baseline_index]),
                            None if error is None else error.median))
    return pairs


def all_reduce_pairs(jobs, held_out_median) -> list[GoalPair]:
    """The study's all-reduce sweep rows as pairs of the all-reduce goal (`held_out_median(job,
    row)`: the error the all-reduce part of the study uses)."""
    pairs = []
    for job in jobs:
        for row in job.rows:
            pairs.append(GoalPair("allreduce", job.topology.name, job.axes, row.matrix, row.reduce, row.group_size,
                                  row.bytes, row.best_program, row.best_time_s, row.baseline_program,
                                  row.baseline_time_s, held_out_median(job, row)))
    return pairs


def summary(pairs: list[GoalPair]) -> dict:
    verdicts = Counter(pair.verdict for pair in pairs)
    wins = [pair for pair in pairs if pair.verdict == "win"]
    return {"pairs": len(pairs), "predicted_wins": sum(pair.predicted_win for pair in pairs),
            "wins": verdicts["win"], "inside_error": verdicts["inside error"],
            "no_error_figure": verdicts["no error figure"],
            "max_win_speedup": max((pair.speedup for pair in wins), default=1.0),
            "max_predicted_speedup": max((pair.speedup for pair in pairs), default=1.0)}


def _max(counted: dict) -> str:
    return f"{counted['max_win_speedup']:.2f}x" if counted["wins"] else "-"


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def render(pairs: list[GoalPair], systems: list[str], sizes, rows_file: str) -> list[str]:
    """The report's section: per goal and system, then per goal and size, then the largest wins."""
    goals = list(dict.fromkeys(pair.goal for pair in pairs))
    lines = ["## Every goal: the fastest program against the goal's flat call", "",
             "Per goal (docs/model.md section 7), every built-in multi-level NCCL system, every data x model job, "
             "placement and reduction request, at each size: the fastest valid program of the goal against the "
             "goal's flat call (one NCCL `ReduceScatter`/`AllGather`/`AllToAll`/`Broadcast`/`Reduce`/`AllReduce` "
             "over the whole group), NCCL as measured, the pipelined estimate, local `Permute` steps at the copy "
             "rate. `predicted` counts the pairs where a program is faster at all; `wins` only those faster by more "
             "than the model's held-out median error for the call's class and size band (synth/model/heldout.py, "
             "measured on published all-reduce and all-gather logs, the closest evidence for every goal); `inside "
             "error` are predicted wins no larger than that error (what `synth rank` marks `~`), not counted as "
             "wins; `no figure` are predicted wins where no published log covers the class and band (TCP sockets "
             "under 1 MiB), not counted either. Every win with its error: "
             f"[{rows_file}]({rows_file}).", "",
             "| goal | system | pairs | predicted | wins (beyond error) | inside error | no figure | max win |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for goal in goals:
        for name in systems + ["all"]:
            chosen = [p for p in pairs if p.goal == goal and (name == "all" or p.topology == name)]
            if not chosen:
                continue
            s = summary(chosen)
            shown = f"**{name}**" if name == "all" else name
            lines.append(f"| {GOALS[goal].title} | {shown} | {s['pairs']} | {_pct(s['predicted_wins'], s['pairs'])} | "
                         f"{s['wins']} ({_pct(s['wins'], s['pairs'])}) | {s['inside_error']} | {s['no_error_figure']} | "
                         f"{_max(s)} |")
    lines += ["", "Per size (all systems):", "",
              "| goal | size | pairs | predicted | wins (beyond error) | inside error | no figure | max win |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for goal in goals:
        for size in sizes:
            chosen = [p for p in pairs if p.goal == goal and p.bytes == size]
            s = summary(chosen)
            lines.append(f"| {GOALS[goal].title} | {format_bytes(size)} | {s['pairs']} | "
                         f"{_pct(s['predicted_wins'], s['pairs'])} | {s['wins']} ({_pct(s['wins'], s['pairs'])}) | "
                         f"{s['inside_error']} | {s['no_error_figure']} | {_max(s)} |")
    lines += ["", "The largest wins beyond the error, per goal (each with the model's held-out error beside it):", "",
              "| goal | system | job | placement | reduce | size | program | speedup | held-out error |",
              "|---|---|---|---|---|---:|---|---:|---:|"]
    for goal in goals:
        wins = sorted((p for p in pairs if p.goal == goal and p.verdict == "win"), key=lambda p: -p.speedup)
        seen = set()
        for pair in wins:
            if (pair.topology, pair.best_program) in seen:
                continue  # one row per system and program: the table shows where, not every placement
            seen.add((pair.topology, pair.best_program))
            lines.append(f"| {GOALS[goal].title} | {pair.topology} | {pair.axes} | `{pair.matrix}` | {pair.reduce} | "
                         f"{format_bytes(pair.bytes)} | `{pair.best_program}` | {pair.speedup:.2f}x | "
                         f"{pair.held_out_error:.0%} |")
            if len(seen) == 5:
                break
        if not seen:
            lines.append(f"| {GOALS[goal].title} | - | - | - | - | - | no win beyond the error | - | - |")
    lines += ["", "Predicted wins inside the error, most frequent programs per goal: " + "; ".join(
        f"{GOALS[goal].title}: " + (", ".join(f"`{program}` ({count})" for program, count in Counter(
            p.best_program for p in pairs if p.goal == goal and p.verdict == "inside error").most_common(2)) or "none")
        for goal in goals) + "."]
    lines += ["", READING]
    return lines


READING = (
    "Reading it. Reduce-scatter and all-gather win where all-reduce does and more often: their flat call is "
    "one ring over every member, paying NCCL's per-hop latency across the network for every member of the "
    "ring, while a program of two steps crosses the network in one-GPU-per-node groups (a ring of as many "
    "hops as nodes), and its `Permute` (a local copy, costed at half the device's memory bandwidth) "
    "is cheap beside it; the two mirror each other (an all-gather program is a reduce-scatter program "
    "reversed), hence the equal counts. Broadcast and reduce win through masters per node at small sizes, "
    "where NCCL's ring or chain pays a hop per member. The all-to-all never wins in the model: NCCL's flat call "
    "already sends every block straight to its destination once, each device through its own NIC, and a "
    "hierarchical program moves the cross-node bytes as often plus an extra NVLink hop and a launch per step; "
    "what DeepEP-style forwarding gains on real systems (fewer, larger RDMA messages; NIC aggregation) is not "
    "in the model. Wins over TCP sockets (the GCP systems) rest on the socket class's held-out error, which is "
    "large (89-285% median), so most of them are inside it.")


def write_rows(pairs: list[GoalPair], path: Path) -> None:
    """Every predicted win (beyond the error or not), with its error and verdict."""
    fields = list(GoalPair.__dataclass_fields__) + ["speedup", "verdict"]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(fields)
        for pair in pairs:
            if pair.predicted_win:
                record = dict(asdict(pair), speedup=pair.speedup, verdict=pair.verdict)
                writer.writerow(["" if record[f] is None else (repr(record[f]) if isinstance(record[f], float)
                                                               else record[f]) for f in fields])
