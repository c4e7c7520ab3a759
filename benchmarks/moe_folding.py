"""MoE parallel folding: what the wider search costs and which layouts it finds.

    python -m benchmarks.moe_folding [-o results] [--pinned COMMIT]

Each MoE plan runs in a fresh process on this checkout and on a pinned commit from before
folding (benchmarks/pinned.py), alternately, on the same machine at the same load: the winner
(degrees, step), the degree choices searched and the search's CPU time (what the plan's own
estimate predicts; the wall time grows with the machine's load). Writes results/moe-folding/
(README.md, the table; moe_folding.json, the rows).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.pinned import exported, label
from benchmarks.plan_speed import WORKER
from benchmarks.record import REPORT, header, study_dir

STUDY = "moe-folding"
PINNED = "f35b1c4"  # the planner before MoE parallel folding
CASES = (  # (model, topology, resize): the published layouts' systems (tests/test_plan_moe_published.py)
    ("gpt-oss-120b", "dgx-h100-2x8x8", "rack=1"),
    ("mixtral-8x22b", "dgx-h100-2x8x8", "rack=2"),
    ("qwen3-235b-a22b", "dgx-h100-2x8x8", "rack=4"),
    ("mixtral-8x7b", "selene", ""),
    ("mixtral-8x7b", "dgx-h100-2x8x8", "rack=256"),
)
TIMEOUT_S = 900


def command_for(model: str, topology: str, resize: str) -> list[str]:
    return ["plan", "--topology", topology, *(["--resize", resize] if resize else []), "--model", model,
            "--micro-batch", "1", "--top", "1", "--json", "--budget", "3600"]


def _degrees(degrees: dict) -> str:
    parts = [f"{role}={degrees[role]}" for role in ("dp", "tp", "pp", "cp", "ep") if degrees.get(role, 1) > 1]
    return ",".join(parts + ([f"etp={degrees['etp']}"] if degrees.get("folded") else []))


def measure(argv: list[str], source: Path | None) -> dict:
    """One command in a fresh process (this checkout when `source` is None)."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(source), env.get("PYTHONPATH"))))
    load = os.getloadavg()[0]
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", WORKER, *argv], cwd=source or Path.cwd(), env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"over {TIMEOUT_S} s"}
    row = {"wall_s": time.perf_counter() - started, "load_before": load}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    worker = json.loads(lines[-1]) if lines else {}
    if done.returncode != 0 or worker.get("code") != 0:
        return {**row, "error": (done.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    result = json.loads(worker["stdout"])
    best = result["ranked"][0]
    return {**row, "cpu_s": worker["cpu_s"], "search_cpu_s": result.get("cpu_s"),
            "degree_choices": result["search"]["degrees"], "placements": result["search"]["placements"],
            "estimated_s": result["search"]["estimated_s"], "winner": _degrees(best["degrees"]),
            "placement": best["placement"], "step_s": best["step_s"]}


def summary(rows: list[dict]) -> list[str]:
    """The ratios after / before and the winners that changed, in words."""
    done = [row for row in rows if "error" not in row["before"] and "error" not in row["after"]]
    if not done:
        return []
    ratio = lambda key: [row["after"][key] / row["before"][key] for row in done]  # noqa: E731
    lines = [f"Over {len(done)} plans, after / before: degree choices x{min(ratio('degree_choices')):.2f} to "
             f"x{max(ratio('degree_choices')):.2f}, the estimate x{min(ratio('estimated_s')):.2f} to "
             f"x{max(ratio('estimated_s')):.2f}, the search's CPU time x{min(ratio('search_cpu_s')):.2f} to "
             f"x{max(ratio('search_cpu_s')):.2f}."]
    for row in done:
        before, after = row["before"], row["after"]
        if (before["winner"], before["placement"]) != (after["winner"], after["placement"]):
            lines.append(f"`synth {' '.join(row['argv'])}`: the winner is now {after['winner']} at "
                         f"{after['step_s']:.4g} s a step, {100 * (1 - after['step_s'] / before['step_s']):.1f}% "
                         f"faster than {before['winner']} ({before['step_s']:.4g} s).")
    lines.append("Every other winner is unchanged, to the bit.")
    return ["", *lines]


def render(rows: list[dict], command: str, before: str) -> str:
    lines = ["# MoE parallel folding: the search's cost and its winners", "", header(command), "",
             f"Before: {before}. After: this checkout. Each plan runs in a fresh process, before and after "
             "alternately; search CPU is the planner's own CPU time (the estimate's unit), load the 1-minute "
             "load average before the run on this shared machine.", "",
             *summary(rows), "",
             "| command | | degree choices | placements | estimated | search CPU | wall | load | winner | step |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for row in rows:
        for which in ("before", "after"):
            run = row[which]
            if "error" in run:
                lines.append(f"| `synth {' '.join(row['argv'])}` | {which} | | | | | | | {run['error']} | |")
                continue
            lines.append(f"| `synth {' '.join(row['argv'])}` | {which} | {run['degree_choices']} | {run['placements']} "
                         f"| {run['estimated_s']:.1f} s | {run['search_cpu_s']:.2f} s | {run['wall_s']:.1f} s "
                         f"| {run['load_before']:.1f} | {run['winner']} `{run['placement']}` | {run['step_s']:.4g} s |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="results", help="the results directory (default results)")
    parser.add_argument("--pinned", default=PINNED, metavar="COMMIT", help=f"the commit before folding ({PINNED})")
    args = parser.parse_args(argv)
    rows = []
    with exported(args.pinned) as source:
        for model, topology, resize in CASES:
            plan_argv = command_for(model, topology, resize)
            rows.append({"argv": plan_argv, "before": measure(plan_argv, source), "after": measure(plan_argv, None)})
            print(json.dumps(rows[-1]), flush=True)
    folder = study_dir(STUDY, args.output)
    command = "python -m benchmarks.moe_folding" + (f" --pinned {args.pinned}" if args.pinned != PINNED else "")
    (folder / REPORT).write_text(render(rows, command, label(args.pinned)), encoding="utf-8")
    (folder / "moe_folding.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
