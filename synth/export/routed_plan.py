"""A JSON plan of dispatch or combine programs (docs/model.md section 7, "Dispatch and
combine"): for each program, each step's `AllToAll` calls as global ranks, so a runtime
builds one process group per call and runs the steps in order, forwarding each token copy
(or summed partial) to the member of the call that agrees with its destination on the
step's levels. The routing is recorded where one was given: the programs are valid for
every routing, the ranking that chose them was for that one.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from synth.goals import Goal
from synth.hierarchy import SynthesisHierarchy
from synth.routed import RoutedSemantics
from synth.routing import Routing
from synth.semantics import FORMS

FORMAT = "synth-routed-plan"
VERSION = 1


def routed_plan(hierarchy: SynthesisHierarchy, goal: Goal, programs, routing: Routing | None, command) -> dict:
    """The plan as a JSON-ready dict; every program is checked first (InvalidProgramError)."""
    groups = hierarchy.groups
    entries = [{"program": str(program),
                "steps": program_steps(hierarchy.level_names, hierarchy.sizes, groups, goal, program)}
               for program in programs]
    return {"format": FORMAT, "version": VERSION, "command": list(command), "collective": goal.name,
            "routing": None if routing is None else asdict(routing),
            "hierarchy": [{"name": level.name, "size": level.size} for level in hierarchy.levels],
            "groups": [list(group) for group in groups], "programs": entries}


def program_steps(level_names, sizes, groups, goal: Goal | str, program) -> list[dict]:
    """Each step of `program` as the plan writes it (its text, the levels it resolves, its
    calls per group in global ranks); InvalidProgramError for a program invalid for `goal`.
    The runtime's reader (synth.torch.moe_plan) recomputes them to check a file."""
    level_names, sizes = tuple(level_names), tuple(sizes)
    steps = []
    for entry in RoutedSemantics(level_names, sizes, goal).run(program):
        step = entry.step
        calls, _ = FORMS[step.form](sizes, level_names.index(step.level))
        steps.append({"step": str(step), "levels": [level_names[i] for i in sorted(entry.after - entry.before)],
                      "calls": [[[group[m] for m in call] for call in sorted(calls)] for group in groups]})
    return steps


def render(plan: dict) -> str:
    return json.dumps(plan, separators=(",", ":")) + "\n"
