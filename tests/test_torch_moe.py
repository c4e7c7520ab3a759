"""synth.torch.moe's dispatch and combine on 8 gloo ranks (tests/torch_moe_worker.py, one torchrun
launch for every check): equal outputs and gradients (tokens, router weights, experts'
parameters) against a reference MoE layer built from all_to_all_single as Megatron's alltoall
dispatcher does, for the flat and the two-stage form, node layouts 2x4 and 4x2, top-k 1, 2 and 4,
uneven routing with ranks that send or receive no token; the two-stage form sends one row per
(token, other node); bad input on one rank raises on every rank. The layout checks need no torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from synth.errors import UsageError
from synth.torch.moe_layout import ExpertLayout

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


@pytest.fixture(scope="module")
def ranks():
    pytest.importorskip("torch")
    from synth.execute.launch import torchrun

    result = torchrun(WORKER, 8, [], timeout=600)
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
