"""Which estimate predicts the emulated cluster better: lockstep or pipelined (issue 9).

    python -m benchmarks.estimates [-o results]

Re-predicts every stored measurement of the accuracy campaign (results/accuracy/raw/*.json,
`python -m benchmarks.accuracy run`; nothing is run here, no root needed) with both
estimates of synth/model/estimate.py, on the calibrated topologies the campaign uses
(the built-in <topology>-gloo) and on the emulated figures, and compares them with
the accuracy campaign's own metrics (benchmarks/accuracy_metrics.py): top-1, the first
choice within 5% of the measured best, Spearman's rank correlation, and the measured
speedup of the first choice over the default all-reduce. Writes results/estimate-choice/README.md
and estimate-choice.json.

The choice rule, fixed before looking: what a user gets from following the ranking, i.e. the
geometric mean of the measured speedup of the first choice over the default all-reduce, at
the campaign's size and at 256 KiB, on the calibrated topologies; then top-1; Spearman only
breaks a tie (it weighs the order of programs nobody would pick).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from benchmarks.accuracy import CAMPAIGN, evaluate, observations, predict, variant_topologies
from benchmarks.accuracy_metrics import summarize
from benchmarks.index import write_index
from benchmarks.record import REPORT, header, study_dir
from synth.model.estimate import DEFAULT_ESTIMATE
from synth.output_files import write_text

COMMAND = "python -m benchmarks.estimates"
STUDY = "estimate-choice"
ESTIMATES = ("lockstep", "pipelined")
BASES = (("calibrated", "gloo"), ("emulated rates", "emulated"))


def compare() -> dict:
    observed = observations(CAMPAIGN)
    if not observed:
        raise SystemExit("no measurements under results/accuracy/raw: run 'python -m benchmarks.accuracy run'")
    sizes = sorted({o.nbytes for o in observed})
    result = {"observations": len(observed), "sizes": sizes, "variants": []}
    for base, suffix in BASES:
        topologies = variant_topologies(CAMPAIGN, suffix)
        if topologies is None:
            continue
        for estimate in ESTIMATES:
            evaluated = evaluate(observed, predict(observed, topologies, pipelined=estimate == "pipelined"))
            groups = {}
            for size in sizes:
                at = [m for _, n, m in evaluated if n == size]
                groups[f"all cases, {size // 1024} KiB"] = at
                groups[f"cases with >= 10 programs, {size // 1024} KiB"] = [m for m in at if m.programs >= 10]
            result["variants"].append({"base": base, "estimate": estimate, "summaries": {
                label: asdict(summarize(metrics)) for label, metrics in groups.items() if metrics}})
    return result


def choose(result: dict) -> str:
    """The rule of the module docstring, on the calibrated topologies."""

    def score(estimate: str) -> tuple:
        variant = next(v for v in result["variants"] if v["base"] == "calibrated" and v["estimate"] == estimate)
        summaries = [s for label, s in variant["summaries"].items() if label.startswith("all cases")]
        speedup = 1.0
        for s in summaries:
            speedup *= s["speedup_geomean"]
        top1 = sum(s["top1"] * s["cases"] for s in summaries) / sum(s["cases"] for s in summaries)
        rho = sum(s["spearman_median"] for s in summaries) / len(summaries)
        return (round(speedup, 6), round(top1, 6), rho)

    return max(ESTIMATES, key=score)


def render(result: dict, chosen: str) -> str:
    lines = ["# Which estimate predicts the measurements better", "", header(COMMAND), "",
             f"Re-predicts the {result['observations']} stored (program, placement, size) medians of the "
             f"emulated-cluster accuracy campaign (results/accuracy/README.md, docs/accuracy.md; gloo on `emu-2x4` and "
             f"`emu-2x2x2`, every valid program of up to 4 steps) with both estimates, through the same costing "
             f"engine `synth rank` uses. Choice rule (fixed before looking): the geometric mean of the measured "
             f"speedup of the first choice over the default all-reduce (what following the ranking gives), at "
             f"every measured size, on the calibrated topologies; then top-1; Spearman breaks ties.", "",
             f"**Chosen: `{chosen}`** (the library's default estimate is `{DEFAULT_ESTIMATE.name}`, "
             f"`synth rank --estimate`).", "",
             "| topologies, cases, size | estimate | cases | top-1 | first within 5% | Spearman mean / median | "
             "measured speedup of the first choice over the default, geomean / min | measured best over the "
             "default, geomean / max |", "|---|---|---|---|---|---|---|---|"]
    for variant in result["variants"]:
        for label, s in variant["summaries"].items():
            lines.append(f"| {variant['base']}, {label} | {variant['estimate']} | {s['cases']} | {s['top1']:.0%} | "
                         f"{s['top1_within_5pct']:.0%} | {s['spearman_mean']:.2f} / {s['spearman_median']:.2f} | "
                         f"{s['speedup_geomean']:.3f} / {s['speedup_min']:.3f} | {s['possible_speedup_geomean']:.3f} / "
                         f"{s['possible_speedup_max']:.3f} |")
    lines += ["", "Reading it: single calls are predicted nearly alike by both (for one step the pipelined "
              "estimate drops only the hop latencies that back-to-back runs overlap); they differ on multi-step "
              "programs where several reduction groups share links, which measure faster than the lockstep sum "
              "because groups do not wait for each other. There the pipelined estimate picks the hierarchical "
              "program the measurements favour (emu-2x4, `[[2,2],[1,2]]`, where the lockstep sum picks the default: "
              "1.49x over the default at 64 KiB and 1.30x at 256 KiB in the first campaign, 1.37x and 1.23x in the "
              "second, whose measured best was 1.52x and 1.33x; results/accuracy/README.md has the cases). The two "
              "`emu-2x2x2` misses at 64 KiB are the emulator's token-bucket burst (docs/accuracy.md), which neither "
              "estimate models. Spearman over all cases is lower for the pipelined estimate only in the one-level "
              "cases of 3 programs, where it predicts two programs equal (a tie ranks 0.5); on the cases with 10 "
              "programs or more both are within 0.02."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="results",
                        help="the results directory (default results/); writes its estimate-choice/ folder")
    args = parser.parse_args(argv)
    result = compare()
    chosen = choose(result)
    directory = study_dir(STUDY, args.output)
    write_text(directory / "estimate-choice.json", json.dumps(dict(result, chosen=chosen, command=COMMAND), indent=1)
                                                   + "\n")
    write_text(directory / REPORT, render(result, chosen))
    print(f"chosen: {chosen}; wrote {directory / REPORT} and {write_index(args.output)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
