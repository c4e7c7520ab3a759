"""A dispatch or combine plan read back for the runtime, every field checked (no torch).

`synth export --collective dispatch|combine --format json` writes the programs a ranking
chose, each step's calls in global ranks (synth.export.routed_plan). The token dispatcher
(synth.torch.moe) runs two forms, so the plan's program must be one of them:

- one step over the whole group (`AllToAll(InsideGroup(<outermost level>))`): the flat form;
- two steps, across to the same-index member of each inner group, then inside that group
  (`AllToAll(Parallel(node)); AllToAll(InsideGroup(gpu))`; for combine the reverse): the
  two-stage form, its inner groups (the second step's calls) being the layout's nodes.

The plan's groups become the ExpertLayout's expert-parallel groups; the flat form's nodes
are the blocks of the hierarchy's innermost level (they only count the rows that cross).
Any other program raises NoRuntimeFormError naming it. The file is input, so each field is
checked where it is read and the steps are recomputed from the program's text by synth's
semantics (a program invalid for its goal, or calls that are not its, are refused): anything
wrong raises PlanFileError, one line naming the field.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from math import prod
from pathlib import Path

from synth.errors import InvalidProgramError, PlanFileError, UsageError
from synth.goals import ROUTED_GOALS, Goal
from synth.torch.errors import NoRuntimeFormError
from synth.torch.moe_layout import ExpertLayout
from synth.torch.plan_document import MAX_RANKS, Fields, _echo

FORMAT, VERSION = "synth-routed-plan", 1
FIX = "write it again with synth export's JSON format for dispatch or combine"


@dataclass(frozen=True)
class DispatchPlan:
    """What TokenDispatcher.from_plan needs: the layout, top-k and form of one program."""

    collective: str  # dispatch or combine: which of the two the plan's ranking priced
    program: str  # the program's text
    form: str  # "flat" or "hierarchical" (synth.torch.moe.FORMS)
    layout: ExpertLayout
    top_k: int


def load_dispatch_plan(path: str | os.PathLike, num_experts: int | None = None, top_k: int | None = None,
                       program: int = 0) -> DispatchPlan:
    """The plan in a file; its `program` (0: the best the ranking found). `num_experts` and
    `top_k` are needed when the plan has no routing, and must agree with it when it has one."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise UsageError(f"cannot read the plan {os.fspath(path)!r}: {error}") from None
    except (ValueError, RecursionError) as error:
        raise PlanFileError(f"cannot read the plan {os.fspath(path)!r}: not a JSON plan "
                            f"({' '.join(str(error).split())[:80] or type(error).__name__}); {FIX}") from None
    return read_dispatch_plan(document, f"plan {os.fspath(path)!r}", num_experts, top_k, program)


class _Fields(Fields):
    def fail(self, where: str, problem: str):
        raise PlanFileError(f"{self.source}: {where} {problem}; {FIX}")


def read_dispatch_plan(document, source: str = "the plan", num_experts: int | None = None,
                       top_k: int | None = None, program: int = 0) -> DispatchPlan:
    """As load_dispatch_plan, from the file's value."""
    fields = _Fields(source)
    document = fields.obj(document, "the document")
    if document.get("format") != FORMAT:
        raise PlanFileError(f"{source}: not a synth dispatch or combine plan (format "
                            f"{_echo(document.get('format'))}); {FIX}")
    if document.get("version") != VERSION:
        fields.fail("version", f"is {_echo(document.get('version'))}: this synth reads version {VERSION}")
    goal = fields.goal(fields.get(document, "collective", ""), "collective", ROUTED_GOALS)
    names, sizes = _hierarchy(fields, fields.get(document, "hierarchy", ""))
    groups = _groups(fields, fields.get(document, "groups", ""), prod(sizes))
    experts, k = _routing(fields, document.get("routing"), num_experts, top_k)
    programs = fields.array(fields.get(document, "programs", ""), "programs", least=1)
    if type(program) is not int or not 0 <= program < len(programs):
        raise UsageError(f"program {program!r}: {source} has {len(programs)} program(s), numbered from 0")
    chosen = None
    for index, entry in enumerate(programs):
        text, steps = _program(fields, entry, f"programs[{index}]", names, sizes, groups, goal)
        if index == program:
            chosen = text, steps
    text, steps = chosen
    try:
        form, layout = _form(steps[::-1] if goal.reverses else steps, groups, sizes[-1], experts)
    except UsageError as error:  # the routing's experts do not spread over the groups
        fields.fail("routing.experts" if document.get("routing") else "groups", f"do not fit: {error}")
    if form is None:
        raise NoRuntimeFormError(
            f"{source}: programs[{program}] {text!r} has no form in synth.torch's dispatcher, which runs the flat "
            f"all-to-all and the two-stage {goal} (across to the same-index member of each node, then inside "
            f"the node{', reversed' if goal.reverses else ''}): export one of those programs")
    return DispatchPlan(goal.name, text, form, layout, k)


def _hierarchy(fields: Fields, value) -> tuple[tuple[str, ...], tuple[int, ...]]:
    levels = [fields.obj(level, f"hierarchy[{i}]") for i, level in enumerate(fields.array(value, "hierarchy", least=1))]
    names = tuple(fields.text(fields.get(level, "name", f"hierarchy[{i}]"), f"hierarchy[{i}].name")
                  for i, level in enumerate(levels))
    sizes = tuple(fields.integer(fields.get(level, "size", f"hierarchy[{i}]"), f"hierarchy[{i}].size", 1, MAX_RANKS)
                  for i, level in enumerate(levels))
    if len(set(names)) != len(names):
        fields.fail("hierarchy", f"names a level twice ({', '.join(names)})")
    if prod(sizes) > MAX_RANKS:
        fields.fail("hierarchy", f"sizes {list(sizes)[:16]} multiply past {MAX_RANKS} ranks")
    return names, sizes


def _groups(fields: Fields, value, size: int) -> tuple[tuple[int, ...], ...]:
    entries = fields.array(value, "groups", least=1)
    world = size * len(entries)
    if world > MAX_RANKS:
        fields.fail("groups", f"hold {world} ranks, more than {MAX_RANKS}")
    groups = tuple(fields.ranks(group, f"groups[{i}]", world, size) for i, group in enumerate(entries))
    if sorted(rank for group in groups for rank in group) != list(range(world)):
        fields.fail("groups", f"do not split ranks 0..{world - 1} into groups of {size} (a rank missing or in two groups)")
    return groups


def _routing(fields: Fields, value, num_experts, top_k) -> tuple[int, int]:
    """(experts, top-k): the routing's, the caller's where it has none; they must agree."""
    if value is None:
        if num_experts is None or top_k is None:
            raise UsageError("the plan records no routing: give num_experts and top_k")
        return num_experts, top_k
    from synth.routing import Routing

    value = fields.obj(value, "routing")
    try:
        routing = Routing(**{key: tuple(v) if key == "weights" and isinstance(v, list) else v
                             for key, v in value.items()})
    except TypeError as error:  # a key Routing does not have
        fields.fail("routing", f"is not a routing ({' '.join(str(error).split())[:80]})")
    except UsageError as error:
        fields.fail("routing", f"is not a routing: {error}")
    for name, given, recorded in (("num_experts", num_experts, routing.experts), ("top_k", top_k, routing.topk)):
        if given is not None and given != recorded:
            raise UsageError(f"{name}={given!r}, but the plan was ranked for a routing of {recorded}: give "
                             f"{recorded}, or export the plan for yours")
    return routing.experts, routing.topk


def _program(fields: Fields, entry, where: str, names, sizes, groups, goal: Goal) -> tuple[str, list[dict]]:
    """The program's text and its steps, which must be the ones its text gives on the hierarchy."""
    from synth.export.routed_plan import program_steps
    from synth.language import parse_program

    entry = fields.obj(entry, where)
    text = fields.text(fields.get(entry, "program", where), f"{where}.program")
    try:
        steps = program_steps(names, sizes, groups, goal, parse_program(text))
    except InvalidProgramError as error:
        fields.fail(f"{where}.program", f"{_echo(text)} is not a valid {goal} program on the hierarchy "
                                        f"{dict(zip(names, sizes))}: {' '.join(str(error).split())[:160]}")
    except UsageError as error:  # does not parse, or names a level the hierarchy lacks
        fields.fail(f"{where}.program", f"{_echo(text)} is not a program here: {' '.join(str(error).split())[:160]}")
    written = fields.array(fields.get(entry, "steps", where), f"{where}.steps", len(steps))
    for number, (step, want) in enumerate(zip(written, steps)):
        if step != want:
            fields.fail(f"{where}.steps[{number}]", f"is not step {number + 1} of {text!r} on the plan's groups "
                                                    f"({want['step']})")
    return text, steps


def _form(steps: list[dict], groups, innermost: int, experts: int) -> tuple[str | None, ExpertLayout | None]:
    """The runtime form running `steps` (in dispatch order) and its layout; (None, None) when none does."""
    if len(steps) == 1:
        nodes = [group[start:start + innermost] for group in groups for start in range(0, len(group), innermost)]
        return "flat", ExpertLayout.from_groups(experts, groups, nodes)
    if len(steps) != 2:
        return None, None
    across, inside = ([tuple(call) for per_group in step["calls"] for call in per_group] for step in steps)
    if sorted(rank for call in inside for rank in call) != sorted(rank for group in groups for rank in group):
        return None, None  # the second step idles some ranks: not the inside-node exchange
    layout = ExpertLayout.from_groups(experts, groups, inside)
    try:
        split_inside, split_across = layout.split_groups()
    except UsageError:  # inner groups of different sizes inside one EP group
        return None, None
    if set(split_inside) != set(inside) or set(split_across) != set(across):
        return None, None
    return "hierarchical", layout
