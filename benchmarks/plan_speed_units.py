"""The plan search's CPU time split by unit of work, timed inside a real plan (for the estimate's
per-unit constants in synth/plan/search.py; run by `python -m benchmarks.plan_speed --units`).

Run as a script in a fresh process (`python -m benchmarks.plan_speed_units ARGS...`, ARGS a
`synth plan` command line): it wraps the search's own functions with process-time timers, runs
the command, and prints one JSON line with the estimate's counts and the time of each unit:

* bounds: the first bounds (predict without data-parallel terms, and the groups' floors,
  step.group_floor), less the program searches and one-off costings they trigger;
* placements: listing the placements (listed_placements);
* group_shapes: the costings the lower-bound pass runs for the first time (a program search,
  a two-stage dispatch's forms, or a call's estimate on an equivalent system: memo misses of
  synth/plan/costs.py);
* gradient_schedules: the full predictions and their tighter bounds (data-parallel terms:
  gradient schedules, their program grids and searches, the sharded optimizer's gathers).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time


import synth.plan.costs as costs_module
import synth.plan.search as search_module

TIMES = {"bounds": 0.0, "placements": 0.0, "group_shapes": 0.0, "gradient_schedules": 0.0}
CALLS = {"lower_bound_predictions": 0, "group_floors": 0, "full_predictions": 0, "listed_placements": 0,
         "costing_misses": 0}
_state = {"depth": 0, "misses": 0.0}
_MEMOS = {"all_reduce": "_all_reduce", "_goal_call": "_single", "point_to_point": "_p2p", "two_stage": "_routed"}


def _wrap_costing(name: str, memo: str):
    inner = getattr(costs_module.CommunicationCosts, name)

    def wrapped(self, *args, **kwargs):
        if _state["depth"]:
            return inner(self, *args, **kwargs)
        before, started = len(getattr(self, memo)), time.process_time()
        _state["depth"] += 1
        try:
            return inner(self, *args, **kwargs)
        finally:
            _state["depth"] -= 1
            if len(getattr(self, memo)) > before:
                _state["misses"] += time.process_time() - started
                CALLS["costing_misses"] += 1

    setattr(costs_module.CommunicationCosts, name, wrapped)


def _wrap_predict():
    inner = search_module.predict

    def predict(*args, **kwargs):
        full = kwargs.get("data_parallel", True)
        misses, started = _state["misses"], time.process_time()
        if full:
            _state["depth"] += 1  # everything inside is the schedule unit's
        try:
            return inner(*args, **kwargs)
        finally:
            seconds = time.process_time() - started
            if full:
                _state["depth"] -= 1
                TIMES["gradient_schedules"] += seconds
                CALLS["full_predictions"] += 1
            else:
                missed = _state["misses"] - misses
                TIMES["group_shapes"] += missed
                TIMES["bounds"] += seconds - missed
                CALLS["lower_bound_predictions"] += 1

    search_module.predict = predict


def _wrap_floor():
    """The groups' floors: first bounds, less the costings they run first (group_shapes)."""
    inner = search_module.group_floor

    def group_floor(*args, **kwargs):
        misses, started = _state["misses"], time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            missed = _state["misses"] - misses
            TIMES["group_shapes"] += missed
            TIMES["bounds"] += time.process_time() - started - missed
            CALLS["group_floors"] += 1

    search_module.group_floor = group_floor


def _wrap_placements():
    inner = search_module.listed_placements

    def listed_placements(*args, **kwargs):
        started = time.process_time()
        listed = list(inner(*args, **kwargs))
        TIMES["placements"] += time.process_time() - started
        CALLS["listed_placements"] += len(listed)
        return listed

    search_module.listed_placements = listed_placements


def main(argv: list[str]) -> int:
    for name, memo in _MEMOS.items():
        _wrap_costing(name, memo)
    _wrap_predict()
    _wrap_placements()
    _wrap_floor()
    from synth.cli import main as cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli(argv)
    if code != 0:
        print(json.dumps({"code": code}))
        return 1
    result = json.loads(out.getvalue())
    print(json.dumps({"code": 0, "search": result["search"], "cpu_s": result["cpu_s"], "times": TIMES,
                      "calls": CALLS}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
