"""synth.torch.moe's dispatch and combine on 8 gloo ranks (tests/torch_moe_worker.py, one torchrun
launch for every check): equal outputs and gradients (tokens, router weights, experts'
parameters) against a reference MoE layer built from all_to_all_single as Megatron's alltoall
dispatcher does, for the flat and the two-stage form, node layouts 2x4 and 4x2, top-k 1, 2 and 4,
uneven routing with ranks that send or receive no token; the two-stage form sends one row per
(token, other node); dispatchers built from plans `synth export --collective dispatch|combine`
wrote equal the reference too; bad input on one rank raises on every rank. The layout checks
and the plan reader's need no torch."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from math import prod
from pathlib import Path

import pytest

from synth.errors import PlanFileError, UsageError
from synth.torch.errors import NoRuntimeFormError
from synth.torch.moe_layout import ExpertLayout
from synth.torch.moe_plan import load_dispatch_plan, read_dispatch_plan

WORKER = Path(__file__).resolve().parent / "torch_moe_worker.py"
TOLERANCE = 1e-12  # float64: only the summation order differs


def test_layouts_from_sizes_groups_and_a_hierarchy():
    layout = ExpertLayout.uniform(8, 16, 4)
    assert layout.ep_groups == (tuple(range(8)),) and layout.nodes == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert layout.experts_per_rank == 2
    inside, across = layout.split_groups()
    assert inside == ((0, 1, 2, 3), (4, 5, 6, 7)) and across == ((0, 4), (1, 5), (2, 6), (3, 7))
    two = ExpertLayout.uniform(8, 8, 2, ep_size=4)
    assert two.split_groups() == (((0, 1), (2, 3), (4, 5), (6, 7)), ((0, 2), (1, 3), (4, 6), (5, 7)))
    # EP ranks need not follow node order: the split follows the groups given
    mixed = ExpertLayout.from_groups(8, [[0, 4, 1, 5, 2, 6, 3, 7]], [[0, 1, 2, 3], [4, 5, 6, 7]])
    assert mixed.node_split(mixed.ep_groups[0]).members == ((0, 2, 4, 6), (1, 3, 5, 7))
    from synth.hierarchy import build_hierarchy
    from synth.placement import make_placement, parse_axes
    from synth.topology import topology_from_levels

    hierarchy = build_hierarchy(make_placement(topology_from_levels("node=4,gpu=2"), parse_axes("ep=8"), [[4, 2]]),
                                ("ep",))
    assert ExpertLayout.from_hierarchy(hierarchy, 16) == ExpertLayout.uniform(8, 16, 2)


@pytest.mark.parametrize("build, message", [
    (lambda: ExpertLayout.uniform(8, 16, 3), "ranks_per_node=3 does not divide the 8 ranks"),
    (lambda: ExpertLayout.uniform(8, 12, 4), "12 experts over expert-parallel groups of 8 ranks"),
    (lambda: ExpertLayout.uniform(8, 0, 4), "num_experts=0"),
    (lambda: ExpertLayout.from_groups(8, [[0, 1, 2, 3]], [[0, 1], [2, 3, 4]]), "must name every rank 0..3"),
    (lambda: ExpertLayout.from_groups(8, [[0, 1], [2, 3, 4, 5]], [[0, 1, 2], [3, 4, 5]]), "every group must have"),
    (lambda: ExpertLayout.from_groups(8, "ab", [[0]]), "list of lists of global ranks"),
    (lambda: ExpertLayout.from_groups(8, [range(4)], [[0], [1, 2, 3]]).split_groups(), "1 to 3 ranks per node"),
])
def test_bad_layouts_are_refused_in_one_line(build, message):
    with pytest.raises(UsageError, match=message) as caught:
        build()
    assert "\n" not in str(caught.value)


def routed_document(levels: str, goal: str, program: str, routing=None) -> dict:
    """The JSON plan synth export writes, built in-process (synth.export.routed_plan)."""
    from synth.export.routed_plan import routed_plan
    from synth.goals import parse_goal
    from synth.hierarchy import build_hierarchy
    from synth.language import parse_program
    from synth.placement import make_placement, parse_axes
    from synth.topology import topology_from_levels

    system = topology_from_levels(levels)
    sizes = [level.size for level in system.levels]
    hierarchy = build_hierarchy(make_placement(system, parse_axes(f"ep={prod(sizes)}"), [sizes]), ("ep",))
    return routed_plan(hierarchy, parse_goal(goal), [parse_program(program)], routing, ["synth", "export"])


FLAT, STAGED, STAGED_BACK = ("AllToAll(InsideGroup(node))", "AllToAll(Parallel(node)); AllToAll(InsideGroup(gpu))",
                             "AllToAll(InsideGroup(gpu)); AllToAll(Parallel(node))")


def test_a_plan_gives_the_layout_and_the_form_of_its_program():
    from synth.routing import Routing

    routing = Routing(tokens=8, topk=2, experts=16, hidden=6)
    two_by_four = ExpertLayout.uniform(8, 16, 4)
    for goal, program, form in (("dispatch", FLAT, "flat"), ("dispatch", STAGED, "hierarchical"),
                                ("combine", FLAT, "flat"), ("combine", STAGED_BACK, "hierarchical")):
        plan = read_dispatch_plan(routed_document("node=2,gpu=4", goal, program, routing))
        assert (plan.collective, plan.program, plan.form, plan.top_k) == (goal, program, form, 2)
        assert plan.layout == two_by_four
    # no routing recorded: the caller gives the experts and top-k
    plan = read_dispatch_plan(routed_document("node=2,gpu=4", "dispatch", STAGED), num_experts=8, top_k=1)
    assert plan.layout == ExpertLayout.uniform(8, 8, 4) and plan.top_k == 1


def test_a_program_with_no_runtime_form_is_named():
    three = routed_document("rack=2,node=2,gpu=2", "dispatch",
                            "AllToAll(Parallel(rack)); AllToAll(Parallel(node)); AllToAll(InsideGroup(gpu))")
    with pytest.raises(NoRuntimeFormError, match=r"programs\[0\] 'AllToAll\(Parallel\(rack\)\); .*' has no form") as caught:
        read_dispatch_plan(three, num_experts=8, top_k=2)
    assert "\n" not in str(caught.value) and isinstance(caught.value, UsageError)


def _set(path, value):
    def change(document):
        *keys, last = path
        target = document
        for key in keys:
            target = target[key]
        if value is KeyError:
            del target[last]
        else:
            target[last] = value
    return change


@pytest.mark.parametrize("change, message", [
    (_set(["format"], "synth-plan"), "not a synth dispatch or combine plan"),
    (_set(["version"], 2), "version is 2"),
    (_set(["collective"], "alltoall"), "collective is 'alltoall', not one of dispatch, combine"),
    (_set(["hierarchy", 0, "size"], "2"), "hierarchy[0].size is '2', not a whole number"),
    (_set(["hierarchy"], KeyError), "hierarchy is missing"),
    (_set(["groups", 0, 3], 0), "groups[0] names a rank twice"),
    (_set(["groups", 0], [0, 1, 2]), "groups[0] has 3 entries, not 8"),
    (_set(["programs"], []), "programs has 0 entries, at least 1 needed"),
    (_set(["programs", 0, "program"], "AllToAll(Parallel(node))"), "programs[0].program 'AllToAll(Parallel(node))' is "
                                                                   "not a valid dispatch program"),
    (_set(["programs", 0, "program"], "AllToAll(Inside"), "programs[0].program 'AllToAll(Inside' is not a program"),
    (_set(["programs", 0, "steps", 1, "calls", 0, 0], [0, 1, 2, 4]), "programs[0].steps[1] is not step 2"),
    (_set(["programs", 0, "steps"], []), "programs[0].steps has 0 entries, not 2"),
    (_set(["routing", "topk"], 20), "routing is not a routing: routing topk=20 is above experts=16"),
    (_set(["routing", "colour"], 1), "routing is not a routing"),
    (_set(["routing", "experts"], 12), "routing.experts do not fit: 12 experts over expert-parallel groups of 8"),
])
def test_bad_plans_are_refused_in_one_line_naming_the_field(change, message):
    from synth.routing import Routing

    document = copy.deepcopy(routed_document("node=2,gpu=4", "dispatch", STAGED, Routing(8, 2, 16, hidden=6)))
    change(document)
    with pytest.raises(PlanFileError) as caught:
        read_dispatch_plan(document)
    assert message in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_the_loader_asks_for_what_the_plan_lacks(tmp_path):
    from synth.routing import Routing

    with pytest.raises(UsageError, match="records no routing: give num_experts and top_k"):
        read_dispatch_plan(routed_document("node=2,gpu=4", "dispatch", FLAT))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(routed_document("node=2,gpu=4", "dispatch", FLAT, Routing(8, 2, 16, hidden=6))))
    with pytest.raises(UsageError, match="top_k=4, but the plan was ranked for a routing of 2"):
        load_dispatch_plan(path, top_k=4)
    with pytest.raises(UsageError, match="has 1 program"):
        load_dispatch_plan(path, program=1)
    path.write_text("{not json")
    with pytest.raises(PlanFileError, match="not a JSON plan"):
        load_dispatch_plan(path)
    with pytest.raises(UsageError, match="cannot read the plan"):
        load_dispatch_plan(tmp_path / "missing.json")


EXPORTS = {"best.json": ("dispatch", "--top", "1"), "flat.json": ("dispatch", "--program", FLAT),
           "combine.json": ("combine", "--program", STAGED_BACK)}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    pytest.importorskip("torch")
    from synth.execute.launch import torchrun

    folder = tmp_path_factory.mktemp("plans")
    for name, (goal, *choice) in EXPORTS.items():
        exported = subprocess.run([sys.executable, "-m", "synth", "export", "--topology", "emu-2x4", "--axes", "ep=8",
                                   "--reduce", "ep", "--collective", goal, "--routing",
                                   "tokens=4096,topk=2,experts=16,hidden=4096", *choice, "--format", "json",
                                   "-o", str(folder / name)], capture_output=True, text=True, timeout=300)
        assert exported.returncode == 0, exported.stderr
    result = torchrun(WORKER, 8, ["--plans", *(str(folder / name) for name in EXPORTS)], timeout=600)
    assert result.returncode == 0, result.log[-6000:]
    return result.report["ranks"]


@pytest.mark.torchrun
def test_dispatch_and_combine_equal_a_reference_moe_layer_with_its_gradients(ranks):
    cases = set()
    for rank, report in enumerate(ranks):
        for row in report["equal"]:
            cases.add((row["layout"], row["form"], row["top_k"]))
            for what in ("out", "tokens", "weights", "experts"):
                assert row[what] <= TOLERANCE, (rank, row)
            if row["form"] == "flat":
                assert row["across"] == row["pairs_across"], row  # one row per (token, expert) on another node
            else:
                assert row["across"] == row["distinct_across"], row  # one row per (token, other node)
    assert cases == {(layout, form, k) for layout in ("2x4", "4x2") for form in ("flat", "hierarchical")
                     for k in (1, 2, 4)}
    rows = [row for report in ranks for row in report["equal"]]
    assert any(row["received"] == 0 for row in rows)  # rank 7's experts get no token
    assert any(row["several_on_one_node"] for row in rows if row["form"] == "hierarchical")
    assert any(row["distinct_across"] < row["pairs_across"] for row in rows)  # the deduplication is exercised
    assert all(row["expert_grad_norm"] > 0 for row in rows if row["received"])  # the experts' gradients are checked
    assert all(max(report["subgroups"].values()) <= TOLERANCE for report in ranks)  # two EP groups of 4


@pytest.mark.torchrun
def test_dispatchers_built_from_exported_plans_equal_the_reference_layer(ranks):
    for rank, report in enumerate(ranks):
        rows = report["plans"]
        assert [(row["collective"], row["form"]) for row in rows][1:] == [("dispatch", "flat"),
                                                                          ("combine", "hierarchical")]
        assert rows[0]["program"] == STAGED and rows[0]["form"] == "hierarchical"  # the best at 4096 tokens of 8 KiB
        for row in rows:
            assert row["nodes"] == [[0, 1, 2, 3], [4, 5, 6, 7]], row
            for what in ("out", "tokens", "weights", "experts"):
                assert row[what] <= TOLERANCE, (rank, row)
            assert row["across"] == row["pairs_across" if row["form"] == "flat" else "distinct_across"], row


@pytest.mark.torchrun
def test_bad_routing_raises_on_every_rank_naming_the_rank(ranks):
    for report in ranks:
        errors = report["errors"]
        for form in ("flat", "hierarchical"):
            assert errors[f"{form}/out_of_range"].startswith(
                "RoutingError: dispatch on rank 3: expert index 16 is outside 0..15"), errors
            assert "rank 5: indices have 3 experts per token, the dispatcher's top_k is 2" in errors[f"{form}/top_k"]
            assert "float32" in errors[f"{form}/dtype"] and "float64" in errors[f"{form}/dtype"]
            assert "rank 2" in errors[f"{form}/dtype"]
            assert "float32 weights" in errors[f"{form}/weights_dtype"] and "rank 7" in errors[f"{form}/weights_dtype"]
            combine = errors[f"{form}/combine_dtype"]
            assert "combine on rank" in combine and "float32 outputs" in combine
            assert "rank 4: tokens must be a tensor [n, hidden]" in errors[f"{form}/no_weights"]
            assert "rank 6: expert" in errors[f"{form}/repeated"] and "twice" in errors[f"{form}/repeated"]
            assert "combine on rank 0: expert_output has" in errors[f"{form}/combine_rows"]
            assert errors[f"{form}/still_works"] <= TOLERANCE  # the groups are usable after the errors
        assert "ranks_per_node=3" in errors["layout/ranks_per_node"]
        assert "multiple of 8" in errors["layout/experts"]
        assert "3 to 5 ranks per node" in errors["layout/uneven_nodes"]
        assert "covers 4 ranks, the job has 8" in errors["layout/other_world"]
        assert errors["layout/disagree"].startswith("RankDisagreementError")
        assert all("\n" not in message for message in errors.values() if isinstance(message, str))
