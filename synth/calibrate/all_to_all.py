"""All-to-all measurements (nccl-tests alltoall_perf, an exported all-to-all's table) fitted
under the NCCL model.

NCCL has no all-to-all algorithm to choose: `all_to_all_single` is one grouped send/recv to
every peer, and the model (synth/model/nccl/backend.py, `all_to_all_plans`) times one call
alone as NCCL schedules point-to-point (synth/model/nccl/p2p.py: its kernels' launches, a hop
latency per batch, the proxy's posts, the NIC's messages) around its pairwise flows through the
links, each at the efficiency NCCL reaches on the link it crosses. The NCCL model's fit
(synth/calibrate/nccl_fit.py: efficiencies, protocols, pipeline stages) has nothing of that
shape, so an all-to-all is fitted apart, after it, on what it can correct: the latency and
the bandwidth of the level its groups span, *as the all-to-all sees them*, written as the
level's `[levels.collectives.AllToAll]` figures (only the all-to-all's costs read them: the
other collectives' fits stand as they are).

The fit is least squares on relative error over every size of every all-to-all group whose
outermost spanned level is that level, of the model's own time for the call (the engine's
estimate of one whole-group AllToAll, what the planner and `synth rank` cost). The time is
linear in the level's latency and in 1 / its bandwidth while the level's links bind, but it
is neither smooth nor monotone in the bandwidth (other links bind above some rate, and NCCL's
own model changes regime), so the bandwidth is searched on a log grid (the base's / 2^(k/2)
from 4x faster to 256x slower, then two finer grids around the best), each point with its
least-squares latency; a level whose links bind no
measured size (another level's links or the latency alone set every time) keeps its
bandwidth, and says so.

nccl-tests' busbw for all-to-all is algbw (n-1)/n (the bytes a rank sends to others), the same
factor as all_gather_perf's; only the time is read.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from synth.calibrate.confidence import band_errors
from synth.calibrate.groups import devices as group_devices
from synth.calibrate.measurements import Measurement
from synth.calibrate.nccl_fit import GroupFit, LevelFit, NcclCalibration, SizeError, calibrate_nccl, replay_nccl
from synth.errors import UsageError
from synth.language import collective_names
from synth.topology import CalibrationRecord, CollectiveFigures, Figure, Topology

ALL_TO_ALL = "AllToAll"
COARSE = 2  # grid points per doubling of the bandwidth, -2..+8 doublings from the base's
FINE = 4  # then twice this many finer points either side of the best, 4x then 16x finer
MIN_BOUND_SHARE = 0.05  # a fit of the bandwidth needs sizes whose time it moves by at least this share


def is_all_to_all(measurement: Measurement) -> bool:
    return measurement.collective == ALL_TO_ALL


def predicted_times(topology: Topology, ranks: tuple[int, ...], sizes) -> np.ndarray:
    """The model's seconds for one AllToAll over `ranks` (alone on the system) at each size
    (bytes per rank, nccl-tests' size column), through the same engine and estimate as every
    program's step."""
    from synth.hierarchy import build_hierarchy
    from synth.model import CostEngine, ProgramTable, StepCalls, cost_context, resolve_estimate
    from synth.placement import enumerate_placements, parse_axes

    n, devices = len(ranks), topology.device_count
    if devices % n:
        raise UsageError(f"an all-to-all group of {n} ranks on {topology.name} ({devices} devices): calibrating it "
                         f"needs a group size dividing the device count; give a topology whose levels fit the run",
                         inputs=("topology",))
    axes = parse_axes(f"other={devices // n},group={n}") if devices > n else parse_axes(f"group={n}")
    placement = enumerate_placements(topology, axes)[0]  # any placement with groups of n: its devices are replaced
    context = cost_context(build_hierarchy(placement, ("group",)), topology, "nccl")
    engine = CostEngine(context, devices=np.array([ranks], dtype=np.int64))
    table = ProgramTable.of([(StepCalls(ALL_TO_ALL, (tuple(range(n)),), (n,)),)])
    return resolve_estimate(None).program_times(engine, table, [int(size) for size in sizes])[0]


def with_figures(topology: Topology, level: int, bandwidth: Figure, latency: Figure) -> Topology:
    """The topology with level `level`'s all-to-all figures set (its other collectives kept)."""
    old = topology.levels[level]
    table = dict(old.collectives)
    table[ALL_TO_ALL] = CollectiveFigures(bandwidth, latency)
    collectives = tuple((name, table[name]) for name in collective_names() if name in table)
    levels = list(topology.levels)
    levels[level] = replace(old, collectives=collectives)
    return replace(topology, levels=tuple(levels))


def _spanned(ranks: tuple[int, ...], topology: Topology) -> int:
    coords = np.stack(np.unravel_index(np.array(ranks), topology.sizes), axis=1)
    return next(level for level in range(coords.shape[1]) if len(set(coords[:, level].tolist())) > 1)


def _times(topology, level, points, latency_s, seconds_per_byte) -> np.ndarray:
    seen = with_figures(topology, level, Figure(1 / seconds_per_byte, "fit"), Figure(latency_s, "fit"))
    result = np.empty(len(points))
    by_group: dict[tuple[int, ...], list[int]] = {}
    for index, (_, ranks) in enumerate(points):
        by_group.setdefault(ranks, []).append(index)
    for ranks, indices in by_group.items():
        result[indices] = predicted_times(seen, ranks, [points[i][0].bytes for i in indices])
    return result


def fit_level(topology: Topology, level: int, points: list[tuple[Measurement, tuple[int, ...]]]
              ) -> tuple[Topology, LevelFit, tuple[CalibrationRecord, ...]]:
    """Level `level`'s all-to-all latency and bandwidth fitted to the points (module docstring)."""
    name = topology.levels[level].name
    bandwidth, latency = topology.levels[level].figures_for(ALL_TO_ALL)
    measured = np.array([m.time_s for m, _ in points])
    if len({m.bytes for m, _ in points}) < 2:
        raise UsageError(f"level {name}, AllToAll: the measurements have one size; the fit needs at least two sizes")
    notes: list[str] = []
    weights = 1 / measured  # relative error
    alpha0, x0 = latency.value, 1 / bandwidth.value

    def best_latency(x: float) -> tuple[float, float]:
        """(loss, latency) at bandwidth 1/x: the latency by least squares (the time is linear in it)."""
        at = _times(topology, level, points, alpha0, x)
        step = max(alpha0, 1e-6)
        slope = (_times(topology, level, points, alpha0 + step, x) - at) / step
        alpha = alpha0
        if np.any(slope > 0):
            alpha = max(0.0, alpha0 + float(np.dot(slope * weights, (measured - at) * weights)
                                             / np.dot(slope * weights, slope * weights)))
        predicted = _times(topology, level, points, alpha, x)
        return float(np.sum(np.square(predicted * weights - 1))), alpha

    # The time is not smooth in the bandwidth (other links bind, NCCL's model changes regime), so
    # the bandwidth is searched on a log grid, coarse then fine, each with its best latency.
    coarse = {x0 * 2.0 ** (k / COARSE): best_latency(x0 * 2.0 ** (k / COARSE)) for k in range(-2 * COARSE, 8 * COARSE + 1)}
    x = min(coarse, key=lambda key: coarse[key][0])
    for per_doubling in (COARSE * FINE, COARSE * FINE * FINE):
        fine = {x * 2.0 ** (k / per_doubling): best_latency(x * 2.0 ** (k / per_doubling)) for k in range(-FINE, FINE + 1)}
        x = min(fine, key=lambda key: fine[key][0])
    alpha = fine[x][1]
    moves = (_times(topology, level, points, alpha, x * 1.25) - _times(topology, level, points, alpha, x / 1.25)) \
        / _times(topology, level, points, alpha, x)
    informs = moves > MIN_BOUND_SHARE  # sizes whose time the level's bandwidth moves
    if not informs.any():
        x = x0
        notes.append(f"level {name}, AllToAll: no measured size is bound by the level's links (latency or other "
                     f"levels set every time): its bandwidth kept ({bandwidth.value / 1e9:.3g} GB/s), its latency fitted")
    files = ", ".join(sorted({m.file.replace("\\", "/").rsplit("/", 1)[-1] for m, _ in points}))
    source = f"fitted by synth calibrate (NCCL model, AllToAll, pairwise send/recv) from {files}"
    fitted = with_figures(topology, level, Figure(1 / x, source) if informs.any() else bandwidth,
                          Figure(alpha, source))
    predicted = _times(fitted, level, points, alpha, x)
    groups, records = [], []
    by_group: dict[tuple, list[int]] = {}
    for index, (m, ranks) in enumerate(points):
        by_group.setdefault((m.file, m.span.describe(), ranks), []).append(index)
    for (file, described, _), indices in by_group.items():
        indices.sort(key=lambda i: points[i][0].bytes)
        span = points[indices[0]][0].span
        nodes, per_node = (span.hosts, span.per_unit) if span.hosts > 1 else (1, span.size)
        errors = tuple(SizeError(points[i][0].bytes, float(measured[i]), float(predicted[i]), "pairwise", "send/recv",
                                 "bandwidth" if informs[i] else "latency") for i in indices)
        group = GroupFit(file, ALL_TO_ALL, described, nodes, per_node, errors)
        groups.append(group)
        records.append(CalibrationRecord(ALL_TO_ALL, name, nodes, per_node, errors[0].nbytes, errors[-1].nbytes,
                                         len(errors), group.rms, group.worst,
                                         file.replace("\\", "/").rsplit("/", 1)[-1], "nccl",
                                         band_errors((e.nbytes, e.error) for e in errors)))
    fit = LevelFit(name, (), None, None, tuple(groups), tuple(notes))
    return fitted, fit, tuple(records)


def calibrate_with_all_to_all(measurements: list[Measurement], base: Topology, assumptions: tuple[str, ...] = ()
                              ) -> NcclCalibration:
    """The NCCL model's fit of every other collective (synth/calibrate/nccl_fit.py), then each
    spanned level's all-to-all figures on top of it."""
    exchanges = [m for m in measurements if is_all_to_all(m)]
    others = [m for m in measurements if not is_all_to_all(m)]
    if not exchanges:
        return calibrate_nccl(measurements, base, assumptions)
    if others:
        result = calibrate_nccl(others, base, assumptions)
    else:
        name = base.name if base.name.endswith("-calibrated") else f"{base.name}-calibrated"
        result = NcclCalibration(replace(base, name=name, source_path=None), (), tuple(assumptions), ())
    topology = result.topology
    by_level: dict[int, list[tuple[Measurement, tuple[int, ...]]]] = {}
    for measurement in exchanges:
        _, ranks = group_devices(measurement, topology)
        by_level.setdefault(_spanned(tuple(ranks), topology), []).append((measurement, tuple(ranks)))
    fits, records = list(result.fits), []
    for level in sorted(by_level, reverse=True):  # innermost first, as the other fits
        topology, fit, new = fit_level(topology, level, by_level[level])
        fits.append(fit)
        records += new
    replaced = {(r.file, r.collective, r.nodes, r.ranks_per_node) for r in records}
    kept = tuple(r for r in topology.calibration if (r.file, r.collective, r.nodes, r.ranks_per_node) not in replaced)
    topology = replace(topology, calibration=kept + tuple(records))
    return NcclCalibration(topology, tuple(fits), result.assumptions, result.notes)


def replay_with_all_to_all(topology: Topology, measurements: list[Measurement]) -> np.ndarray:
    """predicted / measured - 1 of every measurement on the (written) topology, in order."""
    errors = np.empty(len(measurements))
    others = [i for i, m in enumerate(measurements) if not is_all_to_all(m)]
    if others:
        errors[others] = replay_nccl(topology, [measurements[i] for i in others])
    for i, m in enumerate(measurements):
        if is_all_to_all(m):
            _, ranks = group_devices(m, topology)
            predicted = float(predicted_times(topology, tuple(ranks), [m.bytes])[0])
            errors[i] = predicted / m.time_s - 1 if m.time_s > 0 else math.inf
    return errors
