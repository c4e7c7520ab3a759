"""How well the NCCL model predicts real nccl-tests runs (issue 9): for every log in a folder,
predicted against measured busbw at every size,

(a) from the built-in topology of the log's hardware alone (no fitting),
(b) calibrated on the same log (`synth calibrate`'s fit; the sizes it flags as outliers are
    counted, and marked),
(c) calibrated on a log of the same hardware with another node count or ranks per node,
    predicting this one; and, for information, (c') calibrated on another run of the same
    shape (another cluster of the same hardware, or another day).

Targets: (a) within 10% at >= 64 MiB and within 30% below, (b) within 5%, (c) within 10%.
Writes results/fidelity.md and results/fidelity.json, and compares with
results/fidelity-baseline.json when it is there (the figures before the per-protocol fit).
Not a timed test: run it when the model or the logs change.

    python -m benchmarks.fidelity [LOG_DIR] [-o results]

LOG_DIR defaults to ../shared/nccl-logs; the repository does not depend on it (tests use the
copies under docs/examples/ and tests/data/).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.record import header, results_dir
from synth.calibrate import read_measurements
from synth.calibrate.groups import devices as group_devices
from synth.calibrate.infer import infer_nccl_base
from synth.calibrate.nccl_fit import calibrate_nccl
from synth.model.nccl import bus_factor
from synth.model.nccl_hardware import estimate_group, nccl_view
from synth.topology_file import load_topology
from synth.units import format_bytes

TARGET_A_LARGE, TARGET_A_SMALL, TARGET_B, TARGET_C = 0.10, 0.30, 0.05, 0.10
LARGE = 64 * 2 ** 20

# Which built-in topology describes each log's hardware (by a part of its file name), the
# family of logs measured on the same hardware (for (c)), the cluster it ran on, and why, from
# the log's first line. The first matching key wins.
HARDWARE = (
    ("h100-1x8-nvls", "dgx-h100", "h100-1node", "a single-node how-to", "one node of 8 H100 80GB HBM3 (SXM5, NVSwitch)"),
    ("dgx0607", "dgx-h100-x2", "dgx-06/07", "dgx-06/07",
     "two DGX H100 (its PCI bus ids); the log does not state the network, DGX H100's 8x 400 Gb/s NDR is taken"),
    ("a3mega", "gcp-a3-mega-2x8", "a3-mega", "a3-mega",
     "2 Google Cloud A3 Mega VMs, GPUDirect-TCPXO, Google's NCCL environment"),
    ("nt309b", "hgx-h100-ib-4x8", "issue-309", "gj-aion's cluster",
     "HGX H100 servers with 8x ConnectX-7 400 Gb/s InfiniBand"),
    ("4x8-vmware-nt309", "hgx-h100-ib-4x8", "issue-309", "qoofyk's VMware VMs",
     "HGX H100 servers with 8x ConnectX-7 400 Gb/s InfiniBand"),
    ("nt309", "hgx-h100-ib-4x8", "issue-309", "qoofyk's bare-metal XE9680",
     "HGX H100 servers with 8x ConnectX-7 400 Gb/s InfiniBand"),
    ("rtx5090", "rtx5090-loopback", "rtx5090", "rtx5090", "one RTX 5090 shared by 2 ranks over loopback TCP"),
)

# Mechanisms behind the misses the tables show, per log family (what the model leaves out).
WHY = {
    "dgx-06/07": "All three runs are nccl-tests -g N under `mpirun -n 2`: one process per node drives the node's N "
                 "GPUs, and Open MPI binds each process to one core when it starts two or fewer (mpirun(1): 'bind to "
                 "core when the number of processes is <= 2'; NCCL keeps the process's affinity for its threads), so "
                 "the main thread and the N proxy threads of a node most likely share one core. From 32-64 KiB up to "
                 "tens of MiB, where a call needs many network steps from the proxies, calls take up to 2 ms (2x8: "
                 "2069 us at 32 KiB against 50 us at 16 KiB) and jump between neighbouring sizes (2x4: 209 us at 256 "
                 "KiB, 71 us at 512 KiB): CPU time-sharing, which no figure of the hardware describes. The robust fit "
                 "flags most of those sizes as outliers and keeps NCCL's figures for the rest (2x2: 23 of 31 sizes "
                 "within 5%, RMS 4.7% without its 4 outliers); small calls cost NCCL's latency plus the launches on N "
                 "GPUs from one thread (the fitted overhead: 12 us for -g 8), large ones run at the links' rate. "
                 "Where the stalls reach sizes the fit keeps (2x4, 2x8), they pull figures no hardware has (2x8: 27 "
                 "stages per network hop; 2x4: LL128 at 0.14 of its rate), and the fit says it is poor. (a) and (c) "
                 "miss in the stalled range because the stalls grow with the GPUs one core serves, not by a "
                 "mechanism of the hardware; the 2x2 run's LL calls also move at 0.41 of NCCL's LL ceiling where "
                 "issue 309's move at 0.51-0.62.",
    "a3-mega": "GPUDirect-TCPXO (the FasTrak net plugin) moves every chunk through receive bounce buffers that a GPU "
               "kernel unpacks; NCCL's source has no figure for that, the plugin reports none, and no published run "
               "other than this one gives one, so the built-in topology has none and (a) predicts 1-512 MiB calls up "
               "to 5x too fast. Calibrated, the plugin costs about 30 us per call beyond NCCL's latency (a 22 us "
               "overhead and Simple tree latency x1.11) and 4.3 store-and-forward stages per network hop before "
               "large calls stream; (b) "
               "misses between 128 KiB and 2 MiB (up to 15%), where the fill grows with NCCL's chunk size in steps "
               "the measured curve does not show.",
    "rtx5090": "Both ranks share one GPU: their NCCL kernels only run while the GPU time-slices between the two "
               "processes, so a call costs about 2.2 ms whatever its size up to 4 MiB and then streams at what the "
               "proxy threads reach while the GPU is shared. That is a floor, max(2.2 ms, transfer), not an added "
               "latency: the robust fit follows the streaming sizes (8-128 MiB within 7%) and flags the three floor "
               "sizes as outliers. (a) misses by design: the model has no time-slicing.",
    "h100-1node": "A single-node NVLS all-reduce: NCCL 2.28's own NVLS efficiency (0.85 of the NVLink bound) gives the "
                  "asymptotic rate within 4% (1-2 GiB); at 256-512 MiB the measured calls are 11-13% slower, a constant "
                  "of about 80 us per call that NCCL's NVLS latency (25 us) and the model's NVLS pipeline fill do not "
                  "have and no source gives; calibrated (b) it is the per-call overhead, within 2.5% at every size.",
    "issue-309": "From the built-in topology (a) the InfiniBand runs are within target at every size but one: at 512 "
                 "KiB the 2-node run is already as slow as at 1 MiB (70 us), as if NCCL had left LL128 for the NVLS "
                 "tree one size earlier. NCCL's own estimates tie there (tree/LL128 54.5 us, NVLS tree 54.6 us): a 3% "
                 "lower tree LL128 estimate flips it, e.g. NCCL's 0.85 for a tree whose topology search settled for "
                 "the simple pattern (tuning.cc:266; Hopper retries the search with it, search.cc:1052-1056), which "
                 "depends on the servers' PCIe layout the logs do not show. Calibrated (b), the LL calls move at 0.51 "
                 "(2 nodes) and 0.62 (4 nodes) of NCCL's LL ceiling (tuning.cc llMaxBws: 39 and 20.4 GB/s), which the "
                 "per-protocol rate now fits, and NCCL's LL latency table holds at both node counts (x1.00, x0.99). "
                 "What (b) still misses is the NVLS-tree pipeline between 1 and 128 MiB (up to 11%), and 4 KiB, the "
                 "largest LL call on one channel, 6-9% faster than the model's per-channel LL rate says (the next "
                 "sizes add a channel each time and cost 1-2 us more than the rate alone): the measured "
                 "marginal rate rises smoothly (2 nodes: 160 GB/s at 8-16 MiB, 200 at 16-32 MiB, 250 above 128 MiB) "
                 "where the model's fill steps with NCCL's chunk size (32, 64, 128 KiB) and then streams at the full "
                 "rate; a per-chunk cost would bend it, but fitted per log it differs between the two node counts, so "
                 "it is not in the model. The same range decides (c): the 4-node run fills in about the time the "
                 "2-node run does (3.5 against 6.2 fitted stages per hop, while a tree one level deeper has twice the "
                 "hops), so each predicts the other's 8-64 MiB calls 10-23% off; the 2-node run is bare metal, the "
                 "4-node one VMware VMs with a custom NCCL topology file, so part of it may be the platform. nt309b "
                 "(another cluster, from 1 MiB) is predicted by the 2-node fit (c') within 10% at 10 of 14 sizes: "
                 "it costs 12-17 us more per call at 1-2 MiB than qoofyk's servers.",
}


@dataclass(frozen=True)
class Log:
    path: Path
    topology: str
    family: str
    cluster: str
    hardware: str


def hardware_of(path: Path) -> Log | None:
    for key, topology, family, cluster, hardware in HARDWARE:
        if key in path.name:
            return Log(path, topology, family, cluster, hardware)
    return None


def shape(measurements) -> tuple[int, int]:
    """(hosts, ranks per host) of a log's group."""
    span = measurements[0].span
    return span.hosts, span.size // span.hosts


def predict(topology, measurements) -> list[float]:
    view = nccl_view(topology)
    times = []
    for m in measurements:
        _, ranks = group_devices(m, topology)
        times.append(estimate_group(topology, ranks, m.collective, m.bytes, view).time_s)
    return times


def busbw(measurement, seconds: float) -> float:
    return measurement.bytes / seconds * bus_factor(measurement.collective, measurement.span.size) / 1e9


def study(log_dir: Path) -> dict:
    logs, unknown = [], []
    for path in sorted(p for p in log_dir.iterdir() if p.is_file()):
        log = hardware_of(path)
        if log is None:
            unknown.append(path)
        logs.append(log or Log(path, "", "", "inferred from the log"))
    read = {}
    for log in logs:
        _, measurements = read_measurements(str(log.path))
        read[log.path] = measurements
    results = []
    fitted: dict[Path, object] = {}

    def calibration(log: Log, base):
        if log.path not in fitted:
            fitted[log.path] = calibrate_nccl(read[log.path], base)
        return fitted[log.path]

    for log in logs:
        measurements = read[log.path]
        base = load_topology(log.topology) if log.topology else infer_nccl_base(measurements).topology
        built_in = predict(base, measurements)
        own = calibration(log, base)
        calibrated = predict(own.topology, measurements)
        outliers = {(e.nbytes, e.measured_s) for fit in own.fits for g in fit.groups for e in g.errors if e.outlier}
        cross, same_shape = {}, {}
        for other in logs:
            if other is log or not log.family or other.family != log.family:
                continue
            times = predict(calibration(other, base).topology, measurements)
            (cross if shape(read[other.path]) != shape(measurements) else same_shape)[other.path.name] = times
        rows = []
        for i, m in enumerate(measurements):
            row = {"bytes": m.bytes, "measured_s": m.time_s, "measured_busbw": busbw(m, m.time_s),
                   "a_s": built_in[i], "b_s": calibrated[i], "b_outlier": (m.bytes, m.time_s) in outliers,
                   "c": {name: times[i] for name, times in cross.items()},
                   "c_same_shape": {name: times[i] for name, times in same_shape.items()}}
            rows.append(row)
        figures = [{"level": fit.level, "efficiencies": dict(fit.efficiencies), "overhead_s": fit.overhead_s,
                    "stages_per_hop": fit.stages,
                    "protocols": {p: {"bandwidth": bw, "latency": lat} for p, bw, lat in fit.protocols}}
                   for fit in own.fits]
        results.append({"file": log.path.name, "topology": base.name, "family": log.family, "cluster": log.cluster,
                        "hardware": log.hardware, "group": measurements[0].span.describe(),
                        "collective": measurements[0].collective, "fitted": figures, "rows": rows})
    return {"logs": results, "unknown": [p.name for p in unknown]}


def _err(predicted: float, measured: float) -> float:
    """Relative error of the predicted busbw, predicted / measured - 1 (busbw is inverse in time)."""
    return measured / predicted - 1


def summarize(entry: dict) -> dict:
    rows = entry["rows"]
    a = [_err(r["a_s"], r["measured_s"]) for r in rows]
    large = [abs(e) for r, e in zip(rows, a) if r["bytes"] >= LARGE]
    small = [abs(e) for r, e in zip(rows, a) if r["bytes"] < LARGE]
    b = [abs(_err(r["b_s"], r["measured_s"])) for r in rows]
    b_in = [e for r, e in zip(rows, b) if not r.get("b_outlier")]
    c, c_same = {}, {}
    for r in rows:
        for name, seconds in r["c"].items():
            c.setdefault(name, []).append(abs(_err(seconds, r["measured_s"])))
        for name, seconds in r.get("c_same_shape", {}).items():
            c_same.setdefault(name, []).append(abs(_err(seconds, r["measured_s"])))
    summary = {
        "a_large": max(large) if large else None, "a_small": max(small) if small else None,
        "a_large_ok": (sum(e <= TARGET_A_LARGE for e in large), len(large)),
        "a_small_ok": (sum(e <= TARGET_A_SMALL for e in small), len(small)),
        "b_worst": max(b), "b_rms": math.sqrt(sum(e * e for e in b) / len(b)),
        "b_ok": (sum(e <= TARGET_B for e in b), len(b)),
        "b_outliers": len(b) - len(b_in),
        "b_inlier_rms": math.sqrt(sum(e * e for e in b_in) / len(b_in)) if b_in else None,
        "c": {name: (max(errors), sum(e <= TARGET_C for e in errors), len(errors)) for name, errors in c.items()},
        "c_same": {name: (max(errors), sum(e <= TARGET_C for e in errors), len(errors))
                   for name, errors in c_same.items()},
    }
    return summary


def baseline_summary(baseline: dict, entry: dict) -> dict | None:
    """The baseline's summary of the same log, with (c) restricted to the sources the current
    run counts as (c) (the baseline counted every other log of the family)."""
    for old in baseline.get("logs", []):
        if old["file"] == entry["file"]:
            sources = {name for row in entry["rows"] for name in row["c"]}
            rows = [dict(row, c={k: v for k, v in row["c"].items() if k in sources}) for row in old["rows"]]
            return summarize(dict(old, rows=rows))
    return None


def _pct(value) -> str:
    return "-" if value is None else f"{value:.1%}"


def _count(pair) -> str:
    ok, total = pair
    return "-" if not total else f"{ok}/{total}"


def _c_text(pairs: dict) -> str:
    return "; ".join(f"{name}: {ok}/{total}, worst {worst:.1%}" for name, (worst, ok, total) in pairs.items()) or "-"


def _figures_text(fitted: list[dict]) -> str:
    parts = []
    for fit in fitted:
        items = [f"efficiency {name} {value:.3f}" for name, value in fit["efficiencies"].items()]
        if fit["overhead_s"]:
            items.append(f"overhead {fit['overhead_s'] * 1e6:.1f} us")
        if fit["stages_per_hop"] is not None:
            items.append(f"{fit['stages_per_hop']:.2f} stages per network hop")
        for protocol, figures in fit["protocols"].items():
            said = []
            if figures["bandwidth"] is not None:
                said.append(f"rate x{figures['bandwidth']:.2f}")
            if figures["latency"] is not None:
                said.append(f"latency x{figures['latency']:.2f}")
            items.append(f"{protocol} {' '.join(said)}")
        parts.append(f"{fit['level']}: " + ", ".join(items))
    return "; ".join(parts)


def render(result: dict, command: str, baseline: dict | None = None) -> str:
    lines = ["# The NCCL model against published nccl-tests runs", "", header(command)]
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    if load:
        lines.append(f"Load average while it ran (1/5/15 min): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
                     f"(figures are model outputs; the load changes only how long this took)\n")
    lines += [
        "Each log's first line names its source and hardware. Predictions are busbw from the NCCL model "
        "(synth/model/nccl.py: NCCL 2.26.2's choice of algorithm, protocol and channels from its own tables; the time "
        "on the hardware from line rates and the efficiencies NCCL reaches on them, every figure with its source in "
        "the topology). Calibration (synth/calibrate/nccl_fit.py) fits, by robust least squares, per resource the "
        "links' efficiencies, per protocol (LL, LL128, Simple) a rate and a latency factor on the sizes where NCCL "
        "picks that protocol, a per-call overhead and a network hop's pipeline stages; none of them moves NCCL's "
        "choice, so the switch points stay NCCL's. Errors are predicted / measured busbw - 1 (positive: the model "
        "is too fast, as in issue 9's +29%).", "",
        "* (a) the built-in topology of the hardware alone; targets: within 10% at >= 64 MiB, within 30% below;",
        "* (b) calibrated on the same log by `synth calibrate`; target: within 5%; sizes the fit flags as outliers "
        "(more than 25% and 4 robust deviations off after the robust fit, left out of it) are marked with * and "
        "counted;",
        "* (c) calibrated on a log of the same hardware with another node count or ranks per node, predicting this "
        "one; target: within 10%;",
        "* (c') for information: calibrated on another run of the same shape (another cluster of the same hardware).",
        "", "## Summary", "", "Sizes within target, and the worst error:", "",
        "| log | group | topology | (a) >= 64 MiB | (a) < 64 MiB | (b) | (b) RMS (outliers; RMS without them) "
        "| (c) | (c') |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    summaries = []
    for entry in result["logs"]:
        s = summarize(entry)
        summaries.append(s)
        inliers = "-" if s["b_inlier_rms"] is None else f"{s['b_inlier_rms']:.1%}"
        lines.append(f"| {entry['file']} | {entry['group']} | {entry['topology']} | {_count(s['a_large_ok'])}, worst "
                     f"{_pct(s['a_large'])} | {_count(s['a_small_ok'])}, worst {_pct(s['a_small'])} | "
                     f"{_count(s['b_ok'])}, worst {_pct(s['b_worst'])} | {_pct(s['b_rms'])} ({s['b_outliers']}; "
                     f"{inliers}) | {_c_text(s['c']) if s['c'] else 'no other shape'} | {_c_text(s['c_same'])} |")
    if baseline:
        lines += ["", "## Against the baseline", "", baseline.get("baseline", "The baseline") + " "
                  "([fidelity-baseline.json](fidelity-baseline.json)). Sizes within target, before -> after ((c) from "
                  "the same sources as above):", "",
                  "| log | (a) >= 64 MiB | (a) < 64 MiB | (b) | (b) RMS | (c) |", "|---|---|---|---|---|---|"]
        for entry, after in zip(result["logs"], summaries):
            before = baseline_summary(baseline, entry)
            if before is None:
                continue
            c_before = sum(ok for _, ok, _ in before["c"].values()), sum(n for _, _, n in before["c"].values())
            c_after = sum(ok for _, ok, _ in after["c"].values()), sum(n for _, _, n in after["c"].values())
            lines.append(f"| {entry['file']} | {_count(before['a_large_ok'])} -> {_count(after['a_large_ok'])} | "
                         f"{_count(before['a_small_ok'])} -> {_count(after['a_small_ok'])} | "
                         f"{_count(before['b_ok'])} -> {_count(after['b_ok'])} | {_pct(before['b_rms'])} -> "
                         f"{_pct(after['b_rms'])} | {_count(c_before)} -> {_count(c_after)} |")
    lines += ["", "## What (b) fitted", "", "Per log, the figures `synth calibrate` fitted on it (factors are "
              "achieved over NCCL's own: x1.00 is NCCL's figure):", ""]
    for entry in result["logs"]:
        lines.append(f"* **{entry['file']}**: {_figures_text(entry['fitted'])}")
    lines += ["", "## Where it misses and why", ""]
    families = []
    for entry in result["logs"]:
        if entry["family"] and entry["family"] not in families:
            families.append(entry["family"])
    for family in families:
        if family in WHY:
            files = ", ".join(e["file"] for e in result["logs"] if e["family"] == family)
            lines += [f"* **{files}**: {WHY[family]}", ""]
    for entry in result["logs"]:
        lines += ["", f"## {entry['file']}", "", f"{entry['hardware']} ({entry['cluster']}); {entry['collective']} over "
                  f"{entry['group']}; built-in topology `{entry['topology']}`.", ""]
        others = sorted({name for row in entry["rows"] for name in row["c"]})
        same = sorted({name for row in entry["rows"] for name in row.get("c_same_shape", {})})
        head = "| size | measured busbw | (a) busbw | (a) err | (b) busbw | (b) err |"
        rule = "|---:|---:|---:|---:|---:|---:|"
        for name in others:
            head += f" (c) from {name} | err |"
            rule += "---:|---:|"
        for name in same:
            head += f" (c') from {name} | err |"
            rule += "---:|---:|"
        lines += [head, rule]
        for row in entry["rows"]:
            m = row["measured_s"]
            factor = row["measured_busbw"] * m  # busbw x time is constant for a size
            mark = " *" if row.get("b_outlier") else ""
            cells = [format_bytes(row["bytes"]), f"{row['measured_busbw']:.2f}",
                     f"{factor / row['a_s']:.2f}", f"{_err(row['a_s'], m):+.1%}",
                     f"{factor / row['b_s']:.2f}", f"{_err(row['b_s'], m):+.1%}{mark}"]
            for name in others:
                seconds = row["c"][name]
                cells += [f"{factor / seconds:.2f}", f"{_err(seconds, m):+.1%}"]
            for name in same:
                seconds = row["c_same_shape"][name]
                cells += [f"{factor / seconds:.2f}", f"{_err(seconds, m):+.1%}"]
            lines.append("| " + " | ".join(cells) + " |")
    if result["unknown"]:
        lines += ["", f"Logs without a known built-in topology (their base was inferred from the log): "
                      f"{', '.join(result['unknown'])}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fidelity", description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="?", default="../shared/nccl-logs", help="folder of nccl-tests logs")
    parser.add_argument("-o", "--output", default="results", help="results folder (default results/)")
    args = parser.parse_args(argv)
    log_dir = Path(args.logs)
    if not log_dir.is_dir():
        print(f"fidelity: {log_dir} is not a folder of nccl-tests logs", file=sys.stderr)
        return 2
    result = study(log_dir)
    command = " ".join(["python -m benchmarks.fidelity", *(sys.argv[1:] if argv is None else argv)])
    out = results_dir(args.output)
    baseline_path = out / "fidelity-baseline.json"
    baseline = json.loads(baseline_path.read_text(encoding="utf-8")) if baseline_path.is_file() else None
    (out / "fidelity.md").write_text(render(result, command, baseline), encoding="utf-8")
    (out / "fidelity.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out / 'fidelity.md'} and {out / 'fidelity.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
