import itertools
import math

import numpy as np
import pytest

from synth.errors import NoSolutionError, UsageError
from synth.placement import (Factor, Inside, enumerate_placements, enumerate_placements_direct, make_placement,
                             parse_axes, parse_factor, parse_inside, parse_matrix)
from synth.topology import topology_from_levels


@pytest.mark.parametrize("levels, axes", [
    ("2,2,4", "4,4"),
    ("rack=2,server=2,cpu=2,gpu=4", "data=8,model=4"),
    ("node=4,gpu=8", "data=8,model=4"),
    ("a=6,b=4", "x=2,y=3,z=4"),
    ("a=12", "x=3,y=4"),
    ("a=2,b=3,c=2", "x=12"),
    ("a=4,b=4", "x=2,y=2,z=4"),
])
def test_z3_enumeration_matches_direct_search(levels, axes):
    topology = topology_from_levels(levels)
    parsed = parse_axes(axes)
    z3_matrices = [p.matrix for p in enumerate_placements(topology, parsed)]
    direct = enumerate_placements_direct(topology.sizes, tuple(a.size for a in parsed))
    assert z3_matrices == direct
    assert len(set(z3_matrices)) == len(z3_matrices)


def test_spec_example_has_four_placements():
    assert len(enumerate_placements(topology_from_levels("2,2,4"), parse_axes("4,4"))) == 4


def test_matrix_rules_hold_for_every_placement():
    topology = topology_from_levels("rack=2,server=2,cpu=2,gpu=4")
    for placement in enumerate_placements(topology, parse_axes("data=8,model=4")):
        m = np.array(placement.matrix)
        assert tuple(m.prod(axis=0)) == topology.sizes
        assert tuple(m.prod(axis=1)) == (8, 4)


def test_identity_placement_numbers_ranks_row_major_over_axes():
    # Axes kept in order (data outer, model inner) gives rank = row-major index (device mesh order).
    placement = make_placement(topology_from_levels("node=4,gpu=8"), parse_axes("data=8,model=4"), [[4, 2], [1, 4]])
    coords = placement.axis_coordinates
    assert (coords[:, 0] * 4 + coords[:, 1] == np.arange(32)).all()


def test_device_to_axis_coordinates_follow_spec_digits():
    # levels 2,2,4; M = [[1,2,2],[2,1,2]]: c_gpu splits into (d_a0, d_a1) with radices (2, 2).
    placement = make_placement(topology_from_levels("server=2,cpu=2,gpu=4"), parse_axes("4,4"), [[1, 2, 2], [2, 1, 2]])
    # device (server=1, cpu=0, gpu=3): gpu 3 -> d_a0=1, d_a1=1; x_a0 = (cpu 0, gpu 1) -> 1; x_a1 = (server 1, gpu 1) -> 3
    rank = 1 * 8 + 0 * 4 + 3
    assert placement.axis_coordinates[rank].tolist() == [1, 3]
    assert placement.rank_of([1, 3]) == rank


def test_axis_groups_partition_devices_and_agree_on_other_axes():
    placement = make_placement(topology_from_levels("server=2,cpu=2,gpu=4"), parse_axes("4,4"), [[1, 2, 2], [2, 1, 2]])
    for axis in ("a0", "a1"):
        groups = placement.axis_groups(axis)
        assert sorted(r for g in groups for r in g) == list(range(16))
        other = 1 - placement.axis_index(axis)
        for group in groups:
            assert len({placement.axis_coordinates[r, other] for r in group}) == 1
            assert [placement.axis_coordinates[r, placement.axis_index(axis)] for r in group] == list(range(4))


def test_constraints_inside_and_factor():
    topology = topology_from_levels("node=4,gpu=8")
    axes = parse_axes("data=8,model=4")
    inside = enumerate_placements(topology, axes, [Inside("model", "node")])
    assert [p.matrix for p in inside] == [((4, 2), (1, 4))]
    fixed = enumerate_placements(topology, axes, [Factor("model", "gpu", 2)])
    assert all(p.matrix[1][1] == 2 for p in fixed) and fixed
    everything = enumerate_placements(topology, axes)
    assert {p.matrix for p in fixed} == {p.matrix for p in everything if p.matrix[1][1] == 2}


def test_constraint_parsing():
    assert parse_inside("model=node") == Inside("model", "node")
    assert parse_factor("model.gpu=4") == Factor("model", "gpu", 4)
    for bad in ("model", "model=", "1x=gpu"):
        with pytest.raises(UsageError):
            parse_inside(bad)
    for bad in ("model=4", "model.gpu", "model.gpu=x"):
        with pytest.raises(UsageError):
            parse_factor(bad)


@pytest.mark.parametrize("axes, constraints, error", [
    ("data=8,model=5", [], UsageError),
    ("data=8,model=4", [Inside("pipe", "gpu")], UsageError),
    ("data=8,model=4", [Inside("model", "rack")], UsageError),
    ("data=8,model=4", [Factor("model", "gpu", 3)], NoSolutionError),
    ("data=8,model=4", [Inside("model", "node"), Factor("model", "node", 2)], NoSolutionError),
    ("data=8,model=4", [Inside("model", "gpu")], NoSolutionError),  # one gpu holds one device
    ("data=8,model=4", [Factor("model", "gpu", 10**30 + 1)], NoSolutionError),  # no trial division of it
    ("data=8,model=4", [Factor("model", "gpu", 0)], UsageError),
])
def test_impossible_requests_are_explained(axes, constraints, error):
    with pytest.raises(error) as caught:
        enumerate_placements(topology_from_levels("node=4,gpu=8"), parse_axes(axes), constraints)
    assert "\n" not in str(caught.value) and str(caught.value)


@pytest.mark.parametrize("text", ["", "x", "[1,2]", "[[1,2],[2", "[[]]", "{}"])
def test_bad_matrix_text(text):
    with pytest.raises(UsageError):
        parse_matrix(text)


@pytest.mark.parametrize("matrix, fragment", [
    ([[1, 2, 2]], "rows"),
    ([[1, 2], [2, 1]], "entries"),
    ([[1, 2, 2], [2, 1, 3]], "multiplies"),
    ([[2, 1, 2], [2, 1, 2]], "column"),
    ([[1, 2, 2], [2, 1, 2.0]], "positive integer"),
    ([[0, 2, 2], [2, 1, 2]], "positive integer"),
])
def test_bad_matrices_name_the_fault(matrix, fragment):
    with pytest.raises(UsageError) as caught:
        make_placement(topology_from_levels("server=2,cpu=2,gpu=4"), parse_axes("4,4"), matrix)
    assert fragment in str(caught.value)


@pytest.mark.parametrize("text", ["data=0", "data=x", "1data=4", "data=4,data=2", "data=-2", ""])
def test_bad_axes(text):
    with pytest.raises(UsageError):
        parse_axes(text)


# --- --inside AXIS=LEVEL: the axis stays inside one unit of LEVEL ------------------------------------


def _units_spanned(placement, axis: str, level: int) -> set[int]:
    """For each group of `axis`, the set of units of `level` (numbered globally) it touches."""
    sizes = placement.level_sizes
    inner = int(np.prod(sizes[level + 1:]))
    return {len({rank // inner for rank in group}) for group in placement.axis_groups(axis)}


@pytest.mark.parametrize("levels, axes, axis, level", [
    ("node=4,gpu=8", "data=8,model=4", "model", "node"),
    ("node=4,gpu=8", "data=8,model=4", "data", "node"),
    ("node=2,gpu=4", "data=2,model=4", "model", "node"),
    ("rack=2,node=4,gpu=8", "data=16,model=4", "model", "node"),
    ("rack=2,node=4,gpu=8", "data=16,model=4", "model", "rack"),
    ("rack=2,node=4,gpu=8", "data=8,model=8", "model", "rack"),
    ("rack=2,node=2,gpu=4", "data=2,pipe=2,model=4", "pipe", "rack"),
])
def test_inside_keeps_every_group_in_one_unit_of_the_level(levels, axes, axis, level):
    """`--inside model=node` means what it reads: every model group sits inside one node, and
    the constraint keeps exactly the placements where that is so."""
    topology = topology_from_levels(levels)
    parsed = parse_axes(axes)
    index = topology.level_index(level)
    kept = enumerate_placements(topology, parsed, [Inside(axis, level)])
    everything = enumerate_placements(topology, parsed)
    inside = [p for p in everything if _units_spanned(p, axis, index) == {1}]
    assert [p.matrix for p in kept] == [p.matrix for p in inside]
    assert kept


def test_inside_the_outermost_level_is_no_constraint_on_one_unit():
    topology = topology_from_levels("rack=1,node=2,gpu=4")
    everything = enumerate_placements(topology, parse_axes("data=2,model=4"))
    assert enumerate_placements(topology, parse_axes("data=2,model=4"), [Inside("model", "rack")]) == everything


def test_inside_a_unit_too_small_is_refused_with_the_reason():
    with pytest.raises(NoSolutionError, match="one node holds 4 device"):
        enumerate_placements(topology_from_levels("rack=2,node=2,gpu=4"), parse_axes("data=2,model=8"),
                             [Inside("model", "node")])


def test_group_heads_match_the_full_groups():
    topology = topology_from_levels("r=2,n=3,g=4")
    for placement in enumerate_placements(topology, parse_axes("a=4,b=3,c=2")):
        for axis in "abc":
            for index, group in enumerate(placement.axis_groups(axis)):
                assert placement.group_head(axis, index, 100) == group
                assert placement.group_head(axis, index, 2) == group[:2]


@pytest.mark.parametrize("text", ["[[" + "9" * 5000 + "]]", "[" * 5000 + "]" * 5000, "[[1,2]]" + " " * 5000,
                                  "[[true, 2]]", "[[1e3, 2]]"])
def test_hostile_matrix_text_is_refused(text):
    with pytest.raises(UsageError) as caught:
        parse_matrix(text)
    assert len(str(caught.value)) < 300


@pytest.mark.parametrize("text", ["model.gpu=" + "9" * 31, "mod\u0435l=node", "model.gpu=\u0663"])
def test_hostile_constraints_are_refused(text):
    with pytest.raises(UsageError):
        (parse_factor if "." in text else parse_inside)(text)


@pytest.mark.parametrize("text", ["data=\u0663", "data=\uff18", "data=8,", "," * 100, ",".join(f"a{i}=1" for i in range(65)),
                                  "data=" + "9" * 400])
def test_more_bad_axes(text):
    with pytest.raises(UsageError) as caught:
        parse_axes(text)
    assert len(str(caught.value)) < 300


def test_z3_does_not_swallow_ctrl_c(run_cli):
    """Placements need no Z3; the search's pruning, which asks it, leaves SIGINT to Python."""
    import z3

    code, _, err = run_cli("programs", "--levels", "node=2,gpu=2", "--axes", "4", "--reduce", "a0", "--max-len", "3",
                           "--count")
    assert code == 0, err
    assert z3.get_param("ctrl_c") == "false"


# --- counting before enumerating -------------------------------------------------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402

from synth.placement import MAX_PLACEMENTS, count_matching, count_placements, placement_matrices  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 3, 4, 6, 8]), min_size=1, max_size=3),
       st.data())
def test_the_count_is_the_number_of_placements_z3_finds(levels, data):
    topology = topology_from_levels(",".join(map(str, levels)))
    devices = topology.device_count
    first = data.draw(st.sampled_from([d for d in range(1, devices + 1) if devices % d == 0]))
    axes = parse_axes(f"x={first},y={devices // first}")
    constraints = data.draw(st.lists(st.one_of(
        st.builds(Inside, st.sampled_from(["x", "y"]), st.sampled_from(topology.level_names)),
        st.builds(Factor, st.sampled_from(["x", "y"]), st.sampled_from(topology.level_names),
                  st.sampled_from([1, 2, 3, 4]))), max_size=2))
    try:
        found = placement_matrices(topology, axes, constraints)
    except NoSolutionError:
        found = []
    try:
        counted = count_matching(topology, axes, constraints, 10**6)
    except NoSolutionError:
        counted = 0
    assert counted == len(found)
    if not constraints:
        assert len(found) == len(enumerate_placements_direct(topology.sizes, (first, devices // first)))


def test_too_many_placements_are_refused_before_z3_lists_them():
    topology = topology_from_levels("2,2,2,2,2,2,2,2,2,2")
    with pytest.raises(UsageError, match=f"more than {MAX_PLACEMENTS} placements"):
        enumerate_placements(topology, parse_axes("4,4,4,4,4"))
    narrowed = enumerate_placements(topology, parse_axes("4,4,4,4,4"),
                                    [Inside("a0", "l7"), Inside("a1", "l5"), Inside("a2", "l3")])
    assert 0 < len(narrowed) <= MAX_PLACEMENTS
    assert len(narrowed) == count_placements(topology.sizes, (4,) * 5, {
        (2, a, l): 0 for a, last in ((0, 7), (1, 5), (2, 3)) for l in range(last + 1)}, 10**6)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=3), st.lists(st.integers(0, 4), min_size=1, max_size=3),
       st.integers(0, 3), st.integers(0, 2), st.integers(1, 40))
def test_tables_counted_as_walked(rows, columns, fixed_value, fixed_cell, limit):
    """The memoized count of exponent tables is the depth-first walk's count, capped alike."""
    from synth.placement import _count_tables, _tables

    columns[-1] += sum(rows) - sum(columns)  # the sums must agree for any table; keep them so when they can
    if columns[-1] < 0:
        return
    fixed = {(fixed_cell % len(rows), fixed_cell % len(columns)): fixed_value} if fixed_cell else {}
    walked = sum(1 for _ in _tables(rows, columns, fixed))
    assert _count_tables(rows, columns, fixed, limit) == min(walked, limit + 1)


@pytest.mark.parametrize("level_sizes,axis_sizes", [((2, 8), (4, 4)), ((12, 8), (6, 4, 4)), ((1,), (1,)),
                                                    ((2, 9, 4), (3, 4, 6))])
def test_matrices_combine_each_primes_table(level_sizes, axis_sizes):
    """Placements from per-prime tables (powers kept per table) are each table choice's cells
    multiplied, as defined."""
    from synth.placement import _matching, _prime_factors, _tables

    primes = sorted(set().union(*(_prime_factors(n) for n in level_sizes + axis_sizes)))
    per_prime = [list(_tables([_prime_factors(s).get(p, 0) for s in axis_sizes],
                              [_prime_factors(s).get(p, 0) for s in level_sizes], {})) for p in primes]
    defined = [tuple(tuple(math.prod(p ** table[a][l] for p, table in zip(primes, choice))
                           for l in range(len(level_sizes))) for a in range(len(axis_sizes)))
               for choice in itertools.product(*per_prime)]
    assert list(_matching(level_sizes, axis_sizes, {})) == defined


def test_check_matrix_fast_path_agrees_with_its_rules():
    """The quick acceptance of a well-formed matrix passes exactly what the rule-by-rule check passes."""
    from synth.placement import _well_formed, check_matrix
    cases = [((4, 2),), ((2, 2), (2, 1)), ((1, 2), (4, 1)), ((2, 2), (2, 2)), ((2, True), (2, 1)),
             ((2, 0), (2, 2)), ((2,), (2, 2)), ((2, 2),), (), ((2.0, 2), (2, 1)), ([2, 2], [2, 1])]
    for matrix in cases:
        for level_sizes, axis_sizes in (((4, 2), (8,)), ((4, 2), (4, 2)), ((4, 2), (2, 4)), ((), ())):
            try:
                check_matrix(matrix, level_sizes, axis_sizes)
                passed = True
            except UsageError:
                passed = False
            if _well_formed(matrix, level_sizes, axis_sizes):
                assert passed, (matrix, level_sizes, axis_sizes)


@pytest.mark.parametrize("levels,axes", [("2,2,4", "4,4"), ("rack=2,server=2,cpu=2,gpu=4", "data=8,model=4"),
                                         ("4,6,8", "pp=2,dp=12,tp=8"), ("2,3", "a=1,b=6")])
def test_listed_placements_equal_checked_ones(levels, axes):
    """The listing makes its placements without the rules' check (Placement.built): each equals
    the placement made with it."""
    topology = topology_from_levels(levels)
    parsed = parse_axes(axes)
    listed = enumerate_placements(topology, parsed)
    assert listed
    for placement in listed:
        checked = make_placement(topology, parsed, placement.matrix)
        assert checked == placement and hash(checked) == hash(placement)
        assert checked.to_text() == placement.to_text() and checked.spans == {}
