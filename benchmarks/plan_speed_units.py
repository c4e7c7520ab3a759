"""The plan search's CPU time split by unit of work, timed inside a real plan (for the estimate's
per-unit constants in synth/plan/search.py; run by `python -m benchmarks.plan_speed --units`).

Run as a script in a fresh process (`python -m benchmarks.plan_speed_units ARGS...`, ARGS a
`synth plan` command line): it wraps the search's own functions with process-time timers, runs
the command, and prints one JSON line with the estimate's counts and the time of each unit:

* candidates: the lower-bound predictions (predict without data-parallel terms), less the
  program searches and one-off costings they trigger;
* placements: listing the placements (enumerate_placements);
* group_shapes: the costings the lower-bound pass runs for the first time (a program search or
  a call's estimate on an equivalent system: memo misses of synth/plan/costs.py);
* gradient_schedules: the full predictions (data-parallel terms: gradient schedules, their
  program grids and searches), less the goal programs inside them;
* goal_programs: building and pricing synth.analysis.goal_rank.GoalPrograms (a reduce-scatter,
  all-gather or all-to-all's program list on a group shape, lowered and costed at the sizes
  asked), wherever the search asks for them; with the resident memory they add (the growth of
  the process's RSS across those calls, summed).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time

import os

import synth.analysis.goal_rank as goal_module
import synth.plan.costs as costs_module
import synth.plan.search as search_module

TIMES = {"candidates": 0.0, "placements": 0.0, "group_shapes": 0.0, "gradient_schedules": 0.0, "goal_programs": 0.0}
CALLS = {"lower_bound_predictions": 0, "full_predictions": 0, "listed_placements": 0, "costing_misses": 0,
         "goal_program_objects": 0}
MEMORY = {"goal_programs": 0}  # bytes of RSS growth across the goal programs' calls
_state = {"depth": 0, "misses": 0.0, "goal_depth": 0}
_MEMOS = {"all_reduce": "_all_reduce", "_goal_call": "_single", "point_to_point": "_p2p"}
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _resident() -> int:
    with open("/proc/self/statm", encoding="ascii") as handle:
        return int(handle.read().split()[1]) * _PAGE


def _wrap_goal(name: str):
    """Time (and RSS growth) of GoalPrograms' `name`, outermost calls only."""
    inner = getattr(goal_module.GoalPrograms, name)

    def wrapped(self, *args, **kwargs):
        if _state["goal_depth"]:
            return inner(self, *args, **kwargs)
        _state["goal_depth"] += 1
        resident, started = _resident(), time.process_time()
        try:
            return inner(self, *args, **kwargs)
        finally:
            _state["goal_depth"] -= 1
            TIMES["goal_programs"] += time.process_time() - started
            MEMORY["goal_programs"] += max(0, _resident() - resident)
            if name == "__init__":
                CALLS["goal_program_objects"] += 1

    setattr(goal_module.GoalPrograms, name, wrapped)


def _wrap_costing(name: str, memo: str):
    inner = getattr(costs_module.CommunicationCosts, name)

    def wrapped(self, *args, **kwargs):
        if _state["depth"]:
            return inner(self, *args, **kwargs)
        before, started, goal = len(getattr(self, memo)), time.process_time(), TIMES["goal_programs"]
        _state["depth"] += 1
        try:
            return inner(self, *args, **kwargs)
        finally:
            _state["depth"] -= 1
            if len(getattr(self, memo)) > before:
                _state["misses"] += time.process_time() - started - (TIMES["goal_programs"] - goal)
                CALLS["costing_misses"] += 1

    setattr(costs_module.CommunicationCosts, name, wrapped)


def _wrap_predict():
    inner = search_module.predict

    def predict(*args, **kwargs):
        full = kwargs.get("data_parallel", True)
        misses, started, goal = _state["misses"], time.process_time(), TIMES["goal_programs"]
        if full:
            _state["depth"] += 1  # everything inside is the schedule unit's
        try:
            return inner(*args, **kwargs)
        finally:
            seconds = time.process_time() - started - (TIMES["goal_programs"] - goal)  # goal programs: their own unit
            if full:
                _state["depth"] -= 1
                TIMES["gradient_schedules"] += seconds
                CALLS["full_predictions"] += 1
            else:
                missed = _state["misses"] - misses
                TIMES["group_shapes"] += missed
                TIMES["candidates"] += seconds - missed
                CALLS["lower_bound_predictions"] += 1

    search_module.predict = predict


def _wrap_placements():
    inner = search_module.enumerate_placements

    def enumerate_placements(*args, **kwargs):
        started = time.process_time()
        listed = list(inner(*args, **kwargs))
        TIMES["placements"] += time.process_time() - started
        CALLS["listed_placements"] += len(listed)
        return iter(listed)

    search_module.enumerate_placements = enumerate_placements


def main(argv: list[str]) -> int:
    for name, memo in _MEMOS.items():
        _wrap_costing(name, memo)
    _wrap_predict()
    _wrap_placements()
    _wrap_goal("__init__")
    _wrap_goal("prefetch")
    from synth.cli import main as cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli(argv)
    if code != 0:
        print(json.dumps({"code": code}))
        return 1
    result = json.loads(out.getvalue())
    print(json.dumps({"code": 0, "search": result["search"], "cpu_s": result["cpu_s"], "times": TIMES,
                      "calls": CALLS, "memory": MEMORY}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
