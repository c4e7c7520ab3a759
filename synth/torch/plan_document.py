"""Plan documents read back with every field checked, then re-proved (no torch).

A plan file is input: it may be damaged, hand-edited or written by another version. Each
field is checked for its type and range where it is read (counts, ranks inside the world,
communicator and program indices, chunk ranges inside the buffer, `places` and
`final_places` permutations of the chunks, reduction groups partitioning the world, program
and step texts that parse and match the calls, the JSON export's buffer, offsets and
metadata consistent with one another). Where the file names its hierarchy (the JSON export),
each program's text is proved valid for its goal by synth's semantics and every call must be
its lowering's. The calls are then re-proved to compute each program's goal on numbers
(synth.export.plan_proof), whichever format. Anything else raises PlanFileError, one line
naming the field, never a KeyError or TypeError from deep inside the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from synth.errors import PlanFileError, UsageError
from synth.export.plan import CommunicatorSet, Plan, PlanStep, ProgramPlan, RankCall, call_buffers
from synth.export.plan_proof import is_permutation, prove_plan
from synth.goals import DEFAULT_GOAL, GOALS, Goal



@dataclass(frozen=True)
class SizeRange:
    """From `min_bytes` (per device, inclusive) up to the next range, run program `program`."""

    min_bytes: int
    program: int


FIX = "write it again with ReductionPlan.save or as synth export's JSON format"
MAX_RANKS = 2**24  # far beyond any job; bounds what a damaged count could make us allocate
MAX_BYTES = 2**60
COLLECTIVES = ("AllReduce", "ReduceScatter", "AllGather", "Reduce", "Broadcast", "AllToAll")


class Fields:
    """Typed access to a document's fields; each failure names the field's path."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, problem: str):
        raise PlanFileError(f"{self.source}: {where} {problem}; {FIX}")

    def obj(self, value, where: str) -> dict:
        if not isinstance(value, dict):
            self.fail(where, f"is {_echo(value)}, not an object")
        return value

    def get(self, mapping: dict, key: str, where: str, default=...):
        if key not in mapping:
            if default is not ...:
                return default
            self.fail(f"{where}.{key}" if where else key, "is missing")
        return mapping[key]

    def integer(self, value, where: str, lo: int = 0, hi: int | None = None) -> int:
        if type(value) is not int:
            self.fail(where, f"is {_echo(value)}, not a whole number")
        if value < lo or (hi is not None and value > hi):
            self.fail(where, f"is {_echo(value)}, outside {lo}..{hi if hi is not None else ''}")
        return value

    def text(self, value, where: str) -> str:
        if not isinstance(value, str):
            self.fail(where, f"is {_echo(value)}, not a string")
        return value

    def array(self, value, where: str, length: int | None = None, least: int = 0) -> list:
        if not isinstance(value, list):
            self.fail(where, f"is {_echo(value)}, not a list")
        if length is not None and len(value) != length:
            self.fail(where, f"has {len(value)} entries, not {length}")
        if len(value) < least:
            self.fail(where, f"has {len(value)} entries, at least {least} needed")
        return value

    def ranks(self, value, where: str, world: int, length: int | None = None) -> tuple[int, ...]:
        values = self.array(value, where, length, least=1)
        result = tuple(self.integer(v, f"{where}[{i}]", 0, world - 1) for i, v in enumerate(values))
        if len(set(result)) != len(result):
            self.fail(where, "names a rank twice")
        return result

    def places(self, value, where: str, n: int) -> tuple[int, ...]:
        values = tuple(self.integer(v, f"{where}[{i}]", 0, n - 1) for i, v in enumerate(self.array(value, where, n)))
        if not is_permutation(values, n):
            self.fail(where, f"{list(values)[:16]} is not a permutation of 0..{n - 1}")
        return values

    def choice(self, value, where: str, choices) -> str:
        if value not in choices:
            self.fail(where, f"is {_echo(value)}, not one of {', '.join(choices)}")
        return value

    def goal(self, value, where: str, goals: dict[str, Goal] = GOALS) -> Goal:
        """The goal of `goals` (synth/goals.py) the file names, parsed here, at the file's edge."""
        return goals[self.choice(value, where, tuple(goals))]


def _echo(value) -> str:
    """A short, safe rendering: no repr of a deep list or of a number of thousands of digits."""
    if value is None:
        return "null"
    if isinstance(value, (list, dict)):
        return f"a {type(value).__name__} of {len(value)}"
    if type(value) is int and value.bit_length() > 64:
        return f"a number of {value.bit_length()} bits"
    if not isinstance(value, (str, int, float)):
        return type(value).__name__
    text = repr(value[:40] if isinstance(value, str) else value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_document(document, source: str = "the plan") -> tuple:
    """The fields of a ReductionPlan (plan, reduction groups, size ranges, description) from the
    value of a plan file (either format), checked and re-proved; synth.torch.plan builds the plan
    from them (this module stays below it, so the two import in one direction)."""
    fields = Fields(source)
    document = fields.obj(document, "the document")
    kind = document.get("format")
    if kind == "synth-plan":
        plan, groups, ranges, description = _export(fields, document)
    elif kind == "synth-reduction":
        plan, groups, ranges, description = _saved(fields, document)
    else:
        raise PlanFileError(f"{source}: not a synth plan (format {_echo(kind)}): {FIX}")
    parsed = _check_programs(fields, plan)
    if kind == "synth-plan" and "hierarchy" in document:
        _check_lowering(fields, document["hierarchy"], plan, groups, parsed)
    prove_plan(plan, groups, source)
    return plan, groups, ranges, description


# --- the two formats ----------------------------------------------------------------------------


def _saved(fields: Fields, document: dict):
    """ReductionPlan.save's format (synth.torch.plan.ReductionPlan.to_document)."""
    if document.get("version") != 1:
        fields.fail("version", f"is {_echo(document.get('version'))}: this synth reads version 1")
    world = fields.integer(fields.get(document, "world_size", ""), "world_size", 1, MAX_RANKS)
    communicators = tuple(_communicator(fields, comm, f"communicators[{i}]", world)
                          for i, comm in enumerate(fields.array(fields.get(document, "communicators", ""),
                                                                "communicators", least=1)))
    programs = []
    for index, program in enumerate(fields.array(fields.get(document, "programs", ""), "programs", least=1)):
        where = f"programs[{index}]"
        program = fields.obj(program, where)
        chunks = fields.integer(fields.get(program, "chunks", where), f"{where}.chunks", 2, world)
        goal = fields.goal(fields.get(program, "goal", where, DEFAULT_GOAL), f"{where}.goal")
        steps = []
        for number, step in enumerate(fields.array(fields.get(program, "steps", where), f"{where}.steps", least=1)):
            at = f"{where}.steps[{number}]"
            step = fields.obj(step, at)
            text = fields.text(fields.get(step, "text", at), f"{at}.text")
            op = fields.choice(fields.get(step, "op", at), f"{at}.op", COLLECTIVES + ("Permute",))
            comm = fields.integer(fields.get(step, "comm", at), f"{at}.comm", -1, len(communicators) - 1)
            calls = fields.array(fields.get(step, "calls", at), f"{at}.calls", world)
            if op == "Permute" or step.get("places") is not None:
                if op != "Permute" or comm != -1 or any(call is not None for call in calls):
                    fields.fail(at, "mixes a Permute's places with a collective's calls")
                places = fields.places(fields.get(step, "places", at), f"{at}.places", chunks)
                steps.append(PlanStep(text, "Permute", -1, (None,) * world, places))
                continue
            if comm < 0:
                fields.fail(f"{at}.comm", f"is {comm}: a {op} needs a communicator")
            steps.append(PlanStep(text, op, comm, tuple(_saved_call(fields, call, f"{at}.calls[{rank}]", world, chunks)
                                                        for rank, call in enumerate(calls))))
        programs.append(ProgramPlan(
            fields.text(fields.get(program, "label", where, ""), f"{where}.label"),
            fields.text(fields.get(program, "text", where), f"{where}.text"), chunks,
            fields.integer(fields.get(program, "reduction", where), f"{where}.reduction", 0, len(communicators) - 1),
            tuple(steps), goal, _final(fields, program, where, chunks)))
    plan = Plan(world, communicators, tuple(programs))
    groups = _reduction_groups(fields, document, plan)
    ranges = []
    for index, entry in enumerate(fields.array(fields.get(document, "size_ranges", ""), "size_ranges", least=1)):
        where = f"size_ranges[{index}]"
        entry = fields.obj(entry, where)
        start = fields.integer(fields.get(entry, "min_bytes", where), f"{where}.min_bytes", 0, MAX_BYTES)
        if (index == 0 and start != 0) or (index and start <= ranges[-1].min_bytes):
            fields.fail(f"{where}.min_bytes", f"is {start}: the ranges start at 0 and increase")
        ranges.append(SizeRange(start, fields.integer(fields.get(entry, "program", where), f"{where}.program", 0,
                                                      len(programs) - 1)))
    description = fields.text(document.get("description", ""), "description")
    return plan, groups, tuple(ranges), description


def _saved_call(fields: Fields, call, where: str, world: int, chunks: int) -> RankCall | None:
    if call is None:
        return None
    values = fields.array(call, where, 6)
    color, key, size, lo, hi = (fields.integer(values[i], f"{where}[{i}]", 0, world) for i in range(5))
    root = values[5] if values[5] is None else fields.integer(values[5], f"{where}[5]", 0, world - 1)
    if not 0 <= lo < hi <= chunks:
        fields.fail(where, f"spans chunks [{lo},{hi}), not inside [0,{chunks})")
    return RankCall(color, key, size, lo, hi, root)


def _export(fields: Fields, document: dict):
    """`synth export --format json` (synth/export/json_plan.py): chunk ranges back from the
    element offsets it gives for one buffer, every offset checked against them."""
    if document.get("version") != 1:
        fields.fail("version", f"is {_echo(document.get('version'))}: this synth reads version 1")
    world = fields.integer(fields.get(document, "world_size", ""), "world_size", 1, MAX_RANKS)
    buffer = fields.obj(fields.get(document, "buffer", ""), "buffer")
    chunks = fields.integer(fields.get(buffer, "chunks", "buffer"), "buffer.chunks", 2, world)
    chunk_count = fields.integer(fields.get(buffer, "chunk_count", "buffer"), "buffer.chunk_count", 1, MAX_BYTES)
    count = fields.integer(fields.get(buffer, "count", "buffer"), "buffer.count", 1, MAX_BYTES)
    if count != chunks * chunk_count:
        fields.fail("buffer.count", f"is {count}, not chunks x chunk_count = {chunks * chunk_count}")
    fields.choice(buffer.get("dtype", "float32"), "buffer.dtype", ("float32",))
    if buffer.get("bytes", count * 4) != count * 4:
        fields.fail("buffer.bytes", f"is {_echo(buffer.get('bytes'))}, not count x 4 = {count * 4}")
    _check_metadata(fields, document, world, chunks)
    communicators = []
    for index, comm in enumerate(fields.array(fields.get(document, "communicators", ""), "communicators", least=1)):
        where = f"communicators[{index}]"
        comm = fields.obj(comm, where)
        if fields.get(comm, "id", where, index) != index:
            fields.fail(f"{where}.id", f"is {_echo(comm.get('id'))}, not its position {index}")
        communicators.append(_communicator(fields, fields.get(comm, "groups", where), f"{where}.groups", world))
    programs = []
    for index, program in enumerate(fields.array(fields.get(document, "programs", ""), "programs", least=1)):
        where = f"programs[{index}]"
        program = fields.obj(program, where)
        goal = fields.goal(fields.get(program, "collective", where, DEFAULT_GOAL), f"{where}.collective")
        steps = []
        for number, step in enumerate(fields.array(fields.get(program, "steps", where), f"{where}.steps", least=1)):
            at = f"{where}.steps[{number}]"
            step = fields.obj(step, at)
            if fields.get(step, "index", at, number) != number:
                fields.fail(f"{at}.index", f"is {_echo(step.get('index'))}, not its position {number}")
            text = fields.text(fields.get(step, "text", at), f"{at}.text")
            op = fields.choice(fields.get(step, "collective", at), f"{at}.collective", COLLECTIVES + ("Permute",))
            if op == "Permute":  # a local reordering: no communicator, no call
                steps.append(PlanStep(text, "Permute", -1, (None,) * world,
                                      fields.places(fields.get(step, "places", at), f"{at}.places", chunks)))
                continue
            comm_index = fields.integer(fields.get(step, "communicator", at), f"{at}.communicator", 0,
                                        len(communicators) - 1)
            comm = communicators[comm_index]
            ranks = fields.array(fields.get(step, "ranks", at), f"{at}.ranks", world)
            calls = tuple(_export_call(fields, entry, f"{at}.ranks[{rank}]", rank, op, comm, chunk_count, chunks)
                          for rank, entry in enumerate(ranks))
            steps.append(PlanStep(text, op, comm_index, calls))
        programs.append(ProgramPlan(
            fields.text(fields.get(program, "label", where, ""), f"{where}.label"),
            fields.text(fields.get(program, "text", where), f"{where}.text"), chunks,
            fields.integer(fields.get(program, "reduction_communicator", where), f"{where}.reduction_communicator", 0,
                           len(communicators) - 1),
            tuple(steps), goal, _final(fields, program, where, chunks)))
    plan = Plan(world, tuple(communicators), tuple(programs))
    command = document.get("command", "")
    return plan, _reduction_groups(fields, document, plan), (SizeRange(0, 0),), \
        command if isinstance(command, str) else ""


def _export_call(fields: Fields, entry, where: str, rank: int, op: str, comm: CommunicatorSet, chunk_count: int,
                 chunks: int) -> RankCall | None:
    entry = fields.obj(entry, where)
    if fields.get(entry, "rank", where, rank) != rank:
        fields.fail(f"{where}.rank", f"is {_echo(entry.get('rank'))}, not its position {rank}")
    idle = fields.get(entry, "idle", where)
    if type(idle) is not bool:
        fields.fail(f"{where}.idle", f"is {_echo(idle)}, not true or false")
    if idle:
        return None
    color = fields.integer(fields.get(entry, "color", where), f"{where}.color", 0, len(comm.groups) - 1)
    members = comm.groups[color]
    if tuple(fields.array(fields.get(entry, "members", where), f"{where}.members")) != members:
        fields.fail(f"{where}.members", f"are not group {color} of its communicator, {list(members)[:16]}")
    key = fields.integer(fields.get(entry, "key", where), f"{where}.key", 0, len(members) - 1)
    offset = fields.integer(fields.get(entry, "offset", where), f"{where}.offset", 0, chunks * chunk_count - 1)
    count = fields.integer(fields.get(entry, "count", where), f"{where}.count", 1, chunks * chunk_count - offset)
    if offset % chunk_count or count % chunk_count:
        fields.fail(where, f"offset {offset} and count {count} are not whole chunks of {chunk_count} elements")
    root = fields.get(entry, "root", where)
    root = root if root is None else fields.integer(root, f"{where}.root", 0, len(members) - 1)
    call = RankCall(color, key, len(members), offset // chunk_count, (offset + count) // chunk_count, root)
    buffers = call_buffers(op, call, chunk_count)
    for name in ("send_offset", "send_count", "recv_offset", "recv_count"):
        if name in entry and entry[name] != getattr(buffers, name):
            fields.fail(f"{where}.{name}", f"is {_echo(entry[name])}, its offset, count and key give "
                                           f"{getattr(buffers, name)}")
    return call


# --- shared checks ------------------------------------------------------------------------------


def _communicator(fields: Fields, groups, where: str, world: int) -> CommunicatorSet:
    result = tuple(fields.ranks(group, f"{where}[{i}]", world) for i, group in enumerate(fields.array(groups, where)))
    seen = [rank for group in result for rank in group]
    if len(set(seen)) != len(seen):
        fields.fail(where, "puts a rank in two groups")
    return CommunicatorSet(result)


def _final(fields: Fields, program: dict, where: str, chunks: int) -> tuple[int, ...] | None:
    final = program.get("final_places")
    return None if final is None else fields.places(final, f"{where}.final_places", chunks)


def _reduction_groups(fields: Fields, document: dict, plan: Plan) -> tuple[tuple[int, ...], ...]:
    world, chunks = plan.world_size, plan.programs[0].chunks
    groups = tuple(fields.ranks(group, f"reduction_groups[{i}]", world, chunks) for i, group in
                   enumerate(fields.array(fields.get(document, "reduction_groups", ""), "reduction_groups", least=1)))
    members = sorted(rank for group in groups for rank in group)
    if members != list(range(world)):
        fields.fail("reduction_groups", f"do not split the world of {world} ranks into groups of {chunks} "
                                        "(a rank missing or in two groups)")
    for index, program in enumerate(plan.programs):
        where = f"programs[{index}]"
        if program.chunks != chunks:
            fields.fail(f"{where}.chunks", f"is {program.chunks}, programs[0]'s {chunks}")
        if program.goal != plan.programs[0].goal:
            fields.fail(where, f"computes {program.goal}, programs[0] {plan.programs[0].goal} (one plan per goal)")
        if program.reduction != plan.programs[0].reduction:
            fields.fail(where, "reduces over another communicator than programs[0]")
        if set(plan.communicators[program.reduction].groups) != set(groups):
            fields.fail(where, f"names communicator {program.reduction} as its reduction groups, whose groups are "
                               "not reduction_groups")
    return groups


def _check_programs(fields: Fields, plan: Plan) -> list:
    """Each program's text parses and its steps' texts and collectives are the calls'; the
    parsed programs."""
    from synth.language import parse_program

    result = []
    for index, program in enumerate(plan.programs):
        where = f"programs[{index}]"
        try:
            parsed = parse_program(program.text)
        except UsageError:
            fields.fail(f"{where}.text", f"{_echo(program.text)} is not a program")
        if len(parsed.steps) != len(program.steps):
            fields.fail(f"{where}.steps", f"has {len(program.steps)} steps, its text {len(parsed.steps)}")
        for number, (step, written) in enumerate(zip(program.steps, parsed.steps)):
            if step.text != str(written) or step.collective != written.collective:
                fields.fail(f"{where}.steps[{number}]", f"({step.text}, {step.collective}) is not step {number + 1} "
                                                        f"of the program's text, {written}")
        result.append(parsed)
    return result


def _check_lowering(fields: Fields, hierarchy: dict, plan: Plan, groups, parsed) -> None:
    """The export names its hierarchy: each program's text is proved valid for its goal on it
    by synth's own semantics (synth.lowering), and every rank's call, Permute and final place
    must be the ones that lowering gives, mapped through the reduction groups."""
    from synth.errors import InvalidProgramError
    from synth.lowering import lower_on

    levels = [fields.obj(level, f"hierarchy.levels[{i}]") for i, level in enumerate(hierarchy["levels"])]
    names = tuple(fields.text(fields.get(level, "name", f"hierarchy.levels[{i}]"), f"hierarchy.levels[{i}].name")
                  for i, level in enumerate(levels))
    sizes = tuple(level["size"] for level in levels)  # checked by _check_metadata
    for index, (program, written) in enumerate(zip(plan.programs, parsed)):
        where = f"programs[{index}]"
        try:
            lowered = lower_on(written, names, sizes, program.goal)
        except (InvalidProgramError, ValueError) as error:  # UsageError is a ValueError
            fields.fail(f"{where}.text", f"is not a valid {program.goal} program on the hierarchy "
                                         f"{dict(zip(names, sizes))}: {' '.join(str(error).split())[:160]}")
        if program.final_places != lowered.final_places:
            fields.fail(f"{where}.final_places", f"is {_echo(program.final_places)}, the program's text ends with "
                                                 f"{_echo(lowered.final_places)}")
        for number, (step, low) in enumerate(zip(program.steps, lowered.steps)):
            at = f"{where}.steps[{number}]"
            if step.places != low.places:
                fields.fail(f"{at}.places", f"{_echo(step.places)} are not the places of {low.step}")
            if low.places is not None:
                continue
            comm = plan.communicators[step.communicator]
            for group in groups:
                for call in low.calls:
                    members = tuple(group[m] for m in call.members)
                    for key, rank in enumerate(members):
                        got = step.calls[rank]
                        if got is None or (got.lo, got.hi, got.key) != (call.lo, call.hi, key) \
                                or comm.groups[got.color] != members:
                            fields.fail(f"{at}", f"gives rank {rank} another call than step {number + 1} of the "
                                                 f"program's text, {low.step}, over group {list(members)[:16]}")
                for rank in (group[m] for m in low.idle):
                    if step.calls[rank] is not None:
                        fields.fail(f"{at}", f"makes rank {rank} call where {low.step} leaves it idle")


def _check_metadata(fields: Fields, document: dict, world: int, chunks: int) -> None:
    """The export's description of the job, where present, agrees with its world and groups."""
    for key, total in (("topology", world), ("hierarchy", chunks)):
        if key in document:
            section = fields.obj(document[key], key)
            levels = fields.array(fields.get(section, "levels", key), f"{key}.levels", least=1)
            sizes = [fields.integer(fields.get(fields.obj(level, f"{key}.levels[{i}]"), "size", f"{key}.levels[{i}]"),
                                    f"{key}.levels[{i}].size", 1, MAX_RANKS) for i, level in enumerate(levels)]
            if prod(sizes) != total:
                fields.fail(f"{key}.levels", f"sizes {sizes[:16]} multiply to {prod(sizes)}, not "
                                             f"{'world_size' if key == 'topology' else 'buffer.chunks'} {total}")
    if "axes" in document:
        axes = fields.array(document["axes"], "axes", least=1)
        sizes = {}
        for i, axis in enumerate(axes):
            axis = fields.obj(axis, f"axes[{i}]")
            sizes[fields.text(fields.get(axis, "name", f"axes[{i}]"), f"axes[{i}].name")] = fields.integer(
                fields.get(axis, "size", f"axes[{i}]"), f"axes[{i}].size", 1, MAX_RANKS)
        if prod(sizes.values()) != world:
            fields.fail("axes", f"sizes multiply to {prod(sizes.values())}, not world_size {world}")
        if "reduce" in document:
            reduce = [fields.choice(name, f"reduce[{i}]", tuple(sizes))
                      for i, name in enumerate(fields.array(document["reduce"], "reduce", least=1))]
            if prod(sizes[name] for name in reduce) != chunks:
                fields.fail("reduce", f"axes {reduce} hold {prod(sizes[name] for name in reduce)} ranks, not "
                                      f"buffer.chunks {chunks}")
