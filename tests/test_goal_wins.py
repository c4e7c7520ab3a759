"""The synthesis-wins study of every goal (benchmarks/goal_wins.py): pairs, verdicts, report."""

from __future__ import annotations

import csv
import json

import pytest

from benchmarks.goal_wins import OTHER_GOALS, GoalPair, goal_pairs, render, summary, write_rows
from synth.analysis.goal_rank import rank_goal
from synth.hierarchy import build_hierarchy
from synth.model.context import cost_context
from synth.placement import make_placement, parse_axes
from synth.topology_file import load_topology

SIZES = (64 * 1024, 16 * 2**20)


def _pair(speedup: float, error: float | None) -> GoalPair:
    return GoalPair("reducescatter", "t", "data=2,model=4", "[[1,2],[2,2]]", "model", 4, 2**20, "P", 1.0, "F",
                    speedup, error)


def test_a_predicted_win_inside_the_held_out_error_is_not_a_win():
    assert _pair(1.0, 0.1).verdict == "flat"
    assert _pair(1.05, 0.1).verdict == "inside error"
    assert _pair(1.2, 0.1).verdict == "win"
    assert _pair(1.2, None).verdict == "no error figure"
    counted = summary([_pair(1.0, 0.1), _pair(1.05, 0.1), _pair(1.2, 0.1), _pair(1.2, None)])
    assert counted == {"pairs": 4, "predicted_wins": 3, "wins": 1, "inside_error": 1, "no_error_figure": 1,
                       "max_win_speedup": pytest.approx(1.2), "max_predicted_speedup": pytest.approx(1.2)}


@pytest.fixture(scope="module")
def emu_pairs():
    return goal_pairs(load_topology("emu-2x4"), OTHER_GOALS, SIZES, 5)


def test_every_goal_placement_request_and_size_is_a_pair(emu_pairs):
    # emu-2x4: jobs data=2,model=4 and data=4,model=2, two placements each, three requests
    for goal in OTHER_GOALS:
        assert len([p for p in emu_pairs if p.goal == goal]) == 2 * 2 * 3 * len(SIZES)
    assert all(p.best_time_s <= p.flat_time_s for p in emu_pairs)


def test_a_pair_is_goal_rank_best_against_its_flat_call(emu_pairs):
    topology = load_topology("emu-2x4")
    pair = next(p for p in emu_pairs if p.goal == "reducescatter" and p.predicted_win)
    placement = make_placement(topology, parse_axes(pair.axes), json.loads(pair.matrix))
    hierarchy = build_hierarchy(placement, tuple(pair.reduce.split(",")), "merged")
    ranked = rank_goal(cost_context(hierarchy, topology, "nccl"), "reducescatter", [pair.bytes])[0]
    assert pair.best_program == str(ranked[0].program)
    assert pair.best_time_s == pytest.approx(ranked[0].time_s, rel=1e-12)
    assert pair.flat_time_s == pytest.approx(next(r for r in ranked if r.baseline).time_s, rel=1e-12)


def test_the_report_lists_each_goal_and_the_rows_file_each_predicted_win(emu_pairs, tmp_path):
    lines = "\n".join(render(emu_pairs, ["emu-2x4"], SIZES, "rows.csv"))
    for goal in ("reduce-scatter", "all-gather", "all-to-all", "broadcast", "reduce"):
        assert f"| {goal} | **all** |" in lines
    write_rows(emu_pairs, tmp_path / "rows.csv")
    rows = list(csv.DictReader((tmp_path / "rows.csv").open()))
    assert len(rows) == sum(p.predicted_win for p in emu_pairs)
    assert {row["verdict"] for row in rows} <= {"win", "inside error", "no error figure"}
