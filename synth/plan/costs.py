"""The planner's one door to the cost model: every communication time a training step needs.

The step model (synth/plan/step.py) asks four questions, all for one placement on one topology:

* `all_reduce`: the fastest synthesized all-reduce program for S bytes over some axes, and the
  default all-reduce's time (synth.search.best.BestPrograms, the exact cost-guided search);
* `reduce_scatter` / `all_gather` / `all_to_all`: what sequence and context parallelism, the
  sharded optimizer, ZeRO-3/FSDP and the mixture-of-experts token dispatch and combine run:
  the fastest valid program of that goal over the groups' synthesis hierarchy
  (synth.search.best.BestPrograms with the goal: the ranker's best-first search over every
  program up to `max_len` steps, local Permutes at the copy rate; over groups of up to
  COSTED_WHOLE_MEMBERS, every such program costed at once, the same answer), beside the goal's flat call (one backend call over the group, what a
  framework runs), all through the same estimate as the all-reduce programs
  (synth/model/estimate.py). `Communication.synthesized` says which won, and by how much;
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
from functools import cached_property

import numpy as np

from synth.search import BestPrograms, CandidateTimes
from synth.search.best import grid_sizes
from synth.search.programs import ProgramSets
from synth.search.routed_rank import RoutedPrograms
from synth.analysis.explore import hierarchy_text
from synth.analysis.fusion import bound_floor, merge_idle, optimal_ranges, ready_times, schedule
from synth.goals import ALL_GATHER, ALL_REDUCE, BY_COLLECTIVE, REDUCE_SCATTER, Goal
from synth.hierarchy import build_hierarchy
from synth.language import Program, parse_program
from synth.lowering import lower
from synth.model.bound import BoundLine, bound_line
from synth.model.context import cost_context
from synth.model.estimate import resolve_estimate
from synth.model.cost import step_costs
from synth.model.engine import CostEngine, engine_for, step_calls
from synth.model.backends import resolve_backend
from synth.model.network import check_costable, network_for
from synth.placement import Placement
from synth.plan.equivalent import equivalent, span
from synth.plan.folding import DigitGroup
from synth.topology import Topology

SYNTHESIZED_ALONE = tuple(BY_COLLECTIVE[name] for name in ("ReduceScatter", "AllGather", "AllToAll"))  # priced by synthesis
# Reduce-scatters and all-gathers over groups of at most this many members are answered by
# costing every valid program (BestPrograms.every, exact at every size as the best-first search
# is: the same program and times) rather than by a search per size: the tensor- and expert-
# tensor-parallel groups of a MoE plan are asked at up to a dozen sizes each, and their few
# programs cost less together than the searches. Larger groups (a data-parallel group of
# thousands of members, asked at a size or two) keep the search, which costs few of their steps.
COSTED_WHOLE = (REDUCE_SCATTER, ALL_GATHER)
COSTED_WHOLE_MEMBERS = 256
MAX_BUCKET_TENSORS = 32  # gradients fused into at most this many pieces before the bucket DP (see step.py)


@dataclass(frozen=True)
class Communication:
    """One collective's time on a placement and where it runs."""

    program: str  # the program (or call) that runs it
    time_s: float
    default_time_s: float  # the goal's flat call over the group (the default all-reduce for all-reduces)
    levels: str  # the groups' synthesis hierarchy, e.g. "node=2,gpu=8"
    collective: str = "AllReduce"  # the goal's record name (synth/collectives.py)

    @property
    def synthesized(self) -> bool:
        """True when a program beats the flat call in the model (by more than float rounding)."""
        return self.time_s < self.default_time_s * (1 - 1e-9)

    @property
    def gain(self) -> float:
        """The flat call's time over the program's (1 where the flat call is the best)."""
        return self.default_time_s / self.time_s if self.time_s > 0 else 1.0


@dataclass(frozen=True)
class GradientSchedule:
    """The gradient reduction behind backward: buckets on one stream (synth.analysis.fusion)."""

    finish_s: float  # after the start of the last micro-batch's backward
    exposed_s: float  # finish minus the end of backward (>= 0)
    busy_s: float  # time the communication stream is busy
    buckets: int
    program: str  # the largest bucket's program
    levels: str
    default_busy_s: float = 0.0  # the same buckets each run by the flat call (the default all-reduce
    # or, with the sharded optimizer, one ReduceScatter call)
    collective: str = "AllReduce"


class CommunicationCosts:
    """Communication times for one topology and backend, memoized across placements."""

    def __init__(self, topology: Topology, backend: str = "nccl", max_len: int = 5):
        check_costable(topology)
        self.topology = topology
        self.backend = resolve_backend(backend)
        self.max_len = max_len
        self._contexts: dict[tuple, object] = {}
        self._program_sets = ProgramSets()  # every ranker's valid programs: enumerated once per shape (search/programs.py)
        self._engines: dict[tuple, CostEngine] = {}  # one per context: every goal's ranker on it shares it
        self._best: dict[tuple, BestPrograms] = {}
        self._goals: dict[tuple, BestPrograms] = {}
        self._every: dict[tuple, CandidateTimes] = {}
        self._candidates: dict[tuple, CandidateTimes] = {}
        self._all_reduce: dict[tuple, Communication] = {}
        self._single: dict[tuple, Communication] = {}
        self._p2p: dict[tuple, tuple[float, float, str]] = {}
        self._schedules: dict[tuple, GradientSchedule] = {}
        # by (factors, program, bytes per bucket), then by seconds per bucket (as the step's route states them)
        self._gradients: dict[tuple, dict[float, GradientSchedule]] = {}
        self._floors: dict[tuple, object] = {}
        self._sharded_floors: dict[tuple, object] = {}  # the reduce-scatter goal's bound, by factors
        self._programs: dict[str, Program] = {}  # every program handed out, by its text (kept as objects)
        self._goal_of: dict[str, Goal] = {}  # the goal of every non-all-reduce program handed out
        self._routed: dict[tuple, Communication] = {}  # two-stage dispatch/combine, by (goal, factors, routing, host)
        self._routed_programs: dict[tuple, object] = {}  # RoutedPrograms by (goal, factors, routing per token)
        self._routed_seconds: dict[tuple, dict] = {}  # by factors: RoutedPrograms' step times, every goal's
        self._routed_texts: set[str] = set()  # dispatch/combine programs handed out (explained by their goal)
        self._named_engines: dict[tuple, CostEngine] = {}  # bottleneck's engines on the contexts' own devices
        self._bottlenecks: dict[tuple, str] = {}  # bottleneck's answers by (factors, program text, goal, size)

    @cached_property
    def userbuffers_level(self) -> int:
        """The outermost level inside the domain Transformer Engine's userbuffers reach (its
        comm-GEMM overlap, Megatron's --tp-comm-overlap): a multi-host NVLink domain where the
        system has one (a level marked nvlink_domain: TE >= 2.2 maps the tensor-parallel
        group's buffers by CUDA fabric handles across multi-node NVLink, NVIDIA/
        TransformerEngine#1470, userbuffers-host.cpp has_mnnvl_fabric, and groups them by
        tensor-parallel rank, not host), else the innermost level (CUDA IPC inside a node)."""
        domains = [index for index, level in enumerate(self.topology.levels) if level.nvlink_domain]
        return domains[0] if domains else len(self.topology.levels) - 1  # kept: group floors ask it per placement

    # --- reductions ------------------------------------------------------------------------------

    def factors(self, placement: Placement, axes: tuple[str, ...] | DigitGroup) -> tuple[int, ...]:
        """The groups' span per system level: the product of the axes' factors at each level (or a
        folded expert group's span, synth/plan/folding.py). Every question below takes its groups
        through here, so `axes` may be either everywhere."""
        spans = placement.spans
        found = spans.get(axes)
        if found is None:
            found = spans[axes] = span(placement, axes)
        return found

    def _context(self, key: tuple[int, ...]):
        """The cost context of the groups spanning `key`, on the smallest equivalent system."""
        context = self._contexts.get(key)
        if context is None:
            small = equivalent(self.topology, key)  # the same costs on fewer devices
            hierarchy = build_hierarchy(small.placement, small.axes, "merged")
            context = self._contexts[key] = cost_context(hierarchy, small.topology, self.backend)
        return context

    def _engine(self, key: tuple[int, ...]) -> CostEngine:
        """The shared engine of the groups spanning `key` (synth.model.engine.engine_for: the same
        for every goal on the context, found once here rather than once per goal's ranker)."""
        engine = self._engines.get(key)
        if engine is None:
            engine = self._engines[key] = engine_for(self._context(key))
        return engine

    def _best_programs(self, placement: Placement, axes: tuple[str, ...]) -> BestPrograms:
        key = self.factors(placement, axes)
        best = self._best.get(key)
        if best is None:
            best = self._best[key] = BestPrograms(self._context(key), self.max_len, engine=self._engine(key),
                                                  sets=self._program_sets)
        return best

    def goal_programs(self, collective: str, placement: Placement, axes: tuple[str, ...]) -> BestPrograms:
        """The ranker of the goal over the axes' groups (one per group shape)."""
        key = (collective, self.factors(placement, axes))
        found = self._goals.get(key)
        if found is None:
            found = self._goals[key] = BestPrograms(self._context(key[1]), self.max_len, goal=BY_COLLECTIVE[collective],
                                                    engine=self._engine(key[1]), sets=self._program_sets)
        return found

    def every_goal_program(self, collective: str, placement: Placement, axes: tuple[str, ...]) -> CandidateTimes:
        """Every valid program of the goal over the axes' groups, costed at any size in batches
        (what a bucket schedule asks at every sum of consecutive tensors)."""
        key = (collective, self.factors(placement, axes))
        found = self._every.get(key)
        if found is None:
            found = self._every[key] = self.goal_programs(collective, placement, axes).every()
        return found

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

    def _goal_call(self, collective: str, placement: Placement, axes: tuple[str, ...], size: int) -> Communication:
        key = (collective, self.factors(placement, axes), size)
        found = self._single.get(key)
        if found is None:
            programs = self.goal_programs(collective, placement, axes)
            if BY_COLLECTIVE[collective] in COSTED_WHOLE and programs.context.group_size <= COSTED_WHOLE_MEMBERS:
                choice = self.every_goal_program(collective, placement, axes)(size)  # exact too, in one batch
            else:
                choice = programs.best(size)
            text = self._text(choice.program)
            self._goal_of[text] = BY_COLLECTIVE[collective]
            found = Communication(text, choice.time_s, choice.baseline_time_s,
                                  hierarchy_text(programs.hierarchy), collective)
            self._single[key] = found
        return found

    def reduce_scatter(self, placement: Placement, axes: tuple[str, ...], size: int) -> Communication:
        """The fastest reduce-scatter program over the axes' groups, `size` bytes of input per
        device (each member ends with its 1/n block of the sum, in member-rank order)."""
        return self._goal_call("ReduceScatter", placement, axes, size)

    def all_gather(self, placement: Placement, axes: tuple[str, ...], size: int) -> Communication:
        """The fastest all-gather program over the axes' groups, `size` bytes of output per device."""
        return self._goal_call("AllGather", placement, axes, size)

    def all_to_all(self, placement: Placement, axes: tuple[str, ...], size: int) -> Communication:
        """The fastest all-to-all program of `size` bytes per device (size/n to each member, as
        `all_to_all_single` with equal splits) over the axes' groups, all groups at once."""
        return self._goal_call("AllToAll", placement, axes, size)

    def synthesized(self, placement: Placement, axes: tuple[str, ...], program: str, size: int,
                    time_s: float | None = None, schedule: GradientSchedule | None = None) -> list[Communication]:
        """The collectives priced for `size` bytes over the axes' groups whose program is part of
        `program` (a step route's text) and beats the goal's flat call: what the plan names as
        synthesized. Gradient buckets (`size` = bytes per bucket) come as one entry whose times
        are the buckets' sums: the schedule whose seconds per bucket are `time_s` (the route's own;
        candidates alike in program and bucket size may differ in their buckets), else the last;
        `schedule`: the route's own (Route.schedule), whatever else the search priced."""
        factors = self.factors(placement, axes)
        schedules = self._gradients.get((factors, program, size), {})
        gradients = schedule or schedules.get(time_s) or next(reversed(schedules.values()), None)
        if gradients is not None:  # the route is the gradient buckets
            found = [Communication(gradients.program, gradients.busy_s, gradients.default_busy_s,
                                   gradients.levels, gradients.collective)]
        else:
            found = [self._all_reduce.get((factors, size))]
            found += [self._single.get((goal.collective, factors, size)) for goal in SYNTHESIZED_ALONE]
            found += [call for (_, shape, routing, _), call in self._routed.items()  # a two-stage dispatch/combine
                      if shape == factors and routing.buffer_bytes * routing.topk == size]
        return [c for c in found if c is not None and c.synthesized and c.program in program]

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
        """The busiest link of the program's slowest step (for explaining a row, not for ranking).
        Costed on the context's own devices, so links are named as they are: one engine per
        context, and one answer per (groups, program, goal, size), asked by many rows."""
        factors = self.factors(placement, axes)
        text = program if isinstance(program, str) else str(program)
        if text in self._routed_texts:
            return ""  # a dispatch or combine: its steps move a routing's copies, not a collective's blocks
        if text not in self._programs:
            # a route of two collectives ("<reduce-scatter program>; <all-gather program>"): its first
            known = [seen for seen in self._programs if text.startswith(seen + "; ")]
            text = max(known, key=len) if known else text
        program = self.program(text)
        goal = self._goal_of.get(text)
        if goal is None:  # an all-reduce program, or a flat call of another goal handed in as text
            first = program.steps[0].collective
            alone = BY_COLLECTIVE.get(first) if len(program.steps) == 1 else None
            goal = alone if alone in SYNTHESIZED_ALONE else ALL_REDUCE
        key = (factors, text, goal, size)
        found = self._bottlenecks.get(key)
        if found is None:
            found = self._bottlenecks[key] = self._bottleneck(factors, program, goal, size)
        return found

    def _bottleneck(self, factors: tuple[int, ...], program: Program, goal: Goal, size: int) -> str:
        context = self._context(factors)
        hierarchy = context.hierarchy
        lowered = [step for step in lower(program, hierarchy, goal).steps if step.places is None]  # no Permutes
        if not lowered:
            return ""
        engine = self._named_engines.get(factors)
        if engine is None:
            engine = self._named_engines[factors] = CostEngine(context)
        costs = step_costs(engine, [step_calls(step) for step in lowered], size, [step.step for step in lowered])
        return max(costs, key=lambda c: c.time_s).bottleneck

    # --- routed: MoE dispatch and combine in two stages ---------------------------------------------

    def two_stage(self, goal: Goal, placement: Placement, axes: tuple[str, ...], routing, host: int) -> Communication:
        """The fastest `dispatch` or `combine` program (synth/search/routed_rank.py, the
        programs `synth rank --collective dispatch|combine` ranks) of the two-stage form DeepEP
        and HybridEP run, for `routing` (synth/routing.py: its tokens per member, top-k,
        experts, node limit) over the axes' groups: dispatch crosses the system levels
        0..`host` first, each step over those levels only, then resolves the levels inside a
        host in one step; combine the reverse. The flat all-to-all of the same routing is its
        `default_time_s`. A pure function of the groups' factors, the routing and `host`,
        memoized on them."""
        factors = self.factors(placement, axes)
        key = (goal, factors, routing, host)
        found = self._routed.get(key)
        if found is None:
            found = self._routed[key] = self._two_stage(goal, factors, routing, host)
        return found

    def _two_stage(self, goal: Goal, factors: tuple[int, ...], routing, host: int) -> Communication:
        context = self._context(factors)
        key = (goal, factors, routing.with_tokens(1))
        programs = self._routed_programs.get(key)
        if programs is None:  # the steps' times shared by the goals on these groups (a combine's are its dispatch's)
            programs = self._routed_programs[key] = RoutedPrograms(
                context, goal, routing, self.max_len, self._engine(factors), self._routed_seconds.setdefault(factors, {}))
        names = context.hierarchy.level_names
        outer_names = {level.name for level in self.topology.levels[:host + 1]}
        outer = frozenset(i for i, name in enumerate(names) if name in outer_names)
        forms = [program for program in programs.programs if _two_stage_form(programs, program, outer)]
        flat = programs.baseline
        times = {program: programs.time(program, routing) for program in forms or [flat]}
        best = min(times, key=lambda program: (times[program], str(program)))
        text = self._text(best)
        self._goal_of[text] = goal
        self._routed_texts.add(text)
        flat_time = times[flat] if flat in times else programs.time(flat, routing)
        return Communication(text, times[best], flat_time, hierarchy_text(context.hierarchy), goal.name)

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

    def _floor(self, factors: tuple[int, ...]):
        """The all-reduce lower bound of the groups spanning `factors`, as a function of the size
        (synth/model/bound.py: a line in the size, below every program's time)."""
        floor = self._floors.get(factors)
        if floor is None:
            floor = self._floors[factors] = bound_floor(self._context(factors))
        return floor

    def _sharded_floor(self, factors: tuple[int, ...]):
        """The reduce-scatter goal's lower bound of the groups spanning `factors` as a function of
        the size (the ranker's own, Ranker.bound_times, found without a ranker), shaved by a
        relative 1e-9 as the all-reduce one."""
        floor = self._sharded_floors.get(factors)
        if floor is None:
            line = bound_line(self._context(factors))
            line = BoundLine(line.latency_s, REDUCE_SCATTER.bound_share * line.seconds_per_byte,
                             line.bottleneck)
            estimate = resolve_estimate(None)
            floor = self._sharded_floors[factors] = (
                lambda size: float(estimate.bound_times(line, [size])[0]) * (1 - 1e-9))
        return floor

    def gradient_floor(self, placement: Placement, axes: tuple[str, ...], tensors: tuple[int, ...],
                       backward_s: float, sharded: bool) -> float:
        """A lower bound on `gradient_schedule(...).exposed_s`, found without the schedule (the
        search's bound before a full prediction). The bucket holding tensor j starts once j is
        ready, and it and the buckets after it run one after another on the stream, at least
        the all-reduce lower bound of the bytes from j on (synth/model/bound.py: the bound is a
        line, or the larger of two, in the size, so the bounds of several buckets add up to at
        least the bound of their sum): the schedule ends no earlier than ready(j) + bound(tensors
        j..n-1), for every j. Shaved for the rounding of `finish - end of backward`.
        Reduce-scatters (`sharded`) by the reduce-scatter goal's bound instead (the all-reduce
        bound's bytes term halved, synth/search/rank.py: below every reduce-scatter program,
        the flat call among them), so no program is searched for the floor either way."""
        factors = self.factors(placement, axes)
        floor = self._sharded_floor(factors) if sharded else self._floor(factors)
        if backward_s > 0:
            ready = ready_times(tensors, sum(tensors) / backward_s)
        else:
            ready = (0.0,) * len(tensors)
        bound, after = 0.0, 0
        for j in range(len(tensors) - 1, -1, -1):
            after += tensors[j]
            bound = max(bound, ready[j] - ready[-1] + floor(after))
        return max(0.0, bound * (1 - 1e-9) - 64 * math.ulp(2 * backward_s + bound))

    def _schedule(self, placement, axes, tensors, backward_s, sharded) -> GradientSchedule:
        best = self._best_programs(placement, axes)
        rate = sum(tensors) / backward_s if backward_s > 0 else math.inf
        ready = ready_times(tensors, rate)
        if sharded:
            # every bucket the DP may form is a sum of consecutive tensors: cost them in one batch
            sums = {sum(tensors[i:j + 1]) for i in range(len(tensors)) for j in range(i, len(tensors))}
            every = self.every_goal_program("ReduceScatter", placement, axes)
            every.prefetch(sums)

            def cost(size):
                choice = every(size)
                return choice.program, choice.time_s
            floor = None
        else:
            # keyed by the grid the sizes span, not the sizes: every schedule whose buckets fall on
            # the same grid shares its candidates and their costed sizes (MoE stages differ in
            # their tensors' sizes by expert-parallel degree, rarely in their grid)
            grid_key = (self.factors(placement, axes), grid_sizes(min(tensors), sum(tensors)))
            chooser = self._candidates.get(grid_key)
            if chooser is None:
                chooser = self._candidates[grid_key] = CandidateTimes(best, grid_key[1])

            def cost(size):
                choice = chooser(size)
                return choice.program, choice.time_s  # an object: text once, for the largest bucket
            floor = self._floor(grid_key[0])
        seconds = lambda size: cost(size)[1]  # noqa: E731
        if backward_s > 0:
            ranges = merge_idle(tensors, ready, optimal_ranges(tensors, ready, seconds, floor), seconds)
        else:
            ranges = [(0, len(tensors) - 1)]  # all ready at once: one call of the whole buffer
        planned = schedule(tensors, ready, ranges, cost)
        largest = max(planned.buckets, key=lambda bucket: bucket.bytes)
        if sharded:
            default_busy = sum(every(bucket.bytes).baseline_time_s for bucket in planned.buckets)
        else:
            default_busy = sum(chooser(bucket.bytes).baseline_time_s for bucket in planned.buckets)
        found = GradientSchedule(planned.finish_s, max(0.0, planned.exposed_s), planned.busy_s, len(planned.buckets),
                                 self._text(largest.program), hierarchy_text(best.hierarchy), default_busy,
                                 "ReduceScatter" if sharded else "AllReduce")
        if sharded:
            self._goal_of[found.program] = REDUCE_SCATTER
        per_bucket = sum(tensors) // found.buckets  # as the step's route states it
        self._gradients.setdefault((self.factors(placement, axes), found.program, per_bucket), {})[
            found.busy_s / found.buckets] = found
        return found


def fuse_tensors(tensors: tuple[int, ...], limit: int = MAX_BUCKET_TENSORS) -> tuple[int, ...]:
    """Consecutive tensors merged into at most `limit` pieces (bucket boundaries then fall between
    groups of layers rather than between single layers; the DP is quadratic in the count)."""
    if len(tensors) <= limit:
        return tuple(tensors)
    per = math.ceil(len(tensors) / limit)
    return tuple(sum(tensors[i:i + per]) for i in range(0, len(tensors), per))


def _two_stage_form(programs, program: Program, outer: frozenset[int]) -> bool:
    """Whether a routed program is the two-stage form (`CommunicationCosts.two_stage`): every
    step moves along outer levels only or inner levels only, all outer steps first for
    dispatch (last for combine), the inner levels in one step."""
    moves = [entry.after - entry.before for entry in programs.semantics.run(program)]
    if programs.goal.reverses:
        moves = moves[::-1]
    kinds = ["outer" if move <= outer else "inner" if not move & outer else "mixed" for move in moves]
    if "mixed" in kinds or not outer or kinds.count("inner") > 1:
        return False
    return kinds == sorted(kinds, key=lambda kind: kind == "inner")
