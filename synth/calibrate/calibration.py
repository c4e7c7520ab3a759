"""Measurements in, a calibrated topology out.

Levels are fitted innermost first, so that a group spanning an outer level (several hosts
of several GPUs each) is costed with the inner levels' fitted figures, exactly as the
simulator will cost it with the written file. For each level and each measured collective
the fit (synth/calibrate/fit.py) gives a latency and a bandwidth. The level's own figures
are those of its AllReduce fit (the call the baseline and most programs make), or, without
one, of the collective with the most points; every other fitted collective goes in the
level's per-collective table (`[levels.collectives.NAME]`, synth/topology.py), which the
simulator uses for steps of that collective. Names, sizes and uplinks come from the base
topology; a fitted level's uplinks keep their base ratio to its bandwidth (a level's links
are taken to run at one speed relative to the base: whichever of them bounds the measured
transfers sets it). Levels without measurements keep the base figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from synth.calibrate.confidence import band_errors
from synth.calibrate.fit import Point, Solution, UnfitError, fit_points
from synth.calibrate.groups import devices, spanned_levels
from synth.calibrate.measurements import Measurement
from synth.calibrate.model import CallModel
from synth.calibrate.uncertainty import Uncertainty, numeric_jacobian, uncertainty
from synth.errors import UsageError
from synth.language import collective_names
from synth.model.algorithms import Backend
from synth.topology import CalibrationRecord, CollectiveFigures, Figure, Level, Topology, Uplinks, check_levels
from synth.units import format_bandwidth, format_bytes

PLACEHOLDER_BANDWIDTH = Figure(1e9, "placeholder: no figure; never on a fitted group's path")
PLACEHOLDER_LATENCY = Figure(1e-6, "placeholder: no figure; never on a fitted group's path")


@dataclass(frozen=True)
class Fit:
    level: str
    collective: str
    solution: Solution
    points: int
    min_bytes: int
    max_bytes: int
    files: tuple[str, ...]
    groups: tuple[str, ...]  # the measured group shapes, e.g. "2 hosts x 8 ranks"
    level_figure: bool  # these are the level's own bandwidth and latency
    uncertainty: Uncertainty | None = None  # of log latency, log inverse bandwidth, and of a prediction

    def source(self, backend: str) -> str:
        quality = self.solution
        text = (f"fitted by synth calibrate (backend {backend}, {self.collective}) from {', '.join(self.files)}: "
                f"{self.points} points, {format_bytes(self.min_bytes)} to {format_bytes(self.max_bytes)}, "
                f"R^2={quality.r_squared:.5f}, relative RMS error {quality.relative_rms:.2%}")
        return "; ".join([text, *quality.notes])


@dataclass(frozen=True)
class Calibration:
    topology: Topology
    backend: str
    fits: tuple[Fit, ...]
    notes: tuple[str, ...]


def infer_base(measurements: list[Measurement]) -> Topology:
    """Without --topology: node and gpu levels sized from nccl-tests groups (hosts x ranks)."""
    if any(m.span.level is not None for m in measurements):
        raise UsageError("the files (or the level given) name levels; give a base topology for their order and sizes",
                         inputs=("topology",))
    hosts = max(m.span.hosts for m in measurements)
    ranks = max(m.span.per_unit if m.span.hosts > 1 else m.span.units for m in measurements)
    levels = (Level("node", hosts), Level("gpu", ranks)) if hosts > 1 else (Level("gpu", ranks),)
    check_levels(levels, "the measured groups")
    return Topology("nccl-tests", "System inferred from nccl-tests rank lines (hosts x ranks).", levels)


def _with_figures(level: Level) -> Level:
    if level.bandwidth is not None and level.latency is not None:
        return level
    return Level(level.name, level.size, PLACEHOLDER_BANDWIDTH, PLACEHOLDER_LATENCY, level.uplinks, level.collectives,
                 level.fabric)


def calibrate(measurements: list[Measurement], base: Topology, backend: Backend) -> Calibration:
    located: dict[tuple[int, str], list[tuple[Measurement, tuple[int, ...]]]] = {}
    for measurement in measurements:
        index, ranks = devices(measurement, base)
        located.setdefault((index, measurement.collective), []).append((measurement, ranks))
    output = list(base.levels)
    context = [_with_figures(level) for level in base.levels]
    known = {i for i, level in enumerate(base.levels) if level.bandwidth is not None and level.latency is not None}
    fits: list[Fit] = []
    notes = []
    for index in reversed(range(len(base.levels))):
        level_fits, failed = [], []
        for collective in collective_names():
            if (index, collective) in located:
                try:
                    level_fits.append(_fit(base, context, known, index, collective, located[(index, collective)],
                                           backend))
                except UnfitError as error:
                    failed.append(error)
        if failed and not level_fits:
            raise failed[0]
        # a collective the model cannot fit beside others that it can (its times shrink with the
        # size under the others' figures: a noisy run) is left to the level's figures, saying so
        notes += [f"{error}; not fitted: the level's figures cost it" for error in failed]
        if not level_fits:
            continue
        main = _level_fit(level_fits)
        fits += [replace(fit, level_figure=fit is main) for fit in level_fits]
        output[index] = context[index] = _calibrated_level(base.levels[index], main, level_fits, backend.name)
        known.add(index)
    bare = [level.name for level in output if level.bandwidth is None]
    if bare and len(bare) < len(output):
        notes.append(f"level(s) {', '.join(bare)} have no figures in the base or the files: add them before costing")
    files = sorted({m.file for m in measurements})
    name = base.name if base.name.endswith("-calibrated") else f"{base.name}-calibrated"
    description = " ".join(filter(None, [base.description, f"Figures fitted by synth calibrate (backend "
                                                          f"{backend.name}) from {', '.join(files)}."]))
    topology = Topology(name, description, tuple(output))
    sigmas = {(fit.level, fit.collective): fit.uncertainty.sigma for fit in fits if fit.uncertainty is not None}
    topology = replace(topology, calibration=_records(base, topology, backend, measurements, sigmas))
    return Calibration(topology, backend.name, tuple(fits), tuple(notes))


def _records(base: Topology, topology: Topology, backend: Backend, measurements: list[Measurement],
             sigmas: dict[tuple[str, str], float]) -> tuple[CalibrationRecord, ...]:
    """What the fit was made on, one record per file, collective and group shape, with the
    written figures' error there (as the NCCL fit writes them): `synth rank` and `synth bench`
    read them to say how sure a prediction is and what setup it was calibrated for."""
    from synth.model.nccl.hardware import group_layout, nccl_view

    view = nccl_view(base)
    errors = replay(topology, backend, measurements)
    groups: dict[tuple, list[tuple[int, float]]] = {}
    for measurement, error in zip(measurements, errors):
        index, ranks = devices(measurement, base)
        nodes, per_node, _ = group_layout(base, view, tuple(ranks))
        key = (measurement.collective, base.levels[index].name, nodes, per_node,
               measurement.file.replace("\\", "/").rsplit("/", 1)[-1])
        groups.setdefault(key, []).append((measurement.bytes, float(error)))
    records = tuple(CalibrationRecord(collective, level, nodes, per_node, min(b for b, _ in entries),
                                      max(b for b, _ in entries), len(entries),
                                      float(np.sqrt(np.mean([e * e for _, e in entries]))),
                                      max(abs(e) for _, e in entries), file, backend.name, band_errors(entries),
                                      sigmas.get((level, collective)))
                    for (collective, level, nodes, per_node, file), entries in groups.items())
    new = {(r.file, r.collective, r.nodes, r.ranks_per_node) for r in records}
    kept = tuple(r for r in base.calibration if (r.file, r.collective, r.nodes, r.ranks_per_node) not in new)
    return kept + records


def _fit(base: Topology, context: list[Level], known: set[int], index: int, collective: str,
         entries: list[tuple[Measurement, tuple[int, ...]]], backend: Backend) -> Fit:
    level = base.levels[index]
    where = f"level {level.name}, {collective}"
    for measurement, ranks in entries:
        missing = [base.levels[j].name for j in spanned_levels(base, ranks) if j != index and j not in known]
        if missing:
            raise UsageError(f"{measurement.where}: the group ({measurement.span.describe()}) also crosses level(s) "
                             f"{', '.join(missing)}, which have no figures: measure them too (e.g. a single-host run) "
                             f"or give a topology with their figures", inputs=("topology",))
    seen = Topology(base.name, base.description, tuple(context)).for_collective(collective)
    models: dict[tuple[int, ...], CallModel] = {}
    points = []
    for measurement, ranks in entries:
        if ranks not in models:
            models[ranks] = CallModel(seen, backend, collective, ranks, index)
        points.append(Point(models[ranks], measurement.bytes, measurement.time_s))
    start = seen.levels[index]
    solution = fit_points(points, start.latency.value, 1 / start.bandwidth.value, where)
    sizes = [m.bytes for m, _ in entries]
    return Fit(level.name, collective, solution, len(entries), min(sizes), max(sizes),
               tuple(sorted({m.file for m, _ in entries})),
               tuple(sorted({m.span.describe() for m, _ in entries})), False, _uncertainty(points, solution))


def _uncertainty(points: list[Point], solution) -> Uncertainty:
    """The fit's spread in (log latency, log inverse bandwidth), flat priors (synth/calibrate/uncertainty.py)."""
    def residuals(values: np.ndarray) -> np.ndarray:
        alpha, x = math.exp(values[0]), math.exp(values[1])
        return np.array([math.log(p.model.time(alpha, x, p.nbytes)[0] / p.time_s) for p in points])

    at = np.log([solution.latency_s, 1 / solution.bandwidth])
    return uncertainty(residuals(at), numeric_jacobian(residuals, at))


def _level_fit(fits: list[Fit]) -> Fit:
    for fit in fits:
        if fit.collective == "AllReduce":
            return fit
    return max(fits, key=lambda fit: fit.points)  # the first of equals: language order


def _calibrated_level(level: Level, main: Fit, fits: list[Fit], backend: str) -> Level:
    def figures(fit: Fit) -> tuple[Figure, Figure]:
        source = fit.source(backend)
        return Figure(fit.solution.bandwidth, source), Figure(fit.solution.latency_s, source)

    bandwidth, latency = figures(main)
    uplinks = level.uplinks
    if uplinks is not None:  # the level's links run at one speed relative to the base: scale them alike
        factor = bandwidth.value / level.bandwidth.value
        uplinks = Uplinks(uplinks.count, Figure(uplinks.bandwidth.value * factor, (
            f"scaled by synth calibrate with the level's fitted {main.collective} bandwidth (x{factor:.4g} of the "
            f"base {format_bandwidth(level.bandwidth.value)}); base: {uplinks.bandwidth.source}")))
    fabric = level.fabric
    if fabric is not None:  # likewise the level's shared interconnect
        factor = bandwidth.value / level.bandwidth.value
        fabric = Figure(fabric.value * factor, (
            f"scaled by synth calibrate with the level's fitted {main.collective} bandwidth (x{factor:.4g} of the "
            f"base {format_bandwidth(level.bandwidth.value)}); base: {fabric.source}"))
    table = dict(level.collectives)
    for fit in fits:
        table.pop(fit.collective, None)
        if fit is not main:
            table[fit.collective] = CollectiveFigures(*figures(fit))
    collectives = tuple((name, table[name]) for name in collective_names() if name in table)
    return Level(level.name, level.size, bandwidth, latency, uplinks, collectives, fabric)


def replay(topology: Topology, backend: Backend, measurements: list[Measurement]) -> np.ndarray:
    """Relative errors (predicted - measured) / measured of the topology's figures on the
    measurements: what the simulator will predict for the measured calls."""
    errors = []
    models: dict[tuple, CallModel] = {}
    for measurement in measurements:
        index, ranks = devices(measurement, topology)
        seen = topology.for_collective(measurement.collective)
        key = (measurement.collective, ranks)
        if key not in models:
            models[key] = CallModel(seen, backend, measurement.collective, ranks, index)
        level = seen.levels[index]
        predicted, _ = models[key].time(level.latency.value, 1 / level.bandwidth.value, measurement.bytes)
        errors.append(predicted / measurement.time_s - 1)
    return np.array(errors)
