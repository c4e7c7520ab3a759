"""Calibration of the NCCL model (synth/model/nccl/) on measured calls.

One least-squares line through all sizes cannot describe NCCL: small calls run LL or LL128
with their own latency and their own rate, large ones Simple at the links' rate, and NVLS and
tree pipelines take a while to fill in between. NCCL's choice of algorithm and protocol at
every size comes from its own tables and does not depend on anything fitted here
(`nccl.as_nccl_sees`), so every measured size is known to run one (algorithm, protocol), and
each figure is fitted on the sizes where it acts:

* per resource, the efficiency NCCL reaches on a level's links (a GPU's intra-node links, a
  node's NICs): the line rate stays, the fraction is fitted, on the sizes the links bound;
* per protocol (LL, LL128, Simple), its achieved rate over the modelled one (LL's and LL128's
  flag-polling kernels move data below what their links allow; NCCL's per-channel ceilings are
  NVIDIA's measurements on other machines) and its latency over NCCL's own table, on the sizes
  where NCCL picks that protocol. Both are factors on NCCL's per-hop model, so they carry to
  another node count through NCCL's own hop counts (ring steps, tree depth) and tables;
* a per-call overhead NCCL's latency model does not have (a launcher driving several GPUs
  from one thread, a shared GPU), and for groups across nodes whose algorithm pipelines
  (NVLS trees; trees when the network shows a fill) the store-and-forward stages per hop.

All figures are fitted at once by robust least squares (scipy.optimize.least_squares) on the
log of predicted over measured time: a pseudo-Huber loss (quadratic within `ROBUST_SCALE`,
linear beyond), so a few wild sizes (a noisy run, a launcher stall) do not drag the fit, and a
prior pulls every figure towards its base value (NCCL's own: factor 1, no overhead; the
topology's efficiency), so a figure the data cannot determine (a protocol picked at one size
only, a link's rate where a four-size probe cannot tell it from a protocol's) stays near it. Sizes still
off by more than `OUTLIER` after the fit are flagged as outliers, left out of a refit, and
reported (`SizeError.outlier`). Levels are fitted innermost first, so a group across nodes is
costed with the node's fitted figures, as the model will cost it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from synth.calibrate.confidence import band_errors
from synth.calibrate.groups import devices as group_devices
from synth.calibrate.measurements import Measurement
from synth.calibrate.uncertainty import Uncertainty, numeric_jacobian, size_folds, uncertainty, with_held_out
from synth.errors import UsageError
from synth.model import nccl
from synth.model.nccl.hardware import NcclView, estimate_group, group_layout, nccl_view, with_launch
from synth.model.nccl.launch import launch_s_per_gpu
from synth.model.nccl.transports import CALL_FLOOR
from synth.model.nccl.fabric_share import FABRIC_SHARE, crosses_upper_tier
from synth.model.nccl.names import SELECTABLE_ALGORITHMS, algorithms_of_setting
from synth.topology import CalibrationRecord, Figure, NcclSystem, ProtocolFactors, Topology
from synth.units import format_bytes

PROTOCOLS = nccl.PROTOCOLS
ROBUST_SCALE = 0.05  # residuals (log predicted / measured) beyond 5% count linearly, not squared
# The priors: each figure is pulled towards its base value (NCCL's own: factor 1, no overhead, the
# topology's documented efficiency) at a cost linear in its distance over a scale in the fit's
# units (logs of factors; the overhead and the per-cluster floors in units of PRIOR_OVERHEAD x the
# level's shortest measured call; stages as is), like a data outlier's. A four-size probe cannot
# tell a slow link from a slow protocol or an overhead from a latency factor, and a figure fitted
# on one node count is applied to others: a figure moves only where about 1 / scale of the sizes
# that see it ask the same way, so what the probe does not pin stays at the documented value.
PRIOR_OVERHEAD = 2.0  # the overhead's unit, in the level's shortest measured call
MAX_GROUP_FOLDS = 6  # groups left out in turn for the held-out spread (synth/calibrate/uncertainty.py)
OUTLIER = 0.25  # a size predicted more than 25% off after the robust fit is an outlier
OUTLIER_SPREAD = 4.0  # ... and more than 4 robust standard deviations of the residuals
MAX_STAGES = 64.0
# A protocol's factors stay within what a protocol can be off by: NCCL's latency table within 4x
# either way, its rate between a twentieth and 1.5x of the model's (whose ceilings NVIDIA measured);
# beyond that a size is not
# NCCL's protocol being off but something else (a launcher stall, a shared CPU), an outlier.
MAX_LATENCY = 4.0
MIN_RATE, MAX_RATE = 0.05, 1.5
BOUND_SHARE = 0.2  # a size informs a rate when its transfer is at least this share of its time
POOR_RMS = 0.05  # a fit with a larger relative RMS error (inliers), or
POOR_WORST = 0.15  # a larger worst inlier error, or
POOR_OUTLIERS = 0.25  # more than this share of outliers, is flagged as poor


@dataclass(frozen=True)
class Priors:
    """The scale of each figure's prior, in the fit's units (see PRIOR_OVERHEAD): a figure moves
    from its base value only where about 1 / scale of the sizes that see it ask the same way."""

    rate: float  # link efficiencies and protocol rate factors (log)
    latency: float  # protocol latency factors over NCCL's table (log)
    overhead: float  # the per-call overhead (units of PRIOR_OVERHEAD)
    floor: float  # the per-cluster floors: launch per GPU, a plugin's per-call floor (same units)
    stages: float  # store-and-forward stages per network hop
    # None: a figure's cost grows linearly with its distance over the scale (a sweep's priors);
    # a weight: a rate's (RATE_KINDS) grows as weight^2 log(1 + (distance / scale)^2), a
    # heavy-tailed prior: a rate stays within about its scale unless the sizes ask for much more
    weight: float | None = None

    def scaled(self, factor: float) -> "Priors":
        """Every scale times `factor` (larger: the data move the figures more freely)."""
        if not factor > 0:
            raise ValueError(f"a prior scale factor must be positive, not {factor}")
        return Priors(self.rate * factor, self.latency * factor, self.overhead * factor, self.floor * factor,
                      self.stages * factor, self.weight)


# A sweep (nccl-tests -f 2: every figure has sizes of its own) moves a figure where a few sizes ask.
SWEEP_PRIORS = Priors(rate=10.0, latency=2.0, overhead=1.0, floor=1.0, stages=32.0)
# A probe of a few sizes (synth probe: four) has one size per regime, so a figure fitted there
# carries that size's miss, whatever caused it (a mechanism the model lacks at this node count),
# to every other size and node count. Its latency figures (latency factors, the overhead, the
# floors, stages) move only where several sizes ask (linear priors, narrower than a sweep's);
# its rates have heavy-tailed priors: a rate moves little for a miss within its scale (what the
# model's structure misses on other systems) and freely for a larger one (a link at half its
# documented rate). Chosen with the shared nccl-tests logs in view, and so a fit:
# results/calibration-transfer picks their scale per fold on the other sources alone.
PROBE_PRIORS = Priors(rate=0.15, latency=1.0, overhead=0.5, floor=1.0, stages=4.0, weight=0.1)
RATE_KINDS = ("efficiency", "bandwidth", "fabric_share")  # the figures a probe's heavy-tailed prior applies to
PROBE_MAX_SIZES = 8  # a level's fit on at most this many distinct sizes takes PROBE_PRIORS


def priors_for(sizes: int) -> Priors:
    """The priors of a level's fit on `sizes` distinct sizes."""
    return PROBE_PRIORS if sizes <= PROBE_MAX_SIZES else SWEEP_PRIORS


@dataclass(frozen=True)
class SizeError:
    """One measured size against the calibrated model."""

    nbytes: int
    measured_s: float
    predicted_s: float
    algorithm: str
    protocol: str
    regime: str  # "latency", "pipeline" or "bandwidth": what dominates the modelled time
    outlier: bool = False  # off by more than OUTLIER after the robust fit; left out of the refit

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
    def outliers(self) -> int:
        return sum(e.outlier for e in self.errors)

    @property
    def inlier_rms(self) -> float:
        inliers = [e.error ** 2 for e in self.errors if not e.outlier]
        return math.sqrt(float(np.mean(inliers))) if inliers else math.inf

    @property
    def poor(self) -> bool:
        inliers = [abs(e.error) for e in self.errors if not e.outlier]
        return (not inliers or self.inlier_rms > POOR_RMS or max(inliers) > POOR_WORST
                or self.outliers > POOR_OUTLIERS * len(self.errors))


@dataclass(frozen=True)
class LevelFit:
    """What was fitted for the groups whose outermost spanned level is `level`."""

    level: str
    efficiencies: tuple[tuple[str, float], ...]  # (level name, fitted efficiency)
    overhead_s: float | None
    stages: float | None
    groups: tuple[GroupFit, ...]
    notes: tuple[str, ...]
    protocols: tuple[tuple[str, float | None, float | None], ...] = ()  # (protocol, bandwidth, latency); None: kept
    uncertainty: Uncertainty | None = None  # of the figures (in the fit's units) and of a prediction
    figures: tuple[tuple[str, str], ...] = ()  # (kind, key) of each fitted figure, in uncertainty's order

    @property
    def outliers(self) -> int:
        return sum(group.outliers for group in self.groups)


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


def calibrate_nccl(measurements: list[Measurement], base: Topology, assumptions: tuple[str, ...] = (),
                   priors: Priors | None = None) -> NcclCalibration:
    """Fit the NCCL figures of `base` to the measurements (see the module docstring), each
    pulled towards its base value with `priors`' scales (None: `priors_for` each level's sizes)."""
    if not measurements:
        raise UsageError("no measurements to calibrate from")
    # fitted as the run was launched (nccl-tests -g N: one thread drives N GPUs, a host floor per
    # call), written back with the base's launch mode: the figures are the hardware's
    launched = launch_of(measurements)
    restore, original = base.nccl, base
    base = with_launch(base, *launched) if launched != _launch_mode(base) else base
    base = with_pinned_algorithms(base, measurements)
    view = nccl_view(base)
    by_level: dict[int, list[_Point]] = {}
    for measurement in measurements:
        _, ranks = group_devices(measurement, base)
        _, _, outer = group_layout(base, view, ranks)
        by_level.setdefault(outer, []).append(_Point(measurement, tuple(ranks)))
    topology = base
    fits, fitted_levels = [], set()
    for level in sorted(by_level, reverse=True):  # innermost first
        topology, fit = _fit_level(topology, level, by_level[level], frozenset(fitted_levels), priors)
        fitted_levels |= {topology.level_index(name) for name, _ in fit.efficiencies}
        fits.append(fit)
    records = tuple(CalibrationRecord(g.collective, fit.level, g.nodes, g.ranks_per_node,
                                      min(e.nbytes for e in g.errors), max(e.nbytes for e in g.errors),
                                      len(g.errors), g.rms, g.worst, g.file.replace("\\", "/").rsplit("/", 1)[-1], "nccl",
                                      band_errors((e.nbytes, e.error) for e in g.errors),
                                      fit.uncertainty.sigma if fit.uncertainty is not None else None)
                    for fit in fits for g in fit.groups)
    files = sorted({_name(m.file) for m in measurements})
    name = base.name if base.name.endswith("-calibrated") else f"{base.name}-calibrated"
    description = " ".join(filter(None, [base.description, f"NCCL figures fitted by synth calibrate from "
                                                           f"{', '.join(files)}."]))
    kept = tuple(r for r in base.calibration if (r.file, r.collective, r.nodes, r.ranks_per_node) not in
                 {(n.file, n.collective, n.nodes, n.ranks_per_node) for n in records})
    if restore is not None and topology.nccl is not None:  # a fitted launch figure is the host's: kept
        restore = replace(restore, launch_per_gpu=topology.nccl.launch_per_gpu)
    topology = replace(topology, name=name, description=description, calibration=kept + records, source_path=None,
                       nccl=restore)
    assumed = tuple(assumptions) + nccl_view(original).assumptions
    return NcclCalibration(topology, tuple(fits), assumed, ())


def launch_of(measurements: list[Measurement]) -> tuple[int, bool, int | None]:
    """(GPUs per host thread, CUDA graphs, CPU cores per process) of the measured run: nccl-tests'
    -g (one thread drives that many GPUs), one process per GPU when the file does not say; the
    cores its launcher bound each process to (RunInfo.cpu_cores), None when not bound."""
    runs = [m.run for m in measurements if m.run is not None]
    per_thread = max((run.gpus_per_process for run in runs), default=1)
    bound = [run.cpu_cores for run in runs]
    cores = min(bound) if bound and None not in bound else None  # bound only where every run says so
    return max(1, per_thread), False, cores


NVLS_ALGORITHMS = ("nvls", "nvls_tree")


def pinned_algorithms(measurements: list[Measurement]) -> tuple[str, ...] | None:
    """The algorithms the measured runs let NCCL pick (their NCCL_ALGO), None when no run
    says; runs pinned differently are refused (one fit prices one setting)."""
    found: dict[tuple[str, ...], Measurement] = {}
    for m in measurements:
        setting = m.run.nccl_algo if m.run is not None else None
        if setting is None:
            continue
        allowed = algorithms_of_setting(setting, m.collective)
        if allowed is None:
            raise UsageError(f"{m.where}: NCCL_ALGO={setting} names an algorithm NCCL does not have (it knows "
                             f"Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT)")
        if not allowed:
            raise UsageError(f"{m.where}: NCCL_ALGO={setting} leaves {m.collective} no algorithm the NCCL model prices "
                             f"({', '.join(SELECTABLE_ALGORITHMS)}); calibrate from a run without CollNet")
        found.setdefault(allowed, m)
    if len(found) > 1:
        runs = "; ".join(f"{m.where}: NCCL_ALGO={m.run.nccl_algo}" for m in found.values())
        raise UsageError(f"the runs were launched with different NCCL_ALGO settings ({runs}); calibrate the runs of "
                         f"one setting at a time")
    if not found:
        return None
    allowed = next(iter(found))
    return None if allowed == SELECTABLE_ALGORITHMS else allowed


def with_pinned_algorithms(topology: Topology, measurements: list[Measurement]) -> Topology:
    """The topology with the algorithms the runs pinned (NCCL_ALGO): the fit prices what ran.
    A pin the topology cannot run (only NVLS where it has no NVLS) is refused."""
    pinned = pinned_algorithms(measurements)
    if pinned is None:
        return topology
    system = topology.nccl or NcclSystem("ampere", "assumed: Ampere, no NVLS (no [nccl] table)")
    if not system.nvls and set(pinned) <= set(NVLS_ALGORITHMS):
        setting = next(m.run.nccl_algo for m in measurements if m.run is not None and m.run.nccl_algo)
        raise UsageError(f"the runs were launched with NCCL_ALGO={setting}, but topology {topology.name} has no NVLS "
                         f"(nvls = false in its [nccl] table): NVLS ran, so set nvls = true there", inputs=("topology",))
    return replace(topology, nccl=replace(system, algorithms=pinned))


def nvls_flipped(topology: Topology, measurements: list[Measurement]) -> Topology | None:
    """The topology with its NVLS setting the other way, to tell whether the measurements
    contradict it; None where the other setting cannot differ or cannot run: NVLS off where
    the algorithms allowed (the runs' NCCL_ALGO, else the topology's) are all NVLS ones,
    NVLS on where none is, or on a GPU before Hopper."""
    system = topology.nccl
    if system is None:
        return None
    allowed = pinned_algorithms(measurements) or system.algorithms or SELECTABLE_ALGORITHMS
    nvls_allowed = set(allowed) & set(NVLS_ALGORITHMS)
    if system.nvls and nvls_allowed == set(allowed):
        return None
    if not system.nvls and (not nvls_allowed or system.generation not in ("hopper", "blackwell")):
        return None
    return replace(topology, nccl=replace(system, nvls=not system.nvls))


def _launch_mode(topology: Topology) -> tuple[int, bool, int | None]:
    system = topology.nccl
    return (system.gpus_per_thread, system.cuda_graphs, system.cpu_cores) if system is not None else (1, False, None)


def _name(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


# --- the figures of one level --------------------------------------------------------------------


@dataclass(frozen=True)
class _Param:
    """One fitted figure: what it is, where it goes, and its value x in the fit's units (the
    log of an efficiency or factor, the overhead in units of `_Setup.overhead_unit`, stages as is)."""

    kind: str  # "efficiency", "bandwidth", "latency", "overhead", "stages", "launch", "floor", "fabric_share"
    key: int | str  # level index (efficiency) or protocol (bandwidth, latency)
    start: float
    lower: float
    upper: float
    prior: float  # the prior's scale in x units


@dataclass(frozen=True)
class _Setup:
    topology: Topology
    level: int
    points: tuple[_Point, ...]
    unique: tuple[_Point, ...]  # one point per (devices, collective, bytes)
    calls: tuple[tuple[nccl.Call, nccl.Choice, nccl.Tuning], ...]  # of the unique points: the call, NCCL's (fixed)
    # choice and table
    index: np.ndarray  # points -> unique
    times: np.ndarray  # measured seconds of every point
    params: tuple[_Param, ...]
    overhead_unit: float  # seconds per unit of the overhead's x: PRIOR_OVERHEAD x the shortest measured call
    prior_weight: float | None = None  # Priors.weight: None linear, else heavy-tailed


def _fit_level(topology: Topology, level: int, points: list[_Point], frozen: frozenset[int],
               priors: Priors | None = None) -> tuple[Topology, LevelFit]:
    level = max(level, 0)
    name = topology.levels[level].name
    setup = _setup(topology, level, points, frozen,
                   priors or priors_for(len({p.measurement.bytes for p in points})))
    notes: list[str] = []
    keep = np.ones(len(points), dtype=bool)
    x = np.array([p.start for p in setup.params])
    # a first fit under the Cauchy loss finds what most sizes agree on, however wild the rest;
    # the sizes it leaves far off are flagged, and the figures refitted on the others
    for loss in (_cauchy, _pseudo_huber):
        x = _solve(setup, x, keep, loss)
        residuals = np.log(_predict(setup, x) / setup.times)
        keep = ~_outliers(residuals)
    def data_residuals(values: np.ndarray) -> np.ndarray:
        return np.log(_predict(setup, values)[keep] / setup.times[keep])

    # a heavy-tailed prior is weight x distance / scale near its centre: a Gaussian of scale / weight
    widths = np.array([p.prior / (setup.prior_weight if setup.prior_weight and p.kind in RATE_KINDS else 1.0)
                       for p in setup.params])
    spread = uncertainty(data_residuals(x), numeric_jacobian(data_residuals, x), widths) if keep.any() else None
    if spread is not None:
        spread = with_held_out(spread, _held_out_residuals(setup, x, keep))
    source = _source(setup, keep)
    fitted = _apply(setup, x, source)
    estimates = _evaluate(fitted, list(setup.points))
    view = nccl_view(fitted)
    groups = _group_fits(fitted, list(setup.points), estimates, view, ~keep)
    values = dict(zip(((p.kind, p.key) for p in setup.params), x))
    efficiencies = tuple((fitted.levels[p.key].name, math.exp(values[(p.kind, p.key)]))
                         for p in setup.params if p.kind == "efficiency")
    for level_name, value in efficiencies:
        if value > 0.999:
            notes.append(f"level {level_name}: measured as fast as its line rate allows under the model; efficiency "
                         f"kept at 1")
    protocols = []
    for protocol in PROTOCOLS:
        bandwidth = values.get(("bandwidth", protocol))
        latency = values.get(("latency", protocol))
        if bandwidth is not None or latency is not None:
            protocols.append((protocol, None if bandwidth is None else math.exp(bandwidth),
                              None if latency is None else math.exp(latency)))
    if not any(e.transfer_s >= 0.6 * e.time_s for e in estimates):
        notes.append("no bandwidth-bound size: the efficiencies rest on the sizes in between")
    if not any(e.latency_s >= 0.6 * e.time_s for e in estimates):
        notes.append("no latency-bound size: the overhead and latency factors rest on the larger sizes")
    if len({p.measurement.bytes for p in setup.points}) == 1:
        notes.append("one size only: the figures it cannot tell apart stay at their base values")
    outliers = int((~keep).sum())
    if outliers:
        notes.append(f"{outliers} of {len(keep)} measured sizes flagged as outliers (more than {OUTLIER:.0%} and "
                     f"{OUTLIER_SPREAD:g} robust deviations off after the robust fit) and left out of it; see the "
                     f"per-size errors")
    for group in groups:
        if group.poor:
            notes.append(f"poor fit for {group.file} ({group.group}): relative RMS {group.inlier_rms:.1%} over "
                         f"{len(group.errors) - group.outliers} sizes, worst {group.worst:.1%}, {group.outliers} "
                         f"outliers; the model misses what this run shows (see the per-size errors)")
    stages = values.get(("stages", level))
    overhead = (setup.overhead_unit * values[("overhead", level)] if ("overhead", level) in values else
                (topology.levels[level].overhead.value if topology.levels[level].overhead is not None else 0.0))
    fit = LevelFit(name, efficiencies, overhead if overhead >= 1e-9 else 0.0, stages, groups,
                   tuple(dict.fromkeys(notes)), tuple(protocols), spread,
                   tuple((p.kind, str(p.key)) for p in setup.params))
    return fitted, fit


def _held_out_residuals(setup: _Setup, x: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """log(predicted / measured) of every inlier size, from a refit without its share of sizes."""
    sizes = np.array([p.measurement.bytes for p in setup.points])
    groups = [(p.devices, p.measurement.collective) for p in setup.points]
    kinds = list(dict.fromkeys(g for g, k in zip(groups, keep) if k))
    # sizes left out, and, where several groups were measured (a probe's levels and flat calls),
    # each group left out in turn: how the figures carry to a configuration they did not see
    outs = [np.isin(sizes, list(held)) & keep for held in size_folds(sizes[keep])]
    if len(kinds) > 1:
        outs += [np.array([g == kind for g in groups]) & keep for kind in kinds[:MAX_GROUP_FOLDS]]
    residuals = []
    for out in outs:
        if not (keep & ~out).any():
            continue
        refit = _solve(setup, x, keep & ~out, _pseudo_huber)
        residuals.append(np.log(_predict(setup, refit)[out] / setup.times[out]))
    return np.concatenate(residuals) if residuals else np.array([])


def _setup(topology: Topology, level: int, points: list[_Point], frozen: frozenset[int],
           priors: Priors = SWEEP_PRIORS) -> _Setup:
    """Which figures this level's points determine, from the model's estimates on the base: NCCL's
    choice at every size (fixed), what binds each transfer, whether a pipeline fills."""
    keys: dict[tuple, int] = {}
    unique, index = [], []
    for p in points:
        key = (p.devices, p.measurement.collective, p.measurement.bytes)
        if key not in keys:
            keys[key] = len(unique)
            unique.append(p)
        index.append(keys[key])
    times = np.array([p.measurement.time_s for p in points])
    view = nccl_view(topology)
    estimates = _evaluate(topology, unique)
    target = topology.levels[level]
    params: list[_Param] = []
    binding = sorted({b for e in estimates if e.transfer_s >= BOUND_SHARE * e.time_s
                      for b in [_binding_level(topology, view, e)] if b is not None and b not in frozen})
    fabric = _fabric_params(topology, level, unique, view, estimates, priors.rate)
    fabric_only = bool(fabric) and all(crosses_upper_tier(e.call) for e in estimates)
    if fabric_only:
        # calls over more hosts than a leaf holds, and no other: their rate miss cannot be told
        # apart between the node's links, Simple's rate and the fabric; the links' and Simple's
        # rates are NCCL's documented figures (topo.h, search.cc, its per-channel ceilings), the
        # fabric's share is a cluster's own, so the miss is the fabric's (fabric_share.py)
        binding = []
    for b in binding:
        params.append(_Param("efficiency", b, math.log(_efficiency_of(topology, view, b)), math.log(0.02), 0.0,
                             priors.rate))
    counts = {p: [e for e in estimates if e.choice.protocol == p] for p in PROTOCOLS}
    base_factors = dict(target.protocols)
    for protocol in PROTOCOLS:
        chosen = counts[protocol]
        if not chosen:
            continue
        factors = base_factors.get(protocol, ProtocolFactors())
        bound = [e for e in chosen if e.transfer_s >= BOUND_SHARE * e.time_s]
        # LL and LL128 rates are the protocol's own (wherever NCCL picks them at two sizes or
        # more: their rate may be far below the model's, so no share of the modelled time
        # tells); Simple's are the links' (their efficiencies) except where one of NCCL's
        # measured per-channel ceilings binds a Simple transfer.
        if (len(chosen) >= 2 if protocol != "Simple" else (not fabric_only
                                                           and any(e.bottleneck == "protocol" for e in bound))):
            start = math.log(factors.bandwidth.value) if factors.bandwidth else 0.0
            params.append(_Param("bandwidth", protocol, start, math.log(MIN_RATE), math.log(MAX_RATE), priors.rate))
        start = math.log(factors.latency.value) if factors.latency else 0.0
        params.append(_Param("latency", protocol, start, -math.log(MAX_LATENCY), math.log(MAX_LATENCY),
                             priors.latency))
    overhead = target.overhead.value if target.overhead is not None else 0.0
    unit = PRIOR_OVERHEAD * float(times.min())
    if priors.weight is None or _overhead_acts(topology, level, unique, view):
        params.append(_Param("overhead", level, overhead / unit, 0.0, 1e5, priors.overhead))
    params += _floor_params(topology, level, unique, view, unit, priors.floor)
    params += fabric
    if _fills(topology, level, unique, view):
        # without a figure NVLS trees fill with NET_HOP_STAGES per hop and classic trees not at
        # all (nccl.pipeline_stages): start from what the chosen algorithms do
        nvls_tree = any(e.choice.algorithm == "nvls_tree" for e in estimates)
        stages = target.transport.stages.value if target.transport.stages is not None else \
            (nccl.NET_HOP_STAGES if nvls_tree else 0.0)
        params.append(_Param("stages", level, stages, 0.0, MAX_STAGES, priors.stages))
    hardware = view.hardware
    calls = tuple((e.call, e.choice, nccl.tuning(hardware, e.call)) for e in estimates)
    return _Setup(topology, level, tuple(points), tuple(unique), calls, np.array(index), times, tuple(params), unit,
                  priors.weight)


# --- per-cluster floors: what a cluster's calls cannot go under, fitted like the overhead ---------


def _floor_params(topology: Topology, level: int, points: list[_Point], view: NcclView, unit: float,
                  prior: float = SWEEP_PRIORS.floor) -> list[_Param]:
    """The per-cluster floors these points determine, in units of the overhead's x: the host's
    launch time per GPU (launch.py) on a run driving several GPUs from one thread, and a net
    plugin's or TCP socket transport's per-call floor (transports.call_floor_s) on calls crossing
    its level: neither reports a latency NCCL's tables could carry (net_socket.cc and the TCPX
    plugin's getProperties: latency 0), and what a host's TCP path or a GPU shared by two ranks
    costs per call is the cluster's."""
    params = []
    system = topology.nccl
    if system is not None and system.gpus_per_thread > 1 and not system.cuda_graphs:
        params.append(_Param("launch", "system", launch_s_per_gpu(view.hardware) / unit, 0.0, 1e5, prior))
    transport = topology.levels[level].transport
    if (transport is not None and transport.kind in ("plugin", "socket") and view.node_level == level
            and any(group_layout(topology, view, p.devices)[0] > 1 for p in points)):
        floor = transport.floor.value if transport.floor is not None else CALL_FLOOR[transport.kind][0]
        params.append(_Param("floor", level, floor / unit, 0.0, 1e5, prior))
    return params


def _overhead_acts(topology: Topology, level: int, points: list[_Point], view: NcclView) -> bool:
    """Whether a probe (a few sizes, heavy-tailed priors) may fit a per-call overhead beyond
    NCCL's tables: not on calls across nodes over NCCL's own InfiniBand transport launched one GPU
    per process, where NCCL's tables hold every per-call cost (its base latencies, the network's
    per-step latency; net_ib reports no latency of its own: transports.CALL_FLOOR), so on a probe's
    few sizes a fitted overhead would only stand in for another figure's miss and carry it to other
    node counts (results/calibration-transfer). A sweep keeps it: its sizes pin it, and without it
    a protocol's rate takes that miss instead (results/fidelity)."""
    transport = topology.levels[level].transport
    system = topology.nccl
    one_per_process = system is None or system.gpus_per_thread == 1
    shared = any(p.measurement.run is not None and p.measurement.run.shared_device for p in points)
    return not (view.node_level == level and transport is not None and transport.kind == "ib"
                and one_per_process and not shared)


def _fabric_params(topology: Topology, level: int, points: list[_Point], view: NcclView, estimates,
                    prior: float) -> list[_Param]:
    """The fabric's share of the NICs' rate (synth/model/nccl/fabric_share.py), on a network level whose calls span
    more hosts than a leaf holds and whose transfers some of them bound (log of the share)."""
    transport = topology.levels[level].transport
    if transport is None or view.node_level != level:
        return []
    if not any(crosses_upper_tier(e.call) and e.transfer_s >= BOUND_SHARE * e.time_s for e in estimates):
        return []
    share = transport.fabric_share.value if transport.fabric_share is not None else FABRIC_SHARE[0]
    return [_Param("fabric_share", level, math.log(share), math.log(0.05), 0.0, prior)]


def _with_floors(topology: Topology, level: int, values: dict[tuple, float], said, unit: float) -> Topology:
    """The topology with fitted per-cluster floors and the fabric's share in place (`_floor_params`'
    and `_fabric_params`' figures)."""
    if ("launch", "system") in values and topology.nccl is not None:
        launch = Figure(values[("launch", "system")] * unit, said(("launch", "system")))
        topology = replace(topology, nccl=replace(topology.nccl, launch_per_gpu=launch))
    transport = topology.levels[level].transport
    if ("floor", level) in values and transport is not None:
        levels = list(topology.levels)
        floor = Figure(values[("floor", level)] * unit, said(("floor", level)))
        levels[level] = replace(levels[level], transport=replace(transport, floor=floor))
        topology = replace(topology, levels=tuple(levels))
    transport = topology.levels[level].transport
    if ("fabric_share", level) in values and transport is not None:
        levels = list(topology.levels)
        fabric_share = Figure(math.exp(values[("fabric_share", level)]), said(("fabric_share", level)))
        levels[level] = replace(levels[level], transport=replace(transport, fabric_share=fabric_share))
        topology = replace(topology, levels=tuple(levels))
    return topology


def _fills(topology: Topology, level: int, points: list[_Point], view: NcclView) -> bool:
    """Whether some point runs a pipelined algorithm across nodes whose fill a network's
    stages would change (only there is a fill to fit)."""
    if view.node_level is None or level > view.node_level or topology.levels[level].transport is None:
        return False
    if not any(group_layout(topology, view, p.devices)[0] > 1 for p in points):
        return False
    probe = _apply_values(topology, level, {("stages", level): 1.0}, "probe")
    return any(e.fill_s > 0 for e in _evaluate(probe, points))


def _pseudo_huber(r: np.ndarray, scale: float) -> np.ndarray:
    """A residual whose square is the pseudo-Huber loss: r for |r| << scale, about
    sqrt(2 scale |r|) beyond (smooth, so least squares can take its derivatives)."""
    return np.sign(r) * np.sqrt(2 * scale ** 2 * (np.sqrt(1 + (r / scale) ** 2) - 1))


def _cauchy(r: np.ndarray, scale: float) -> np.ndarray:
    """A residual whose square is the Cauchy loss: r for |r| << scale, growing only as the log
    beyond, so a wild size (a stall ten times the call) pulls no harder than a moderate one."""
    return np.sign(r) * scale * np.sqrt(np.log1p((r / scale) ** 2))


def _solve(setup: _Setup, x0: np.ndarray, keep: np.ndarray, loss=_pseudo_huber) -> np.ndarray:
    from scipy.optimize import least_squares  # only a fit needs scipy (a ranking imports this module for its error)
    starts = np.array([p.start for p in setup.params])
    priors = np.array([p.prior for p in setup.params])
    lower = np.array([p.lower for p in setup.params])
    upper = np.array([p.upper for p in setup.params])
    rates = np.array([p.kind in RATE_KINDS for p in setup.params], dtype=bool)

    def residuals(x):
        r = np.log(_predict(setup, x)[keep] / setup.times[keep])
        # the priors cost like the data's outliers (linearly), so a figure moves only when
        # enough sizes ask for it: about 1 / scale sizes off the same way (a narrower scale
        # asks more of them)
        prior = _pseudo_huber((x - starts) / priors, ROBUST_SCALE)
        if setup.prior_weight is not None:  # heavy-tailed on the rates
            prior = np.where(rates, setup.prior_weight * _cauchy((x - starts) / priors, 1.0), prior)
        return np.concatenate([loss(r, ROBUST_SCALE), prior])

    # start inside the bounds: the solver scales its steps by the distance to a bound, and a
    # figure started on one (no overhead, efficiency 1) would never leave it; and from a second
    # start with a sizeable overhead, since an overhead and the latency factors trade off
    margin = np.minimum(0.05, (upper - lower) / 4)
    starts_x = [np.clip(x0, lower + margin, upper - margin)]
    overhead = [i for i, p in enumerate(setup.params) if p.kind == "overhead"]
    if overhead:
        other = starts_x[0].copy()
        other[overhead[0]] = max(other[overhead[0]], 0.25)
        starts_x.append(other)
    # a per-call floor below every modelled time has no slope (it is a max()), so a floor started
    # at the transport's default of none never moves: start it also at the shortest measured call
    # (half an overhead unit), from where the data pull it down to what the shortest calls take
    floors = [i for i, p in enumerate(setup.params) if p.kind == "floor"]
    if floors:
        other = starts_x[0].copy()
        other[floors] = np.maximum(other[floors], 0.5)
        starts_x.append(other)
    best = None
    for start in starts_x:
        result = least_squares(residuals, start, bounds=(lower, upper), diff_step=1e-4, x_scale=1.0, ftol=1e-6,
                               xtol=1e-6, gtol=1e-8, max_nfev=40 * len(start) + 40)
        if best is None or result.cost < best.cost:
            best = result
    return best.x


def _outliers(residuals: np.ndarray) -> np.ndarray:
    """The sizes off by more than OUTLIER and OUTLIER_SPREAD robust deviations. Fewer than half
    are ever flagged: when most sizes miss the same way (a per-call floor the first fit could not
    reach: every size of the A3 High excerpts took three times the model's), the miss is the
    figures' to fit, and only the sizes that far off the residuals' median are outliers."""
    centre = float(np.median(residuals))
    spread = 1.4826 * float(np.median(np.abs(residuals - centre)))
    threshold = max(math.log1p(OUTLIER), OUTLIER_SPREAD * spread)
    flagged = np.abs(residuals) > threshold
    if 2 * int(flagged.sum()) < len(residuals):
        return flagged
    flagged &= np.abs(residuals - centre) > threshold
    return flagged if 2 * int(flagged.sum()) < len(residuals) else np.zeros(len(residuals), dtype=bool)


def _predict(setup: _Setup, x: np.ndarray) -> np.ndarray:
    values = dict(zip(((p.kind, p.key) for p in setup.params), x))
    trial = _apply_values(setup.topology, setup.level, values, "trial", setup.overhead_unit)
    view = nccl_view(trial)
    hardware = view.hardware
    overhead = view.overheads[setup.level]
    if overhead:
        hardware = replace(hardware, overhead_s=overhead)
    if view.protocols[setup.level]:
        hardware = replace(hardware, protocol_figures=view.protocols[setup.level])
    seconds = np.array([nccl.timed(hardware, call, choice, table).time_s for call, choice, table in setup.calls])
    return seconds[setup.index]


def _apply(setup: _Setup, x: np.ndarray, source: dict[tuple, str]) -> Topology:
    values = dict(zip(((p.kind, p.key) for p in setup.params), x))
    return _apply_values(setup.topology, setup.level, values, source, setup.overhead_unit)


def _apply_values(topology: Topology, level: int, values: dict[tuple, float], source, overhead_unit: float = 1.0
                  ) -> Topology:
    """The topology with the fitted figures in place: efficiencies on their levels, and the
    overhead, pipeline stages and per-protocol factors on the level the groups span."""
    def said(key) -> str:
        return source if isinstance(source, str) else source[key]

    values = {key: float(x) for key, x in values.items()}
    levels = list(topology.levels)
    for (kind, key), x in values.items():
        if kind == "efficiency":
            levels[key] = replace(levels[key], efficiency=Figure(math.exp(x), said((kind, key))))
    target = levels[level]
    if ("overhead", level) in values:
        overhead = values[("overhead", level)] * overhead_unit
        # below a nanosecond (what a topology file can say) there is no overhead
        target = replace(target, overhead=Figure(overhead, said(("overhead", level))) if overhead >= 1e-9 else None)
    if ("stages", level) in values and target.transport is not None:
        target = replace(target, transport=replace(target.transport,
                                                   stages=Figure(values[("stages", level)], said(("stages", level)))))
    factors = dict(target.protocols)
    for protocol in PROTOCOLS:
        old = factors.get(protocol, ProtocolFactors())
        bandwidth, latency = old.bandwidth, old.latency
        if ("bandwidth", protocol) in values:
            bandwidth = Figure(math.exp(values[("bandwidth", protocol)]), said(("bandwidth", protocol)))
        if ("latency", protocol) in values:
            latency = Figure(math.exp(values[("latency", protocol)]), said(("latency", protocol)))
        if bandwidth is not None or latency is not None:
            factors[protocol] = ProtocolFactors(bandwidth, latency)
    target = replace(target, protocols=tuple((p, factors[p]) for p in PROTOCOLS if p in factors))
    levels[level] = target
    return _with_floors(replace(topology, levels=tuple(levels)), level, values, said, overhead_unit)


def _source(setup: _Setup, keep: np.ndarray) -> dict[tuple, str]:
    """Every fitted figure's source: the files, and the sizes it was fitted on."""
    points = [p for p, k in zip(setup.points, keep) if k]
    files = ", ".join(sorted({_name(p.measurement.file) for p in setup.points}))
    outliers = len(setup.points) - len(points)
    flagged = f", {outliers} outlier{'s' if outliers != 1 else ''} left out" if outliers else ""

    def span(chosen) -> str:
        sizes = sorted({p.measurement.bytes for p in chosen})
        if not sizes:
            return "no size"
        if len(sizes) == 1:
            return f"1 size ({format_bytes(sizes[0])})"
        return f"{len(sizes)} sizes ({format_bytes(sizes[0])} to {format_bytes(sizes[-1])})"

    whole = (f"fitted by synth calibrate (NCCL model) from {files} by robust least squares: {len(points)} points, "
             f"{span(points)}{flagged}")
    estimates = _evaluate(setup.topology, points)
    result = {}
    for p in setup.params:
        if p.kind in ("bandwidth", "latency"):
            chosen = [q for q, e in zip(points, estimates) if e.choice.protocol == p.key]
            what = "rate over the modelled one" if p.kind == "bandwidth" else "latency over NCCL's own"
            result[(p.kind, p.key)] = (f"fitted by synth calibrate (NCCL model) from {files} by robust least "
                                       f"squares: {p.key}'s {what}, on the {span(chosen)} at which NCCL picks "
                                       f"{p.key}{flagged}")
        else:
            result[(p.kind, p.key)] = whole
    return result


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


def _efficiency_of(topology: Topology, view: NcclView, index: int) -> float:
    if view.node_level is not None and index == view.node_level:
        return view.hardware.network.link.efficiency
    return view.hardware.intra.efficiency


def _group_fits(topology: Topology, points: list[_Point], estimates: list[nccl.Estimate], view: NcclView,
                outliers: np.ndarray) -> tuple[GroupFit, ...]:
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
                                    e.choice.algorithm, e.choice.protocol, max(shares, key=shares.get),
                                    bool(outliers[i])))
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
