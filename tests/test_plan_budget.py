"""The plan search is estimated (time and memory) before it starts and refused when it cannot
finish; budgets that would switch the refusal off are refused themselves. Fast: nothing here
runs a big search (benchmarks/plan_speed.py compares the estimate with real runs)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from synth.cli import main
from synth.errors import UsageError
from synth.placement import count_matching
from synth.plan.degrees import DegreeLimits, Degrees
from synth.plan.model import PRESETS
from synth.plan.search import BudgetValueError, PlanRequest, SearchBudgetError, check_size, estimate, plan
from synth.plan.step import compute_of
from synth.topology_file import load_topology


def _request(topology_name="selene", resize=None, **overrides):
    topology = load_topology(topology_name)
    if resize:
        name, size = resize
        levels = tuple(dataclasses.replace(level, size=size) if level.name == name else level
                       for level in topology.levels)
        topology = dataclasses.replace(topology, levels=levels)
    model = PRESETS["gpt3-175b"]
    return PlanRequest(model, topology, compute_of(topology.device, model.precision), **overrides)


def test_placements_listed_without_z3_are_z3s():
    """The estimate lists placements by their prime-exponent tables (synth.placement.matching_matrices)."""
    from synth.placement import (Inside, enumerate_placements, listed_placements, matching_matrices, parse_axes,
                                 placement_matrices)

    for name, axes, constraints in (("dgx-h100-2x8x8", "a=8,b=4,c=4", ()), ("selene", "a=4,b=16", ()),
                                    ("dgx-h100-2x8x8", "a=8,b=4,c=4", (Inside("b", "node"),)),
                                    ("selene", "a=2,b=2,c=16", ())):
        topology, parsed = load_topology(name), parse_axes(axes)
        assert sorted(matching_matrices(topology, parsed, constraints)) == placement_matrices(topology, parsed, constraints)
        # the planner's listing: Z3's placements, in Z3's order
        assert listed_placements(topology, parsed, constraints) == enumerate_placements(topology, parsed, constraints)


def test_the_estimate_counts_placements_exactly_and_grows_with_the_system():
    small, large = estimate(_request()), estimate(_request(resize=("node", 2048)))
    request = _request()
    assert small.placements == sum(count_matching(request.topology, choice.axes(), (), 10**6)
                                   for choice in _choices(request))
    assert large.devices > small.devices and large.estimated_bytes > small.estimated_bytes
    assert 0 < small.estimated_s < large.estimated_s


def _choices(request):
    from synth.plan.degrees import enumerate_degrees

    return [d for d in enumerate_degrees(request.topology.device_count, request.model, request.limits)
            if request.space.settings(request.model, d)]


def test_131072_gpus_are_estimated_in_a_moment_and_within_the_targets():
    size = estimate(_request(resize=("node", 16384)))
    assert size.estimated_s < 10 and size.estimated_bytes < 2**30


def test_a_search_over_the_time_budget_is_refused_with_its_figures():
    request = _request(budget_s=0.01)
    with pytest.raises(SearchBudgetError) as caught:
        plan(request)
    assert caught.value.over == "time" and caught.value.budget == 0.01
    assert "placements" in str(caught.value) and "--" not in str(caught.value)  # options are the command's


def test_a_search_over_the_memory_budget_is_refused():
    request = _request("dgx-h100-2x8x8", resize=("rack", 256), budget_s=3600, memory_budget_bytes=2**28)
    size = estimate(request)
    assert size.estimated_bytes > 2**28  # issue 15: accepted, then grew to gigabytes
    with pytest.raises(SearchBudgetError) as caught:
        check_size(size, request)
    assert caught.value.over == "memory" and "MiB" in str(caught.value)


def test_a_choice_with_too_many_placements_is_refused_before_the_search():
    """Eight levels of two: four axes of four have 8!/2!^4 = 2520 placements, more than can be listed."""
    request = _request(limits=DegreeLimits(dp=4, tp=4, pp=4, cp=4), budget_s=3600)
    node = request.topology.levels[0]
    levels = tuple(dataclasses.replace(node, name=f"l{i}", size=2) for i in range(8))
    request = dataclasses.replace(request, topology=dataclasses.replace(request.topology, levels=levels))
    size = estimate(request)
    assert size.too_many_placements == (Degrees(4, 4, 4, 4),)
    with pytest.raises(SearchBudgetError) as caught:
        check_size(size, request)
    assert caught.value.over == "placements"


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0, 0.0, True])
def test_budgets_that_would_switch_the_refusal_off_are_refused(value):
    with pytest.raises(BudgetValueError):
        _request(budget_s=value)
    with pytest.raises(BudgetValueError):
        _request(memory_budget_bytes=value)


@pytest.mark.parametrize("argv, words", [
    (["--budget", "nan"], "--budget 'nan': give a positive, finite"),
    (["--budget", "inf"], "--budget 'inf'"),
    (["--budget", "-5"], "--budget '-5'"),
    (["--budget", "1e999"], "--budget '1e999'"),
    (["--budget", "0.001"], "raise --budget"),
    (["--search-memory", "1MiB"], "raise --search-memory"),
    (["--search-memory", "0"], "--search-memory"),
])
def test_the_command_names_its_options_and_exits_2(argv, words, capsys):
    assert main(["plan", "-t", "selene", "-m", "gpt3-175b", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and "Traceback" not in err


def test_dgx_h100_rack_256_is_estimated_and_refused_over_memory(capsys):
    """Issue 15: accepted, then grew past the machine's memory. With a budget below its estimate: refused."""
    argv = ["plan", "-t", "dgx-h100-2x8x8", "--resize", "rack=256", "-m", "gpt3-175b", "--budget", "3600",
            "--search-memory", "256MiB"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "memory budget" in err and "MiB here" in err


def test_the_planner_names_no_option_the_command_does():
    """Option names live in synth/commands/: the planner's messages carry values (launch.py's
    and dispatcher.py's strings are Megatron-LM's own options, what the export writes)."""
    import ast
    from pathlib import Path

    import synth.plan

    folder = Path(synth.plan.__file__).parent
    found = []
    for path in sorted(folder.glob("*.py")):
        if path.name in ("launch.py", "dispatcher.py"):
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                      and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if any(part[:1].isalpha() for part in node.value.split("--")[1:]):
                    found.append(f"{path.name}:{node.lineno}: {node.value!r}")
    assert not found, found


def test_limit_errors_carry_the_value_and_the_command_names_the_option():
    from synth.plan.errors import LimitValueError

    with pytest.raises(LimitValueError) as caught:
        DegreeLimits(max_tp=0)
    assert caught.value.limit == "max_tp" and caught.value.value == 0 and "--" not in str(caught.value)
    from synth.commands.plan import _flags_for

    assert str(_flags_for(caught.value)) == "--max-tp 0: give a positive integer"
