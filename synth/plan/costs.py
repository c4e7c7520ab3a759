"""The planner's one door to the cost model: every communication time a training step needs.

The step model (synth/plan/step.py) asks four questions, all for one placement on one topology:

* `all_reduce`: the fastest synthesized all-reduce program for S bytes over some axes, and the
  default all-reduce's time (synth.search.best.BestPrograms, the exact cost-guided search);
* `reduce_scatter` / `all_gather`: one backend call over the axes' groups (what sequence
  parallelism and the sharded optimizer run; the program search synthesizes all-reduces only),
  timed by the same estimate as the all-reduce programs (synth/model/estimate.py);
* `all_to_all`: the mixture-of-experts token dispatch and combine over the expert-parallel
  groups, one AllToAll call through the same estimate (NCCL's grouped send/recv to every peer,
  synth/model/algorithms.py's pairwise plan, each device's blocks through its own NIC);
* `point_to_point`: every device sending S bytes to its neighbour along an axis at once (the
  pipeline's activations), through the network's links with their contention;
* `gradient_schedule`: the gradient reduction in buckets behind backward (synth.analysis.fusion's
  dynamic program over split points, each bucket running its fastest program).

Nothing else in synth/plan imports the cost model, so re-pointing the planner at another
costing engine means editing this file only.

Memoization. A reduction's cost on a placement depends only on how many units of each system
level its groups span (the reduced axes' factors per level): levels are uniform and units of a
level are interchangeable, so two placements with the same factors are the same groups up to a
renumbering of each unit's children, which changes no link load. One search per factor vector
is kept (tests/test_plan_launch.py checks the identity against fresh searches), and it is run
on the smallest system with the same costs (synth/plan/equivalent.py), so a plan for 131,072
GPUs never builds the network or the groups of 131,072 devices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from synth.search import BestPrograms, CandidateTimes
from synth.analysis.explore import hierarchy_text
from synth.analysis.fusion import bound_floor, merge_idle, optimal_ranges, ready_times, schedule
from synth.hierarchy import build_hierarchy
from synth.language import Program, Step, parse_program
from synth.lowering import lower
from synth.model.context import cost_context
from synth.model.cost import program_cost, step_costs
from synth.model.engine import CostEngine, ProgramTable, StepCalls
from synth.model.algorithms import resolve_backend
from synth.model.network import check_costable, network_for
from synth.placement import Placement
from synth.plan.equivalent import equivalent, span
from synth.topology import Topology

MAX_BUCKET_TENSORS = 32  # gradients fused into at most this many pieces before the bucket DP (see step.py)


@dataclass(frozen=True)
class Communication:
    """One collective's time on a placement and where it runs."""

    program: str  # the program (or call) that runs it
    time_s: float
    default_time_s: float  # the default all-reduce's time (the same call for non-all-reduces)
    levels: str  # the groups' synthesis hierarchy, e.g. "node=2,gpu=8"


@dataclass(frozen=True)
class GradientSchedule:
    """The gradient reduction behind backward: buckets on one stream (synth.analysis.fusion)."""

    finish_s: float  # after the start of the last micro-batch's backward
    exposed_s: float  # finish minus the end of backward (>= 0)
    busy_s: float  # time the communication stream is busy
    buckets: int
    program: str  # the largest bucket's program
    levels: str


class CommunicationCosts:
    """Communication times for one topology and backend, memoized across placements."""

    def __init__(self, topology: Topology, backend: str = "nccl", max_len: int = 5):
        check_costable(topology)
        self.topology = topology
        self.backend = resolve_backend(backend)
        self.max_len = max_len
        self._best: dict[tuple, BestPrograms] = {}
        self._candidates: dict[tuple, CandidateTimes] = {}
        self._all_reduce: dict[tuple, Communication] = {}
        self._single: dict[tuple, Communication] = {}
        self._p2p: dict[tuple, tuple[float, float, str]] = {}
        self._schedules: dict[tuple, GradientSchedule] = {}
        self._factors: dict[tuple, tuple[int, ...]] = {}
        self._floors: dict[tuple, object] = {}
        self._programs: dict[str, Program] = {}  # every program handed out, by its text (kept as objects)

    # --- reductions ------------------------------------------------------------------------------

    def factors(self, placement: Placement, axes: tuple[str, ...]) -> tuple[int, ...]:
        """The groups' span per system level: the product of the axes' factors at each level."""
        key = (placement.matrix, placement.axis_names, axes)
        found = self._factors.get(key)
        if found is None:
            found = self._factors[key] = span(placement, axes)
        return found

    def _best_programs(self, placement: Placement, axes: tuple[str, ...]) -> BestPrograms:
        key = self.factors(placement, axes)
        best = self._best.get(key)
        if best is None:
            small = equivalent(self.topology, key)  # the same costs on fewer devices
            hierarchy = build_hierarchy(small.placement, small.axes, "merged")
            best = BestPrograms(cost_context(hierarchy, small.topology, self.backend), self.max_len)
            self._best[key] = best
        return best

    def all_reduce(self, placement: Placement, axes: tuple[str, ...], size: int) -> Communication:
        """The fastest all-reduce program of `size` bytes per device over `axes`."""
        key = (self.factors(placement, axes), size)
        found = self._all_reduce.get(key)
        if found is None:
            best = self._best_programs(placement, axes)
            choice = best.best(size)
            found = Communication(self._text(choice.program), choice.time_s, choice.baseline_time_s,
                                  hierarchy_text(best.hierarchy))
            self._all_reduce[key] = found
        return found

    def _single_call(self, collective: str, placement: Placement, axes: tuple[str, ...], size: int) -> Communication:
        key = (collective, self.factors(placement, axes), size)
        found = self._single.get(key)
        if found is None:
            best = self._best_programs(placement, axes)
            hierarchy = best.hierarchy
            n = hierarchy.group_size
            step = Step(collective, "InsideGroup", hierarchy.level_names[0])
            one_call = StepCalls(collective, (tuple(range(n)),), (n,))
            # through the same estimate as every all-reduce program (not the lockstep step time)
            ranker = best.ranker
            seconds = float(ranker.estimate.program_times(ranker.engine, ProgramTable.of([(one_call,)]), [size])[0, 0])
            found = Communication(self._text(Program((step,))), seconds, seconds, hierarchy_text(hierarchy))
            self._single[key] = found
        return found

    def reduce_scatter(self, placement: Placement, axes: tuple[str, ...], size: int) -> Communication:
        """One ReduceScatter call over the axes' groups, `size` bytes of input per device."""
        return self._single_call("ReduceScatter", placement, axes, size)

    def all_gather(self, placement: Placement, axes: tuple[str, ...], size: int) -> Communication:
        """One AllGather call over the axes' groups, `size` bytes of output per device."""
        return self._single_call("AllGather", placement, axes, size)

    def all_to_all(self, placement: Placement, axes: tuple[str, ...], size: int) -> Communication:
        """One AllToAll call of `size` bytes per device (size/n to each member, as
        `all_to_all_single` with equal splits) over the axes' groups, all groups at once."""
        return self._single_call("AllToAll", placement, axes, size)

    def _text(self, program: Program) -> str:
        """A program's text for the rows, the object kept to explain them without parsing."""
        text = str(program)
        self._programs.setdefault(text, program)
        return text

    def program(self, text: str) -> Program:
        """The object of a program this search handed out (parsed only if it came from elsewhere)."""
        found = self._programs.get(text)
        return found if found is not None else parse_program(text)

    def bottleneck(self, placement: Placement, axes: tuple[str, ...], program: str | Program, size: int) -> str:
        """The busiest link of the program's slowest step (for explaining a row, not for ranking)."""
        best = self._best_programs(placement, axes)
        hierarchy = best.hierarchy
        engine = CostEngine(best.context)  # the context's own devices, so links are named as they are
        program = self.program(program) if isinstance(program, str) else program
        steps = []
        for step in program.steps:
            n = hierarchy.group_size
            if step.collective in ("ReduceScatter", "AllGather", "AllToAll") and step.form == "InsideGroup" \
                    and step.level == hierarchy.level_names[0]:
                one_call = StepCalls(step.collective, (tuple(range(n)),), (n,))
                steps.append(step_costs(engine, [one_call], size, [step])[0])  # one whole-group call
            else:
                cost = program_cost(best.context, lower(program, hierarchy), size, engine=engine)
                return max(cost.steps, key=lambda c: c.time_s).bottleneck
        return max(steps, key=lambda c: c.time_s).bottleneck if steps else ""

    # --- point to point --------------------------------------------------------------------------

    def point_to_point(self, placement: Placement, axis: str, size: int, first: int | None = None,
                       last: int | None = None) -> tuple[float, str]:
        """(seconds, busiest link) for every device sending `size` bytes to the device one step
        further along `axis` (all at once, sharing links), or, with `first` and `last`, the
        devices at those two positions exchanging `size` bytes both ways. Seconds include the
        launch and the latency of the outermost level crossed."""
        key = (self.factors(placement, (axis,)), first, last)
        found = self._p2p.get(key)
        if found is None:
            small = equivalent(self.topology, key[0])  # the same flows' loads on fewer devices
            found = self._p2p_figures(small.topology, small.placement, small.axes[0], first, last)
            self._p2p[key] = found
        latency, per_byte, link = found
        return latency + size * per_byte, link

    def _p2p_figures(self, topology: Topology, placement: Placement, axis: str, first, last
                     ) -> tuple[float, float, str]:
        a = placement.axis_index(axis)
        size = placement.axis_sizes[a]
        if size == 1:
            return 0.0, 0.0, ""
        coords = placement.axis_coordinates
        mesh = np.empty(placement.axis_sizes, dtype=np.int64)
        mesh[tuple(coords.T)] = np.arange(placement.device_count)
        moved = np.moveaxis(mesh, a, 0)
        if first is None:
            src, dst = moved[:-1].reshape(-1), moved[1:].reshape(-1)
        else:
            src = np.concatenate([moved[first].reshape(-1), moved[last].reshape(-1)])
            dst = np.concatenate([moved[last].reshape(-1), moved[first].reshape(-1)])
        network = network_for(topology)
        seconds, link = network.makespan(src, dst, np.ones(len(src)))
        level = int(network.first_difference(src, dst).min())
        latency = self.backend.launch_s + topology.levels[level].latency.value
        return latency, seconds, network.link_name(link)

    # --- gradients behind backward ---------------------------------------------------------------

    def gradient_schedule(self, placement: Placement, axes: tuple[str, ...], tensors: tuple[int, ...],
                          backward_s: float, sharded: bool) -> GradientSchedule:
        """Gradients `tensors` (bytes per device, in the order backward produces them, spread
        evenly over `backward_s`) reduced in buckets on one stream: all-reduces by the fastest
        program per bucket (synth.analysis.fusion's dynamic program), or reduce-scatters with
        the sharded optimizer. `backward_s = 0`: all gradients ready at once (no overlap)."""
        key = (self.factors(placement, axes), tensors, backward_s, sharded)
        found = self._schedules.get(key)
        if found is None:
            found = self._schedule(placement, axes, tensors, backward_s, sharded)
            self._schedules[key] = found
        return found

    def _schedule(self, placement, axes, tensors, backward_s, sharded) -> GradientSchedule:
        best = self._best_programs(placement, axes)
        rate = sum(tensors) / backward_s if backward_s > 0 else math.inf
        ready = ready_times(tensors, rate)
        if sharded:
            def cost(size):
                call = self.reduce_scatter(placement, axes, size)
                return self._programs[call.program], call.time_s
            floor = None
        else:
            grid_key = (self.factors(placement, axes), min(tensors), sum(tensors))
            chooser = self._candidates.get(grid_key)
            if chooser is None:
                chooser = best.candidates((min(tensors), sum(tensors)))
                self._candidates[grid_key] = chooser

            def cost(size):
                choice = chooser(size)
                return choice.program, choice.time_s  # an object: text once, for the largest bucket
            floor = self._floors.get(grid_key[0])
            if floor is None:
                floor = self._floors[grid_key[0]] = bound_floor(best.context)
        seconds = lambda size: cost(size)[1]  # noqa: E731
        if backward_s > 0:
            ranges = merge_idle(tensors, ready, optimal_ranges(tensors, ready, seconds, floor), seconds)
        else:
            ranges = [(0, len(tensors) - 1)]  # all ready at once: one call of the whole buffer
        planned = schedule(tensors, ready, ranges, cost)
        largest = max(planned.buckets, key=lambda bucket: bucket.bytes)
        return GradientSchedule(planned.finish_s, max(0.0, planned.exposed_s), planned.busy_s, len(planned.buckets),
                                self._text(largest.program), hierarchy_text(best.hierarchy))


def fuse_tensors(tensors: tuple[int, ...], limit: int = MAX_BUCKET_TENSORS) -> tuple[int, ...]:
    """Consecutive tensors merged into at most `limit` pieces (bucket boundaries then fall between
    groups of layers rather than between single layers; the DP is quadratic in the count)."""
    if len(tensors) <= limit:
        return tuple(tensors)
    per = math.ceil(len(tensors) / limit)
    return tuple(sum(tensors[i:i + per]) for i in range(0, len(tensors), per))
