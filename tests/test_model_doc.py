"""docs/model.md against the code: every `checked` block is regenerated here and must match.

A block is a fenced code block right after a `<!-- checked: NAME -->` line. Run with
SYNTH_UPDATE_DOCS=1 to rewrite the blocks from the code (then read the diff: the prose
around them may need the same change).
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

import numpy as np
import pytest

from synth.errors import InvalidProgramError
from synth.hierarchy import build_hierarchy
from synth.language import Program, parse_program
from synth.model.cost import bus_factor
from synth.placement import enumerate_placements, make_placement, parse_axes
from synth.search import enumerate_programs
from synth.semantics import FORMS, Semantics
from synth.search.states import format_members, format_trace
from synth.topology import topology_from_levels
from synth.units import parse_bytes

REPOSITORY = Path(__file__).resolve().parent.parent
MODEL = REPOSITORY / "docs" / "model.md"
CHECKED = re.compile(r"<!-- checked: ([\w -]+) -->\n```text\n(.*?)```\n", re.DOTALL)

# The running example of sections 2, 4 and 7.
LEVELS, AXES, MATRIX = "server=2,cpu=2,gpu=4", "data=4,model=4", ((1, 2, 2), (2, 1, 2))
RS_PROGRAM = "ReduceScatter(InsideGroup(gpu)); AllReduce(Parallel(cpu)); AllGather(InsideGroup(gpu))"
MASTER_PROGRAM = "Reduce(InsideGroup(gpu)); AllReduce(Master(cpu)); Broadcast(InsideGroup(gpu))"


def _placement():
    return make_placement(topology_from_levels(LEVELS), parse_axes(AXES), MATRIX)


def _tuple(values) -> str:
    return "(" + ",".join(str(int(v)) for v in values) + ")"


def placements_block() -> str:
    found = enumerate_placements(topology_from_levels("2,2,4"), parse_axes("4,4"))
    return "".join(p.to_text() + "\n" for p in found)


def coordinates_block() -> str:
    placement = _placement()
    lines = ["rank  c (server,cpu,gpu)  d[data]  d[model]  x_data  x_model"]
    for rank in range(placement.device_count):
        coords = np.unravel_index(rank, placement.level_sizes)
        digits, axis = placement.digits[rank], placement.axis_coordinates[rank]
        lines.append(f"{rank:4d}  {_tuple(coords):18s}  {_tuple(digits[0]):7s}  {_tuple(digits[1]):8s}  "
                     f"{axis[0]:6d}  {axis[1]:7d}")
    return "\n".join(lines) + "\n"


def hierarchies_block() -> str:
    placement, lines = _placement(), []
    for reduce in (("data",), ("data", "model")):
        hierarchies = {kind: build_hierarchy(placement, reduce, kind) for kind in ("merged", "split", "system")}
        groups = hierarchies["merged"].groups
        plural = "groups" if len(groups) > 1 else "group"
        lines.append(f"reduce {','.join(reduce)}: {len(groups)} {plural} of {len(groups[0])}: "
                     + " ".join(_tuple(group) for group in groups))
        for kind, hierarchy in hierarchies.items():
            lines.append(f"  {kind}: " + ", ".join(f"{level.name}={level.size}" for level in hierarchy.levels))
        if reduce == ("data",):
            merged = hierarchies["merged"]
            members = []
            for member, device in enumerate(groups[0]):
                where = ", ".join(f"{name} {p}" for name, p in zip(merged.level_names, merged.positions[device]))
                members.append(f"member {member} = device {device} ({where})")
            lines.append(f"  group {_tuple(groups[0])} in the merged hierarchy: " + ", ".join(members))
    return "\n".join(lines) + "\n"


def forms_block() -> str:
    lines = []
    for names, sizes in ((("cpu", "gpu"), (2, 2)), (("rack", "node", "gpu"), (2, 2, 2))):
        lines.append(", ".join(f"{n}={s}" for n, s in zip(names, sizes)))
        width = max(len(form) for form in FORMS) + max(len(name) for name in names) + 2
        seen = {}
        for form in FORMS:
            for level, name in enumerate(names):
                groups, _ = FORMS[form](sizes, level)
                groups = tuple(sorted(groups))
                spelling = f"{form}({name})"
                text = f"  {spelling:{width}s}  " + " ".join("{" + ",".join(map(str, g)) + "}" for g in groups)
                members = set().union(*map(set, groups))
                idle = [m for m in range(int(np.prod(sizes))) if m not in members]
                if idle:
                    text += "  idle " + ",".join(map(str, idle))
                if groups in seen:
                    text += f"  same as {seen[groups]}"
                else:
                    seen[groups] = spelling
                lines.append(text)
    return "\n".join(lines) + "\n"


def _trace(program: str) -> str:
    semantics = Semantics(("cpu", "gpu"), (2, 2), quotient=False)
    return format_trace(semantics, semantics.run(parse_program(program))) + "\n"


def _goal_trace(goal: str, program: str) -> str:
    semantics = Semantics(("node", "gpu"), (2, 2), quotient=False, goal=goal)
    return format_trace(semantics, semantics.run(parse_program(program))) + "\n"


def folding_block() -> str:
    """The MoE parallel folding example: expert groups as digit ranges of the stage index."""
    from synth.plan.degrees import Degrees

    placement = make_placement(topology_from_levels("node=2,gpu=8"), parse_axes("dp=8,tp=2"), ((2, 4), (1, 2)))
    degrees = Degrees(8, 2, 1, 1, 8, 1)
    lines = []
    for label, group in (("ep groups: ", degrees.expert_group()), ("edp groups:", degrees.expert_data_axes())):
        lines.append(f"{label} " + " ".join(str(members) for members in group.groups(placement))
                     + f"  span {_tuple(group.span(placement))}")
    return "\n".join(lines) + "\n"


GENERATORS = {
    "folding": folding_block,
    "trace reduce-scatter goal": lambda: _goal_trace(
        "reducescatter", "Permute(gpu,node); ReduceScatter(InsideGroup(gpu)); ReduceScatter(Parallel(node))"),
    "trace all-to-all goal": lambda: _goal_trace(
        "alltoall", "AllToAll(Parallel(node)); Permute(gpu,node); AllToAll(InsideGroup(gpu)); Permute(node,gpu)"),
    "placements": placements_block,
    "coordinates": coordinates_block,
    "hierarchies": hierarchies_block,
    "forms": forms_block,
    "trace reduce-scatter": lambda: _trace(RS_PROGRAM),
    "trace reduce-master": lambda: _trace(MASTER_PROGRAM),
}


def _blocks() -> dict[str, str]:
    return {name: body for name, body in CHECKED.findall(MODEL.read_text(encoding="utf-8"))}


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_checked_block_matches_the_code(name):
    blocks = _blocks()
    assert name in blocks, f"docs/model.md has no `<!-- checked: {name} -->` block"
    expected = GENERATORS[name]()
    if blocks[name] != expected and os.environ.get("SYNTH_UPDATE_DOCS") == "1":
        text = MODEL.read_text(encoding="utf-8")
        text = text.replace(f"<!-- checked: {name} -->\n```text\n{blocks[name]}```",
                            f"<!-- checked: {name} -->\n```text\n{expected}```")
        MODEL.write_text(text, encoding="utf-8")
        return
    assert blocks[name] == expected


def test_every_checked_block_has_a_check():
    assert set(_blocks()) - {"invalid"} == set(GENERATORS)


def test_invalid_programs_fail_where_the_page_says():
    """Each program of the `invalid` block fails at the step the page names (the reasons are
    prose; which step fails is the code's)."""
    semantics = Semantics(("cpu", "gpu"), (2, 2), quotient=False)
    entries = re.findall(r"^(\S.*)\n  invalid (at step (\d+)|after the last step):", _blocks()["invalid"], re.MULTILINE)
    assert len(entries) >= 4
    for text, _, step in entries:
        program = parse_program(text)
        with pytest.raises(InvalidProgramError) as failure:
            semantics.run(program)
        assert failure.value.step_index == (int(step) - 1 if step else len(program)), text


def test_the_worked_programs_are_valid_on_every_group():
    """The traces show one reduction group; the same programs are valid for the request, as
    `synth check` decides it (the page's shell examples run them too)."""
    hierarchy = build_hierarchy(_placement(), ("data",), "merged")
    assert hierarchy.level_names == ("cpu", "gpu")
    for program in (RS_PROGRAM, MASTER_PROGRAM):
        Semantics(hierarchy.level_names, hierarchy.sizes, quotient=False).run(parse_program(program))


def test_completeness_count_is_the_brute_force_count():
    """Section 7: 27 valid programs of at most 3 steps on cpu=2, gpu=2, one per instruction
    sequence, and a brute force over every sequence of the alphabet finds as many."""
    text = MODEL.read_text(encoding="utf-8")
    stated = int(re.search(r"there are (\d+) of length 3 or less", text).group(1))
    hierarchy = build_hierarchy(_placement(), ("data",), "merged")
    found = list(enumerate_programs(hierarchy, max_len=3))
    semantics = Semantics(("cpu", "gpu"), (2, 2), quotient=False)
    valid = 0
    for length in range(1, 4):
        for steps in itertools.product([step for step, _ in semantics.alphabet], repeat=length):
            try:
                semantics.run(Program(tuple(steps)))
            except InvalidProgramError:
                continue
            valid += 1
    assert stated == len(found) == valid


def test_row_major_placements_are_the_init_device_mesh_layout():
    """Section 2: the rank is the row-major index of the axis coordinates exactly when no level
    where an earlier axis has a factor lies inside one where a later axis has one."""
    def keeps_order(matrix):
        deepest_earlier = -1
        for row in matrix:
            levels = [l for l, factor in enumerate(row) if factor > 1]
            if levels and min(levels) < deepest_earlier:
                return False
            deepest_earlier = max(levels + [deepest_earlier])
        return True

    seen = 0
    for levels, axes in (("2,2,4", "4,4"), ("2,4", "4,2"), ("2,2,2", "2,2,2"), ("2,3,4", "6,4"), ("2,2,4", "2,4,2")):
        for placement in enumerate_placements(topology_from_levels(levels), parse_axes(axes)):
            row_major = np.stack(np.unravel_index(np.arange(placement.device_count), placement.axis_sizes), axis=1)
            assert (placement.axis_coordinates == row_major).all() == keeps_order(placement.matrix), placement.matrix
            seen += 1
    assert seen > 20
    assert [p.to_text() for p in enumerate_placements(topology_from_levels("2,2,4"), parse_axes("4,4"))
            if keeps_order(p.matrix)] == ["[[2,2,1],[1,1,4]]"]


def test_member_ranks_follow_global_ranks():
    """Section 3: in every hierarchy a group's members are in the order of their global ranks."""
    for levels, axes in (("2,2,4", "4,4"), ("2,2,2", "2,2,2"), ("2,3,4", "6,4")):
        for placement in enumerate_placements(topology_from_levels(levels), parse_axes(axes)):
            for count in range(1, len(placement.axis_names) + 1):
                for reduce in itertools.combinations(placement.axis_names, count):
                    for kind in ("merged", "split", "system"):
                        for group in build_hierarchy(placement, reduce, kind).groups:
                            assert list(group) == sorted(group)


def test_bandwidth_example():
    text = MODEL.read_text(encoding="utf-8")
    size, seconds = parse_bytes("256MiB"), 2e-3
    assert size == 268_435_456 and "268,435,456" in text
    algbw = size / seconds / 1e9
    assert f"algbw = {algbw:.1f} GB/s" in text
    assert f"busbw = {algbw:.1f} * 62/32 = {algbw * bus_factor(32):.1f} GB/s" in text


def test_members_are_written_as_ranges():
    assert format_members(0b1111) == "{0-3}"
    assert format_members(0b1011) == "{0,1,3}"
    assert format_members(0b1110111) == "{0-2,4-6}"


def test_sections_cited_across_the_repository_exist():
    """Every `docs/model.md section N` cited in the code and documents names a section."""
    sections = set(re.findall(r"^## (\d+)\. ", MODEL.read_text(encoding="utf-8"), re.MULTILINE))
    assert sections == {str(n) for n in range(1, 9)}
    cited = []
    for path in [REPOSITORY / "README.md", *REPOSITORY.glob("docs/**/*.md"), *REPOSITORY.glob("synth/**/*.py"),
                 *REPOSITORY.glob("grammar/*"), *REPOSITORY.glob("tests/*.py"), *REPOSITORY.glob("benchmarks/*.py")]:
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            for match in re.finditer(r"docs/model\.md,? sections? (\d+)(?:,? (?:and|to) (\d+))?", text):
                cited += [(path, number) for number in match.groups() if number]
    missing = [(str(path.relative_to(REPOSITORY)), number) for path, number in cited if number not in sections]
    assert not missing


def test_nothing_cites_a_document_outside_the_repository():
    """The repository stands alone: no code, test or document cites the old SPEC.md."""
    offenders = []
    for path in [REPOSITORY / "README.md", *REPOSITORY.glob("docs/**/*.md"), *REPOSITORY.glob("synth/**/*.py"),
                 *REPOSITORY.glob("grammar/*"), *REPOSITORY.glob("tests/*.py"), *REPOSITORY.glob("benchmarks/*.py")]:
        if path.is_file() and path != Path(__file__).resolve():
            text = path.read_text(encoding="utf-8", errors="replace")
            if re.search(r"SPEC\.md|SPEC('s)? (section|well-known)|\bthe SPEC\b", text):
                offenders.append(str(path.relative_to(REPOSITORY)))
    assert not offenders, f"these cite SPEC.md, which is not in the repository; cite docs/model.md: {offenders}"


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_to_model_sections_resolve():
    anchors = {_slug(h) for h in re.findall(r"^#+ (.+)$", MODEL.read_text(encoding="utf-8"), re.MULTILINE)}
    broken = []
    for path in [REPOSITORY / "README.md", *REPOSITORY.glob("docs/**/*.md")]:
        for anchor in re.findall(r"\]\((?:docs/)?model\.md#([^)]+)\)", path.read_text(encoding="utf-8")):
            if anchor not in anchors:
                broken.append(f"{path.relative_to(REPOSITORY)}: #{anchor}")
    assert not broken, f"links to headings docs/model.md does not have: {broken}"
