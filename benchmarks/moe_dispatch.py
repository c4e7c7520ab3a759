"""Where a synthesized mixture-of-experts dispatch or combine beats the flat all-to-all.

    python -m benchmarks.moe_dispatch [-o results]

For every built-in NCCL system, every published routing below (uniform, and skewed by a Zipf
law of exponent 1 over the experts: the first experts, on the first members, hottest; each
pair then priced at its own expected bytes, synth/model/weighted.py), both
goals, two token counts per member (4096, a training micro-batch as DeepEP's normal kernels
are benchmarked; 128, decoding) and every placement of the expert-parallel axis (`ep`, as
large as the experts allow and the system holds, beside `dp` for the rest): the fastest
dispatch or combine program (synth/search/routed_rank.py, the programs `synth rank
--collective dispatch|combine` ranks) against the flat all-to-all of the same routing, both
through the same engine. Writes results/moe-dispatch/README.md and rows.csv.

The model's held-out error: results/fidelity measures all-reduces and all-gathers only; there
is no held-out all-to-all (or point-to-point) figure, so no win here is told apart from the
model's error, and the report says so.
"""

from __future__ import annotations

import argparse
import csv
import time
from dataclasses import asdict, dataclass, replace

from benchmarks.record import REPORT, header, study_dir
from synth.goals import parse_goal
from synth.hierarchy import build_hierarchy
from synth.model.context import cost_context
from synth.model.network import check_costable
from synth.placement import enumerate_placements, parse_axes
from synth.routing import Routing
from synth.search.rank import Ranker
from synth.topology_file import builtin_topology_names, load_topology
from synth.units import format_bytes

COMMAND = "python -m benchmarks.moe_dispatch"
STUDY = "moe-dispatch"
TOKENS = (4096, 128)
MAX_PLACEMENTS = 8
# Published routings (experts, top-k, node limit, hidden): DeepSeek-V3 (arXiv 2412.19437,
# section 2.1.2 and table of hyper-parameters: 256 routed experts, 8 per token, at most 4
# nodes, hidden 7168); Qwen3-235B-A22B (its config.json: 128 experts, 8 per token, hidden
# 4096); Mixtral 8x7B (arXiv 2401.04088: 8 experts, top-2, hidden 4096).
MODELS = {
    "deepseek-v3": Routing(4096, 8, 256, 7168, node_limit=4),
    "qwen3-235b": Routing(4096, 8, 128, 4096),
    "mixtral-8x7b": Routing(4096, 2, 8, 4096),
}
ZIPF = 1.0
WIN_MARGIN = 0.01  # a win is a predicted speedup above 1%: smaller ones are rounding next to the model's error


def routings():
    for name, routing in MODELS.items():
        yield name, "uniform", routing
        yield name, f"zipf {ZIPF:g}", replace(routing, zipf=ZIPF)


@dataclass(frozen=True)
class Row:
    system: str
    model: str
    skew: str
    goal: str
    axes: str
    matrix: str
    hierarchy: str
    tokens: int
    bytes: int
    best_program: str
    best_time_s: float
    flat_time_s: float
    speedup: float


def systems():
    for name in builtin_topology_names():
        topology = load_topology(name)
        if "gloo" in name:
            continue
        try:
            check_costable(topology)
        except Exception:  # a system without link figures cannot be priced
            continue
        yield topology


def ep_degree(devices: int, experts: int) -> int:
    """The largest expert-parallel degree dividing both the devices and the experts."""
    from math import gcd

    return gcd(devices, experts)


def rows_for(topology) -> list[Row]:
    devices = 1
    for size in topology.sizes:
        devices *= size
    rows = []
    for model, skew, routing in routings():
        ep = ep_degree(devices, routing.experts)
        if ep < 2:
            continue
        axes = f"ep={ep}" + (f",dp={devices // ep}" if devices > ep else "")
        for placement in enumerate_placements(topology, parse_axes(axes))[:MAX_PLACEMENTS]:
            hierarchy = build_hierarchy(placement, ("ep",))
            context = cost_context(hierarchy, topology, "nccl")
            for goal in ("dispatch", "combine"):
                ranker = Ranker(context, 4, goal=parse_goal(goal), routing=routing)
                for tokens in TOKENS:
                    ranked = ranker.rank([tokens * routing.bytes_per_token])[0]
                    best, flat = ranked[0], next(row for row in ranked if row.baseline)
                    rows.append(Row(topology.name, model, skew, goal, axes, placement.to_text(),
                                    ",".join(f"{level.name}={level.size}" for level in hierarchy.levels), tokens,
                                    best.bytes, str(best.program), best.time_s, flat.time_s,
                                    flat.time_s / best.time_s))
    return rows


def render(rows: list[Row], seconds: float) -> str:
    lines = ["# MoE dispatch and combine: synthesized programs against the flat all-to-all", "",
             header(COMMAND), "",
             f"Load: the machine shared with other work (2 CPU cores); the study took {seconds:.0f} s.", "",
             "Each row: one built-in system, routing and token count per member; over every placement of the "
             "expert-parallel axis `ep` (beside `dp`, at most 8 placements), the fastest program `synth rank "
             "--collective dispatch|combine` finds against the flat all-to-all of the same routing (one NCCL "
             "grouped send/recv over the group), both priced by the same engine from the routing's expected "
             "fan-out (docs/model.md section 8, \"Dispatch and combine\"). Routings: DeepSeek-V3 (256 experts, "
             "top-8, at most 4 nodes, hidden 7168), Qwen3-235B-A22B (128 experts, top-8, hidden 4096), Mixtral "
             "8x7B (8 experts, top-2, hidden 4096), each uniform and skewed (Zipf exponent 1: the first experts, "
             "on the first members, hottest); bf16 activations; `ep` is the largest degree dividing both the "
             "experts and the system's GPUs.", "",
             "**Held-out error: there is no held-out all-to-all figure.** results/fidelity measures the model on "
             "all-reduces and all-gathers only, so none of these predicted wins can be told apart from the "
             "model's error on point-to-point traffic; they are predictions, not measurements.", ""]
    wins = [row for row in rows if won(row)]
    multi = [row for row in rows if "," in row.hierarchy]
    same = all(abs(a.speedup - b.speedup) <= 1e-9 * a.speedup for a, b in zip(
        sorted((r for r in rows if r.goal == "dispatch"), key=_key), sorted((r for r in rows if r.goal == "combine"), key=_key)))
    lines += ["## Summary", "",
              f"{len(rows)} (system, routing, placement, goal, tokens) rows; {len(multi)} with the expert-parallel "
              f"group over more than one level; {len(wins)} where a synthesized program beats the flat all-to-all by "
              f"more than {WIN_MARGIN:.0%}"
              + (", every one of them over more than one level. " if all(row in multi for row in wins) else ". ")
              + ("Combine's speedups equal dispatch's in every row: its programs are dispatch's reversed and carry "
                 "the same copies backwards, priced alike." if same else "Combine's speedups differ from dispatch's "
                 "in some rows (rows.csv)."), "",
              "| system | routing | tokens | placements | won | best dispatch speedup | the fastest program (placement, hierarchy) |",
              "|---|---|---|---|---|---|---|"]
    groups: dict[tuple, list[Row]] = {}
    for row in rows:
        if row.goal == "dispatch":
            groups.setdefault((row.system, f"{row.model} {row.skew}", row.tokens), []).append(row)
    for (system, routing, tokens), members in groups.items():
        top = max(members, key=lambda row: row.speedup)
        count = sum(1 for row in members if won(row))
        shown = f"{top.speedup:.2f}x" if won(top) else f"none (best {top.speedup:.3f}x)"
        lines.append(f"| {system} | {routing} | {tokens} | {len(members)} | {count} | {shown} | "
                     f"`{top.best_program}` ({top.matrix}, {top.hierarchy}) |")
    lines += ["", "## Why", "",
              "* One level (the group inside one node or NVLink domain): the only program is the flat all-to-all.",
              f"* Several levels, top-k > 1 with many experts (DeepSeek-V3, Qwen3), uniform routing: "
              f"{_spread(rows, ('deepseek-v3', 'qwen3-235b'))}. The staged program (across the outer level to the "
              f"same-index member, then inside; three stages on three levels) wins because a token's 8 experts share "
              f"destination nodes and its copy crosses the slow level once per node, not once per expert's GPU: "
              f"where DeepEP and HybridEP win.",
              f"* Mixtral (8 experts, top-2), uniform: {_spread(rows, ('mixtral-8x7b',))}. It has little to "
              f"deduplicate (over two nodes of four GPUs a token's two experts share a node 3/7 of the time), and "
              f"the inside step's own launch and NVLink time eat much of the saving, most at 128 tokens.",
              f"* Under the skew each pair carries its own expected bytes (dispatch: the receiver's; combine: the "
              f"sender's) and a step ends with its slowest member: {_skew_spread(rows)}. The flat all-to-all's "
              f"hottest members (the first experts) receive the most; the staged program's outer step sends one "
              f"copy per destination node, to the same-index member, so a hot node's load is spread over its "
              f"members, and the win grows where the links bound the step. A skew can also cost less than the "
              f"uniform routing ({_cheaper(rows)}): a token's experts crowd onto the hottest members, so fewer "
              f"copies are sent, and where NCCL's proxy posts bound the step the hot pairs are posted in larger "
              f"chunks (NCCL's network chunk doubles from 8 steps of bytes).",
              "", "All rows: [rows.csv](rows.csv).", ""]
    return "\n".join(lines)


def _spread(rows: list[Row], models) -> str:
    """Where the uniform routing's dispatch wins, per token count: systems and speedups."""
    parts = []
    for tokens in TOKENS:
        chosen = [row for row in rows if row.model in models and row.skew == "uniform" and row.goal == "dispatch"
                  and row.tokens == tokens and "," in row.hierarchy]
        systems = {row.system for row in chosen}
        winning = [row for row in chosen if won(row)]
        won_systems = {row.system for row in winning}
        speedups = [row.speedup for row in winning]
        span = f", {min(speedups):.2f}x to {max(speedups):.2f}x" if speedups else ""
        parts.append(f"at {tokens} tokens a win on {len(won_systems)} of the {len(systems)} systems where the group "
                     f"spans levels ({len(winning)} of {len(chosen)} placements{span})")
    return "; ".join(parts)


def _skew_spread(rows: list[Row]) -> str:
    """Where the skewed routings' dispatch wins over several levels: rows and speedups."""
    chosen = [row for row in rows if row.skew != "uniform" and row.goal == "dispatch" and "," in row.hierarchy]
    winning = [row.speedup for row in chosen if won(row)]
    span = f", {min(winning):.2f}x to {max(winning):.2f}x" if winning else ""
    return f"a win in {len(winning)} of {len(chosen)} placements over several levels{span}"


def _cheaper(rows: list[Row]) -> str:
    """How many skewed flat all-to-alls the model prices below the same routing's uniform one."""
    uniform = {(row.system, row.model, row.goal, row.matrix, row.tokens): row.flat_time_s
               for row in rows if row.skew == "uniform"}
    skewed = [row for row in rows if row.skew != "uniform" and row.goal == "dispatch"]
    cheaper = [row for row in skewed if row.flat_time_s < uniform[(row.system, row.model, row.goal, row.matrix, row.tokens)]]
    tokens = sorted({row.tokens for row in cheaper})
    return (f"the flat dispatch in {len(cheaper)} of {len(skewed)} skewed rows"
            + (f", at {' and '.join(map(str, tokens))} tokens" if tokens else ""))


def _key(row: Row):
    return (row.system, row.model, row.skew, row.matrix, row.tokens)


def won(row: Row) -> bool:
    return row.speedup > 1 + WIN_MARGIN


SCALE_SYSTEM, SCALE_RACKS = "dgx-h100-2x8x8", 64  # 64 racks of 8 nodes of 8 H100: 4096 members
SCALE_ROUTING = Routing(4096, 8, 4096, 7168, zipf=ZIPF)


@dataclass(frozen=True)
class Scale:
    """The skewed flat dispatch over 4096 members: seconds drawing the tokens and counting the
    pairs' expected bytes, seconds pricing the step per class, its predicted time."""

    draw_s: float
    price_s: float
    time_s: float


def scale() -> Scale:
    from synth.model.engine import CostEngine
    from synth.model.fanout import step_pairs
    from synth.model.weighted import weighted_step_s

    base = load_topology(SCALE_SYSTEM)
    levels = (replace(base.levels[0], size=SCALE_RACKS), *base.levels[1:])
    topology = replace(base, name=f"{SCALE_SYSTEM} x{SCALE_RACKS} racks", levels=levels)
    members = SCALE_RACKS * 64
    context = cost_context(build_hierarchy(enumerate_placements(topology, parse_axes(f"ep={members}"))[0], ("ep",)),
                           topology, "nccl")
    engine = CostEngine(context)
    sizes, levels_used = tuple(context.hierarchy.sizes), frozenset(range(len(context.hierarchy.sizes)))
    start = time.process_time()
    pairs = step_pairs(SCALE_ROUTING, sizes, levels_used, levels_used, False)
    drawn = time.process_time()
    seconds = weighted_step_s(engine, (tuple(range(members)),), pairs)
    return Scale(drawn - start, time.process_time() - drawn, seconds)


def render_scale(found: Scale) -> list[str]:
    return ["## At 4096 members", "",
            f"The skewed flat dispatch over 4096 members ({SCALE_SYSTEM} grown to {SCALE_RACKS} racks; "
            f"{SCALE_ROUTING.experts} experts, top-{SCALE_ROUTING.topk}, Zipf {ZIPF:g}, 4096 tokens per member), "
            f"every one of its 16,773,120 pairs at its own bytes, priced per class: {found.price_s:.2f} s of CPU "
            f"(drawing the 2^14 tokens over the experts and counting each member's expected bytes: "
            f"{found.draw_s:.2f} s); predicted {found.time_s * 1e3:.1f} ms.", ""]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="results", help="the results directory (default results)")
    args = parser.parse_args(argv)
    start = time.time()
    rows = [row for topology in systems() for row in rows_for(topology)]
    seconds = time.time() - start
    folder = study_dir(STUDY, args.output)
    with open(folder / "rows.csv", "w", newline="") as handle:
        handle.write(f"# command: {COMMAND}\n")
        writer = csv.DictWriter(handle, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        for row in rows:
            writer.writerow(asdict(row))
    text = render(rows, seconds)
    marker = "All rows: [rows.csv](rows.csv)."
    (folder / REPORT).write_text(text.replace(marker, "\n".join(render_scale(scale())) + "\n" + marker))
    print(f"{len(rows)} rows in {seconds:.0f} s; {format_bytes(sum(row.bytes for row in rows[:1]))} first size; "
          f"written to {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
