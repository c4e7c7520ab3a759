"""The search's home (synth/search/): its public names, a light import, and a completion bound
that refuses what it has no rule for instead of bounding it silently."""

from __future__ import annotations

import subprocess
import sys

import pytest

import synth.search as search
from synth.goals import parse_goal
from synth.hierarchy import build_hierarchy
from synth.model import cost_context
from synth.model.engine import CostEngine
from synth.placement import enumerate_placements, parse_axes
from synth.collectives import Combine, Delivery
from synth.search import completion
from synth.search.completion import Abstract, CompletionBound, UnknownStepKindError
from synth.semantics import Semantics
from synth.topology_file import load_topology


def test_every_public_name_resolves():
    for name in search.__all__:
        assert getattr(search, name) is not None, name


def test_importing_the_search_loads_neither_the_cost_model_nor_the_solver():
    code = ("import sys, synth.search; "
            "print(sorted(m for m in sys.modules if m.startswith('synth.model') or m in ('z3', 'numpy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _context():
    topology = load_topology("emu-2x2x2")
    placement = enumerate_placements(topology, parse_axes("data=8"))[0]
    return cost_context(build_hierarchy(placement, ("data",), "split"), topology)


def test_the_state_abstraction_is_a_named_type():
    walker = search.StateWalker(_context().hierarchy)
    a = walker.abstraction.of(walker.machine.initial)
    assert isinstance(a, Abstract) and a.lo == a.short == a.hi == 8 and not a.empty


def _bound_for(goal):
    context = _context()
    hierarchy = context.hierarchy
    semantics = Semantics(hierarchy.level_names, hierarchy.sizes, goal=goal)
    calls = [semantics.real_calls(step) for step, _ in semantics.alphabet]
    return lambda: CompletionBound(semantics, calls, CostEngine(context), 1 << 20)


def test_the_completion_bound_refuses_a_goal_it_has_no_finishing_rule_for(monkeypatch):
    monkeypatch.delitem(completion.FINISHING, parse_goal("alltoall").end)
    with pytest.raises(UnknownStepKindError, match="alltoall"):
        _bound_for("alltoall")()


def test_the_completion_bound_refuses_a_collective_it_has_no_rule_for(monkeypatch):
    monkeypatch.setattr(completion, "KNOWN_KINDS", completion.KNOWN_KINDS - {(Combine.EXCHANGE, Delivery.TRANSPOSE)})
    with pytest.raises(UnknownStepKindError, match="AllToAll"):
        _bound_for("alltoall")()


@pytest.mark.parametrize("goal", ["allreduce", "reducescatter", "allgather", "alltoall", "broadcast", "reduce"])
def test_the_completion_bound_has_a_rule_for_every_goal(goal):
    assert _bound_for(goal)() is not None
