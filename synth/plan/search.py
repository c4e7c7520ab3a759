"""The planner: every degree choice x every placement x every setting, predicted and ranked.

For each `Degrees` the model and the limits allow (degrees.py), every placement of its axes
on the system (synth.placement.listed_placements, with the user's Inside/Factor
constraints), and every runnable setting (micro-batch size, interleaving, sequence
parallelism, recomputation, sharded optimizer), the step is predicted (step.py): first without
its data-parallel terms (a lower bound), then, in the order of those bounds, in full where the
bound does not already lose to the top and the Pareto set. With data parallelism a (degrees,
settings) pair's placements wait as one group, by a floor below all their bounds
(step.group_floor), and are bounded one by one only if that floor does not lose already; the
group waits first by a floor without its collectives (nothing priced), and its exact floor is
found only if that one does not stop it (about half the groups of DeepSeek-V3 on 131,072 GPUs stop there). Candidates
whose memory exceeds the device's are dropped and counted; the rest are ranked by step time
(ties: less memory, then the degrees', placement's and settings' text, so every run agrees),
and the Pareto set of step time against memory is kept.

The size of the search is counted before it starts (placements per degree choice exactly,
under the constraints: synth.placement.count_matching; the group shapes of its collectives as
those placements have them, listed without Z3, each on its equivalent system), its CPU time
and peak memory estimated from those counts, and a search estimated over the time budget or
the memory budget, or with a choice of more placements than can be listed, is refused with
what to fix (`SearchBudgetError`, its fields for the command to name options).
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from synth.errors import NoSolutionError, UsageError
from synth.placement import (MAX_PLACEMENTS, Factor, Inside, Placement, count_matching, listed_placements, make_placement,
                             sorted_matrices)
from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import DegreeLimits, Degrees, divisors, enumerate_degrees
from synth.plan.equivalent import equivalent_sizes
from synth.plan.errors import BudgetValueError, SearchBudgetError
from synth.plan.formulas import RECOMPUTE
from synth.plan.model import Transformer
from synth.plan.reserve import MemoryReserve
from synth.plan.step import Compute, Prediction, Settings, group_floor, predict, representatives, settings_problem
from synth.topology import Topology

# What the search costs, in CPU seconds (a loaded machine adds wall time, not CPU time) and
# bytes, unit by unit of the work it does (benchmarks/plan_speed.py --units times each unit
# inside real plans; results/plan-speed/units.md has the figures and the check):
# * every first bound: a candidate predicted without its data-parallel terms where it is bounded
#   alone (no data parallelism, or HSDP), and with data parallelism one floor per (degree
#   choice, settings) group over the choice's representatives (step.group_floor: one per
#   distinct tensor-, context- and expert-parallel span), first without its collectives; its
#   kernel times, its communication looked up, its memory. The groups the floor does not stop
#   (their exact floors, their placements' own bounds) are known only during the search: this
#   unit is an average over the first bounds of the space, the stopped ones included;
# * every placement is listed (synth.placement.listed_placements: from exponent tables);
# * every distinct group shape the lower-bound pass costs (tensor-, context-, expert-parallel
#   groups and pipeline transfers) is searched once (its goals' program searches, a MoE
#   dispatch's two-stage forms, synth/plan/costs.py) on its equivalent system
#   (synth/plan/equivalent.py): a fixed part (the search's context) and a part per device of
#   that system;
# * for every pair of a degree choice (with dp > 1) and a span of its data-parallel groups,
#   the full predictions of the candidates the bound does not stop: their gradient schedules
#   (bucket dynamic program, each bucket's program from the programs costed on the
#   data-parallel shape's equivalent system, every bucket size of a sharded schedule in
#   batches) and the sharded optimizer's gathers: a part per pair, and per distinct span a part
#   per device of its equivalent system. Which candidates the bound stops is known only once
#   they are predicted, so this unit too is an average over the pairs of the space.
# Derived by benchmarks/plan_speed.py --units from the Selene GPT-3 175B series (64 to 131,072
# GPUs) and checked on other plans, dense and MoE (results/plan-speed/units.md).
SECONDS_PER_BOUND = 61.8e-6
SECONDS_PER_PLACEMENT = 14.0e-6  # the Placement objects: the estimate has listed the matrices already
SECONDS_PER_SHAPE = 39.4e-3
SECONDS_PER_SHAPE_DEVICE = 6.78e-6
SECONDS_PER_SCHEDULE = 1.09e-3
SECONDS_PER_SCHEDULE_DEVICE = 12.7e-6  # per device of a distinct span's equivalent system
# Memory: the process's bytes before the search, then per device of the equivalent systems
# (networks, groups, per-link tables, the engines' canonical devices). Set above the peak RSS of
# every MoE plan of results/plan-speed/moe.md (14,296 to 3,176,920 such devices; the largest
# part per device was 735 bytes, DeepSeek-V3 on 131,072 GPUs) and of the dense plans of
# results/plan-speed/README.md, once translated groups kept only one group's device links
# (synth/model/engine.py: 2000 bytes before): no part grows with the member pairs of a group
# (a 16,384-member data-parallel span's 2^28 pairs took no more than its devices' share). The
# base grew by 20 MiB once groups of up to 256 members had every valid program costed at once
# (synth/plan/costs.py; a small plan's peak rose 13 MiB, DeepSeek-V3 on 2,048 GPUs to 206 MiB).
BASE_BYTES = 205 * 2**20
BYTES_PER_DEVICE = 750
DEFAULT_BUDGET_S = 300.0
MEMORY_SHARE = 0.8  # of the memory the machine has available: the default memory budget
MAX_VIRTUAL = 8
# a queue entry: a candidate's first bound, its tighter one, a group's floor, a group's floor without its
# collectives (found without pricing any: the group's exact floor is found only if that one does not stop it)
BOUND, TIGHTENED, GROUP, UNPRICED = 0, 1, 2, 3


def check_budget(value: float, which: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        unit = "seconds" if which == "time" else "bytes"
        raise BudgetValueError(f"{which} budget {value!r}: give a positive, finite number of {unit}",
                               which=which, value=value)


def available_memory() -> int | None:
    """Bytes this machine can give a process now (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


@dataclass(frozen=True)
class SearchSpace:
    """The settings tried for every degree choice and placement (runnable ones only)."""

    micro_batches: tuple[int, ...] = ()  # empty: the model's own micro-batch
    virtual: tuple[int, ...] = ()  # empty: 1 and every divisor of L/p up to MAX_VIRTUAL
    sequence_parallel: tuple[bool, ...] = (False, True)
    recompute: tuple[str, ...] = RECOMPUTE
    sharded_optimizer: tuple[bool, ...] = (False, True)
    overlap_gradients: bool = True
    zero_stages: tuple[int, ...] = (1,)  # ZeRO stages tried with the sharded optimizer
    tp_overlap: bool = True  # with sequence parallelism (never slower in the step model: synth/plan/step.py)
    overlap_param_gather: bool = True  # with the sharded optimizer (never slower either)
    hsdp: tuple[bool, ...] = (False,)  # with ZeRO-3: also shard inside a node and replicate across (HSDP)
    overlap_p2p: bool = True  # interleaved schedule: pipeline transfers behind compute (Megatron's default)
    # activation offload of L - 1 layers (synth/plan/offload.py), on devices with a host link
    # figure: it never saves time, so it ranks first only where its copies hide entirely (then
    # the smaller memory breaks the tie) and otherwise enters the Pareto set or fits what did not
    activation_offload: tuple[bool, ...] = (False, True)
    # MoE with expert parallelism: dispatch and combine behind the other micro-batch's compute
    # (--overlap-moe-expert-parallel-comm); never slower, one more micro-batch in flight
    ep_overlap: tuple[bool, ...] = (False, True)

    def settings(self, model: Transformer, degrees: Degrees, host_link: bool = True,
                 refused: Counter | None = None) -> list[Settings]:
        """The runnable settings (`refused`, when given, counts the others by Megatron's reason)."""
        micro = self.micro_batches or (model.micro_batch,)
        if self.virtual:
            virtual = self.virtual
        else:
            virtual = [v for v in divisors(model.layers // degrees.pp) if v <= MAX_VIRTUAL] if degrees.pp > 1 else [1]
        result = []
        for b in micro:
            for v in virtual:
                for sp in self.sequence_parallel:
                    for rc in self.recompute:
                        for sharded in self.sharded_optimizer:
                            for stage in (self.zero_stages if sharded else (1,)):
                                for hsdp in (self.hsdp if stage == 3 else (False,)):
                                    for off in (self.activation_offload if host_link else (False,)):
                                        for eo in (self.ep_overlap if degrees.ep > 1 else (False,)):
                                            settings = Settings(b, v, sp, rc, sharded, self.overlap_gradients,
                                                                self.tp_overlap and sp,
                                                                self.overlap_param_gather and sharded and stage < 3,
                                                                stage, hsdp, self.overlap_p2p and v > 1,
                                                                model.layers - 1 if off else 0, eo)
                                            problem = settings_problem(model, degrees, settings)
                                            if problem is None:
                                                result.append(settings)
                                            elif refused is not None:
                                                refused[problem] += 1
        return result


@dataclass(frozen=True)
class PlanRequest:
    model: Transformer
    topology: Topology
    compute: Compute
    limits: DegreeLimits = DegreeLimits()
    constraints: tuple = ()  # synth.placement Inside / Factor on the roles pp, dp, cp, tp
    space: SearchSpace = SearchSpace()
    backend: str = "nccl"
    max_len: int = 5
    memory_headroom: float = 0.0  # fraction of the device memory the allocator may lose to fragmentation: below it, tight
    top: int = 10
    budget_s: float = DEFAULT_BUDGET_S
    memory_budget_bytes: float | None = None  # None: MEMORY_SHARE of what the machine has available
    placement_filter: Callable[[Placement, Degrees], bool] | None = None  # keep only these (e.g. Megatron-launchable)
    memory_reserve: MemoryReserve | None = None  # bytes kept free (reserve.py)

    def __post_init__(self):
        check_budget(self.budget_s, "time")
        if self.memory_budget_bytes is not None:
            check_budget(self.memory_budget_bytes, "memory")

    def memory_budget(self) -> float | None:
        """Bytes the search may use (None: unknown, not checked)."""
        if self.memory_budget_bytes is not None:
            return self.memory_budget_bytes
        available = available_memory()
        return None if available is None else MEMORY_SHARE * available

    @property
    def memory_limit(self) -> float:
        """What a candidate may use before the reserve's part per communicator."""
        fixed = self.memory_reserve.fixed_bytes if self.memory_reserve else 0.0
        return self.compute.memory_bytes - fixed

    def memory_limit_for(self, degrees: Degrees) -> float:
        """What a candidate with these degrees may use: the device's memory less the reserve (the
        CUDA context, cuBLAS's workspace, NCCL's buffers: reserve.py). Above it a candidate is dropped."""
        if self.memory_reserve is None:
            return self.memory_limit
        return self.compute.memory_bytes - self.memory_reserve.bytes_for(degrees)

    def margin(self, prediction) -> float:
        """Bytes a kept candidate leaves free below its limit."""
        return self.memory_limit_for(prediction.degrees) - prediction.memory.peak

    def tight(self, prediction) -> bool:
        """Whether a kept candidate's margin is under the fragmentation headroom (reserve.py): it
        fits beside what the CUDA context, cuBLAS and NCCL take, but not beside the allocator's
        measured average fragmentation as well."""
        return self.margin(prediction) < self.memory_headroom * self.compute.memory_bytes


@dataclass(frozen=True)
class SearchSize:
    degrees: int
    placements: int  # under the constraints (a choice over MAX_PLACEMENTS counts MAX_PLACEMENTS + 1)
    candidates: int  # placements x runnable settings
    estimated_s: float
    refused: tuple[tuple[str, int], ...]  # degree choices the model or the limits refuse, by reason
    shapes: int = 0  # distinct group shapes the collectives may need (at most)
    devices: int = 0  # devices of their equivalent systems, summed
    estimated_bytes: float = 0.0  # the process's peak memory
    too_many_placements: tuple[Degrees, ...] = ()  # choices whose placements cannot be listed
    searched_shapes: int = 0  # group shapes the lower-bound pass costs (all but the data-parallel groups')
    searched_devices: int = 0  # devices of their equivalent systems, summed
    schedules: int = 0  # (degree choice, data-parallel span) pairs: the gradient schedules' unit
    schedule_devices: int = 0  # per distinct span: the devices of its equivalent system, summed
    refused_settings: tuple[tuple[str, int], ...] = ()  # settings not runnable, by reason (Megatron's checks)
    runnable_choices: int = -1  # degree choices with a runnable setting (-1: not counted)
    bounds: int = 0  # first bounds: candidates bounded alone, and (choice, settings) groups x their representatives

    def seconds_by_unit(self) -> dict[str, float]:
        """The estimated CPU seconds split by unit of work (module constants)."""
        return {"bounds": self.bounds * SECONDS_PER_BOUND,
                "placements": self.placements * SECONDS_PER_PLACEMENT,
                "group_shapes": self.searched_shapes * SECONDS_PER_SHAPE + self.searched_devices * SECONDS_PER_SHAPE_DEVICE,
                "gradient_schedules": self.schedules * SECONDS_PER_SCHEDULE
                + self.schedule_devices * SECONDS_PER_SCHEDULE_DEVICE}

    def to_json(self) -> dict:
        return {"degrees": self.degrees, "placements": self.placements, "candidates": self.candidates,
                "group_shapes": self.shapes, "equivalent_devices": self.devices, "bounds": self.bounds,
                "searched_shapes": self.searched_shapes, "searched_devices": self.searched_devices,
                "gradient_schedules": self.schedules, "schedule_devices": self.schedule_devices,
                "estimated_s_by_unit": self.seconds_by_unit(),
                "estimated_s": self.estimated_s, "estimated_bytes": self.estimated_bytes,
                "refused_degrees": dict(self.refused)}


@dataclass
class PlanResult:
    request: PlanRequest
    size: SearchSize
    ranked: list[Prediction]  # the top candidates that fit, fastest first
    pareto: list[Prediction]  # no other is both faster and smaller, fastest first
    evaluated: int = 0
    bounded: int = 0  # candidates whose lower bound already lost to the top and the Pareto set (not costed further)
    dropped_memory: int = 0  # candidates that do not fit in the device's memory
    no_placement: int = 0  # degree choices whose axes have no placement under the constraints
    filtered: int = 0  # placements the request's placement_filter left out
    smallest_dropped: Prediction | None = None  # the least memory among the dropped (to say by how much)
    elapsed_s: float = 0.0
    cpu_s: float = 0.0  # the search's CPU time (what the estimate predicts: a loaded machine adds wall time)
    costs: CommunicationCosts | None = None  # the search's memoized costs, for explaining rows
    interrupted_after: int | None = None  # Ctrl-C: the placements searched before it (the rows rank those)


def _key(prediction: Prediction) -> tuple:
    return (prediction.step_s, prediction.memory.peak, prediction.degrees.text, prediction.placement.to_text(),
            prediction.settings.text)


def _constraints_for(degrees: Degrees, constraints) -> tuple | None:
    """The constraints on this choice's axes; None when a factor > 1 is fixed for a role of size 1,
    or when one names `ep` and the choice is folded (its expert groups are no axis to constrain)."""
    present = {axis.name for axis in degrees.axes()}
    if degrees.folded and any(constraint.axis == "ep" for constraint in constraints):
        return None
    kept = []
    for constraint in constraints:
        if constraint.axis in present:
            kept.append(constraint)
        elif isinstance(constraint, Factor) and constraint.value != 1:
            return None
        elif not isinstance(constraint, (Inside, Factor)):
            raise UsageError(f"unknown placement constraint {constraint!r}")
    return tuple(kept)


def expert_spans(choice: Degrees, topology: Topology, axes, matrix) -> dict[str, tuple[int, ...]]:
    """A folded choice's expert groups (synth/plan/folding.py) on the placement `matrix`: their
    spans by name (`ep`, and `etp`, `edp` where larger than 1), or {} when one is cut unevenly
    (`Degrees.expert_aligned`: the search skips that placement)."""
    placement = make_placement(topology, axes, matrix)
    if not choice.expert_aligned(placement):
        return {}
    groups = [choice.expert_group(), choice.expert_tp_group(), choice.expert_data_axes()]
    return {group.name: group.span(placement) for group in groups if group and group.size > 1}


def estimate(request: PlanRequest) -> SearchSize:
    """The search's size, time and memory, counted before it starts (module docstring): exact
    placement and candidate counts, and the group shapes whose programs it searches (the span
    per level of each collective's axis over every placement, listed without Z3), each on its
    equivalent system."""
    refused: Counter = Counter()
    topology = request.topology
    degrees = list(enumerate_degrees(topology.device_count, request.model, request.limits, refused))
    placements = candidates = 0
    collectives: set[tuple[int, ...]] = set()  # group shapes of the reductions: a program search each
    transfers: set[tuple[int, ...]] = set()  # of the pipeline's point-to-point: a network each
    too_many = []
    refused_settings: Counter = Counter()
    runnable = 0
    data_spans: set[tuple[Degrees, tuple[int, ...], str]] = set()  # (choice, its data-parallel (or expert
    # data-parallel) groups' span, which)
    lower_bound: set[tuple[int, ...]] = set()  # shapes the lower-bound pass costs (not the data-parallel ones)
    bounds = 0  # first bounds (SearchSize.bounds)
    for choice in degrees:
        constraints = _constraints_for(choice, request.constraints)
        settings = request.space.settings(request.model, choice, request.compute.host_bandwidth is not None,
                                          refused_settings)
        runnable += bool(settings)
        if constraints is None or not settings:
            continue
        axes = choice.axes()
        try:
            count = count_matching(topology, axes, constraints, MAX_PLACEMENTS)
        except NoSolutionError:
            continue
        placements += count
        candidates += count * len(settings)
        if count > MAX_PLACEMENTS:
            too_many.append(choice)
            continue
        rows = [(index, axis.name) for index, axis in enumerate(axes) if axis.size > 1]
        # the search's groups (search.plan): with data parallelism every settings but HSDP's waits as
        # one group, bounded by one floor over the choice's representatives (step.representatives)
        grouped = sum(1 for setting in settings if choice.dp > 1 and not setting.hsdp)
        represented = [index for index, axis in enumerate(axes) if axis.name in ("tp", "cp", "ep") and axis.size > 1]
        classes = set()
        data_rows = [index for index, axis in enumerate(axes) if axis.name in choice.data_axes()]
        # a MoE choice reduces its routed experts' gradients in a schedule of their own, over the
        # expert data-parallel groups (step.py): one more schedule per (choice, span)
        expert_rows = ([index for index, axis in enumerate(axes) if axis.name in choice.expert_data_axes()]
                       if request.model.is_moe and choice.expert_data_axes() and not choice.folded else None)
        for matrix in sorted_matrices(topology, axes, constraints):
            folded = expert_spans(choice, topology, axes, matrix) if choice.folded else None
            if folded is not None and not folded:
                continue  # a placement the folded expert groups cut unevenly: the search skips it
            for index, name in rows:
                (transfers if name == "pp" else collectives).add(matrix[index])
                if index not in data_rows:
                    lower_bound.add(matrix[index])
            for name, shape in (folded or {}).items():
                if name != "edp":  # the expert data-parallel groups are data_spans' (below), as the dp axis is
                    collectives.add(shape)
                    lower_bound.add(shape)
            # a folded choice's representatives are told apart by its expert groups too (step.representatives)
            classes.add(tuple(matrix[index] for index in represented)
                        + tuple(shape for name, shape in sorted((folded or {}).items()) if name != "edp"))
            if choice.dp > 1:
                expert_span = (folded or {}).get("edp")
                for rows_of, role in ((data_rows, "data"), (expert_rows, "expert"), (expert_span, "expert")):
                    if rows_of is None:
                        continue
                    pair = (choice, rows_of if rows_of is expert_span else
                            tuple(math.prod(matrix[index][level] for index in rows_of)
                                  for level in range(len(topology.sizes))), role)
                    data_spans.add(pair)
        bounds += count * (len(settings) - grouped) + grouped * len(classes)
    shapes = collectives | transfers | lower_bound | {span for _, span, _ in data_spans}
    equivalent = {shape: math.prod(equivalent_sizes(topology, shape)) for shape in shapes}
    devices = sum(equivalent[shape] for shape in collectives | transfers)
    searched_devices = sum(equivalent[shape] for shape in lower_bound)
    schedules = len(data_spans)
    spans = {span for _, span, _ in data_spans}
    schedule_devices = sum(equivalent[span] for span in spans)
    seconds = (bounds * SECONDS_PER_BOUND + placements * SECONDS_PER_PLACEMENT
               + len(lower_bound) * SECONDS_PER_SHAPE + searched_devices * SECONDS_PER_SHAPE_DEVICE
               + schedules * SECONDS_PER_SCHEDULE + schedule_devices * SECONDS_PER_SCHEDULE_DEVICE)
    memory = BASE_BYTES + devices * BYTES_PER_DEVICE
    return SearchSize(len(degrees), placements, candidates, seconds, tuple(sorted(refused.items())),
                      len(collectives), devices, memory, tuple(too_many), len(lower_bound), searched_devices,
                      schedules, schedule_devices, tuple(sorted(refused_settings.items())), runnable, bounds)


def check_size(size: SearchSize, request: PlanRequest) -> None:
    """Refuse what cannot finish: no degree choice, a choice whose placements cannot be listed, a
    search estimated over the time budget or over the memory budget."""
    if size.degrees == 0:
        reasons = "; ".join(f"{reason}: {count}" for reason, count in size.refused) or "none"
        raise NoSolutionError(f"no degree choice for {request.model.name} on {request.topology.device_count} devices "
                              f"passes the model's and the limits' rules (refused: {reasons}); relax a fixed degree")
    if size.runnable_choices == 0 and size.refused_settings:
        reasons = "; ".join(f"{reason}: {count}" for reason, count in size.refused_settings)
        raise UsageError(f"no settings for {request.model.name} on {request.topology.device_count} devices are "
                         f"runnable with any degree choice ({reasons}); change the settings asked for")
    work = (f"the search has {size.degrees} degree choices, {size.placements} placements, {size.candidates} candidates "
            f"and up to {size.shapes} group shapes (on {size.devices} devices of their equivalent systems), "
            f"estimated {size.estimated_s:.0f} s and {size.estimated_bytes / 2**20:,.0f} MiB here")
    if size.too_many_placements:
        shown = ", ".join(choice.text for choice in size.too_many_placements[:3])
        raise SearchBudgetError(f"{len(size.too_many_placements)} degree choice(s) ({shown}) have more than "
                                f"{MAX_PLACEMENTS} placements each, too many to list",
                                "fix a degree or keep axes inside levels",
                                size=size, over="placements", budget=MAX_PLACEMENTS)
    if size.estimated_s > request.budget_s:
        raise SearchBudgetError(f"{work}, over the {request.budget_s:g} s time budget",
                                "fix a degree, keep axes inside levels, try fewer settings, or raise the time budget",
                                size=size, over="time", budget=request.budget_s)
    memory = request.memory_budget()
    if memory is not None and size.estimated_bytes > memory:
        raise SearchBudgetError(f"{work}, over the {memory / 2**20:,.0f} MiB memory budget",
                                "fix a degree, keep axes inside levels, or use a machine with more memory",
                                size=size, over="memory", budget=memory)


def plan(request: PlanRequest, progress: Callable[[int, int], None] | None = None,
         size: SearchSize | None = None, costs: CommunicationCosts | None = None) -> PlanResult:
    """Search, predict and rank (module docstring); `progress(done, total)` after each placement.
    `size`: the request's estimate when the caller made it already (it is checked again).
    `costs`: the request topology's costs when the caller keeps them across plans (a sweep shares
    priced collectives between points: synth/codesign/run.py)."""
    size = size or estimate(request)
    check_size(size, request)
    started, cpu = time.perf_counter(), time.process_time()
    if costs is None:
        costs = CommunicationCosts(request.topology, request.backend, request.max_len)
    result = PlanResult(request, size, [], [], costs=costs)
    kept: list = []  # at least the `top` fastest so far, as (key, prediction)
    fitting: list[Prediction] = []  # Pareto candidates: kept only while nobody dominates them
    pending: list = []  # (bound's key, state, degrees, placement or group's placements, settings): data parallelism
    terms: dict = {}  # the group floors' collective terms by what they read (step.group_floor), every group's
    done = 0
    try:
        for degrees in enumerate_degrees(request.topology.device_count, request.model, request.limits):
            settings = request.space.settings(request.model, degrees, request.compute.host_bandwidth is not None)
            constraints = _constraints_for(degrees, request.constraints)
            if constraints is None or not settings:
                result.no_placement += constraints is None
                continue
            try:
                placements = listed_placements(request.topology, degrees.axes(), constraints)
            except NoSolutionError:
                result.no_placement += 1
                continue
            if degrees.folded:  # placements whose digits the folded expert groups cut unevenly are not priced
                placements = [placement for placement in placements if degrees.expert_aligned(placement)]
                if not placements:
                    result.no_placement += 1
                    continue
            memory_limit = request.memory_limit_for(degrees)
            # With data parallelism each (degrees, settings) pair but HSDP's (its memory depends on
            # the placement) enters the queue as one group of placements, by its floor
            # (step.group_floor: placement-independent), and is expanded into its candidates'
            # bounds only if it reaches the front of the queue without being stopped.
            grouped = {setting for setting in settings if degrees.dp > 1 and not setting.hsdp}
            groups: list = []  # (floor, setting) of the groups that fit
            listed: list[Placement] = []  # the placements the filter keeps
            if grouped:
                shown = [placement for placement in placements if request.placement_filter is None
                         or request.placement_filter(placement, degrees)]
                classes = representatives(costs, degrees, shown)
            for placement in placements:
                if request.placement_filter is not None and not request.placement_filter(placement, degrees):
                    result.filtered += 1
                    done += 1
                    if progress is not None:
                        progress(done, size.placements)
                    continue
                listed.append(placement)
                for setting in settings:
                    if setting in grouped:
                        if len(listed) == 1:  # a group's memory is the same on every placement
                            floor = group_floor(request.model, request.compute, costs, degrees, setting, classes,
                                                communication=False)
                            if floor.memory.peak <= memory_limit:
                                groups.append((floor, setting))
                            elif result.smallest_dropped is None or floor.memory.peak < result.smallest_dropped.memory.peak:
                                result.smallest_dropped = predict(request.model, request.compute, costs, degrees,
                                                                  placement, setting, data_parallel=False)
                        continue
                    result.evaluated += 1
                    prediction = predict(request.model, request.compute, costs, degrees, placement, setting,
                                         data_parallel=False)
                    if prediction.memory.peak > memory_limit:
                        result.dropped_memory += 1
                        if result.smallest_dropped is None or prediction.memory.peak < result.smallest_dropped.memory.peak:
                            result.smallest_dropped = prediction
                        continue
                    if degrees.dp > 1:  # its full prediction waits for the second pass, by its bound
                        pending.append((_key(prediction), BOUND, degrees, placement, setting))
                        continue
                    _keep(result, kept, fitting, prediction, request.top)
                done += 1
                if progress is not None:
                    progress(done, size.placements)
            result.evaluated += len(listed) * len(grouped)
            result.dropped_memory += len(listed) * (len(grouped) - len(groups))
            for floor, setting in groups:
                key = (floor.step_s, floor.memory.peak, degrees.text, "", setting.text)
                pending.append((key, UNPRICED, degrees, (tuple(listed), classes), setting))
    except KeyboardInterrupt:  # rank what was found; the caller says the search was cut short
        if not kept and not pending:
            raise
        result.interrupted_after = done
    # Second pass: the full predictions (their gradient schedules are most of a search's work) in
    # the order of their bounds, so the fastest are kept first and the bound stops the most.
    # Which candidates are kept does not depend on the order (_keep, _cannot_rank).
    # A candidate the first bound does not stop gets a tighter one first (its gradient schedules'
    # lower bounds, step.predict's `floor`) and waits in the queue by it when others come before.
    # A group (its floor is below every member's first bound) that is not stopped is replaced by
    # its members' first bounds.
    queue = [(key, index, state, degrees, where, setting)
             for index, (key, state, degrees, where, setting) in enumerate(pending)]
    counter = itertools.count(len(queue))
    pending.clear()
    heapq.heapify(queue)
    try:
        while queue:
            key, index, state, degrees, where, setting = heapq.heappop(queue)
            if _cannot_rank(key, kept, fitting, request.top):
                result.bounded += len(where[0]) if state == UNPRICED else len(where) if state == GROUP else 1
                continue
            if state == UNPRICED:  # its exact floor (no lower) takes its place in the queue
                listed, classes = where
                floor = group_floor(request.model, request.compute, costs, degrees, setting, classes, terms)
                heapq.heappush(queue, ((floor.step_s, floor.memory.peak, degrees.text, "", setting.text), index,
                                       GROUP, degrees, listed, setting))
                continue
            if state == GROUP:
                for placement in where:
                    bound = predict(request.model, request.compute, costs, degrees, placement, setting,
                                    data_parallel=False)
                    heapq.heappush(queue, (_key(bound), next(counter), BOUND, degrees, placement, setting))
                continue
            placement = where
            if state == BOUND:
                tighter = _key(predict(request.model, request.compute, costs, degrees, placement, setting, floor=True))
                if tighter > key:
                    if _cannot_rank(tighter, kept, fitting, request.top):
                        result.bounded += 1
                        continue
                    if queue and queue[0][0] < tighter:
                        heapq.heappush(queue, (tighter, index, TIGHTENED, degrees, placement, setting))
                        continue
            _keep(result, kept, fitting, predict(request.model, request.compute, costs, degrees, placement, setting),
                  request.top)
    except KeyboardInterrupt:
        if not kept:
            raise
        result.interrupted_after = done if result.interrupted_after is None else result.interrupted_after
    result.ranked = [prediction for _, prediction in sorted(kept, key=lambda entry: entry[0])[:request.top]]
    result.pareto = _pareto(fitting)
    result.elapsed_s = time.perf_counter() - started
    result.cpu_s = time.process_time() - cpu
    return result


def _keep(result: PlanResult, kept: list, fitting: list, prediction: Prediction, top: int) -> None:
    key = _key(prediction)
    kept.append((key, prediction))
    if len(kept) > 4 * top:
        kept.sort(key=lambda entry: entry[0])
        del kept[top:]
    if not any(_dominates(other, prediction) for other in fitting):
        fitting[:] = [other for other in fitting if not _dominates(prediction, other)]
        fitting.append(prediction)


def _cannot_rank(key: tuple, kept: list, fitting: list, top: int) -> bool:
    """Whether a candidate whose lower bound has this `_key` (its step at least the bound's, its
    memory known exactly) can neither enter the top nor the Pareto set: both are already held by
    faster candidates."""
    if len(kept) < top:
        return False
    kept.sort(key=lambda entry: entry[0])
    del kept[top:]
    # the full prediction's key is >= this one: its step can only grow
    if not kept[-1][0] < key:
        return False
    step_s, peak = key[0], key[1]
    return any(other.step_s <= step_s and other.memory.peak <= peak and _key(other) < key for other in fitting)


def _dominates(a: Prediction, b: Prediction) -> bool:
    """a is at least as fast and as small as b, and strictly better in one (or earlier on ties)."""
    if a.step_s <= b.step_s and a.memory.peak <= b.memory.peak:
        return a.step_s < b.step_s or a.memory.peak < b.memory.peak or _key(a) < _key(b)
    return False


def _pareto(candidates: list[Prediction]) -> list[Prediction]:
    return sorted(candidates, key=_key)
