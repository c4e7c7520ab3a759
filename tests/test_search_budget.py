"""The search-size estimate and the refusal of searches that cannot finish (issue 12)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synth.goals import parse_goal
from synth.errors import SearchTooLargeError, UsageError
from synth.hierarchy import build_hierarchy
from synth.placement import enumerate_placements, parse_axes
from synth.search import Enumerator, SearchOptions
from synth.search import budget as search_budget
from synth.search.budget import (
    DEFAULT_BUDGET_S,
    EXPANSIONS,
    MAX_DEPTH,
    check_budget,
    estimate,
    largest_length,
    search_depth,
)
from synth.semantics import Semantics
from synth.topology_file import load_topology

RESULTS = Path(__file__).resolve().parent.parent / "results" / "synthesis-speed"


def levels(depth: int, size: int = 2):
    return tuple(f"l{i}" for i in range(depth)), (size,) * depth


def test_the_tables_are_the_committed_calibration():
    """synth/search/budget.py carries what `python -m benchmarks.synthesis --calibrate` measured."""
    document = json.loads((RESULTS / "synthesis-calibration.json").read_text())
    assert {int(d): tuple(v) for d, v in document["expansions"].items()} == EXPANSIONS
    assert {int(d): v for d, v in document["seconds_per_expansion"].items()} == search_budget.SECONDS_PER_EXPANSION


@pytest.mark.parametrize("depth, max_len", [(2, 5), (3, 4), (4, 3)])
def test_the_table_is_what_the_search_expands_today(depth, max_len):
    """A stale table (the search changed, the calibration was not rerun) fails here."""
    enumerator = Enumerator(Semantics(*levels(depth)), SearchOptions(max_len=max_len))
    enumerator.total()
    assert enumerator.stats.expanded == estimate(depth, max_len).expansions


@pytest.mark.parametrize("sizes, max_len", [((3, 4, 2), 5), ((8, 4), 6), ((4, 2, 3, 2), 4)])
def test_larger_levels_expand_no_more_than_levels_of_two(sizes, max_len):
    names = tuple(f"l{i}" for i in range(len(sizes)))
    enumerator = Enumerator(Semantics(names, sizes), SearchOptions(max_len=max_len))
    enumerator.total()
    assert enumerator.stats.expanded <= estimate(search_depth(sizes), max_len).expansions


def test_estimates_grow_with_length_and_depth():
    for depth in range(1, MAX_DEPTH + 1):
        seconds = [estimate(depth, length).seconds for length in range(1, 10)]
        assert seconds == sorted(seconds)
    for length in range(2, 6):
        assert [estimate(d, length).expansions for d in range(1, MAX_DEPTH + 1)] == sorted(
            estimate(d, length).expansions for d in range(1, MAX_DEPTH + 1))


def test_a_seven_level_hierarchy_at_length_six_is_refused_with_the_length_that_fits():
    names, sizes = levels(7)
    with pytest.raises(SearchTooLargeError) as refusal:
        Enumerator(Semantics(names, sizes), SearchOptions(max_len=6))
    error = refusal.value
    assert isinstance(error, UsageError)
    assert (error.depth, error.max_len) == (7, 6)
    assert 1 <= error.largest_length < 6
    assert estimate(7, error.largest_length).seconds <= DEFAULT_BUDGET_S < estimate(7, error.largest_length + 1).seconds
    message = str(error)
    assert "7-level" in message and "length 6" in message and f"at most {error.largest_length} steps" in message
    assert "--" not in message  # the library describes values; the command names its flags
    Enumerator(Semantics(names, sizes), SearchOptions(max_len=error.largest_length))  # that length is accepted


def test_a_hierarchy_deeper_than_measured_is_refused_before_anything_is_built():
    names, sizes = levels(20)
    semantics = Semantics(names, sizes)
    with pytest.raises(SearchTooLargeError, match="20 levels") as refusal:
        Enumerator(semantics, SearchOptions(max_len=1))
    assert refusal.value.largest_length == 0
    assert "initial" not in vars(semantics) and "alphabet" not in vars(semantics)


def test_levels_of_one_member_do_not_count():
    assert search_depth((2, 1, 4, 1)) == 2
    assert check_budget([(("a", "b", "c"), (1, 2, 1))], 5).depth == 1


def test_no_budget_lifts_the_time_limit_but_not_the_depth_limit():
    names, sizes = levels(7)
    Enumerator(Semantics(names, sizes), SearchOptions(max_len=6, budget_s=None))
    with pytest.raises(SearchTooLargeError):
        Enumerator(Semantics(*levels(MAX_DEPTH + 1)), SearchOptions(max_len=1, budget_s=None))


def test_split_hierarchies_of_three_reduced_axes_are_refused_together():
    """Issue 12: `--hierarchy split` with three reduced axes on dgx-h100-2x8x8, every placement."""
    topology = load_topology("dgx-h100-2x8x8")
    hierarchies = [build_hierarchy(p, ("data", "pipe", "model"), "split")
                   for p in enumerate_placements(topology, parse_axes("data=4,pipe=4,model=8"))]
    with pytest.raises(SearchTooLargeError) as refusal:
        check_budget([(h.level_names, h.sizes) for h in hierarchies], 5)
    error = refusal.value
    assert f"{len(hierarchies)} synthesis hierarchies" in str(error)
    assert error.largest_length == largest_length([search_depth(h.sizes) for h in hierarchies], DEFAULT_BUDGET_S, 4)
    assert error.largest_length >= 3
    check_budget([(h.level_names, h.sizes) for h in hierarchies], error.largest_length)


@pytest.mark.parametrize("arguments, hint", [
    (("--levels", "2,2,2,2,2,2,2", "--axes", "128", "--reduce", "a0", "--max-len", "6"), "--max-len"),
    (("--topology", "dgx-h100-2x8x8", "--axes", "data=4,pipe=4,model=8", "--reduce", "data,pipe,model",
      "--hierarchy", "split", "--count"), "--max-len"),
    (("--levels", "2,2,2,2,2,2,2,2,2", "--axes", "512", "--reduce", "a0", "--max-len", "2"), "--hierarchy merged"),
])
def test_the_command_refuses_at_once_with_one_line_naming_the_flag(run_cli, arguments, hint):
    code, out, err = run_cli("programs", *arguments)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and hint in err and "Traceback" not in err


def test_the_goal_tables_are_the_committed_calibration():
    """GOAL_EXPANSIONS carries what `python -m benchmarks.goals --calibrate` measured."""
    document = json.loads((RESULTS.parent / "synthesis-goals" / "goals-calibration.json").read_text())
    for goal, rows in document["tables"].items():
        assert {int(d): tuple(row["expansions"]) for d, row in rows.items()} == search_budget.GOAL_EXPANSIONS[parse_goal(goal)]


@pytest.mark.parametrize("goal", ["reducescatter", "allgather", "alltoall", "broadcast", "reduce"])
@pytest.mark.parametrize("depth, max_len", [(2, 5), (3, 4)])
def test_the_goal_tables_are_what_the_search_expands_today(goal, depth, max_len):
    enumerator = Enumerator(Semantics(*levels(depth), goal=goal), SearchOptions(max_len=max_len))
    enumerator.total()
    assert enumerator.stats.expanded == estimate(depth, max_len, goal).expansions


def test_a_goal_search_beyond_the_budget_is_refused_with_the_length_that_fits():
    from synth.errors import SearchTooLargeError

    with pytest.raises(SearchTooLargeError) as refused:
        search_budget.check_budget([(("a", "b", "c", "d", "e", "f"), (2,) * 6)], 8, goal="reduce")
    assert 0 < refused.value.largest_length < 8
