"""One program's predicted cost in detail (docs/model.md section 8): per step and as a whole.

Every time is for one run of the program by every reduction group at once, for S bytes per
device. The steps are costed by the engine (synth/model/engine.py: per step, every call of
every group at once, sharing links, as the backend runs it) and combined by an estimate
(synth/model/estimate.py: the lockstep sum of steps, or the pipelined estimate in which
groups do not wait for each other between steps). Bandwidth figures follow nccl-tests
(doc/PERFORMANCE.md): `algbw = S / t` and `busbw = algbw * 2(n-1)/n`, n the reduction group
size. The baseline is the default all-reduce, `AllReduce(InsideGroup(outermost level of H))`,
costed the same way.

This is the path for a few programs shown in detail (a table, a benchmark's prediction);
the analyses cost many programs at many sizes through `ProgramTable` batches, with the same
numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from synth.goals import ALL_REDUCE
from synth.hierarchy import SynthesisHierarchy
from synth.language import Program, Step
from synth.lowering import LoweredProgram, lower
from synth.model.algorithms import call_layout  # noqa: F401  (synth/calibrate reads it from here)
from synth.model.context import CostContext
from synth.model.engine import NO_LINK, CostEngine, ProgramTable, StepCalls, steps_of
from synth.model.estimate import Estimate, resolve_estimate


@dataclass(frozen=True)
class StepCost:
    step: Step
    collective: str
    algorithm: str  # what the backend runs for this step's calls, e.g. "ring"
    call_bytes: float  # B of the step's largest call
    latency_s: float  # launch + hop latencies (+ the backend's own excess over its flows, e.g. NCCL's latency)
    transfer_s: float  # sum over phases of the busiest link's drain time
    bottleneck: str  # the busiest link of the longest phase ("" when nothing moves)
    extra_memory_bytes: float  # scratch per device the backend allocates for the call

    @property
    def time_s(self) -> float:
        """The step's lockstep time: every group's calls of it together."""
        return self.latency_s + self.transfer_s


@dataclass(frozen=True)
class ProgramCost:
    program: Program
    bytes_per_device: int
    group_size: int
    estimate: str  # which estimate `time_s` is
    steps: tuple[StepCost, ...]  # each step as the lockstep sum charges it
    time_s: float
    algbw: float  # bytes/s, S / t
    busbw: float  # bytes/s, algbw * 2(n-1)/n
    link_bound_s: float  # the busiest link's load over the whole program / its capacity
    chain_s: float  # one group's own steps in order, each for its calls alone
    busiest_link: str

    @property
    def algbw_GBps(self) -> float:
        return self.algbw / 1e9

    @property
    def busbw_GBps(self) -> float:
        return self.busbw / 1e9


def bus_factor(n: int) -> float:
    """nccl-tests' all-reduce bus bandwidth factor 2(n-1)/n (doc/PERFORMANCE.md): the share of
    the data each rank must send and receive, so busbw compares with the link speed; the
    all-reduce record's (synth/collectives.py), the one definition."""
    from synth.collectives import RECORDS

    return RECORDS["AllReduce"].bus_factor(n)


def baseline_program(hierarchy: SynthesisHierarchy) -> Program:
    """The default all-reduce: one call over the whole reduction group (docs/model.md section 8)."""
    return ALL_REDUCE.flat_call(hierarchy.level_names[0])


def program_cost(context: CostContext, lowered: LoweredProgram, bytes_per_device: int,
                 estimate: str | Estimate | None = None, engine: CostEngine | None = None) -> ProgramCost:
    """The predicted cost of one run of the lowered program by every reduction group at once.
    `engine` (for the context) reuses its caches across calls."""
    estimate = resolve_estimate(estimate)
    engine = engine or CostEngine(context)
    n = context.group_size
    if n == 1:
        return ProgramCost(lowered.program, bytes_per_device, 1, estimate.name, (), 0.0, float("inf"), 0.0, 0.0, 0.0, "")
    steps = steps_of(lowered)
    figures = engine.figures(steps, [bytes_per_device])
    details = step_costs(engine, steps, bytes_per_device, [step.step for step in lowered.steps])
    link_s = np.zeros(engine.link_count)
    for index in range(len(steps)):
        link_s = link_s + engine.regimes[int(figures.regime[index, 0])].link_s
    table = ProgramTable.of([steps])
    total = float(estimate.program_times(engine, table, [bytes_per_device])[0, 0])
    chain = 0.0
    for index in range(len(steps)):
        chain = chain + float(figures.chain_s[index, 0])
    busiest = int(np.argmax(link_s))
    algbw = bytes_per_device / total
    return ProgramCost(lowered.program, bytes_per_device, n, estimate.name, tuple(details), total, algbw,
                       algbw * bus_factor(n), bytes_per_device * float(link_s[busiest]), chain,
                       engine.link_name(engine.column_link(busiest)))


def step_costs(engine: CostEngine, steps: Sequence[StepCalls], bytes_per_device: int,
               spelled: Sequence[Step]) -> tuple[StepCost, ...]:
    """Each step's lockstep cost in detail (any steps, a program's or not); `spelled` names them."""
    figures = engine.figures(steps, [bytes_per_device])
    details = []
    for index, (step, spelling) in enumerate(zip(steps, spelled)):
        regime = engine.regimes[int(figures.regime[index, 0])]
        call_bytes = engine.call_bytes(step, bytes_per_device)
        transfer = 0.0
        for drain in regime.drain_s:
            transfer = transfer + call_bytes * drain
        longest = max(range(len(regime.drain_s)), key=lambda i: (regime.drain_s[i], -i))
        link = regime.links[longest] if regime.drain_s[longest] > 0 else NO_LINK
        # everything but the links' drain: launch, hop latencies, the backend's own excess
        # (NCCL's protocol latency and ramp), and, when the costliest call alone is the floor, the rest of it
        latency = max(regime.latency_s + float(figures.residual_s[index, 0]), float(figures.alone_s[index, 0]) - transfer)
        details.append(StepCost(spelling, step.collective, regime.algorithm, call_bytes, latency, transfer,
                                engine.link_name(link), regime.extra_memory * call_bytes))
    return tuple(details)


def simulate(lowered: LoweredProgram, context: CostContext, bytes_per_device: int,
             estimate: str | Estimate | None = None) -> ProgramCost:
    """The predicted cost of one run of the program by every reduction group at once."""
    return program_cost(context, lowered, bytes_per_device, estimate)


def baseline_cost(context: CostContext, bytes_per_device: int, estimate: str | Estimate | None = None) -> ProgramCost:
    """The default all-reduce's cost, modelled exactly as any program."""
    return program_cost(context, lower(baseline_program(context.hierarchy), context.hierarchy), bytes_per_device,
                        estimate)
