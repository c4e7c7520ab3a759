"""Does a four-size probe calibrate a system? Leave one source out on published nccl-tests logs.

Every log in LOG_DIR (default ../shared/nccl-logs) belongs to a source (benchmarks/fidelity.py's
SOURCES: one thread, one poster's cluster), i.e. one system. Per fold, one log A of a source:

* the probe: the four sizes of A nearest (in log size) to `synth probe`'s sizes
  (synth/calibrate/probe.py: 8 KiB, 512 KiB, 32 MiB, 2 GiB), every row of those sizes;
* `synth calibrate`'s NCCL fit (synth/calibrate/nccl_fit.py) on them alone, from A's built-in
  topology (with A's launch mode and NCCL_* settings), every fitted figure refitted in the fold,
  under the probe priors (nccl_fit.PROBE_PRIORS) times each scale in SCALES;
* prediction of every other size of A and every size of the source's other logs (other node
  counts, other launch modes: each log's own NCCL settings over the figures fitted on A),
  with the fit's own spread (synth/calibrate/confidence.py).

Per judged source, on the folds of the other sources alone (`select`): the prior scale that puts
the most of their predictions within target, and per size band (for A's other sizes and for the
other logs) the model-structure term that makes 90% of their intervals cover
(synth/calibrate/transfer_error.py). The judged source's folds are scored at that scale, each
interval predicted x exp(+-1.645 sqrt(fit spread^2 + structure term^2)), its upper end plus the
host's possible stall where the launch oversubscribes a process's CPUs (proxy.host_stall_s).

Scored per band as the issue states the target: |busbw error| within 30% below 1 MiB, 15% at
1-64 MiB, 10% at 64 MiB and up, and the share of measured times inside their interval (target
at least 90%), with the median interval's width. The uncalibrated model (the built-in topology
alone) is scored on the same calls.

Not refitted per fold, and so partly fitted on these logs: the model's constants and built-in
topologies that were chosen while looking at them (the launch floor per GPU, the TCP per-stream
rate, the A3 High topology), the probe priors and the scales tried; the report says so.

    python -m benchmarks.calibration_transfer [LOG_DIR] [-o results]
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.fidelity import Log, busbw, error, load_logs, predict
from benchmarks.record import REPORT, header, log_folder, log_folder_parser, study_dir
from synth.calibrate.confidence import model_error_for_group
from synth.calibrate.transfer_error import combined, structure_sigma
from synth.calibrate.uncertainty import interval
from synth.calibrate.groups import devices as group_devices
from synth.calibrate.nccl_fit import PROBE_PRIORS, Priors, calibrate_nccl
from synth.calibrate.probe import PROBE_SIZES
from synth.errors import UsageError
from synth.units import format_bytes

MiB = 2 ** 20
# the target per band: (name, low, high, tolerance on |busbw error|)
BANDS = (("< 1 MiB", 0, MiB, 0.30), ("1-64 MiB", MiB, 64 * MiB, 0.15), (">= 64 MiB", 64 * MiB, math.inf, 0.10))
COVERAGE_TARGET = 0.90
# the prior scales tried, as factors on synth calibrate's probe priors (nccl_fit.PROBE_PRIORS): 0.1
# moves almost nothing (about the uncalibrated model), 50 about the sweep priors of the first runs
SCALES = (0.1, 0.5, 1.0, 2.0, 4.0, 50.0)
STRUCTURE_MODULE = Path(__file__).resolve().parent.parent / "synth" / "calibrate" / "transfer_error.py"
# the bands whose structure term is measured per launch class (`shared_host`): where the stalls of
# a thread driving several GPUs across hosts lie (results/fidelity: calls of up to 2 ms at 32 KiB-64
# MiB); a design choice made with these logs in view
CLASS_BANDS = ("1-64 MiB",)
MIN_CELL = 20  # a (band, same log or not) cell with fewer other-source predictions takes the band's
# what the earlier versions measured on the same logs, so the changes stand beside what they did
HISTORY = (
    "Earlier runs on the same 1264 predictions: probe sizes 8 KiB-256 MiB (x32) with the in-sample "
    "sigma alone: 790 (62%) within target, intervals covering 731 (58%); adding the held-out-size sigma "
    "(refits leaving a quarter of the sizes out): coverage 1009 (80%); probe sizes 8 KiB-2 GiB (x64): 851 (67%) "
    "within target against 892 (71%) uncalibrated (calibrated worse at 1-64 MiB, 53 against 57%, and from "
    "64 MiB, 58 against 67%, and on the source's other logs, 65 against 73%), intervals covering 906 (72%). "
    "The probe sizes were changed after the first run showed the 256 MiB bandwidth short of NCCL's asymptote "
    "across nodes, so they too were chosen on these logs. With the probe priors and the per-source choices: "
    "876 (69%) within target against 892 (71%) uncalibrated (< 1 MiB 86%, 1-64 MiB 54%, from 64 MiB 66%), "
    "intervals covering 1171 (93%), the median 1-64 MiB interval x0.06-x15.52 (issue 309's 1-64 MiB term "
    "measured on dgx-06/07's stalls). This run adds the fabric's share (below), no per-call overhead where NCCL's "
    "tables hold every per-call cost (on a probe), and the 1-64 MiB structure term per launch class: 927 (73%) "
    "within target against 892 (71%) uncalibrated, intervals covering 1171 (93%); dgx-06/07 157/270 (58%) within "
    "target, 200/270 (74%) covered; nccl-tests#309 709/910 within target, 892/910 (98%) covered, its other logs' "
    "terms (< 1 MiB 0.67, >= 64 MiB 0.48) measured on dgx-06/07's stalls, the only other source with other logs. "
    "This run adds the cores an Open MPI launch binds each process to, read off the command line, shared by the "
    "proxy threads of the GPUs the process drives (synth/model/nccl/proxy.py cpu_share), the host's stall "
    "as an additive upper bound of the interval (host_stall_s), the classic tree's mid-size rate and the LL128 "
    "tree's fill (below).")


# why calibration hurt transfer in the runs before this one (the fitted figures per fold, read off
# those runs; the mechanisms the probe priors, the fabric's share and the overhead's condition answer)
FINDINGS = (
    "Why calibration made the other logs worse before (per-fold fitted figures of the previous run): every "
    "figure had a near-flat prior, so a four-size probe moved six or seven of them. The 4- and 8-node issue-309 "
    "logs start at 1 MiB, so their probes fitted a per-call overhead of 6-12 us on sizes no latency bounds, and "
    "an intra-node efficiency of 0.74-0.85 traded against a Simple rate factor of 0.86-1.11 on the two "
    "bandwidth sizes; carried to the 2-node logs, which the uncalibrated model put within 1-3%, small sizes came "
    "out 18-29% slow and sizes from 64 MiB 12-16% slow. The 2x8 dgx-06/07 log (one thread launching 8 GPUs, "
    "stalls from 32 KiB to 64 MiB) fitted LL128's latency at its 4x bound and 9 stages per hop; carried to 2x2 "
    "and 2x4, 1-64 MiB went from +20% / +87% to -69% / -48%. The probe priors (synth/calibrate/nccl_fit.py) hold "
    "latency figures where fewer than a few sizes ask and rates within about their scale unless the miss is "
    "much larger. Issue 309's 4 and 8 nodes of gj-aion's cluster ran 9-14% slower than modelled from 64 MiB "
    "(ring and NVLS tree alike, the network binding) where its 2 nodes and qoofyk's 4 VMs are exact: the "
    "fabric's share of the NICs' rate on calls over more hosts than a leaf holds (synth/model/nccl/fabric_share.py: "
    "NCCL's user guide gives NCCL_IB_QPS_PER_CONNECTION for 'multi-level fabrics which need multiple queue pairs "
    "to have good routing entropy'; its 8-node run with 2 queue pairs per connection is not slow), a per-cluster "
    "figure, default none lost, that a probe over more than two hosts fits in place of the links' efficiencies "
    "and Simple's rate (4 nodes: 0.90, 8 nodes: 0.94), so the 2-node logs keep NCCL's documented rates. A fitted "
    "per-call overhead on those probes (6-12 us on sizes no latency bounds) carried to the 2-node logs; on "
    "InfiniBand launched one GPU per process NCCL's tables hold every per-call cost, so a probe fits none "
    "there. dgx-06/07 (one thread launching 2/4/8 GPUs per host): mpirun binds each of its two processes to "
    "one core (Open MPI's default for at most two processes), and NCCL keeps the process's proxy threads, one per "
    "GPU, within its CPU set, so the 2 hardware threads of that core post every network step of 2, 4 or 8 GPUs: "
    "each step's host work takes GPUs / 2 times as long (x2 for -g 4, whose 2-8 MiB tree/LL128 calls and 1-2 GiB "
    "calls it now predicts within 5%; x4 for -g 8). Still missed there: the stalls of 0.02-2 ms from 16-32 KiB "
    "(the busy threads outnumber the CPUs and a proxy thread waits for the scheduler; when is not modelled, only "
    "its bound, one slice, in the interval), the 2x2 ring/LL at 32-512 KiB (+20-70%) and the NVLS tree of -g 4 "
    "and -g 8 from 1 MiB (the NVLS tree has no proxy floor to share). "
    "The LL128 tree at 1-4 MiB over 4 and 8 nodes ran 15-30% slower than modelled (a probe's LL128 latency "
    "factor then carried that to the 2-node ring LL128 run, -37% at 1 MiB from the 8-node probe): the model let "
    "a tree reach NCCL's measured LL128 ceiling in full, where NCCL's own estimate scales it by its "
    "treeCorrectionFactor (tuning.cc: 0.6 for LL128 at 64 KiB-2 MiB, 'trees are not perfectly sticking to the "
    "model for medium sizes'), and gave the LL128 tree no fill, where calcCollChunking counts 1 + log2(nodes) + "
    "0.1 x GPUs per node steps for its chunk (nstepsLL128); the model now applies both (synth/model/nccl/"
    "tables.py tree_correction, chunking.py ll128_tree_stages), taking those calls' misses from 24 to 6 of their "
    "51 predictions and the 2-node ring LL128 run's at 4-16 MiB from 10 to 2. Still missed elsewhere: mid-size "
    "NVLS-tree fill on qoofyk's hosts (2-16 MiB 10-26% faster than modelled, where gj-aion's are within 12%; "
    "NCCL's chunking, calcCollChunking, is the same on both) and, on the 2-node ring of 24 channels, 1-2 MiB "
    "15-25% faster than the proxy floor prices. The per-fold choice of scale on the other sources stays noisy. "
    "nccl-tests#309's intervals on its "
    "other logs (4 and 8 nodes from a 2-node probe and back: the fabric's share a 2-node probe cannot see) were "
    "covered by terms measured on dgx-06/07's stalls, the only other source with other logs; with those stalls "
    "bounded in dgx-06/07's own intervals the terms are what its other residuals say, and #309's coverage is "
    "what its own residuals give: no source but #309 itself measures how far its node counts transfer.")


def probe_sizes(log: Log) -> tuple[int, ...]:
    """The log's sizes nearest the probe's, distinct (fewer when the log has fewer sizes)."""
    sizes = sorted({m.bytes for m in log.measurements})
    chosen: list[int] = []
    for target in PROBE_SIZES:
        free = [s for s in sizes if s not in chosen]
        if free:
            chosen.append(min(free, key=lambda s: abs(math.log(s / target))))
    return tuple(sorted(chosen))


def fold(held: Log, logs: list[Log], priors: Priors = PROBE_PRIORS) -> dict:
    """Calibrate on the probe sizes of `held`; predict the rest of its source."""
    probe = probe_sizes(held)
    fitted_on = [m for m in held.measurements if m.bytes in probe]
    entry = {"probe_log": held.name, "source": held.source.name, "probe_sizes": list(probe), "rows": []}
    try:
        calibrated = calibrate_nccl(fitted_on, held.base, priors=priors).topology
    except (UsageError, ValueError) as failure:
        entry["failed"] = " ".join(str(failure).split())[:300]
        return entry
    for log in logs:
        if log.source != held.source:
            continue
        topology = replace(calibrated, nccl=log.base.nccl)  # the log's own launch mode and NCCL settings
        calls = [m for m in log.measurements if not (log is held and m.bytes in probe)]
        if not calls:
            continue
        try:
            predicted = predict(topology, calls)
            uncalibrated = predict(log.base, calls)
        except (UsageError, ValueError) as failure:
            entry.setdefault("skipped", []).append(f"{log.name}: {' '.join(str(failure).split())[:200]}")
            continue
        for m, p, u in zip(calls, predicted, uncalibrated):
            _, ranks = group_devices(m, topology)
            # the fit's own spread: the study measures the structure term itself, per fold
            sure = model_error_for_group(topology, ranks, m.collective, m.bytes)
            sigma = sure.fit_sigma(m.bytes)
            low, high = interval(p, sigma)
            entry["rows"].append({"log": log.name, "same_log": log is held, "shared_host": shared_host(m),
                                  "collective": m.collective,
                                  "group": m.span.describe(), "bytes": m.bytes, "measured_s": m.time_s,
                                  "measured_busbw": busbw(m, m.time_s), "predicted_s": p, "uncalibrated_s": u,
                                  "sigma_fit": sigma, "low_fit_s": low, "high_fit_s": high, "stall_s": sure.stall_s})
    return entry


def shared_host(m) -> bool:
    """Whether the call ran from one host thread driving several GPUs across hosts (nccl-tests -g N
    over nodes): its calls wait on NCCL proxy threads that share that process's CPU binding (mpirun
    binds a process to one core when it starts at most two; NCCL keeps its threads within the
    process's affinity): the model shares the core among them (proxy.cpu_share) and bounds the
    scheduler's stalls in the interval (proxy.host_stall_s), but not when they come. Known from
    the run's command line before any size is measured; its structure term is measured on runs of
    its own class only (`select`)."""
    return bool(m.run is not None and m.run.gpus_per_process > 1 and m.span.hosts > 1)


def study(log_dir: Path) -> dict:
    """Every fold at every prior scale; then, per source, the scale and the structure term chosen
    on the other sources' folds alone (`select`)."""
    logs, unknown = load_logs(log_dir)
    runs = {scale: folds_at(logs, PROBE_PRIORS.scaled(scale)) for scale in SCALES}
    folds, choices = select(runs)
    default = [r for f in runs[1.0] for r in f["rows"]]
    at_default = {label: sum(map(_within, part)) for label, part in (
        ("all", default), ("same", [r for r in default if r["same_log"]]), ("other", [r for r in default if not r["same_log"]]))}
    return {"folds": folds, "choices": choices, "unknown": unknown, "structure_sigma": structure_table(runs[1.0]),
            "at_default": at_default}


def structure_table(folds: list[dict]) -> dict:
    """Per band, the structure term (measured configuration, other configuration) over every
    fold's predictions at synth calibrate's own priors: what synth/calibrate/transfer_error.py's
    STRUCTURE_SIGMA states, a fit on these logs (no fold above is judged with it)."""
    rows = [r for f in folds for r in f["rows"]]
    table = {}
    for name, low, high, _ in BANDS:
        band = [r for r in rows if low <= r["bytes"] < high]
        if not band:
            continue
        terms = []
        for same in (True, False):
            cell = [r for r in band if r["same_log"] is same]
            cell = cell if len(cell) >= MIN_CELL else band
            terms.append(round(structure_sigma([_residual(r) for r in cell],
                                               [r["sigma_fit"] for r in cell]), 4))
        table[name] = tuple(terms)
    return table


def write_structure_table(table: dict, path: Path) -> None:
    """Rewrite the generated table of synth/calibrate/transfer_error.py."""
    text = path.read_text(encoding="utf-8")
    begin = text.index("\n", text.index("# BEGIN GENERATED")) + 1
    end = text.index("# END GENERATED")
    body = "STRUCTURE_SIGMA: dict = {\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in table.items()) + "}\n"
    path.write_text(text[:begin] + body + text[end:], encoding="utf-8")


def folds_at(logs: list[Log], priors: Priors) -> list[dict]:
    """One fold per log with enough sizes for a four-size probe and a size held out."""
    folds = []
    for log in logs:
        if len({m.bytes for m in log.measurements}) < len(PROBE_SIZES) + 1:
            folds.append({"probe_log": log.name, "source": log.source.name, "rows": [],
                          "failed": f"{len({m.bytes for m in log.measurements})} size(s): too few for a "
                                    f"four-size probe and a held-out size"})
            continue
        folds.append(fold(log, logs, priors))
    return folds


def _within(row: dict) -> bool:
    tolerance = next(t for _, low, high, t in BANDS if low <= row["bytes"] < high)
    return abs(error(row["predicted_s"], row["measured_s"])) <= tolerance


def _cell(row: dict) -> tuple[str, bool]:
    return next(name for name, low, high, _ in BANDS if low <= row["bytes"] < high), row["same_log"]


def _residual(row: dict) -> float:
    """log(predicted / measured) as the interval judges it: a measured time above the prediction
    less the host's possible wait (stall_s, which the interval's upper end adds), not below it."""
    predicted, measured = row["predicted_s"], row["measured_s"]
    if measured > predicted:
        measured = max(predicted, measured - row.get("stall_s", 0.0))
    return math.log(predicted / measured)


def _term_key(band: str, same: bool, shared: bool) -> str:
    return f"{band} | {'same log' if same else 'other logs'}" + (" | one thread, several GPUs, across hosts"
                                                                   if shared else "")


def select(runs: dict[float, list[dict]]) -> tuple[list[dict], dict]:
    """Per source S: the prior scale whose folds of the other sources put the most predictions
    within target (ties: the narrower scale), and per (band, same log or not) the structure term
    (synth/calibrate/transfer_error.py) that makes those other sources' intervals cover 90%; S's
    folds at that scale, every row's interval widened by it. Nothing of S chooses either."""
    sources = list(dict.fromkeys(f["source"] for f in next(iter(runs.values()))))
    chosen_folds, choices = [], {}
    for source in sources:
        def others(scale: float) -> list[dict]:
            return [r for f in runs[scale] if f["source"] != source for r in f["rows"]]

        scale = max(sorted(runs), key=lambda k: sum(map(_within, others(k))))
        rows = others(scale)
        terms = {}
        for shared in (False, True):
            # a launch class's own rows where the other sources have enough of them, else all
            kind = [r for r in rows if r.get("shared_host", False) is shared]
            kind = kind if len(kind) >= MIN_CELL else rows
            for name, *_ in BANDS:
                pool = kind if name in CLASS_BANDS else rows
                band = [r for r in pool if _cell(r)[0] == name] or pool
                for same in (True, False):
                    cell = [r for r in band if r["same_log"] is same]
                    cell = cell if len(cell) >= MIN_CELL else band
                    terms[_term_key(name, same, shared)] = structure_sigma(
                        [_residual(r) for r in cell], [r["sigma_fit"] for r in cell])
        choices[source] = {"scale": scale, "within_on_others": sum(map(_within, rows)), "others": len(rows),
                           "structure_sigma": terms}
        for f in runs[scale]:
            if f["source"] != source:
                continue
            widened = []
            for r in f["rows"]:
                name, same = _cell(r)
                sigma = combined(r["sigma_fit"], terms[_term_key(name, same, r.get("shared_host", False))])
                low, high = interval(r["predicted_s"], sigma)
                high += r.get("stall_s", 0.0)  # the host's possible wait (proxy.host_stall_s), additive
                widened.append({**r, "sigma": sigma, "low_s": low, "high_s": high})
            chosen_folds.append({**f, "scale": scale, "rows": widened})
    order = {f["probe_log"]: i for i, f in enumerate(next(iter(runs.values())))}
    return sorted(chosen_folds, key=lambda f: order[f["probe_log"]]), choices


def score(rows: list[dict], key: str = "predicted_s") -> dict:
    """Per band: calls, share within the band's tolerance, median |error|, interval coverage."""
    out = {}
    for name, low, high, tolerance in BANDS:
        chosen = [r for r in rows if low <= r["bytes"] < high]
        errors = [abs(error(r[key], r["measured_s"])) for r in chosen]
        out[name] = {"calls": len(chosen), "within": sum(e <= tolerance for e in errors),
                     "median": statistics.median(errors) if errors else None, **_coverage(chosen)}
    out["all"] = {"calls": len(rows), "within": sum(out[b]["within"] for b, *_ in BANDS), **_coverage(rows)}
    return out


def _coverage(rows: list[dict]) -> dict:
    """Measured times inside the interval (fit and structure term), inside the fit's own, and
    the median interval's low and high factors on the prediction."""
    return {"covered": sum(r["low_s"] <= r["measured_s"] <= r["high_s"] for r in rows),
            "covered_fit": sum(r["low_fit_s"] <= r["measured_s"] <= r["high_fit_s"] for r in rows),
            "width": [statistics.median(r[k] / r["predicted_s"] for r in rows) for k in ("low_s", "high_s")]
            if rows else None}


def _share(part: int, whole: int) -> str:
    return f"{part}/{whole} ({part / whole:.0%})" if whole else "-"


def _pct(value) -> str:
    return "-" if value is None else f"{value:.1%}"


def _width(value) -> str:
    """The median interval's (low, high) factors on the prediction (a host stall widens only the high one)."""
    return "-" if value is None else f"x{value[0]:.2f}-x{value[1]:.2f}"


def render(result: dict, command: str, seconds: float) -> str:
    rows = [r for f in result["folds"] for r in f["rows"]]
    calibrated, uncalibrated = score(rows), score(rows, "uncalibrated_s")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = ["# Calibration transfer: a four-size probe, leave one source out", "", header(command),
             f"Load: 1-minute load average {load:.1f} at the end; the study took {seconds:.0f} s", "",
             "Per fold: `synth calibrate`'s NCCL fit on the four sizes of one log nearest `synth probe`'s "
             f"({', '.join(format_bytes(s) for s in PROBE_SIZES)}), then every other size of that log and every size "
             "of the other logs of its source (other node counts and launch modes) predicted from it. The fit's "
             "prior scale (a factor on synth calibrate's probe priors, nccl_fit.PROBE_PRIORS; tried: "
             f"{', '.join(f'{k:g}' for k in SCALES)}) and the interval's model-structure term (per size band, for the "
             "probe's own log and for the source's other logs: the smallest spread that makes 90% of those "
             "predictions' intervals cover, synth/calibrate/transfer_error.py) are chosen per judged source on the "
             "folds of the other sources alone. A prediction's 90% interval is predicted x exp(+-1.645 sigma), sigma = "
             "sqrt(fit's own spread^2 + structure term^2), its upper end plus what the call may wait for its host's "
             "CPUs where the launch leaves a process more busy threads than CPUs (one scheduler slice, 3 ms: "
             "synth/model/nccl/proxy.py host_stall_s; the structure terms are measured on what that leaves). Target (issue 25): within 30% below 1 MiB, 15% at 1-64 MiB, "
             "10% from 64 MiB (busbw), and intervals covering the measured time at least 90% of the time.", "",
             "| band | predictions | within target, calibrated | within target, uncalibrated | median abs error, "
             "calibrated | median abs error, uncalibrated | interval coverage | the fit's own interval alone | "
             "median 90% interval |", "|---|---|---|---|---|---|---|---|---|"]
    for name, *_ in BANDS:
        c, u = calibrated[name], uncalibrated[name]
        lines.append(f"| {name} | {c['calls']} | {_share(c['within'], c['calls'])} | {_share(u['within'], u['calls'])} "
                     f"| {_pct(c['median'])} | {_pct(u['median'])} | {_share(c['covered'], c['calls'])} | "
                     f"{_share(c['covered_fit'], c['calls'])} | {_width(c['width'])} |")
    c, u = calibrated["all"], uncalibrated["all"]
    lines.append(f"| all | {c['calls']} | {_share(c['within'], c['calls'])} | {_share(u['within'], u['calls'])} | | | "
                 f"{_share(c['covered'], c['calls'])} | {_share(c['covered_fit'], c['calls'])} | {_width(c['width'])} |")
    for label, same in (("the probe's own log, other sizes", True), ("the source's other logs", False)):
        part = score([r for r in rows if r["same_log"] is same])["all"]
        base = score([r for r in rows if r["same_log"] is same], "uncalibrated_s")["all"]
        lines.append(f"| {label} | {part['calls']} | {_share(part['within'], part['calls'])} | "
                     f"{_share(base['within'], base['calls'])} | | | {_share(part['covered'], part['calls'])} | "
                     f"{_share(part['covered_fit'], part['calls'])} | {_width(part['width'])} |")
    met_accuracy = c["calls"] and c["within"] == c["calls"]
    met_coverage = c["calls"] and c["covered"] >= COVERAGE_TARGET * c["calls"]
    if "at_default" in result:
        d = result["at_default"]
        own = sum(r["same_log"] for r in rows)
        lines += ["", f"At synth calibrate's own probe priors in every fold (scale 1, no per-fold choice; that scale was "
                      f"chosen with these logs in view, so this row is a fit): {_share(d['all'], c['calls'])} within "
                      f"target; the probe's own log {_share(d['same'], own)}, the source's other logs "
                      f"{_share(d['other'], c['calls'] - own)}."]
    lines += ["", f"Target met: accuracy {'yes' if met_accuracy else 'no'} (every prediction within its band's "
                  f"tolerance), interval coverage {'yes' if met_coverage else 'no'} (at least 90%, pooled over every "
                  f"prediction; per source below). Coverage is bought with width where held-out errors are large: a median "
                  f"interval wider than x0.5-x2 (the table's last column) says the model cannot pin that band on an "
                  f"unseen system, not that its prediction is good there.", "", HISTORY, "", FINDINGS, "", "## Per source", "",
              "Each source's prior scale and structure terms were chosen on the other sources' folds (`within target "
              "there`: what the chosen scale scored on them). At 1-64 MiB (CLASS_BANDS) the structure terms are "
              "measured per launch class: runs where one host thread drives several GPUs across hosts (nccl-tests -g N "
              "over nodes, whose NCCL proxy threads share the process's CPU binding, `shared_host`) take terms from the "
              "other sources' runs of that class, where they have at least 20 predictions, else from all of them; "
              "every other run from the other sources' runs that are not of it. That band was chosen with these logs "
              "in view (where the fidelity study locates those stalls); the other bands pool both classes.", "",
              "| source | folds | predictions | within target | interval coverage | median 90% interval | prior scale "
              "(within target there) | structure term, own log: < 1 / 1-64 / >= 64 MiB | other logs |",
              "|---|---|---|---|---|---|---|---|---|"]
    by_source: dict[str, list[dict]] = {}
    for f in result["folds"]:
        by_source.setdefault(f["source"], []).append(f)
    for source, folds in by_source.items():
        source_rows = [r for f in folds for r in f["rows"]]
        s = score(source_rows)["all"]
        done = sum("failed" not in f for f in folds)
        choice = result["choices"][source]
        terms = choice["structure_sigma"]
        shared = any(r.get("shared_host", False) for r in source_rows)
        own = " / ".join(f"{terms[_term_key(name, True, shared)]:.2f}" for name, *_ in BANDS)
        other = " / ".join(f"{terms[_term_key(name, False, shared)]:.2f}" for name, *_ in BANDS)
        lines.append(f"| {source} | {done} of {len(folds)} | {s['calls']} | {_share(s['within'], s['calls'])} | "
                     f"{_share(s['covered'], s['calls'])} | {_width(s['width'])} | {choice['scale']:g} "
                     f"({_share(choice['within_on_others'], choice['others'])}) | {own} | {other} |")
    table = result.get("structure_sigma", {})
    lines += ["", "What every prediction on a calibrated topology now carries (synth/calibrate/transfer_error.py's "
                  "STRUCTURE_SIGMA, written by this study): the structure term over every fold at synth calibrate's "
                  "own priors (scale 1), all sources pooled, and so a fit on these logs: "
              + "; ".join(f"{band} {own:.2f} on the measured configuration, {other:.2f} on another"
                          for band, (own, other) in table.items()) + "."]
    lines += ["", "## Per fold", "", "| probe log | probe sizes | predictions | within target | coverage | note |",
              "|---|---|---|---|---|---|"]
    for f in result["folds"]:
        s = score(f["rows"])["all"]
        note = f.get("failed", "") or "; ".join(f.get("skipped", []))
        sizes = ", ".join(format_bytes(b) for b in f.get("probe_sizes", []))
        lines.append(f"| {f['probe_log']} | {sizes} | {s['calls']} | {_share(s['within'], s['calls'])} | "
                     f"{_share(s['covered'], s['calls'])} | {note.replace('|', '/')} |")
    lines += ["", "## What is and is not refitted per fold", "",
              "Refitted in every fold from the four probe sizes alone: every figure `synth calibrate` fits (link "
              "efficiencies, per-protocol rate and latency factors, the per-call overhead, pipeline stages, the "
              "fabric's share) and the fit's own spread. Chosen per judged source on the other sources' folds "
              "alone: the prior scale and the interval's structure terms. Not refitted, so this figure is partly a "
              "fit on these logs: the probe priors themselves (nccl_fit.PROBE_PRIORS), the scales tried and the "
              "cell size below which a structure term pools the band's predictions, all chosen with these logs in "
              "view; the NCCL model's constants and the built-in topologies chosen while reading them (the launch "
              "floor per GPU, the TCP per-stream rate, the A3 High topology), which built-in topology each source "
              "uses (benchmarks/fidelity.py's SOURCES), the hosts a leaf switch is taken to hold "
              "(fabric_share.LEAF_HOSTS, 2) and the launch-class band (CLASS_BANDS).", ""]
    return "\n".join(lines)


COLUMNS = ("log", "same_log", "collective", "group", "bytes", "measured_s", "predicted_s", "uncalibrated_s",
           "sigma_fit", "sigma", "low_s", "high_s", "stall_s")


def compact(result: dict) -> dict:
    """The result with each fold's rows as lists under `columns`, times to 5 significant digits."""
    def cell(value):
        return float(f"{value:.5g}") if isinstance(value, float) else value

    folds = [{**fold, "rows": [[cell(row[c]) for c in COLUMNS] for row in fold["rows"]]} for fold in result["folds"]]
    return {**result, "columns": list(COLUMNS), "folds": folds}


def main(argv=None) -> int:
    parser = log_folder_parser("calibration_transfer", __doc__.split("\n\n")[0], "calibration-transfer")
    args = parser.parse_args(argv)
    log_dir = log_folder(args.logs, "calibration_transfer")
    if log_dir is None:
        return 2
    start = time.perf_counter()
    result = study(log_dir)
    seconds = time.perf_counter() - start
    command = " ".join(["python -m benchmarks.calibration_transfer", *(sys.argv[1:] if argv is None else argv)])
    out = study_dir("calibration-transfer", args.output)
    (out / REPORT).write_text(render(result, command, seconds), encoding="utf-8")
    (out / "calibration-transfer.json").write_text(json.dumps(compact(result), separators=(",", ":")) + "\n",
                                                   encoding="utf-8")
    write_structure_table(result["structure_sigma"], STRUCTURE_MODULE)
    print(f"wrote {out / REPORT}, {out / 'calibration-transfer.json'} and {STRUCTURE_MODULE}'s table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
