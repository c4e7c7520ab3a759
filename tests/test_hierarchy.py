import numpy as np
import pytest

from synth.errors import UsageError
from synth.hierarchy import build_hierarchy, parse_reduce
from synth.placement import make_placement, parse_axes
from synth.topology import topology_from_levels


@pytest.fixture
def paper_placement():
    return make_placement(topology_from_levels("server=2,cpu=2,gpu=4"), parse_axes("4,4"), [[1, 2, 2], [2, 1, 2]])


def test_merged_hierarchy_of_the_paper_example(paper_placement):
    h = build_hierarchy(paper_placement, ("a0",))
    assert h.level_names == ("cpu", "gpu") and h.sizes == (2, 2)
    assert h.group_size == 4 and len(h.groups) == 4


def test_split_hierarchy_orders_by_level_then_axis(paper_placement):
    h = build_hierarchy(paper_placement, ("a0", "a1"), "split")
    assert h.level_names == ("server.a1", "cpu.a0", "gpu.a0", "gpu.a1")
    assert h.sizes == (2, 2, 2, 2)
    merged = build_hierarchy(paper_placement, ("a0", "a1"))
    assert merged.level_names == ("server", "cpu", "gpu") and merged.sizes == (2, 2, 4)
    # Both number members the same way (mixed radix over the same digit order).
    assert (h.member_ranks == merged.member_ranks).all()


def test_system_hierarchy_keeps_every_level(paper_placement):
    h = build_hierarchy(paper_placement, ("a0",), "system")
    assert h.level_names == ("server", "cpu", "gpu") and h.sizes == (1, 2, 2)


@pytest.mark.parametrize("kind", ["merged", "split", "system"])
@pytest.mark.parametrize("reduce", [("a0",), ("a1",), ("a0", "a1")])
def test_groups_are_reduction_groups(paper_placement, kind, reduce):
    h = build_hierarchy(paper_placement, reduce, kind)
    coords = paper_placement.axis_coordinates
    others = [a for a in range(2) if paper_placement.axis_names[a] not in reduce]
    flat = sorted(r for g in h.groups for r in g)
    assert flat == list(range(16))
    for group in h.groups:
        assert len(group) == h.group_size
        for a in others:
            assert len({coords[r, a] for r in group}) == 1
        # member rank is the mixed-radix number of the positions
        for member, rank in enumerate(group):
            assert h.member_ranks[rank] == member
            assert np.ravel_multi_index(tuple(h.positions[rank]), h.sizes) == member


def test_positions_are_axis_digits(paper_placement):
    h = build_hierarchy(paper_placement, ("a0",))
    digits = paper_placement.digits
    assert (h.positions[:, 0] == digits[:, 0, 1]).all()  # cpu digit of a0
    assert (h.positions[:, 1] == digits[:, 0, 2]).all()  # gpu digit of a0


def test_parse_reduce():
    assert parse_reduce("model,data", ("data", "model")) == ("data", "model")
    for bad in ("", "pipe", "data,data"):
        with pytest.raises(UsageError):
            parse_reduce(bad, ("data", "model"))


def test_unknown_hierarchy_kind(paper_placement):
    with pytest.raises(UsageError):
        build_hierarchy(paper_placement, ("a0",), "flat")
