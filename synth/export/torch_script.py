"""Export to a standalone torch.distributed script (one program, or a batch of several).

The script is a header of comments, the runtime in synth/export/torch_runtime.py copied
verbatim, and the plan as a Python string literal of JSON (repr of json.dumps): user text
only ever reaches the file as data, never as code. The runtime cannot import synth, so each
program carries the facts of its goal the runtime reads (`flat`: its torch call, where its
input lies and its result is read, its bus factor), written here from the goal object. A batch puts several programs, possibly
over different placements of the same world, in one script, because starting torchrun is the
slow part on a small machine.
"""

from __future__ import annotations

import json
from importlib import resources

from synth.export.plan import Plan, ProgramPlan
from synth.export.provenance import Provenance
from synth.text import python_comment as comment


def plan_data(plan: Plan) -> dict:
    """The plan in the compact form the runtime reads."""
    return {
        "world_size": plan.world_size,
        "communicators": [[list(group) for group in comm.groups] for comm in plan.communicators],
        "programs": [
            {
                "label": program.label,
                "text": program.text,
                "chunks": program.chunks,
                "reduction": program.reduction,
                "goal": program.goal.name,
                "final_places": None if program.final_places is None else list(program.final_places),
                "steps": [
                    {
                        "text": step.text,
                        "op": step.collective,
                        "comm": step.communicator,
                        "calls": [None if call is None else [call.color, call.key, call.size, call.lo, call.hi, call.root]
                                  for call in step.calls],
                        **({} if step.places is None else {"places": list(step.places)}),
                    }
                    for step in program.steps
                ],
            }
            for program in plan.programs
        ],
    }


def flat_facts(program: ProgramPlan) -> dict:
    """What the runtime needs to know of a program's goal (synth/goals.py), so that it reads
    facts, never a goal's name: its flat call as torch names it, which part of a member's
    buffer is input and which is the result ("whole", "own block", "root only"), and
    nccl-tests' bus factor over the reduction group."""
    goal = program.goal
    return {"call": goal.torch_call, "input": goal.start, "result": goal.result,
            "bus_factor": goal.bus_factor(program.chunks)}


def script_data(plan: Plan) -> dict:
    """The plan as the script's runtime reads it: plan_data, each program with its flat facts."""
    data = plan_data(plan)
    for program, entry in zip(plan.programs, data["programs"]):
        entry["flat"] = flat_facts(program)
    return data


def runtime_source() -> str:
    return resources.files("synth.export").joinpath("torch_runtime.py").read_text(encoding="utf-8")


def render(plan: Plan, provenance: Provenance) -> str:
    n = plan.world_size
    lines = ["#!/usr/bin/env python3"]
    lines += [comment(line) for line in provenance.lines()]
    lines.append(comment(f"Run: torchrun --nproc-per-node {n} THIS_SCRIPT --check   "
                         f"(or across nodes: torchrun --nnodes NODES --nproc-per-node GPUS_PER_NODE ...; "
                         f"NODES * GPUS_PER_NODE = {n})"))
    lines.append(comment(f"{len(plan.programs)} program(s), float32 sum, ranks numbered as torchrun numbers them:"))
    for index, program in enumerate(plan.programs):
        label = f" [{program.label}]" if program.label else ""
        lines.append(comment(f"  {index}{label}: {program.text}"))
    data = json.dumps(dict(script_data(plan), command=provenance.command), sort_keys=True, separators=(",", ":"))
    return "\n".join(lines) + "\n\n" + runtime_source().rstrip() + "\n\n\n" + (
        f"PLAN = json.loads({data!r})\n\n"
        "if __name__ == \"__main__\":\n"
        "    sys.exit(main(PLAN))\n"
    )
