"""The cost of a lowered program (docs/model.md section 8): one run by every reduction group at once.

Per step, every call of every reduction group runs at the same time, so their flows share
links: a step's phase lasts `max over links of load / capacity` for all of them together
(synth/model/network.py), and more groups through one node's NICs make the step slower.
A call's bytes are `B = chunks * S / N` (its chunk range, S bytes per device cut into N
chunks). The calls of one step usually span equal ranges; where they do not (Master and
Broadcast steps can leave members of different classes holding ranges of different lengths),
each call's flows are weighted by its own range. A step costs

    launch + sum over phases (hop latency + transfer / efficiency)

with the launch cost and efficiency of the backend and the phases of the algorithm the
backend picks for the call (synth/model/algorithms.py). Where a backend has several
algorithms (NCCL AllReduce: ring, tree) it picks, like NCCL's tuner, the one its own
estimate says is fastest: the call's time alone on the network, without the other groups.
A level's figures for one collective (`[levels.collectives.NAME]` in the topology file, as
`synth calibrate` writes them) replace its bandwidth and latency in the steps of that
collective: the links are the same, their capacities and hop latencies are that collective's.

Bandwidth figures follow nccl-tests (doc/PERFORMANCE.md): `algbw = S / t` and
`busbw = algbw * 2(n-1)/n`, n the reduction group size. The baseline is the default
all-reduce, `AllReduce(InsideGroup(outermost level of H))`, costed the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from synth.hierarchy import SynthesisHierarchy
from synth.language import Program, Step
from synth.lowering import LoweredProgram, lower
from synth.model.algorithms import Backend, Layout, Plan, resolve_backend
from synth.model.network import NO_LINK, network_for
from synth.topology import Topology

Calls = tuple[tuple[int, ...], ...]  # the member ranks of each call of a step
Chunks = tuple[int, ...]  # the chunks each call of a step spans, in the order of its calls


@dataclass(frozen=True)
class StepCost:
    step: str
    collective: str
    algorithm: str  # what the backend runs for this step's calls, e.g. "ring"
    call_bytes: float  # B of the step's largest call
    latency_s: float  # launch + hop latencies
    transfer_s: float  # sum over phases of the busiest link's drain time
    bottleneck: str  # the busiest link of the longest phase ("" when nothing moves)
    extra_memory_bytes: float  # scratch per device the backend allocates for the call

    @property
    def time_s(self) -> float:
        return self.latency_s + self.transfer_s


@dataclass(frozen=True)
class ProgramCost:
    program: str
    bytes_per_device: int
    group_size: int
    steps: tuple[StepCost, ...]
    time_s: float
    algbw: float  # bytes/s, S / t
    busbw: float  # bytes/s, algbw * 2(n-1)/n

    @property
    def algbw_GBps(self) -> float:
        return self.algbw / 1e9

    @property
    def busbw_GBps(self) -> float:
        return self.busbw / 1e9


def bus_factor(n: int) -> float:
    """nccl-tests' all-reduce bus bandwidth factor 2(n-1)/n (doc/PERFORMANCE.md): the share of
    the data each rank must send and receive, so busbw compares with the link speed."""
    return 2 * (n - 1) / n


def baseline_program(hierarchy: SynthesisHierarchy) -> Program:
    """The default all-reduce: one call over the whole reduction group (docs/model.md section 8)."""
    return Program((Step("AllReduce", "InsideGroup", hierarchy.level_names[0]),))


@dataclass(frozen=True)
class _Compiled:
    """A plan with its flows mapped to devices for every reduction group (unit bytes: B = 1)."""

    plan: Plan
    latencies: tuple[float, ...]
    flows: tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]  # per phase: src, dst, fraction
    alone_s_per_byte: float  # transfer time per byte of B for one call of one group, alone


@dataclass(frozen=True)
class _StepFigures:
    algorithm: str
    latency_s: float
    transfer_s: float
    bottleneck: str
    extra_memory_bytes: float
    time_s: float


def call_layout(coords: np.ndarray, level_latencies) -> Layout:
    """The shape of one call whose members sit at `coords` ([member, level]), with the given
    latency per level: nodes, hop latencies, and the outermost and innermost latencies."""
    nodes: dict[tuple, list[int]] = {}
    for index, row in enumerate(coords):
        nodes.setdefault(tuple(row[:-1]), []).append(index)
    latency_of_level = np.asarray(level_latencies, dtype=float)
    differs = coords[:, None, :] != coords[None, :, :]
    hop = np.where(differs.any(axis=-1), latency_of_level[differs.argmax(axis=-1)], 0.0)
    spanned = [l for l in range(coords.shape[1]) if len(set(coords[:, l])) > 1]
    outer = float(latency_of_level[spanned[0]]) if spanned else 0.0
    return Layout(len(coords), tuple(tuple(n) for n in nodes.values()), tuple(map(tuple, hop.tolist())),
                  outer, float(latency_of_level[-1]))


class Simulator:
    """Costs steps and programs for one (hierarchy, topology, backend); caches what repeats."""

    def __init__(self, hierarchy: SynthesisHierarchy, topology: Topology, backend: str | Backend = "nccl"):
        self.network = network_for(topology)
        if tuple(hierarchy.placement.level_sizes) != tuple(topology.sizes):
            raise ValueError("the placement is not on this topology: level sizes differ")
        self.hierarchy = hierarchy
        self.topology = topology
        self.backend = resolve_backend(backend)
        self.group_size = hierarchy.group_size
        self.devices = np.array(hierarchy.groups, dtype=np.int64)  # [group, member rank] -> device
        self._plans: dict[tuple[str, tuple[int, ...]], tuple[_Compiled, ...]] = {}
        self._phases: dict[tuple, tuple[tuple[float, float, int], ...]] = {}
        self._figures: dict[tuple, _StepFigures] = {}
        self._estimates: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._picked: dict[tuple, tuple[str, float]] = {}

    def _network_of(self, collective: str):
        """The network with the collective's own level figures where the topology has them
        (synth calibrate's per-collective tables); the same links, so link ids agree."""
        return network_for(self.topology.for_collective(collective))

    # --- one call --------------------------------------------------------------------------------

    def layout(self, members: tuple[int, ...], collective: str = "") -> Layout:
        """The call's shape on the system. Every reduction group has the same shape (docs/model.md
        section 3), so the first group's devices stand for all."""
        coords = self.network.coords[self.devices[0, list(members)]]
        levels = self.topology.for_collective(collective).levels
        return call_layout(coords, [level.latency.value for level in levels])

    def _compile(self, collective: str, members: tuple[int, ...]) -> tuple[_Compiled, ...]:
        key = (collective, members)
        if key in self._plans:
            return self._plans[key]
        layout = self.layout(members, collective)
        network = self._network_of(collective)
        member_ranks = np.array(members, dtype=np.int64)
        result = []
        for algorithm in self.backend.candidates(collective):
            plan = algorithm(layout)
            flows, alone = [], 0.0
            for phase in plan.phases:
                local = np.array([(a, b) for a, b, _ in phase.flows], dtype=np.int64).reshape(-1, 2)
                fraction = np.array([f for _, _, f in phase.flows], dtype=float)
                src = self.devices[:, member_ranks[local[:, 0]]]
                dst = self.devices[:, member_ranks[local[:, 1]]]
                flows.append((src.ravel(), dst.ravel(), np.tile(fraction, len(self.devices))))
                alone += network.makespan(src[0], dst[0], fraction)[0]
            latencies = tuple(phase.latency_s for phase in plan.phases)
            result.append(_Compiled(plan, latencies, tuple(flows), alone))
        self._plans[key] = tuple(result)
        return self._plans[key]

    def _choose(self, collective: str, members: tuple[int, ...], call_bytes: float) -> int:
        """The backend's own pick: the candidate its estimate for the call alone says is fastest
        (the first on a tie)."""
        efficiency = self.backend.efficiency_of(collective)
        estimates = [
            sum(compiled.latencies) + call_bytes * compiled.alone_s_per_byte / efficiency
            for compiled in self._compile(collective, members)
        ]
        return min(range(len(estimates)), key=lambda i: (estimates[i], i))

    def _choices(self, collective: str, calls: Calls, chunks: Chunks, bytes_per_device: int) -> tuple[int, ...]:
        """`_choose` for every call of a step at once. A step has many calls and a sweep many
        sizes, so the candidates' latencies and seconds per byte are kept per (collective, calls)
        as (calls x candidates) arrays and a size costs one argmin, not a Python loop over calls;
        the arithmetic is `_choose`'s, element for element, so the picks are the same."""
        key = (collective, calls)
        table = self._estimates.get(key)
        if table is None:
            compiled = [self._compile(collective, members) for members in calls]
            table = (np.array([[sum(c.latencies) for c in candidates] for candidates in compiled]),
                     np.array([[c.alone_s_per_byte for c in candidates] for candidates in compiled]))
            self._estimates[key] = table
        latency, per_byte = table
        if latency.shape[1] == 1:
            return (0,) * len(calls)
        call_bytes = np.array([part * bytes_per_device / self.group_size for part in chunks])
        estimates = latency + call_bytes[:, None] * per_byte / self.backend.efficiency_of(collective)
        return tuple(estimates.argmin(axis=1).tolist())

    # --- one step ----------------------------------------------------------------------------------

    def _step_phases(self, collective: str, calls: Calls, choices: tuple[int, ...], weights: tuple[float, ...]):
        """Per phase, for all calls of all groups together: (latency, seconds per byte of B,
        busiest link), B being the largest call's bytes and `weights` each call's share of it.
        Transfer time is linear in B, so this holds for every size."""
        key = (collective, calls, choices, weights)
        if key in self._phases:
            return self._phases[key]
        plans = [self._compile(collective, members)[choice] for members, choice in zip(calls, choices)]
        result = []
        for phase in range(max(len(p.plan.phases) for p in plans)):
            present = [(p, w) for p, w in zip(plans, weights) if phase < len(p.plan.phases)]
            src = np.concatenate([p.flows[phase][0] for p, _ in present])
            dst = np.concatenate([p.flows[phase][1] for p, _ in present])
            fraction = np.concatenate([p.flows[phase][2] * w for p, w in present])
            present = [p for p, _ in present]
            per_byte, link = self._network_of(collective).makespan(src, dst, fraction)
            result.append((max(p.latencies[phase] for p in present), per_byte, link))
        self._phases[key] = tuple(result)
        return self._phases[key]

    def _algorithms(self, collective: str, calls: Calls, choices: tuple[int, ...]) -> tuple[str, float]:
        """What the step's calls run (e.g. "ring" or "ring/tree") and the largest scratch of
        any call as a fraction of B; kept per choice, as it does not depend on the size."""
        key = (collective, calls, choices)
        if key not in self._picked:
            plans = [self._compile(collective, members)[choice].plan for members, choice in zip(calls, choices)]
            self._picked[key] = ("/".join(sorted({plan.algorithm for plan in plans})),
                                 max(plan.extra_memory for plan in plans))
        return self._picked[key]

    def _step_figures(self, collective: str, calls: Calls, chunks: Chunks, bytes_per_device: int) -> _StepFigures:
        key = (collective, calls, chunks, bytes_per_device)
        cached = self._figures.get(key)
        if cached is not None:
            return cached
        largest = max(chunks)
        call_bytes = largest * bytes_per_device / self.group_size
        choices = self._choices(collective, calls, chunks, bytes_per_device)
        weights = tuple(part / largest for part in chunks)
        phases = self._step_phases(collective, calls, choices, weights)
        efficiency = self.backend.efficiency_of(collective)
        latency = self.backend.launch_s + sum(latency for latency, _, _ in phases)
        transfer = sum(call_bytes * per_byte for _, per_byte, _ in phases) / efficiency
        longest = max(range(len(phases)), key=lambda i: (phases[i][1], -i))
        link = phases[longest][2] if phases[longest][1] > 0 else NO_LINK
        algorithm, extra_memory = self._algorithms(collective, calls, choices)
        figures = _StepFigures(algorithm, latency, transfer, self.network.link_name(link), extra_memory * call_bytes,
                               latency + transfer)
        self._figures[key] = figures
        return figures

    def step_time(self, collective: str, calls: Calls, chunks: Chunks, bytes_per_device: int) -> float:
        """Seconds for one step: `calls` (sorted member-rank tuples), call i spanning `chunks[i]` chunks."""
        return self._step_figures(collective, calls, chunks, bytes_per_device).time_s

    def step_cost(self, step: Step, calls: Calls, chunks: Chunks, bytes_per_device: int) -> StepCost:
        figures = self._step_figures(step.collective, calls, chunks, bytes_per_device)
        return StepCost(str(step), step.collective, figures.algorithm, max(chunks) * bytes_per_device / self.group_size,
                        figures.latency_s, figures.transfer_s, figures.bottleneck, figures.extra_memory_bytes)

    # --- one program -------------------------------------------------------------------------------

    def program_cost(self, lowered: LoweredProgram, bytes_per_device: int) -> ProgramCost:
        steps = []
        for lowered_step in lowered.steps:
            calls = sorted(lowered_step.calls, key=lambda call: call.members)
            steps.append((lowered_step.step, tuple(call.members for call in calls), tuple(call.chunks for call in calls)))
        return self.cost_of_steps(str(lowered.program), steps, bytes_per_device)

    def cost_of_steps(self, program: str, steps: list[tuple[Step, Calls, Chunks]], bytes_per_device: int) -> ProgramCost:
        """A program given as (step, sorted calls, chunks of each call) per step, in order."""
        n = self.group_size
        if n == 1:
            return ProgramCost(program, bytes_per_device, 1, (), 0.0, float("inf"), 0.0)
        costs = tuple(self.step_cost(step, calls, chunks, bytes_per_device) for step, calls, chunks in steps)
        total = 0.0
        for cost in costs:  # in program order, as the search adds them, so both agree exactly
            total += cost.time_s
        algbw = bytes_per_device / total
        return ProgramCost(program, bytes_per_device, n, costs, total, algbw, algbw * bus_factor(n))


def simulate(lowered_program: LoweredProgram, hierarchy: SynthesisHierarchy, topology: Topology,
             bytes_per_device: int, backend: str | Backend = "nccl") -> ProgramCost:
    """The predicted cost of one run of the program by every reduction group at once."""
    return Simulator(hierarchy, topology, backend).program_cost(lowered_program, bytes_per_device)


def baseline_cost(hierarchy: SynthesisHierarchy, topology: Topology, bytes_per_device: int,
                  backend: str | Backend = "nccl") -> ProgramCost:
    """The default all-reduce's cost, modelled exactly as any program."""
    return simulate(lower(baseline_program(hierarchy), hierarchy), hierarchy, topology, bytes_per_device, backend)
