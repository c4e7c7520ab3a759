"""Ranking dispatch and combine programs (docs/model.md sections 7 and 8, "Dispatch and
combine") by predicted time, for one routing.

Every valid program up to the length (synth/routed.py: orders and groupings of the levels)
is priced step by step: a step is one `AllToAll` call per group of its form, every
reduction group's calls together as the engine costs any step (synth/model/engine.py: the
pairwise flows priced by class on the network, NCCL's all-to-all as grouped send/recv), each
call an equal-split all-to-all of the bytes the step sends per member in expectation
(synth/model/fanout.py); under a skewed routing each pair at its own expected bytes
(fanout.step_pairs, synth/model/weighted.py). The steps add up (lockstep). The baseline is
the flat all-to-all of the same routing, `AllToAll(InsideGroup(h_1))`: one copy per
destination member.

Lower bound: at every cut of the hierarchy (the units of its outer levels down to some
level), each token must cross to each distinct destination unit other than its owner's at
least once (`fanout.cut_copies`); an all-to-all sends (q-1)/q of the buffer across a cut of q
units and is bounded by the all-reduce bound's latency plus half its bytes term
(synth/analysis/goal_rank.py), so the routed bound scales that half by the copies' share of
(q-1)/q, at the cut where the share is least.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from synth.collectives import collective
from synth.errors import UsageError
from synth.goals import DELIVERED, Goal, parse_goal
from synth.language import Program, Step
from synth.model.bound import LowerBound, bound_line
from synth.model.context import CostContext
from synth.model.engine import CostEngine, StepCalls
from synth.model.fanout import cut_copies, step_pairs, step_traffic
from synth.model.weighted import weighted_step_s
from synth.routed import RoutedSemantics
from synth.routing import Routing
from synth.search.ranked import RankedProgram
from synth.semantics import FORMS


@dataclass(frozen=True)
class RoutedStep:
    """One step of a routed program as priced: its bytes per member and seconds."""

    step: Step
    span_bytes: float
    time_s: float


def routing_at(routing: Routing, size: int) -> Routing:
    """The routing with as many tokens per member as `size` bytes hold."""
    tokens = int(size) // routing.bytes_per_token
    if tokens < 1:
        raise UsageError(f"{size} bytes per member hold no token of {routing.bytes_per_token} bytes: give at least "
                         f"{routing.bytes_per_token} bytes")
    return routing.with_tokens(tokens)


class RoutedPrograms:
    """Every valid dispatch or combine program on one context, priced for a routing."""

    def __init__(self, context: CostContext, goal, routing: Routing, max_len: int = 4,
                 engine: CostEngine | None = None, seconds: dict | None = None):
        """`seconds`: a step's time by (step, bytes per member) under a uniform routing, shared by
        the callers of one context's engine (a dispatch's steps and its combine's, run backwards,
        are the same calls at the same bytes: priced once)."""
        self.context, self.goal, self.routing, self.max_len = context, parse_goal(goal), routing, max_len
        self._seconds = {} if seconds is None else seconds
        hierarchy = context.hierarchy
        self.sizes = tuple(hierarchy.sizes)
        routing.experts_per_member(hierarchy.group_size)  # refuse an uneven spread before pricing
        self.semantics = RoutedSemantics(hierarchy.level_names, self.sizes, self.goal)
        self.programs = self.semantics.programs(max_len)
        self.engine = engine or CostEngine(context)
        self._calls: dict[Step, tuple[tuple[int, ...], ...]] = {}

    @property
    def baseline(self) -> Program:
        return self.goal.flat_call(self.context.hierarchy.level_names[0])

    def _step_calls(self, step: Step) -> tuple[tuple[int, ...], ...]:
        found = self._calls.get(step)
        if found is None:
            groups, _ = FORMS[step.form](self.sizes, self.context.hierarchy.level_names.index(step.level))
            found = self._calls[step] = tuple(sorted(groups))
        return found

    def steps(self, program: Program, routing: Routing) -> list[RoutedStep]:
        """Each step of a valid program with its bytes and time."""
        trace = self.semantics.run(program)
        all_levels = self.semantics.levels
        result = []
        for entry in trace:
            moving = entry.after - entry.before
            toward_owner = self.goal.end != DELIVERED
            classes = all_levels - entry.before if toward_owner else entry.after
            span = step_traffic(routing, self.sizes, classes, moving, toward_owner).span_bytes(routing)
            calls = self._step_calls(entry.step)
            if routing.skewed:  # each pair at its own bytes (synth/model/weighted.py)
                pairs = step_pairs(routing, self.sizes, classes, moving, toward_owner)
                seconds = weighted_step_s(self.engine, calls, pairs) if span > 0 else 0.0
            else:
                seconds = self._uniform_seconds(entry.step, calls, max(1, round(span))) if span > 0 else 0.0
            result.append(RoutedStep(entry.step, span, seconds))
        return result

    def _uniform_seconds(self, step: Step, calls: tuple[tuple[int, ...], ...], size: int) -> float:
        """The engine's time of the step's equal-split all-to-alls at `size` bytes per member."""
        key = (step, size)
        found = self._seconds.get(key)
        if found is None:
            n = self.context.group_size
            step_calls = StepCalls("AllToAll", calls, (n,) * len(calls))
            found = self._seconds[key] = float(self.engine.figures([step_calls], [size]).time_s[0, 0])
        return found

    def time(self, program: Program, routing: Routing) -> float:
        return sum(step.time_s for step in self.steps(program, routing))

    def bound(self, routing: Routing) -> LowerBound:
        """The routed lower bound (module docstring)."""
        line = bound_line(self.context)
        levels = sorted(self.semantics.levels)
        size = routing.buffer_bytes
        share, where = math.inf, ""
        for depth in range(1, len(levels) + 1):
            outer = frozenset(levels[:depth])
            q = 1
            for level in outer:
                q *= self.sizes[level]
            ratio = cut_copies(routing, self.sizes, outer) / ((q - 1) / q)
            if ratio < share:
                share, where = ratio, self.context.hierarchy.level_names[levels[depth - 1]]
        transfer = 0.5 * share * size * line.seconds_per_byte
        return LowerBound(size, line.latency_s + transfer, transfer, line.latency_s,
                          f"{share:.3g} x half the all-reduce bound's bytes (copies across the {where} cut): {line.bottleneck}")

    def rank(self, size: int) -> list[RankedProgram]:
        """Every program at `size` bytes of tokens per member, fastest first (ties by text),
        the flat all-to-all marked as the baseline."""
        routing = routing_at(self.routing, size)
        size = routing.buffer_bytes
        times = {program: self.time(program, routing) for program in self.programs}
        base = times[self.baseline]
        bound = self.bound(routing).time_s
        n = self.context.group_size
        factor = collective("AllToAll").bus_factor(n)
        rows = []
        for program in sorted(times, key=lambda p: (times[p], str(p))):
            time = times[program]
            algbw = size / time if time > 0 else math.inf
            rows.append(RankedProgram(
                program=program, matrix=self.context.hierarchy.placement.matrix, bytes=size, time_s=time,
                algbw_GBps=algbw / 1e9, busbw_GBps=algbw * factor / 1e9, speedup=base / time if time > 0 else 1.0,
                bound_ratio=time / bound if bound > 0 else math.inf, baseline=program == self.baseline,
                extra_memory_bytes=0, communicators=len({step for step in program.steps}),
                calls_per_device=len(program), length=len(program)))
        return rows


def rank_routed(context: CostContext, goal: Goal | str, routing: Routing, sizes, max_len: int = 4,
                top: int | None = None) -> list[list[RankedProgram]]:
    """Per size, the programs fastest first (the first `top` and the baseline where given)."""
    programs = RoutedPrograms(context, goal, routing, max_len)
    result = []
    for size in sizes:
        rows = programs.rank(int(size))
        result.append(rows if top is None else rows[:top] + [row for row in rows[top:] if row.baseline])
    return result


def routed_bound(context: CostContext, goal, routing: Routing, size: int) -> LowerBound:
    return RoutedPrograms(context, goal, routing, 1).bound(routing_at(routing, size))

