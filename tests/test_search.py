import itertools

import pytest

from synth.errors import UsageError
from synth.hierarchy import build_hierarchy
from synth.interpreter import run_reference
from synth.language import parse_program
from synth.placement import enumerate_placements, make_placement, parse_axes
from synth.search.pruning import DeadPrefixOracle, abstract
from synth.search import (
    Enumerator,
    SearchOptions,
    brute_force_programs,
    enumerate_programs,
)
from synth.semantics import InternedMachine, Semantics, StepFailure
from synth.topology import topology_from_levels


def names_for(sizes):
    return tuple(f"l{i}" for i in range(len(sizes)))


def texts(programs):
    return [str(p) for p in programs]


def hierarchy_of(sizes):
    """A system whose one axis spans every level, so the merged hierarchy is the system's."""
    levels = ",".join(f"l{i}={size}" for i, size in enumerate(sizes))
    devices = 1
    for size in sizes:
        devices *= size
    placement = make_placement(topology_from_levels(levels), parse_axes(f"x={devices}"), [list(sizes)])
    return build_hierarchy(placement, ("x",), "system")


def run_on_every_device(programs, sizes):
    """Every emitted program also computes the true sums on every device (numpy reference)."""
    hierarchy = hierarchy_of(sizes)
    for program in programs:
        run_reference(program, hierarchy)


@pytest.mark.parametrize("sizes", [(2, 2), (2, 3), (4,), (2, 2, 2), (3, 2, 2)])
def test_pruned_search_equals_brute_force(sizes):
    """Completeness: every sequence over the alphabet, checked one by one, gives the same set."""
    semantics = Semantics(names_for(sizes), sizes, quotient=False)
    brute = set(texts(brute_force_programs(semantics, 3)))
    programs = list(Enumerator(Semantics(names_for(sizes), sizes), SearchOptions(max_len=3)).programs())
    found = texts(programs)
    assert len(found) == len(set(found))
    assert set(found) == brute
    run_on_every_device(programs, sizes)


@pytest.mark.parametrize("sizes, max_len", [((2, 2), 5), ((2, 3), 5), ((2, 2, 2), 4), ((2, 1, 3), 4)])
@pytest.mark.parametrize("quotient", [False, True])
def test_each_pruning_rule_keeps_every_program(sizes, max_len, quotient):
    baseline = texts(Enumerator(Semantics(names_for(sizes), sizes, quotient=False),
                                SearchOptions(max_len=max_len, prune_dead=False, share_suffixes=False)).programs())
    for prune_dead, share in itertools.product([False, True], repeat=2):
        options = SearchOptions(max_len=max_len, prune_dead=prune_dead, share_suffixes=share)
        found = texts(Enumerator(Semantics(names_for(sizes), sizes, quotient=quotient), options).programs())
        assert found == baseline


@pytest.mark.parametrize("sizes", [(3, 2), (4, 2), (3, 3), (2, 2, 3), (2, 4, 2), (6,), (1, 3)])
def test_quotient_state_finds_exactly_the_explicit_programs(sizes):
    max_len = 4 if len(sizes) > 2 else 5
    explicit = texts(Enumerator(Semantics(names_for(sizes), sizes, quotient=False), SearchOptions(max_len=max_len)).programs())
    programs = list(Enumerator(Semantics(names_for(sizes), sizes, quotient=True), SearchOptions(max_len=max_len)).programs())
    assert texts(programs) == explicit
    run_on_every_device(programs, sizes)


def test_every_emitted_program_is_valid_under_the_explicit_semantics():
    sizes = (2, 3, 2)
    explicit = Semantics(names_for(sizes), sizes, quotient=False)
    programs = list(Enumerator(Semantics(names_for(sizes), sizes), SearchOptions(max_len=4)).programs())
    for program in programs:
        explicit.run(program)
    run_on_every_device(programs, sizes)


def paper_hierarchy():
    placement = make_placement(topology_from_levels("server=2,cpu=2,gpu=4"), parse_axes("4,4"), [[1, 2, 2], [2, 1, 2]])
    return build_hierarchy(placement, ("a0",))


@pytest.mark.parametrize("text", [
    "AllReduce(InsideGroup(cpu))",
    "AllReduce(InsideGroup(gpu)); AllReduce(Parallel(cpu))",
    "Reduce(InsideGroup(gpu)); AllReduce(Master(cpu)); Broadcast(InsideGroup(gpu))",
    "ReduceScatter(InsideGroup(gpu)); AllReduce(Parallel(cpu)); AllGather(InsideGroup(gpu))",
])
def test_the_well_known_strategies_are_found(text):
    found = texts(enumerate_programs(paper_hierarchy(), max_len=3))
    assert text in found


def test_one_spelling_per_instruction():
    # Parallel and InsideGroup of the innermost level are the same instruction: only the first spelling appears.
    found = texts(enumerate_programs(paper_hierarchy(), max_len=3))
    assert not any("Parallel(gpu)" in t or "Master(gpu)" in t for t in found)


def test_programs_come_shortest_first_and_the_generator_stops_early():
    generator = enumerate_programs(paper_hierarchy(), max_len=5)
    first = [next(generator) for _ in range(5)]
    assert [len(p) for p in first] == sorted(len(p) for p in first)
    assert str(first[0]) == "AllReduce(InsideGroup(cpu))"


def test_total_counts_without_listing():
    enumerator = Enumerator(Semantics(("cpu", "gpu"), (2, 2)), SearchOptions(max_len=4))
    assert enumerator.total() == sum(1 for _ in Enumerator(Semantics(("cpu", "gpu"), (2, 2)), SearchOptions(max_len=4)).programs())


def test_every_placement_and_request_gives_programs_that_the_explicit_semantics_accepts():
    topology = topology_from_levels("node=2,gpu=4")
    for placement in enumerate_placements(topology, parse_axes("data=4,model=2")):
        for reduce in (("data",), ("model",), ("data", "model")):
            for kind in ("merged", "split", "system"):
                hierarchy = build_hierarchy(placement, reduce, kind)
                explicit = Semantics(hierarchy.level_names, hierarchy.sizes, quotient=False)
                programs = list(enumerate_programs(hierarchy, max_len=3))
                assert programs, (placement.matrix, reduce, kind)
                for program in programs:
                    explicit.run(program)
                    run_reference(program, hierarchy)


def test_split_hierarchy_reduces_one_axis_before_another():
    placement = make_placement(topology_from_levels("node=2,gpu=4"), parse_axes("data=4,model=2"), [[2, 2], [1, 2]])
    hierarchy = build_hierarchy(placement, ("data", "model"), "split")
    assert hierarchy.level_names == ("node.data", "gpu.data", "gpu.model")
    found = texts(enumerate_programs(hierarchy, max_len=3))
    assert "AllReduce(InsideGroup(gpu.model)); AllReduce(Parallel(gpu.data)); AllReduce(Parallel(node.data))" in found


@pytest.mark.parametrize("max_len", [0, -1, 13])
def test_lengths_that_cannot_finish_or_make_no_sense_are_refused(max_len):
    with pytest.raises(UsageError):
        Enumerator(Semantics(("a",), (2,)), SearchOptions(max_len=max_len))


def test_parsed_program_matches_enumerated_spelling():
    program = parse_program("ReduceScatter(InsideGroup(gpu)); AllReduce(Parallel(cpu)); AllGather(InsideGroup(gpu))")
    assert program in list(enumerate_programs(paper_hierarchy(), max_len=3))


# --- deeper hierarchies, where the oracles stay fast ------------------------------------------------


@pytest.mark.parametrize("sizes, max_len", [((2, 2, 2, 2, 2), 2), ((2, 2, 2, 2, 2, 2), 2)])
def test_pruned_search_equals_brute_force_on_five_and_six_levels(sizes, max_len):
    semantics = Semantics(names_for(sizes), sizes, quotient=False)
    brute = texts(brute_force_programs(semantics, max_len))
    assert texts(Enumerator(Semantics(names_for(sizes), sizes), SearchOptions(max_len=max_len)).programs()) == brute


@pytest.mark.parametrize("sizes, max_len", [((3, 2, 2, 2, 2), 3), ((2, 3, 2, 2, 2, 2), 3)])
def test_quotient_equals_explicit_on_five_and_six_levels(sizes, max_len):
    explicit = texts(Enumerator(Semantics(names_for(sizes), sizes, quotient=False), SearchOptions(max_len=max_len)).programs())
    programs = list(Enumerator(Semantics(names_for(sizes), sizes), SearchOptions(max_len=max_len)).programs())
    assert texts(programs) == explicit
    run_on_every_device(programs, sizes)


@pytest.mark.parametrize("sizes", [(2, 3), (3, 2, 2), (2, 2, 2), (4, 2)])
@pytest.mark.parametrize("quotient", [False, True])
def test_interned_machine_makes_the_same_steps_as_the_semantics(sizes, quotient):
    """The search's memoized machine over member ids = Semantics.apply, failures included."""
    semantics = Semantics(names_for(sizes), sizes, quotient=quotient)
    machine = InternedMachine(semantics)
    frontier, seen = [semantics.initial], {semantics.initial}
    for _ in range(3):
        following = []
        for state in frontier:
            ids = machine.intern(state)
            for index, (_, instruction) in enumerate(semantics.alphabet):
                try:
                    expected = semantics.apply(state, instruction)
                except StepFailure:
                    expected = None
                found = machine.apply(ids, index)
                assert (None if found is None else machine.expand(found)) == expected
                if expected is not None and expected not in seen:
                    seen.add(expected)
                    following.append(expected)
        frontier = following[:150]


@pytest.mark.parametrize("sizes", [(2, 3), (3, 3), (6,), (2, 2, 2), (3, 2, 2), (1, 3)])
@pytest.mark.parametrize("quotient", [False, True])
def test_the_cached_abstraction_equals_the_abstraction_from_scratch(sizes, quotient):
    semantics = Semantics(names_for(sizes), sizes, quotient=quotient)
    enumerator = Enumerator(semantics, SearchOptions(max_len=4, prune_dead=False))
    enumerator.total()
    oracle = DeadPrefixOracle(semantics.alphabet, semantics.member_count, quotient, enumerator.machine.members)
    for ids in enumerator._states[:2000]:
        assert oracle.facts(ids) == abstract(enumerator.machine.expand(ids), semantics.member_count)


# --- every goal (synth/goals.py) -----------------------------------------------------------------------

OTHER_GOALS = ["reducescatter", "allgather", "alltoall", "broadcast", "reduce"]


@pytest.mark.parametrize("goal", OTHER_GOALS)
@pytest.mark.parametrize("sizes", [(2, 2), (2, 3), (4,), (3, 2, 2)])
def test_pruned_search_equals_brute_force_for_every_goal(sizes, goal):
    """Completeness per goal: the pruned quotient search finds exactly the sequences over the
    goal's alphabet that the explicit semantics accepts, and each runs correctly on every
    device of the numpy interpreter."""
    semantics = Semantics(names_for(sizes), sizes, quotient=False, goal=goal)
    brute = set(texts(brute_force_programs(semantics, 3)))
    programs = list(Enumerator(Semantics(names_for(sizes), sizes, goal=goal), SearchOptions(max_len=3)).programs())
    found = texts(programs)
    assert len(found) == len(set(found))
    assert set(found) == brute
    hierarchy = hierarchy_of(sizes)
    for program in programs:
        run_reference(program, hierarchy, goal=goal)


@pytest.mark.parametrize("goal", OTHER_GOALS)
@pytest.mark.parametrize("sizes, max_len", [((2, 4), 5), ((4, 3), 4), ((2, 3, 2), 4), ((3, 1, 2), 4)])
def test_quotient_pruned_search_equals_the_explicit_unpruned_one_for_every_goal(sizes, max_len, goal):
    """The quotient state (every level shrunk to 2) and the dead-prefix pruning keep exactly the
    explicit machine's programs for every goal; every program runs on every device."""
    quotient = list(Enumerator(Semantics(names_for(sizes), sizes, goal=goal), SearchOptions(max_len=max_len)).programs())
    explicit = Enumerator(Semantics(names_for(sizes), sizes, quotient=False, goal=goal),
                          SearchOptions(max_len=max_len, prune_dead=False))
    assert texts(quotient) == texts(explicit.programs())
    hierarchy = hierarchy_of(sizes)
    for program in quotient:
        run_reference(program, hierarchy, goal=goal)


@pytest.mark.parametrize("goal, text", [
    ("reducescatter", "Permute(l1,l0); ReduceScatter(InsideGroup(l1)); ReduceScatter(Parallel(l0))"),
    ("allgather", "Permute(l1,l0); AllGather(Parallel(l0)); AllGather(InsideGroup(l1)); Permute(l0,l1)"),
    ("alltoall", "AllToAll(Parallel(l0)); Permute(l1,l0); AllToAll(InsideGroup(l1)); Permute(l0,l1)"),
])
def test_the_permuted_hierarchical_programs_are_found(goal, text):
    found = texts(Enumerator(Semantics(names_for((2, 4)), (2, 4), goal=goal), SearchOptions(max_len=4)).programs())
    assert text in found


@pytest.mark.parametrize("goal", ["allreduce", *OTHER_GOALS])
@pytest.mark.parametrize("sizes", [(2, 3), (2, 2, 2), (3, 1, 2)])
@pytest.mark.parametrize("quotient", [False, True])
def test_the_cached_abstraction_equals_the_abstraction_from_scratch_for_every_goal(sizes, quotient, goal):
    """The oracle's facts, cached per member (partition need, reduce-scatter's split,
    misplaced blocks and overlapping data), equal the facts computed from the state itself."""
    from synth.goals import parse_goal

    semantics = Semantics(names_for(sizes), sizes, quotient=quotient, goal=goal)
    enumerator = Enumerator(semantics, SearchOptions(max_len=4, prune_dead=False))
    enumerator.total()
    oracle = DeadPrefixOracle(semantics.alphabet, semantics.member_count, quotient, enumerator.machine.members,
                              parse_goal(goal))
    for ids in enumerator._states[:3000]:
        expected = abstract(enumerator.machine.expand(ids), semantics.member_count, parse_goal(goal))
        found = oracle.facts(ids)
        if expected.need < 0:  # dead either way: the rest is not computed
            assert found.need < 0
        else:
            assert found == expected


@pytest.mark.parametrize("goal", ["reducescatter", "reduce", "allreduce"])
@pytest.mark.parametrize("sizes", [(2, 2, 2), (2, 3)])
def test_the_pruned_quotient_search_equals_the_unpruned_explicit_one_at_length_five(sizes, goal):
    """The pruning rules of goals that sum (the partition bound, reduce-scatter's overlap and
    misplaced blocks, steps that cannot end a program) keep every program at length 5."""
    quotient = list(Enumerator(Semantics(names_for(sizes), sizes, goal=goal), SearchOptions(max_len=5)).programs())
    explicit = Enumerator(Semantics(names_for(sizes), sizes, quotient=False, goal=goal),
                          SearchOptions(max_len=5, prune_dead=False, budget_s=None))
    assert texts(quotient) == texts(explicit.programs())
