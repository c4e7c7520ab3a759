"""Calibration of the NCCL model (synth/model/nccl.py) on measured calls.

One least-squares line through all sizes cannot describe NCCL: small calls run LL or LL128
with their own latency, large ones Simple at the links' rate, and NVLS and tree pipelines
take a while to fill in between. So the figures are fitted where each one shows, under the
model's own choice of algorithm and protocol at every size:

* bandwidth-bound sizes (the transfer is most of the modelled time) fit the efficiency of the
  resource that binds them (a GPU's intra-node links, or a node's NICs): the line rate stays,
  the fraction NCCL reaches on it is what is fitted;
* latency-bound sizes fit a per-call overhead the model's NCCL latency does not have (a
  launcher driving several GPUs from one thread, a net plugin's latency, a shared GPU);
* for groups across nodes whose algorithm pipelines (NVLS trees, or trees once a network hop
  shows a fill), the sizes in between fit the store-and-forward stages per network hop.

Each step minimises the squared relative error of its own points, and the three repeat a few
times (each changes which points are bound by what). Levels are fitted innermost first, so a
group across nodes is costed with the node's fitted figures, as the model will cost it. After
the fit every size's error is kept (`SizeError`), and a fit whose errors are large says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from synth.calibrate.groups import devices as group_devices
from synth.calibrate.measurements import Measurement
from synth.errors import UsageError
from synth.model import nccl
from synth.model.nccl_hardware import NcclView, estimate_group, group_layout, nccl_view
from synth.topology import CalibrationRecord, Figure, Topology
from synth.units import format_bytes

ROUNDS = 4
SHARE = 0.6  # a point is bound by what takes at least this share of its modelled time
MAX_STAGES = 64.0
POOR_RMS = 0.05  # a fit with a larger relative RMS error, or
POOR_WORST = 0.15  # a larger worst error, is flagged as poor


@dataclass(frozen=True)
class SizeError:
    """One measured size against the calibrated model."""

    nbytes: int
    measured_s: float
    predicted_s: float
    algorithm: str
    protocol: str
    regime: str  # "latency", "pipeline" or "bandwidth": what dominates the modelled time

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1


@dataclass(frozen=True)
class GroupFit:
    """One measured group (a file's run) after the fit of its level."""

    file: str
    collective: str
    group: str
    nodes: int
    ranks_per_node: int
    errors: tuple[SizeError, ...]

    @property
    def rms(self) -> float:
        return math.sqrt(float(np.mean([e.error ** 2 for e in self.errors])))

    @property
    def worst(self) -> float:
        return max(abs(e.error) for e in self.errors)

    @property
    def poor(self) -> bool:
        return self.rms > POOR_RMS or self.worst > POOR_WORST


@dataclass(frozen=True)
class LevelFit:
    """What was fitted for the groups whose outermost spanned level is `level`."""

    level: str
    efficiencies: tuple[tuple[str, float], ...]  # (level name, fitted efficiency)
    overhead_s: float | None
    stages: float | None
    groups: tuple[GroupFit, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class NcclCalibration:
    topology: Topology
    fits: tuple[LevelFit, ...]
    assumptions: tuple[str, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class _Point:
    measurement: Measurement
    devices: tuple[int, ...]


def calibrate_nccl(measurements: list[Measurement], base: Topology, assumptions: tuple[str, ...] = ()
                   ) -> NcclCalibration:
    """Fit the NCCL figures of `base` to the measurements (see the module docstring)."""
    if not measurements:
        raise UsageError("no measurements to calibrate from")
    view = nccl_view(base)
    by_level: dict[int, list[_Point]] = {}
    for measurement in measurements:
        _, ranks = group_devices(measurement, base)
        _, _, outer = group_layout(base, view, ranks)
        by_level.setdefault(outer, []).append(_Point(measurement, tuple(ranks)))
    topology = base
    fits, fitted_levels = [], set()
    for level in sorted(by_level, reverse=True):  # innermost first
        topology, fit = _fit_level(topology, level, by_level[level], frozenset(fitted_levels))
        fitted_levels |= {topology.level_index(name) for name, _ in fit.efficiencies}
        fits.append(fit)
    records = tuple(CalibrationRecord(g.collective, fit.level, g.nodes, g.ranks_per_node,
                                      min(e.nbytes for e in g.errors), max(e.nbytes for e in g.errors),
                                      len(g.errors), g.rms, g.worst, g.file.replace("\\", "/").rsplit("/", 1)[-1])
                    for fit in fits for g in fit.groups)
    files = sorted({m.file.replace("\\", "/").rsplit("/", 1)[-1] for m in measurements})
    name = base.name if base.name.endswith("-calibrated") else f"{base.name}-calibrated"
    description = " ".join(filter(None, [base.description, f"NCCL figures fitted by synth calibrate from "
                                                           f"{', '.join(files)}."]))
    kept = tuple(r for r in base.calibration if (r.file, r.collective, r.nodes, r.ranks_per_node) not in
                 {(n.file, n.collective, n.nodes, n.ranks_per_node) for n in records})
    topology = replace(topology, name=name, description=description, calibration=kept + records, source_path=None)
    assumed = tuple(assumptions) + nccl_view(base).assumptions
    return NcclCalibration(topology, tuple(fits), assumed, ())


# --- one level ----------------------------------------------------------------------------------


@dataclass
class _Params:
    efficiency: dict[int, float]  # level index -> efficiency
    overhead: float
    stages: float | None


def _with(topology: Topology, level: int, params: _Params, source: str) -> Topology:
    levels = list(topology.levels)
    for index, value in params.efficiency.items():
        levels[index] = replace(levels[index], efficiency=Figure(value, source))
    target = levels[level]
    levels[level] = replace(target, overhead=Figure(params.overhead, source))
    if params.stages is not None and target.transport is not None:
        levels[level] = replace(levels[level], transport=replace(target.transport, stages=Figure(params.stages, source)))
    return replace(topology, levels=tuple(levels))


def _evaluate(topology: Topology, points: list[_Point]) -> list[nccl.Estimate]:
    """The model's estimate for every point; repeated sizes (nccl-tests -N cycles, several
    files of one group) are estimated once."""
    view = nccl_view(topology)
    cache: dict[tuple, nccl.Estimate] = {}
    result = []
    for p in points:
        key = (p.devices, p.measurement.collective, p.measurement.bytes)
        if key not in cache:
            cache[key] = estimate_group(topology, p.devices, p.measurement.collective, p.measurement.bytes, view)
        result.append(cache[key])
    return result


def _binding_level(topology: Topology, view: NcclView, estimate: nccl.Estimate) -> int | None:
    """The topology level whose efficiency scales the transfer of this estimate."""
    if estimate.bottleneck == "net":
        return view.node_level
    if estimate.bottleneck == "intra":
        inner = range((view.node_level + 1) if view.node_level is not None else 0, len(topology.levels))
        candidates = [i for i in inner if topology.levels[i].bandwidth is not None]
        if not candidates:
            return None
        intra = view.hardware.intra
        for i in candidates:  # the level the model's intra link came from
            level = topology.levels[i]
            if level.bandwidth.value == intra.bandwidth:
                return i
        return candidates[-1]
    return None


def _initial(topology: Topology, level: int) -> _Params:
    target = topology.levels[level]
    stages = target.transport.stages.value if (target.transport is not None and target.transport.stages) else None
    return _Params({}, target.overhead.value if target.overhead is not None else 0.0, stages)


def _fit_level(topology: Topology, level: int, points: list[_Point], frozen: frozenset[int]
               ) -> tuple[Topology, LevelFit]:
    level = max(level, 0)
    name = topology.levels[level].name
    files = sorted({p.measurement.file.replace("\\", "/").rsplit("/", 1)[-1] for p in points})
    source = (f"fitted by synth calibrate (NCCL model) from {', '.join(files)}: {len(points)} points, "
              f"{format_bytes(min(p.measurement.bytes for p in points))} to "
              f"{format_bytes(max(p.measurement.bytes for p in points))}")
    params = _initial(topology, level)
    times = np.array([p.measurement.time_s for p in points])
    notes: list[str] = []
    view = nccl_view(topology)
    network_level = view.node_level is not None and level <= view.node_level
    fits_stages = network_level and any(_layout(topology, view, p)[0] > 1 for p in points)
    if fits_stages:  # only where a pipelined algorithm runs Simple across nodes is there a fill to fit
        probe = _evaluate(_with(topology, level, replace_params(params, stages=1.0), source), points)
        fits_stages = any(e.fill_s > 0 for e in probe)
    for _ in range(ROUNDS):
        current = _with(topology, level, params, source)
        estimates = _evaluate(current, points)
        params = _fit_bandwidth(current, params, points, estimates, times, notes, frozen)
        estimates = _evaluate(_with(topology, level, params, source), points)
        params = _fit_overhead(params, estimates, times)
        if fits_stages:
            params = _fit_stages(topology, level, params, source, points, times)
    fitted = _with(topology, level, params, source)
    estimates = _evaluate(fitted, points)
    if not any(e.transfer_s >= SHARE * e.time_s for e in estimates):
        notes.append("no bandwidth-bound size: the efficiencies are kept")
    if not any(e.latency_s >= SHARE * e.time_s for e in estimates):
        notes.append("no latency-bound size: the overhead rests on the larger sizes")
    if len({p.measurement.bytes for p in points}) == 1:
        notes.append("one size only: one figure of the three is determined")
    groups = _group_fits(fitted, points, estimates, view)
    for group in groups:
        if group.poor:
            notes.append(f"poor fit for {group.file} ({group.group}): relative RMS {group.rms:.1%}, worst "
                         f"{group.worst:.1%}; the model misses what this run shows (see the per-size errors)")
    fit = LevelFit(name, tuple((fitted.levels[i].name, v) for i, v in sorted(params.efficiency.items())),
                   params.overhead, params.stages if fits_stages else None, groups, tuple(dict.fromkeys(notes)))
    return fitted, fit


def _layout(topology: Topology, view: NcclView, point: _Point) -> tuple[int, int, int]:
    return group_layout(topology, view, point.devices)


def _fit_bandwidth(topology: Topology, params: _Params, points: list[_Point], estimates: list[nccl.Estimate],
                   times: np.ndarray, notes: list[str], frozen: frozenset[int]) -> _Params:
    """Per binding level, the efficiency that best fits its bandwidth-bound points: the
    transfer time scales as 1 / efficiency, so t ~ c + b * x with x = old / new efficiency."""
    view = nccl_view(topology)
    groups: dict[int, list[int]] = {}
    for i, estimate in enumerate(estimates):
        if estimate.transfer_s >= SHARE * estimate.time_s:
            binding = _binding_level(topology, view, estimate)
            if binding is not None and binding not in frozen:  # levels fitted by inner groups keep their figure
                groups.setdefault(binding, []).append(i)
    efficiency = dict(params.efficiency)
    for binding, indices in groups.items():
        t = times[indices]
        b = np.array([estimates[i].transfer_s for i in indices])
        c = np.array([estimates[i].time_s - estimates[i].transfer_s for i in indices])
        denominator = float(np.sum((b / t) ** 2))
        if denominator <= 0:
            continue
        x = float(np.sum(b * (t - c) / t ** 2)) / denominator
        if not x > 0:
            continue
        old = _efficiency_of(topology, view, binding)
        new = old / x
        if new > 1.0:
            notes.append(f"level {topology.levels[binding].name}: measured faster than its line rate allows under "
                         f"the model (efficiency {new:.3f}); kept at 1")
            new = 1.0
        efficiency[binding] = new
    return replace_params(params, efficiency=efficiency)


def _efficiency_of(topology: Topology, view: NcclView, index: int) -> float:
    if view.node_level is not None and index == view.node_level:
        return view.hardware.network.link.efficiency
    return view.hardware.intra.efficiency


def _fit_overhead(params: _Params, estimates: list[nccl.Estimate], times: np.ndarray) -> _Params:
    """The additive overhead that best fits the latency-bound points (relative errors)."""
    indices = [i for i, e in enumerate(estimates) if e.latency_s >= SHARE * e.time_s]
    if not indices:
        indices = [int(np.argmin(times))]  # the smallest size still says most about the overhead
    t = times[indices]
    m = np.array([estimates[i].time_s for i in indices])
    delta = float(np.sum((t - m) / t ** 2) / np.sum(1 / t ** 2))
    return replace_params(params, overhead=max(0.0, params.overhead + delta))


def _fit_stages(topology: Topology, level: int, params: _Params, source: str, points: list[_Point],
                times: np.ndarray) -> _Params:
    """The stages per network hop that minimise the squared relative error over all points
    (a golden-section search: the error is unimodal in the fill, which grows with the stages)."""
    def loss(stages: float) -> float:
        trial = _with(topology, level, replace_params(params, stages=stages), source)
        predicted = np.array([e.time_s for e in _evaluate(trial, points)])
        return float(np.sum(((predicted - times) / times) ** 2))

    low, high = 0.0, MAX_STAGES
    ratio = (math.sqrt(5) - 1) / 2
    a, b = high - ratio * (high - low), low + ratio * (high - low)
    fa, fb = loss(a), loss(b)
    for _ in range(18):
        if fa < fb:
            high, b, fb = b, a, fa
            a = high - ratio * (high - low)
            fa = loss(a)
        else:
            low, a, fa = a, b, fb
            b = low + ratio * (high - low)
            fb = loss(b)
    best = (low + high) / 2
    if loss(0.0) <= loss(best):
        best = 0.0
    return replace_params(params, stages=round(best, 3))


def replace_params(params: _Params, **changes) -> _Params:
    values = {"efficiency": params.efficiency, "overhead": params.overhead, "stages": params.stages}
    values.update(changes)
    return _Params(**values)


def _group_fits(topology: Topology, points: list[_Point], estimates: list[nccl.Estimate], view: NcclView
                ) -> tuple[GroupFit, ...]:
    groups: dict[tuple, list[int]] = {}
    for i, point in enumerate(points):
        m = point.measurement
        groups.setdefault((m.file, m.collective, m.span.describe(), point.devices), []).append(i)
    result = []
    for (file, collective, group, devices), indices in groups.items():
        nodes, per_node, _ = group_layout(topology, view, devices)
        errors = []
        for i in sorted(indices, key=lambda j: points[j].measurement.bytes):
            e = estimates[i]
            shares = {"latency": e.latency_s, "pipeline": e.fill_s, "bandwidth": e.transfer_s}
            errors.append(SizeError(points[i].measurement.bytes, points[i].measurement.time_s, e.time_s,
                                    e.choice.algorithm, e.choice.protocol, max(shares, key=shares.get)))
        result.append(GroupFit(file, collective, group, nodes, per_node, tuple(errors)))
    return tuple(result)


def replay_nccl(topology: Topology, measurements: list[Measurement]) -> np.ndarray:
    """Relative errors (predicted - measured) / measured of the topology's NCCL figures."""
    view = nccl_view(topology)
    errors = []
    for m in measurements:
        _, ranks = group_devices(m, topology)
        e = estimate_group(topology, ranks, m.collective, m.bytes, view)
        errors.append(e.time_s / m.time_s - 1)
    return np.array(errors)
