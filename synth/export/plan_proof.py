"""A rank-level plan re-proved: every rank's calls, run as the runtimes run them, compute the
goal of each program (docs/model.md section 7) over the plan's reduction groups.

A plan read from a file is input: a changed chunk range, communicator, key, `places` or
`final_places` would make a runtime return wrong sums without a word. `prove_plan` checks
first that the calls are consistent with the communicators (every member of a group calls,
with one range and one root; an idle rank is in no group; a rank's color, key and size are
its communicator's), then runs each program on numbers, once per distinct shape of reduction
group (a plan made by synth has one shape), exactly as synth.export.torch_runtime runs it:
in place, ReduceScatter keeping block `key` of the range, AllGather giving it, AllToAll
swapping blocks, Reduce leaving the non-roots' range undefined, Permute moving the chunk at
place p to `places[p]`. The result is compared with the goal's flat collective on the same
input, where the framework reads it (reduce-scatter: block r at `final_places[r]`).

The numbers are random residues modulo a prime, drawn anew at each call, in two independent
lanes: the result of any sequence of these steps is a linear form in the inputs, and two
different linear forms agree at a random point with probability 1/p per lane, so a plan that
does not compute its goal passes with probability below 2^-60. Data that is undefined (a
Reduce's non-roots, an all-gather's output before it is written) is tracked apart and never
counts as a result. Cost: N^2 residues per distinct group shape (N the group size).
"""

from __future__ import annotations

import numpy as np

from synth.collectives import collective
from synth.errors import PlanFileError
from synth.export.plan import Plan, ProgramPlan
from synth.goals import GATHERED, OWN_BLOCK, ROOT_EVERYWHERE, ROOT_ONLY, TRANSPOSED

PRIME = 2**31 - 1  # sums of up to 2^32 residues fit an int64
LANES = 2


def is_permutation(values, n: int) -> bool:
    return len(values) == n and sorted(values) == list(range(n))


def prove_plan(plan: Plan, reduction_groups, where: str = "the plan") -> None:
    """PlanFileError naming the program (and step) unless every program of `plan` computes its
    goal over `reduction_groups` (tuples of global ranks, each in member order)."""
    world = plan.world_size
    groups = [tuple(group) for group in reduction_groups]
    member_of: dict[int, tuple[int, int]] = {}
    for index, group in enumerate(groups):
        for member, rank in enumerate(group):
            member_of[rank] = (index, member)
    rng = np.random.default_rng()
    for index, program in enumerate(plan.programs):
        label = f"{where}: programs[{index}]"
        _check_layout(program, label)
        colors = {comm: plan.communicators[comm].colors(world) for comm in {s.communicator for s in program.steps}
                  if comm >= 0}
        keys = {comm: plan.communicators[comm].keys(world) for comm in colors}
        shapes = {_group_shape(plan, program, group, member_of, colors, keys, label) for group in groups}
        for shape in shapes:
            _run(shape, program, label, rng)


def _check_layout(program: ProgramPlan, label: str) -> None:
    n = program.chunks
    for number, step in enumerate(program.steps):
        if step.places is not None and not is_permutation(step.places, n):
            raise PlanFileError(f"{label}.steps[{number}].places {list(step.places)[:16]} is not a permutation of "
                                f"0..{n - 1}: the plan was changed; export or save it again")
    final = program.final_places
    if final is None:
        return
    if not program.goal.permutes:
        raise PlanFileError(f"{label}.final_places: a {program.goal} program has none; export or save the plan again")
    if not is_permutation(final, n):
        raise PlanFileError(f"{label}.final_places {list(final)[:16]} is not a permutation of 0..{n - 1}: the plan "
                            "was changed; export or save it again")


def _group_shape(plan: Plan, program: ProgramPlan, group: tuple[int, ...], member_of, colors, keys,
                 label: str) -> tuple:
    """The program's calls for one reduction group in member indices, checked against the
    communicators: ((places,) | ((members, lo, hi, root), ...)) per step."""
    shape = []
    n = len(group)
    for number, step in enumerate(program.steps):
        where = f"{label}.steps[{number}]"
        if step.places is not None:
            shape.append((tuple(step.places),))
            continue
        record = collective(step.collective)
        comm = plan.communicators[step.communicator]
        calls = {}
        for rank in group:
            call = step.calls[rank]
            color = colors[step.communicator][rank]
            if call is None:
                if color is not None:
                    raise PlanFileError(f"{where}: rank {rank} is idle but in group {color} of communicator "
                                        f"{step.communicator} (its group would wait for it forever); export or save "
                                        "the plan again")
                continue
            if color is None or call.color != color:
                raise PlanFileError(f"{where}: rank {rank} calls with color {call.color}, communicator "
                                    f"{step.communicator} puts it in {'no group' if color is None else f'group {color}'}; "
                                    "export or save the plan again")
            members = comm.groups[color]
            key = keys[step.communicator][rank]
            if call.key != key or call.size != len(members):
                raise PlanFileError(f"{where}: rank {rank} calls as key {call.key} of {call.size}, its group "
                                    f"{list(members)[:16]} makes it key {key} of {len(members)}; "
                                    "export or save the plan again")
            if not 0 <= call.lo < call.hi <= n:
                raise PlanFileError(f"{where}: rank {rank}'s chunk range [{call.lo},{call.hi}) is not inside "
                                    f"[0,{n}); export or save the plan again")
            if (record.block_of_input() or record.block_of_output() or step.collective == "AllToAll") \
                    and (call.hi - call.lo) % call.size:
                raise PlanFileError(f"{where}: rank {rank}'s range [{call.lo},{call.hi}) is not {call.size} equal "
                                    "blocks; export or save the plan again")
            if (call.root is not None) != record.rooted or (call.root is not None and not 0 <= call.root < call.size):
                raise PlanFileError(f"{where}: rank {rank}'s root {call.root} does not fit a {step.collective} of "
                                    f"{call.size}; export or save the plan again")
            calls.setdefault(color, set()).add((call.lo, call.hi, call.root))
        shaped = []
        for color, values in sorted(calls.items()):
            members = comm.groups[color]
            if len(values) != 1:
                raise PlanFileError(f"{where}: the ranks of group {list(members)[:16]} call with different ranges or "
                                    "roots; export or save the plan again")
            outside = [rank for rank in members if member_of.get(rank, (None,))[0] != member_of[group[0]][0]]
            if outside:
                raise PlanFileError(f"{where}: group {list(members)[:16]} of communicator {step.communicator} mixes "
                                    f"reduction groups (rank {outside[0]}); export or save the plan again")
            lo, hi, root = values.pop()
            shaped.append((tuple(member_of[rank][1] for rank in members), lo, hi, root))
        shape.append((step.collective, tuple(shaped)))
    return tuple(shape)


def _run(shape: tuple, program: ProgramPlan, label: str, rng) -> None:
    """Run one group shape on random residues; PlanFileError if the result is not the goal's."""
    n, start = program.chunks, program.goal.start
    inputs = rng.integers(0, PRIME, size=(n, n, LANES), dtype=np.int64)
    values = inputs.copy()
    defined = np.ones((n, n), dtype=bool)
    if start == OWN_BLOCK:  # member m holds only its block, at place m
        defined[:] = False
        defined[np.arange(n), np.arange(n)] = True
    elif start == ROOT_ONLY:  # only the root's buffer is input
        defined[1:] = False
    for step in shape:
        if len(step) == 1:  # a Permute: the chunk at place p moves to place places[p]
            places = list(step[0])
            moved_values, moved_defined = np.empty_like(values), np.empty_like(defined)
            moved_values[:, places], moved_defined[:, places] = values, defined
            values, defined = moved_values, moved_defined
            continue
        name, calls = step
        for members, lo, hi, root in calls:
            _call(name, list(members), lo, hi, root, values, defined)
    _compare(program, inputs, values, defined, label)


def _call(name: str, members: list[int], lo: int, hi: int, root, values, defined) -> None:
    k = len(members)
    block = (hi - lo) // k
    span_values, span_defined = values[members, lo:hi], defined[members, lo:hi]  # copies (fancy index)
    if name in ("AllReduce", "ReduceScatter", "Reduce"):
        total = span_values.sum(axis=0) % PRIME
        whole = span_defined.all(axis=0)
        if name == "AllReduce":
            values[members, lo:hi], defined[members, lo:hi] = total, whole
        elif name == "Reduce":
            defined[members, lo:hi] = False
            values[members[root], lo:hi], defined[members[root], lo:hi] = total, whole
        else:  # member i keeps block i of the sum; the rest of its range is left undefined
            defined[members, lo:hi] = False
            for i, member in enumerate(members):
                part = slice(lo + i * block, lo + (i + 1) * block)
                values[member, part] = total[i * block:(i + 1) * block]
                defined[member, part] = whole[i * block:(i + 1) * block]
    elif name == "AllGather":  # member i gives block i of the range; every member gets them all
        index = np.arange(k)
        pieces = span_values.reshape(k, k, block, LANES)[index, index].reshape(k * block, LANES)
        known = span_defined.reshape(k, k, block)[index, index].reshape(k * block)
        values[members, lo:hi], defined[members, lo:hi] = pieces, known
    elif name == "Broadcast":
        values[members, lo:hi], defined[members, lo:hi] = span_values[root], span_defined[root]
    elif name == "AllToAll":  # member j's block i is member i's block j
        swapped = span_values.reshape(k, k, block, LANES).swapaxes(0, 1).reshape(k, hi - lo, LANES)
        known = span_defined.reshape(k, k, block).swapaxes(0, 1).reshape(k, hi - lo)
        values[members, lo:hi], defined[members, lo:hi] = swapped, known
    else:  # the readers refuse unknown collectives first
        raise PlanFileError(f"collective {name!r} is not one synth runs")


def _compare(program: ProgramPlan, inputs, values, defined, label: str) -> None:
    """The goal's end (Goal.end) from the inputs, compared where a framework reads the
    result (Goal.result)."""
    n, goal = program.chunks, program.goal
    members = np.arange(n)
    if goal.sums:
        total = inputs.sum(axis=0) % PRIME  # (N, lanes): chunk c summed over the group
    if goal.result == OWN_BLOCK:  # member m's block m, where final_places puts it
        places = np.asarray(program.final_places if program.final_places is not None else members)
        got, known = values[members, places], defined[members, places]
        expected, checked = total, np.ones(n, dtype=bool)
        got, known, expected = got[:, None], known[:, None], expected[:, None]
    else:
        got, known = values, defined
        checked = np.ones(n, dtype=bool)
        if goal.result == ROOT_ONLY:
            checked[1:] = False
        if goal.end == GATHERED:  # place p of every member: member p's block p
            expected = np.broadcast_to(inputs[members, members], values.shape)
        elif goal.end == TRANSPOSED:  # member j, place i: member i's block j
            expected = inputs.swapaxes(0, 1)
        elif goal.end == ROOT_EVERYWHERE:  # the root's buffer
            expected = np.broadcast_to(inputs[0], values.shape)
        else:  # the sum, on every member or on the root
            expected = np.broadcast_to(total, values.shape)
    wrong = (~known | (got != expected).any(axis=-1)) & checked[:, None]
    if wrong.any():
        member, place = (int(i) for i in np.argwhere(wrong)[0])
        what = f"block (at place {program.final_places[member] if program.final_places else member})" \
            if goal.result == OWN_BLOCK else f"chunk {place}"
        raise PlanFileError(f"{label} ({program.text}) does not compute the {goal} it claims: member {member}'s {what} "
                            f"ends wrong ({int(wrong.sum())} wrong in all; a step's calls, places or the final_places "
                            "were changed); export or save the plan again")
