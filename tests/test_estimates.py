"""The estimate interface and the costing engine: the search with either estimate equals the
head of the full ranking on many generated cases, shared engines give the same numbers as a
context's own, the cost context is checked once, and a backend plugs in through its plans and
its own estimate of a call alone."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synth.search.programs import ProgramSets
from synth.search.rank import Ranker, rank_programs
from synth.errors import UsageError
from synth.hierarchy import build_hierarchy
from synth.language import parse_program
from synth.lowering import lower
from synth.model import (DEFAULT_ESTIMATE, ESTIMATES, LOCKSTEP, PIPELINED, CostEngine, StepCalls, cost_context,
                         engine_for, program_cost)
from synth.model.algorithms import GLOO, NCCL_FLOWS
from synth.model.nccl.hardware import estimate_group
from synth.placement import enumerate_placements, parse_axes
from synth.topology_file import load_topology

JOBS = (
    ("emu-2x4", "data=4,model=2"), ("emu-2x2x2", "data=4,model=2"), ("emu-4x2", "data=8"),
    ("dgx-a100-x4", "data=8,model=4"), ("gcp-n1-v100-4x8", "data=8,model=4"), ("paper-fig3", "data=4,model=4"),
    ("dgx-h100-2x8x8", "data=16,model=8"), ("gcp-a2-2x16", "data=16,model=2"),
)
REQUESTS = (("data",), ("model",), ("data", "model"))


@st.composite
def cases(draw):
    name, axes_text = draw(st.sampled_from(JOBS))
    topology, axes = load_topology(name), parse_axes(axes_text)
    placement = draw(st.sampled_from(enumerate_placements(topology, axes)))
    names = {axis.name for axis in axes}
    request = draw(st.sampled_from([r for r in REQUESTS if set(r) <= names]))
    kind = draw(st.sampled_from(("merged", "split")))
    hierarchy = build_hierarchy(placement, request, kind)
    max_len = draw(st.integers(min_value=1, max_value=4 if len(hierarchy.sizes) <= 3 else 3))
    size = draw(st.sampled_from((1, 8, 4096, 65536, 3 * 2**20 + 5, 2**26, 2**30)))
    return topology, hierarchy, draw(st.sampled_from(("nccl", "gloo"))), max_len, size, draw(st.integers(1, 12))


@pytest.mark.parametrize("estimate", ESTIMATES)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_top_k_is_the_head_of_the_full_ranking_for_either_estimate(estimate, case):
    topology, hierarchy, backend, max_len, size, k = case
    if hierarchy.group_size == 1:
        return
    context = cost_context(hierarchy, topology, backend)
    full = rank_programs(context, size, max_len=max_len, estimate=estimate)
    top = Ranker(context, max_len, estimate).top(size, k)
    head = [row for row in top if not (row.baseline and row not in full[:k])]
    assert head == full[:k]
    assert sum(row.baseline for row in top) == 1
    # the values the search pops are the ranked times, in order
    popped = list(Ranker(context, max_len, estimate).cheapest(size))
    assert [(t, str(p)) for t, p in popped] == [(row.time_s, str(row.program)) for row in full]


@pytest.mark.parametrize("estimate", ESTIMATES)
def test_a_shared_engine_costs_exactly_as_the_contexts_own(estimate):
    """Placements whose groups sit on the system alike share one engine (on canonical devices);
    every program costs the same there as on the context's own devices, bit for bit."""
    estimate = ESTIMATES[estimate]
    topology, axes = load_topology("dgx-h100-2x8x8"), parse_axes("data=4,pipe=4,model=8")
    sets, sizes = ProgramSets(), [1024, 2**20, 2**30]
    shared = 0
    for placement in enumerate_placements(topology, axes)[:8]:
        for request in REQUESTS[:2] + (("data", "pipe"),):
            hierarchy = build_hierarchy(placement, request)
            context = cost_context(hierarchy, topology)
            programs = sets.get(hierarchy, 3)
            own = estimate.program_times(CostEngine(context), programs.table, sizes)
            engine = engine_for(context)
            shared += engine.context is not context
            assert np.array_equal(estimate.program_times(engine, programs.table, sizes), own)
    assert shared > 0


def test_the_default_estimate_is_the_measured_better_one(run_cli):
    assert DEFAULT_ESTIMATE is PIPELINED
    code, out, _ = run_cli("rank", "--topology", "emu-2x4", "--axes", "data=8", "--reduce", "data", "--bytes", "1MiB",
                           "--top", "2", "--json")
    assert code == 0 and {row["estimate"] for row in json.loads(out)} == {"pipelined"}


def test_the_cost_context_is_checked_once():
    topology = load_topology("dgx-a100-x4")
    other = load_topology("emu-2x4")
    hierarchy = build_hierarchy(enumerate_placements(other, parse_axes("data=8"))[0], ("data",))
    with pytest.raises(UsageError, match="not dgx-a100-x4"):
        cost_context(hierarchy, topology)
    with pytest.raises(UsageError, match="unknown backend 'mpi'"):
        cost_context(hierarchy, other, "mpi")
    from synth.topology import topology_from_levels

    bare = topology_from_levels("node=2,gpu=4")
    with pytest.raises(UsageError, match="no link figures"):
        cost_context(hierarchy, bare)
    context = cost_context(hierarchy, other, "gloo")
    assert context.backend is GLOO and context.group_size == 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.topology = topology


# --- the backend seam -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SlowStart:
    """A backend with its own estimate of a call alone: the flows' estimate plus a fixed
    start-up per call, and a preference for one algorithm whatever the flows say."""

    base: object = NCCL_FLOWS
    startup_s: float = 50e-6
    prefer: str = ""

    @property
    def name(self) -> str:
        return "slow-start"

    @property
    def launch_s(self) -> float:
        return self.base.launch_s

    def plans(self, call):
        return self.base.plans(call)

    def alone_s(self, call, plans, call_bytes, flow_s):
        own = flow_s + self.startup_s
        if self.prefer:
            own = own + np.array([0.0 if plan.algorithm == self.prefer else 1.0 for plan in plans])[None, :]
        return own


def test_a_call_alone_costs_launch_plus_the_backends_own_estimate():
    topology = load_topology("dgx-a100-x4")
    hierarchy = build_hierarchy(enumerate_placements(topology, parse_axes("data=32"))[0], ("data",))
    lowered = lower(parse_program("AllReduce(InsideGroup(node))"), hierarchy)
    plain = cost_context(hierarchy, topology, NCCL_FLOWS)
    slow = cost_context(hierarchy, topology, SlowStart())
    for size in (1024, 2**20, 2**30):
        for estimate in ESTIMATES.values():
            flows = program_cost(plain, lowered, size, estimate).time_s
            own = program_cost(slow, lowered, size, estimate).time_s
            assert own == pytest.approx(flows + 50e-6, rel=1e-12)
    step = program_cost(slow, lowered, 2**20, LOCKSTEP).steps[0]
    assert step.latency_s == pytest.approx(program_cost(plain, lowered, 2**20, LOCKSTEP).steps[0].latency_s + 50e-6)


def test_the_backends_own_estimate_picks_the_algorithm_and_contention_adds_the_flows_extra_drain():
    topology = load_topology("gcp-a2-2x16")
    placement = next(p for p in enumerate_placements(topology, parse_axes("data=2,model=16")) if p.matrix == ((2, 1), (1, 16)))
    hierarchy = build_hierarchy(placement, ("data",))  # 16 groups of 2 through one VM NIC
    lowered = lower(parse_program("AllReduce(InsideGroup(vm))"), hierarchy)
    for prefer in ("ring", "tree"):
        cost = program_cost(cost_context(hierarchy, topology, SlowStart(prefer=prefer)), lowered, 2**26, LOCKSTEP)
        assert cost.steps[0].algorithm == prefer
    plain, slow = cost_context(hierarchy, topology, NCCL_FLOWS), cost_context(hierarchy, topology, SlowStart())
    for groups in (1, 16):
        flows = program_cost(plain, lowered, 2**26, LOCKSTEP, CostEngine(plain, plain.devices[:groups])).time_s
        own = program_cost(slow, lowered, 2**26, LOCKSTEP, CostEngine(slow, slow.devices[:groups])).time_s
        assert own == pytest.approx(flows + 50e-6, rel=1e-12)  # same contention, same extra


def test_the_engine_costs_a_step_for_every_size_at_once():
    topology = load_topology("dgx-a100-x4")
    hierarchy = build_hierarchy(enumerate_placements(topology, parse_axes("data=32"))[0], ("data",))
    engine = CostEngine(cost_context(hierarchy, topology))
    n = hierarchy.group_size
    step = StepCalls("AllReduce", (tuple(range(n)),), (n,))
    sizes = [2**e for e in range(0, 34, 3)]
    together = engine.figures([step], sizes)
    for z, size in enumerate(sizes):
        alone = engine.figures([step], [size])
        assert together.time_s[0, z] == alone.time_s[0, 0] and together.chain_s[0, z] == alone.chain_s[0, 0]
    picked = [engine.regimes[r].algorithm for r in together.regime[0]]
    for size, algorithm in zip(sizes, picked):  # NCCL's own pick, which changes with the size
        choice = estimate_group(topology, range(n), "AllReduce", size).choice
        assert algorithm == f"{choice.algorithm}/{choice.protocol}"
    assert len(set(picked)) >= 3
