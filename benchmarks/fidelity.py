"""How well the NCCL model predicts nccl-tests runs it was not built on: leave one source out.

Every log in a folder (default ../shared/nccl-logs) is grouped into its *source* (logs from one
thread, one poster's cluster, one blog post are one source: they share a machine, a software
stack, a launcher). Per log and per size band (< 1 MiB, 1-64 MiB, >= 64 MiB), the median
|error| of predicted busbw against measured, two ways:

* uncalibrated: the best-matching built-in topology alone (no figure fitted on any log);
* calibrated, leave one source out (LOSO): `synth calibrate`'s fit (synth/calibrate/nccl_fit.py)
  is run on every log of every *other* source; the figures it fits are moved onto the held-out
  log's built-in topology as factors (per-call overhead, per-protocol rate and latency factors,
  store-and-forward stages, link efficiencies over the base's), taking per figure the median
  over the other sources of the same class (one node / across nodes over verbs / over a net
  plugin / over sockets), or over all other sources where no other source is of that class.
  Nothing fitted on the held-out source reaches its prediction.

Targets (issue 16, held out): median |error| <= 10% in every size band, <= 30% at every size
from 1 MiB on. Writes results/fidelity/README.md and fidelity.json; when
results/fidelity/fidelity-loso-baseline.json is there (the table before the model changes of
issue 16) the report shows before -> after.

    python -m benchmarks.fidelity [LOG_DIR] [-o results]

The repository does not depend on LOG_DIR (tests use the copies under docs/examples/ and
tests/data/). Not a timed test: run it when the model or the logs change.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.fidelity_mechanisms import proxy_ablation
from benchmarks.record import REPORT, header, log_folder, log_folder_parser, study_dir
from synth.calibrate import read_measurements
from synth.calibrate.groups import devices as group_devices
from synth.calibrate.measurements import Measurement, RunInfo, Span
from synth.calibrate.nccl_fit import calibrate_nccl, launch_of
from synth.model.nccl import bus_factor
from synth.model.nccl.hardware import estimate_group, group_layout, nccl_view, with_launch
from synth.topology import Figure, ProtocolFactors, Topology
from synth.topology_file import load_topology
from synth.units import format_bytes

MiB = 2 ** 20
BANDS = (("< 1 MiB", 0, MiB), ("1-64 MiB", MiB, 64 * MiB), (">= 64 MiB", 64 * MiB, float("inf")))
TARGET_BAND, TARGET_SIZE = 0.10, 0.30
OVERHEAD_SIZES = 64 * 2 ** 10  # a log's fitted overhead transfers only if it has calls below this
BASELINE = "fidelity-loso-baseline.json"
# the study as it stood before the per-cluster floors (the launch per GPU refitted per fold, a
# net plugin's per-call floor fitted by calibrate): the same harness on the model before them
BEFORE_FLOORS = "fidelity-before-floors.json"
HELD_OUT_MODULE = Path(__file__).resolve().parent.parent / "synth" / "model" / "heldout.py"


@dataclass(frozen=True)
class Source:
    """Which logs are one source (a part of the file name), what it is, and the built-in topology
    that best matches its hardware (with the node count the log needs, when the file has fewer)."""

    key: str
    name: str
    topology: str
    what: str
    nodes: int | None = None
    fitted: str = ""  # what of the uncalibrated prediction was chosen with this source's logs in view


A3_HIGH_FIT = ("uncalibrated: the gcp-a3-high-2x8 topology was written with this source's two A3 High logs in view "
               "(its figures carry documented sources, but its choices were checked against these logs)")
LAUNCH_FIT = ("uncalibrated: the default launch per GPU (synth/model/nccl/launch.py, 5.6 us) is the median of "
              "three -g N sources, this one among them")
# The first matching key wins. Issue 309's thread is one source: its logs share a thread, a
# software stack (NCCL 2.26.2) and, for most, a cluster.
SOURCES = (
    Source("a100-1x8-thanos", "thanos blog", "dgx-a100", "one node of 8 A100 SXM4 80GB, NVSwitch, nccl-tests -g 8",
           fitted=LAUNCH_FIT),
    Source("a100-oci", "OCI tutorial", "dgx-a100-x4",
           "2 OCI BM.GPU4.8 (8 A100 40GB), RoCEv2 16 x 100 Gb/s; built-in: DGX A100 on 8 x 200 Gb/s"),
    Source("h100-1x8-nvls", "H100 how-to", "dgx-h100", "one node of 8 H100 SXM5, NVSwitch (NVLS), -g 8"),
    Source("dgx0607", "dgx-06/07", "dgx-h100-x2", "two DGX H100, one process per node driving 2/4/8 GPUs",
           fitted=LAUNCH_FIT),
    Source("clustertoolkit", "cluster-toolkit#3644", "gcp-a3-high-2x8", "2 GCP A3 High (GPUDirect-TCPX), all-gather",
           fitted=A3_HIGH_FIT),
    Source("dstack", "dstack#2587", "gcp-a3-high-2x8", "2 GCP A3 High (GPUDirect-TCPX), all-gather",
           fitted=A3_HIGH_FIT),
    Source("a3mega", "a3-mega repo", "gcp-a3-mega-2x8", "2 GCP A3 Mega (GPUDirect-TCPXO)"),
    Source("nt309", "nccl-tests#309", "hgx-h100-ib-4x8", "HGX H100, 8 x 400 Gb/s InfiniBand per node", 8),
    Source("rtx5090", "nccl-eBPF report", "rtx5090-loopback", "one RTX 5090 shared by 2 ranks over loopback TCP"),
    Source("v100-1x8", "V100 blog", "gcp-n1-v100-4x8", "one machine of 8 V100 SXM2 (hybrid cube mesh), -g 8",
           fitted=LAUNCH_FIT),
)


@dataclass(frozen=True)
class Log:
    path: Path
    source: Source
    measurements: tuple[Measurement, ...]
    base: Topology

    @property
    def name(self) -> str:
        return self.path.name


def source_of(path: Path) -> Source | None:
    return next((s for s in SOURCES if s.key in path.name), None)


_EXCERPT_RANKS = re.compile(r"(\d+) ranks")


def read_log(path: Path) -> list[Measurement]:
    """The log's measurements; an excerpt without nccl-tests' header (the first rows of a table
    a web page kept) is read here from its rows and its first line's rank count."""
    try:
        return read_measurements(str(path))[1]
    except Exception:  # noqa: BLE001 - an excerpt, read below, or a clear error
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
        ranks = _EXCERPT_RANKS.search(text[0]) if text else None
        nodes = re.search(r"(\d+) nodes x (\d+)", text[0]) or re.search(r"-(\d+)x(\d+)-", path.name)
        if ranks is None or nodes is None:
            raise
        hosts, per_host = int(nodes.group(1)), int(nodes.group(2))
        collective = "AllGather" if "all_gather" in path.name else "AllReduce"
        result = []
        for number, line in enumerate(text, 1):
            cells = line.split()
            if len(cells) >= 6 and not line.lstrip().startswith("#") and cells[0].isdigit():
                result.append(Measurement(collective, int(cells[0]), float(cells[5]) * 1e-6,
                                          Span(None, hosts, per_host, hosts), str(path), number, "nccl",
                                          RunInfo(gpus_per_process=1)))
        return result


def with_nodes(topology: Topology, nodes: int | None) -> Topology:
    """The topology with at least `nodes` units on its network level (a cluster of the same servers)."""
    if nodes is None:
        return topology
    view = nccl_view(topology)
    if view.node_level is None or topology.levels[view.node_level].size >= nodes:
        return topology
    levels = list(topology.levels)
    levels[view.node_level] = replace(levels[view.node_level], size=nodes)
    return replace(topology, levels=tuple(levels))


_ENV = re.compile(r"NCCL_(ALGO|PROTO|MIN_CTAS|MAX_CTAS)=([A-Za-z0-9,]+)")
_QPS = re.compile(r"NCCL_IB_QPS_PER_CONNECTION=(\d+)")


def with_environment(topology: Topology, path: Path) -> Topology:
    """The topology with the NCCL_ALGO / NCCL_PROTO (NCCL's choice is then restricted as the
    run's was), NCCL_MIN_CTAS / NCCL_MAX_CTAS (its channels) and NCCL_IB_QPS_PER_CONNECTION (queue
    pairs per connection: synth/model/nccl/fabric_share.py) a log's command line sets."""
    text = path.read_text(encoding="utf-8", errors="replace")
    found = dict(_ENV.findall(text))
    if not (found or _QPS.search(text)) or topology.nccl is None:
        return topology
    names = {"ring": "ring", "tree": "tree", "nvls": "nvls", "nvlstree": "nvls_tree", "pat": "pat",
             "ll": "LL", "ll128": "LL128", "simple": "Simple"}
    nccl = topology.nccl
    if "ALGO" in found:
        nccl = replace(nccl, algorithms=tuple(names[a.lower()] for a in found["ALGO"].split(",")))
    if "PROTO" in found:
        nccl = replace(nccl, protocols=tuple(names[p.lower()] for p in found["PROTO"].split(",")))
    for key in ("MIN_CTAS", "MAX_CTAS"):
        if key in found:
            nccl = replace(nccl, **{key.lower(): int(found[key])})
    qps = _QPS.search(text)
    if qps:
        nccl = replace(nccl, ib_qps=int(qps.group(1)))
    return replace(topology, nccl=nccl)


def load_logs(log_dir: Path) -> tuple[list[Log], list[str]]:
    logs, unknown = [], []
    for path in sorted(p for p in log_dir.iterdir() if p.is_file()):
        source = source_of(path)
        if source is None:
            unknown.append(path.name)
            continue
        measurements = tuple(read_log(path))
        base = with_environment(with_nodes(load_topology(source.topology), source.nodes), path)
        base = with_launch(base, *launch_of(list(measurements)))  # as the run was launched (nccl-tests -g N)
        logs.append(Log(path, source, measurements, base))
    return logs, unknown


def predict(topology: Topology, measurements) -> list[float]:
    view = nccl_view(topology)
    times = []
    for m in measurements:
        _, ranks = group_devices(m, topology)
        times.append(estimate_group(topology, ranks, m.collective, m.bytes, view).time_s)
    return times


def busbw(measurement: Measurement, seconds: float) -> float:
    return measurement.bytes / seconds * bus_factor(measurement.collective, measurement.span.size) / 1e9


def error(predicted_s: float, measured_s: float) -> float:
    """predicted busbw / measured busbw - 1 (positive: the model is too fast)."""
    return measured_s / predicted_s - 1


# --- moving fitted figures from one log to another ------------------------------------------------


def log_class(log: Log) -> str:
    """What a log's figures transfer to: one node, or across nodes by NCCL transport."""
    view = nccl_view(log.base)
    _, ranks = group_devices(log.measurements[0], log.base)
    nodes, _, _ = group_layout(log.base, view, ranks)
    if nodes == 1:
        return "one node"
    network = view.hardware.network
    return f"across nodes, {network.transport if network is not None else 'ib'}"


def fitted_figures(log: Log) -> dict[str, float]:
    """What `synth calibrate` fits on the log, as factors over its base topology: overhead (s),
    protocol rate and latency factors, stages per network hop, efficiencies over the base's."""
    fit = calibrate_nccl(list(log.measurements), log.base)
    view = nccl_view(log.base)
    figures: dict[str, float] = {}
    smallest = min(m.bytes for m in log.measurements)
    for level in fit.fits:
        # a per-call overhead is only determined by calls whose latency shows (a log that starts
        # at 256 MiB fits one to its bandwidth's residue): moved only from logs with small calls
        if level.overhead_s is not None and smallest < OVERHEAD_SIZES:
            figures["overhead_s"] = level.overhead_s
        if level.stages is not None:
            figures["stages"] = level.stages
        for protocol, bandwidth, latency in level.protocols:
            if bandwidth is not None:
                figures[f"{protocol} rate"] = bandwidth
            if latency is not None:
                figures[f"{protocol} latency"] = latency
        for name, value in level.efficiencies:
            index = log.base.level_index(name)
            if view.node_level is not None and index == view.node_level:
                figures["net efficiency"] = value / view.hardware.network.link.efficiency
            else:
                figures["intra efficiency"] = value / view.hardware.intra.efficiency
    # the per-cluster floors synth calibrate fits (nccl_fit._floor_params): the host's launch per
    # GPU of a run driving several GPUs per thread, a net plugin's per-call floor
    system = fit.topology.nccl
    if system is not None and system.launch_per_gpu is not None and log.base.nccl.gpus_per_thread > 1 \
            and smallest < OVERHEAD_SIZES:
        figures["launch_per_gpu"] = system.launch_per_gpu.value
    if view.node_level is not None:
        transport = fit.topology.levels[view.node_level].transport
        if transport is not None and transport.floor is not None:
            figures["floor_s"] = transport.floor.value
    return figures


def transfer(log: Log, figures: dict[str, float]) -> Topology:
    """The log's base topology with figures fitted elsewhere in place."""
    base = log.base
    view = nccl_view(base)
    _, ranks = group_devices(log.measurements[0], base)
    _, _, outer = group_layout(base, view, ranks)
    outer = max(outer, 0)
    said = "leave-one-source-out: the median of what synth calibrate fitted on the other sources' logs"
    levels = list(base.levels)
    target = levels[outer]
    if "overhead_s" in figures:
        overhead = figures["overhead_s"] + (target.overhead.value if target.overhead is not None else 0.0)
        target = replace(target, overhead=Figure(overhead, said) if overhead >= 1e-9 else None)
    if "stages" in figures and target.transport is not None and view.node_level == outer:
        target = replace(target, transport=replace(target.transport, stages=Figure(figures["stages"], said)))
    factors = dict(target.protocols)
    for protocol in ("LL", "LL128", "Simple"):
        old = factors.get(protocol, ProtocolFactors())
        bandwidth, latency = old.bandwidth, old.latency
        if f"{protocol} rate" in figures:
            bandwidth = Figure((bandwidth.value if bandwidth else 1.0) * figures[f"{protocol} rate"], said)
        if f"{protocol} latency" in figures:
            latency = Figure((latency.value if latency else 1.0) * figures[f"{protocol} latency"], said)
        if bandwidth is not None or latency is not None:
            factors[protocol] = ProtocolFactors(bandwidth, latency)
    target = replace(target, protocols=tuple(factors.items()))
    if "floor_s" in figures and target.transport is not None and view.node_level == outer:
        target = replace(target, transport=replace(target.transport, floor=Figure(figures["floor_s"], said)))
    levels[outer] = target
    for key, index in (("net efficiency", view.node_level),
                       ("intra efficiency", _intra_level(base, view))):
        if key in figures and index is not None:
            current = view.hardware.network.link.efficiency if key == "net efficiency" else view.hardware.intra.efficiency
            levels[index] = replace(levels[index], efficiency=Figure(min(1.0, current * figures[key]), said))
    result = replace(base, levels=tuple(levels))
    if "launch_per_gpu" in figures and result.nccl is not None:
        result = replace(result, nccl=replace(result.nccl, launch_per_gpu=Figure(figures["launch_per_gpu"], said)))
    return result


def _intra_level(topology: Topology, view) -> int | None:
    inner = range((view.node_level + 1) if view.node_level is not None else 0, len(topology.levels))
    for i in inner:
        level = topology.levels[i]
        if level.bandwidth is not None and level.bandwidth.value == view.hardware.intra.bandwidth:
            return i
    return None


def pooled(held_out: Log, logs: list[Log], fits: dict[str, dict[str, float]]) -> tuple[dict[str, float], str]:
    """Per figure, the median over the other sources (each source the median of its logs) of the
    same class as the held-out log, or of every other source when none is of that class."""
    others = [log for log in logs if log.source != held_out.source]
    same = [log for log in others if log_class(log) == log_class(held_out)]
    chosen, scope = (same, f"other sources of its class ({log_class(held_out)})") if same else (others, "all other sources")
    by_source: dict[str, dict[str, list[float]]] = {}
    for log in chosen:
        for key, value in fits[log.name].items():
            by_source.setdefault(log.source.name, {}).setdefault(key, []).append(value)
    per_figure: dict[str, list[float]] = {}
    for figures in by_source.values():
        for key, values in figures.items():
            per_figure.setdefault(key, []).append(statistics.median(values))
    names = sorted(by_source)
    result = {key: statistics.median(values) for key, values in per_figure.items()
              if key not in HOST_FIGURES and key not in PLUGIN_FIGURES}
    # a net plugin's per-call floor is that plugin's on that machine (TCPX's receive path is not
    # TCPXO's): the median over the other sources on the same built-in topology, else none (the
    # transport kind's default)
    for key in PLUGIN_FIGURES:
        per_source = [statistics.median(values) for values in
                      _by_source([log for log in others if log.source.topology == held_out.source.topology],
                                 fits, key).values()]
        if per_source:
            result[key] = statistics.median(per_source)
    # a host figure (the launch per GPU) is the host's, whatever the network: the median over every
    # other source that fitted one, so no fold keeps the default read off its own log
    for key in HOST_FIGURES:
        per_source = [statistics.median(values) for values in
                      _by_source([log for log in others], fits, key).values()]
        if per_source:
            result[key] = statistics.median(per_source)
    return result, f"{scope}: {', '.join(names)}"


HOST_FIGURES = ("launch_per_gpu",)
PLUGIN_FIGURES = ("floor_s",)  # a net plugin's, on one machine type: moved between sources of one topology only
SECONDS = ("overhead_s", "floor_s", "launch_per_gpu")  # figures in seconds (the rest are factors or stages)


def _by_source(logs: list[Log], fits: dict[str, dict[str, float]], key: str) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for log in logs:
        if key in fits[log.name]:
            found.setdefault(log.source.name, []).append(fits[log.name][key])
    return found


# --- the study -----------------------------------------------------------------------------------


def study(log_dir: Path) -> dict:
    logs, unknown = load_logs(log_dir)
    fits = {log.name: fitted_figures(log) for log in logs}
    entries = []
    for log in logs:
        measurements = list(log.measurements)
        uncalibrated = predict(log.base, measurements)
        figures, scope = pooled(log, logs, fits)
        loso = predict(transfer(log, figures), measurements)
        rows = [{"bytes": m.bytes, "measured_s": m.time_s, "measured_busbw": busbw(m, m.time_s),
                 "a_s": a, "loso_s": b} for m, a, b in zip(measurements, uncalibrated, loso)]
        entries.append({"file": log.name, "source": log.source.name, "topology": log.base.name,
                        "hardware": log.source.what, "group": measurements[0].span.describe(),
                        "collective": measurements[0].collective, "class": log_class(log),
                        "launch": f"{measurements[0].run.gpus_per_process if measurements[0].run else 1} GPU(s) per "
                                  f"process",
                        "fitted_here": fits[log.name], "loso_figures": figures, "loso_from": scope,
                        "fit_in_view": log.source.fitted, "rows": rows})
    ablation = proxy_ablation(logs, predict, BANDS, error)
    return {"logs": entries, "unknown": unknown, "proxy_ablation": ablation}


def band_errors(rows: list[dict], key: str, low: float, high: float) -> list[float]:
    return [abs(error(r[key], r["measured_s"])) for r in rows if low <= r["bytes"] < high]


def summary(result: dict) -> dict:
    """Per log and overall: median |error| per band, and sizes from 1 MiB within 30%."""
    out = {"logs": {}, "all": {}}
    pooled_errors = {key: {band: [] for band, _, _ in BANDS} for key in ("a_s", "loso_s")}
    for entry in result["logs"]:
        per = {}
        for key in ("a_s", "loso_s"):
            cells = {}
            for band, low, high in BANDS:
                errors = band_errors(entry["rows"], key, low, high)
                pooled_errors[key][band] += errors
                cells[band] = statistics.median(errors) if errors else None
            from_mib = band_errors(entry["rows"], key, MiB, float("inf"))
            cells["from 1 MiB within 30%"] = (sum(e <= TARGET_SIZE for e in from_mib), len(from_mib))
            cells["worst from 1 MiB"] = max(from_mib) if from_mib else None
            per[key] = cells
        out["logs"][entry["file"]] = per
    for key, bands in pooled_errors.items():
        out["all"][key] = {band: (statistics.median(errors) if errors else None) for band, errors in bands.items()}
    return out


def held_out_table(result: dict) -> dict:
    """Per (class, band), the median and worst |error| over every (log, size), uncalibrated and
    leave-one-source-out, with the logs and sizes counted (synth/model/heldout.py's table)."""
    cells: dict[str, dict[str, list]] = {}
    for entry in result["logs"]:
        for band, low, high in BANDS:
            for key, kind in (("a_s", "uncalibrated"), ("loso_s", "calibrated")):
                errors = band_errors(entry["rows"], key, low, high)
                if errors:
                    cell = cells.setdefault(f"{entry['class']} | {band}", {}).setdefault(kind, [[], set()])
                    cell[0].extend(errors)
                    cell[1].add(entry["file"])
    return {key: {kind: (round(float(statistics.median(errors)), 4), round(float(max(errors)), 4), len(files), len(errors))
                  for kind, (errors, files) in kinds.items()} for key, kinds in sorted(cells.items())}


def write_held_out(table: dict, path: Path) -> None:
    """Rewrite the generated table of synth/model/heldout.py."""
    text = path.read_text(encoding="utf-8")
    begin = text.index("# BEGIN GENERATED")
    begin = text.index("\n", begin) + 1
    end = text.index("# END GENERATED")
    body = "HELD_OUT: dict = {\n" + "".join(f"    {key!r}: {value!r},\n" for key, value in table.items()) + "}\n"
    path.write_text(text[:begin] + body + text[end:], encoding="utf-8")


def _pct(value) -> str:
    return "-" if value is None else f"{value:.1%}"


def _mark(value) -> str:
    return "-" if value is None else (f"{value:.1%}" if value <= TARGET_BAND else f"**{value:.1%}**")


TARGET_MEDIAN = 0.10  # the target: <= 10% median |error| in every band
# What each band over the target still lacks, as far as the per-log and per-size tables show it
# (each a mechanism the model does not have, with the logs that show it; none is fitted here).
MISSING_MECHANISMS = {
    "< 1 MiB": "the host's launch time per GPU differs by machine (4.9-6.1 us fitted on the three `-g N` sources; "
               "a fold refits it on the other sources, so each such log's small calls sit 5-16% off); a net plugin's "
               "per-call cost (A3 Mega's TCPXO calls take some 22-31 us more than NCCL's tables say: the A3 High logs "
               "that would transfer it start at 1 MiB).",
    "1-64 MiB": "the one-node LL128/Simple ramp (an A100 node runs LL128 at 0.55-0.66 of the modelled rate, a V100 "
                "node has a 60 us intercept; no ceiling in NCCL's tables binds there); a net plugin's own per-step "
                "cost and tuner (TCPX's fixed 0.6-1.1 ms implies 5-9 us per proxy operation against NCCL's 3; TCPXO "
                "runs mid sizes at an eighth of its large-size rate); when the scheduler stalls a `-g N` process that "
                "mpirun binds to one core (dgx-06/07: the model shares the core's 2 hardware threads among its "
                "proxy threads, synth/model/nccl/proxy.py cpu_share, but calls of up to 2 ms at 32 KiB-64 MiB "
                "wait for the scheduler, which only bounds them, a slice, in an interval); two ranks time-slicing one GPU (the RTX 5090 socket run: some 1.85 ms per chunk "
                "loop). None has a documented figure to build it from.",
    ">= 64 MiB": "at 4-8 H100 nodes one cluster runs 9-14% below the modelled rate (issue 309, gj-aion's) and another "
                 "at it (qoofyk's VMs): the fabric's share of the NICs' rate on calls over more than two hosts "
                 "(synth/model/nccl/fabric_share.py; routing entropy, NCCL_IB_QPS_PER_CONNECTION), a per-cluster "
                 "figure whose default loses nothing; `synth calibrate` fits it on a run over more than two hosts, and "
                 "this study moves no cluster's share onto another; the plugin and socket transports' large-message "
                 "rates.",
}


def render(result: dict, command: str, baseline: dict | None, floors_before: dict | None = None) -> str:
    s = summary(result)
    before = summary(baseline) if baseline else None
    lines = ["# The NCCL model against published nccl-tests runs, held out", "", header(command)]
    if hasattr(os, "getloadavg"):
        load = os.getloadavg()
        lines.append(f"Load average while it ran (1/5/15 min): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
                     f"(figures are model outputs; the load changes only how long this took)\n")
    lines += [
        "Every log of the folder, grouped into sources (one thread, one poster's cluster, one blog post). Error = "
        "predicted busbw / measured busbw - 1 (positive: the model is too fast); cells are the median |error| over "
        "the log's sizes in the band. **Uncalibrated**: the best-matching built-in topology alone. **LOSO**: "
        "calibrated leave one source out: `synth calibrate` fitted on every log of every other source, its figures "
        "(per-call overhead, per-protocol rate and latency factors, pipeline stages, efficiencies over the base's) "
        "moved onto this log's built-in topology as the median over the other sources of "
        "the same class (else of all others), a net plugin's per-call floor as the median over the other sources on "
        "the same built-in topology (one plugin on one machine type; else none), and the host's launch time per GPU "
        "as the median over every other source that fitted one. No figure fitted on a source reaches its own prediction (what the uncalibrated "
        "column took from a log is listed under \"Fit, not held out\"). Targets: <= 10% median in every "
        "band, <= 30% at every size from 1 MiB on. **Bold**: a band median over 10%.", "",
        "## Summary (all logs pooled: median |error| over every (log, size) of the band)", "",
        "| | " + " | ".join(band for band, _, _ in BANDS) + " |", "|---|" + "---:|" * len(BANDS)]
    for key, label in (("a_s", "uncalibrated"), ("loso_s", "calibrated, leave one source out")):
        cells = [_mark(s["all"][key][band]) for band, _, _ in BANDS]
        if before:
            cells = [f"{_pct(before['all'][key][band])} -> {c}" for c, (band, _, _) in zip(cells, BANDS)]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if before:
        lines += ["", f"Before -> after: the baseline is [{BASELINE}]({BASELINE}), this study (the same harness) "
                      f"run on the model before issue 16's changes."]
    if floors_before:
        earlier = summary(floors_before)
        lines += ["", f"Before -> after the per-cluster floors ([{BEFORE_FLOORS}]({BEFORE_FLOORS}), the same harness before "
                      "them; the uncalibrated column does not move, since their defaults are the model's; the LOSO row "
                      "moves because every fold now refits the launch per GPU on the other sources instead of keeping a "
                      "default read off three of these logs, and fits a net plugin's per-call floor):", "",
                  "| | " + " | ".join(band for band, _, _ in BANDS) + " |", "|---|" + "---:|" * len(BANDS)]
        for key, label in (("a_s", "uncalibrated"), ("loso_s", "calibrated, leave one source out")):
            lines.append(f"| {label} | " + " | ".join(f"{_pct(earlier['all'][key][band])} -> {_pct(s['all'][key][band])}"
                                                    for band, _, _ in BANDS) + " |")
    missed = [band for band, _, _ in BANDS
              if any(s["all"][key][band] is not None and s["all"][key][band] > TARGET_MEDIAN for key in ("a_s", "loso_s"))]
    if missed:
        lines += ["", "## Bands over the target, and the mechanisms the model still lacks there", ""]
        lines += [f"* **{band}**: {MISSING_MECHANISMS.get(band, 'not analysed')}" for band in missed]
    in_view = [entry for entry in result["logs"] if entry.get("fit_in_view")]
    if in_view:
        lines += ["", "## Fit, not held out", "",
                  "Every LOSO fold refits what is fitted from data (overhead, protocol factors, stages, efficiencies, the "
                  "launch per GPU and a plugin's per-call floor) on the other sources only. What the uncalibrated "
                  "column of these logs took from the logs themselves:", ""]
        lines += [f"* **{entry['file']}**: {entry['fit_in_view']}" for entry in in_view]
    if result.get("proxy_ablation"):
        lines += ["", "## The proxy floor, one mechanism at a time", "",
                  "Uncalibrated, all logs pooled (median |error| per band), with the floor the proxy thread sets "
                  "(synth/model/nccl/proxy.py) priced each way; below each, the logs whose band median moves against "
                  "the model's floor.", "",
                  "| proxy floor | " + " | ".join(band for band, _, _ in BANDS) + " |", "|---|" + "---:|" * len(BANDS)]
        for row in result["proxy_ablation"]:
            lines.append(f"| {row['variant']} | " + " | ".join(_pct(row["pooled"][band]) for band, _, _ in BANDS) + " |")
        lines.append("")
        for row in result["proxy_ablation"][1:]:
            lines.append(f"* {row['variant']}: {'; '.join(row['moved']) or 'no log moves'}")
    lines += ["", "## Per class of transport (what `synth rank` states as how sure)", "",
              "| class | band | uncalibrated median (worst) | LOSO median (worst) | logs |", "|---|---|---:|---:|---:|"]
    for key, kinds in held_out_table(result).items():
        klass, band = key.split(" | ")
        a, b = kinds.get("uncalibrated"), kinds.get("calibrated")
        lines.append(f"| {klass} | {band} | {_pct(a[0])} ({_pct(a[1])}) | {_pct(b[0])} ({_pct(b[1])}) | {a[2]} |")
    lines += ["", "## Per log", "",
              "| log | source | group | topology | uncal. " + " | uncal. ".join(b for b, _, _ in BANDS) +
              " | uncal. from 1 MiB within 30% (worst) | LOSO " + " | LOSO ".join(b for b, _, _ in BANDS) +
              " | LOSO from 1 MiB within 30% (worst) |", "|---|---|---|---|" + "---:|" * 8]
    for entry in result["logs"]:
        per = s["logs"][entry["file"]]
        cells = []
        for key in ("a_s", "loso_s"):
            cells += [_mark(per[key][band]) for band, _, _ in BANDS]
            ok, total = per[key]["from 1 MiB within 30%"]
            cells.append("-" if not total else f"{ok}/{total} ({_pct(per[key]['worst from 1 MiB'])})")
            if before and entry["file"] in before["logs"]:
                old = before["logs"][entry["file"]][key]
                for i, (band, _, _) in enumerate(BANDS):
                    index = len(cells) - 4 + i
                    cells[index] = f"{_pct(old[band])} -> {cells[index]}"
        lines.append(f"| {entry['file']} | {entry['source']} | {entry['group']} | {entry['topology']} | "
                     + " | ".join(cells) + " |")
    lines += ["", "## What LOSO moved onto each log", ""]
    for entry in result["logs"]:
        figures = ", ".join(f"{k} {v * 1e6:.1f} us" if k in SECONDS else f"{k} x{v:.2f}" if k != "stages"
                            else f"{v:.2f} stages per hop" for k, v in sorted(entry["loso_figures"].items()))
        lines.append(f"* **{entry['file']}** ({entry['class']}, {entry['launch']}): from {entry['loso_from']}: "
                     f"{figures or 'nothing'}")
    lines += ["", "## Per size", ""]
    for entry in result["logs"]:
        lines += [f"### {entry['file']}", "", f"{entry['hardware']}; {entry['collective']} over {entry['group']}; "
                  f"built-in topology `{entry['topology']}`.", "",
                  "| size | measured busbw GB/s | uncalibrated GB/s | error | LOSO GB/s | error |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for row in entry["rows"]:
            factor = row["measured_busbw"] * row["measured_s"]
            lines.append(f"| {format_bytes(row['bytes'])} | {row['measured_busbw']:.2f} | {factor / row['a_s']:.2f} | "
                         f"{error(row['a_s'], row['measured_s']):+.1%} | {factor / row['loso_s']:.2f} | "
                         f"{error(row['loso_s'], row['measured_s']):+.1%} |")
        lines.append("")
    if result["unknown"]:
        lines += [f"Logs of no known source (not counted): {', '.join(result['unknown'])}", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = log_folder_parser("fidelity", __doc__.split("\n\n")[0], "fidelity")
    parser.add_argument("--write-model", action="store_true",
                        help="also rewrite the held-out error table the rankings state (synth/model/heldout.py)")
    args = parser.parse_args(argv)
    log_dir = log_folder(args.logs, "fidelity")
    if log_dir is None:
        return 2
    result = study(log_dir)
    command = " ".join(["python -m benchmarks.fidelity", *(sys.argv[1:] if argv is None else argv)])
    out = study_dir("fidelity", args.output)
    baseline_path = out / BASELINE
    baseline = json.loads(baseline_path.read_text(encoding="utf-8")) if baseline_path.is_file() else None
    floors_path = out / BEFORE_FLOORS
    floors_before = json.loads(floors_path.read_text(encoding="utf-8")) if floors_path.is_file() else None
    (out / REPORT).write_text(render(result, command, baseline, floors_before), encoding="utf-8")
    (out / "fidelity.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if args.write_model:
        write_held_out(held_out_table(result), HELD_OUT_MODULE)
        print(f"wrote the held-out table of {HELD_OUT_MODULE}")
    print(f"wrote {out / REPORT} and {out / 'fidelity.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
