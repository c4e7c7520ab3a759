"""docs/model.md sections 5 and 7: forms, each collective's precondition and effect, program validity,
and the agreement of the quotient machine the search uses with the explicit one."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synth.errors import InvalidProgramError, UsageError
from synth.hierarchy import build_hierarchy
from synth.language import Program, Step, collective_names, form_names, parse_program
from synth.names import product
from synth.placement import enumerate_placements, parse_axes
from synth.search import Enumerator, SearchOptions
from synth.semantics import FORMS, Holding, Semantics, StepFailure
from synth.topology import topology_from_levels


def explicit(*levels: tuple[str, int]) -> Semantics:
    return Semantics(tuple(name for name, _ in levels), tuple(size for _, size in levels), quotient=False)


def held(semantics: Semantics, lo: int, hi: int, chunk_sets) -> tuple:
    """A member state by hand: range [lo, hi) and, per chunk in it, its contributors."""
    n = semantics.member_count
    assert len(chunk_sets) == hi - lo
    bits = sum(1 << (chunk * n + member) for chunk, members in zip(range(lo, hi), chunk_sets) for member in members)
    return Holding(lo, hi, bits, hi - lo)


def apply(semantics: Semantics, state, text: str):
    (step,) = parse_program(text).steps
    return semantics.apply(tuple(state), semantics.instruction_of(step))


def fails(semantics: Semantics, state, text: str, *fragments: str) -> str:
    with pytest.raises(StepFailure) as failure:
        apply(semantics, state, text)
    for fragment in fragments:
        assert fragment in str(failure.value), (fragment, str(failure.value))
    return str(failure.value)


def rejects(semantics: Semantics, text: str, *fragments: str) -> InvalidProgramError:
    with pytest.raises(InvalidProgramError) as error:
        semantics.run(parse_program(text))
    for fragment in fragments:
        assert fragment in str(error.value), (fragment, str(error.value))
    return error.value


PAIR = explicit(("a", 2))
QUAD = explicit(("a", 4))
CPU_GPU = explicit(("cpu", 2), ("gpu", 2))


# --- forms (docs/model.md section 5) -----------------------------------------------------------------------


def test_forms_on_two_by_two():
    sizes = (2, 2)  # member rank = 2 * p_cpu + p_gpu
    assert FORMS["InsideGroup"](sizes, 0) == (((0, 1, 2, 3),), (0, 1))
    assert FORMS["InsideGroup"](sizes, 1) == (((0, 1), (2, 3)), (1,))
    assert FORMS["Parallel"](sizes, 0) == (((0, 2), (1, 3)), (0,))
    assert FORMS["Parallel"](sizes, 1) == (((0, 1), (2, 3)), (1,))
    # Master: only members at position 0 of every inner level take part.
    assert FORMS["Master"](sizes, 0) == (((0, 2),), (0,))
    assert FORMS["Master"](sizes, 1) == (((0, 1), (2, 3)), (1,))


def test_forms_drop_one_member_groups():
    assert FORMS["Parallel"]((2, 1), 1)[0] == ()
    assert FORMS["Master"]((3, 2), 0) == (((0, 2, 4),), (0,))


def test_same_groups_are_one_instruction_in_the_alphabet():
    spelled = {str(step) for step, _ in CPU_GPU.alphabet}
    assert "AllReduce(InsideGroup(gpu))" in spelled
    assert "AllReduce(Parallel(gpu))" not in spelled and "AllReduce(Master(gpu))" not in spelled
    assert len(CPU_GPU.alphabet) == 5 * 4  # per collective: InsideGroup(cpu), InsideGroup(gpu), Parallel(cpu), Master(cpu)


# --- AllReduce ---------------------------------------------------------------------------------


def test_all_reduce_unites_every_chunk():
    after = apply(PAIR, PAIR.initial, "AllReduce(InsideGroup(a))")
    assert after == PAIR.goal
    assert PAIR.chunk_sets(after[0]) == [0b11, 0b11]


def test_all_reduce_needs_one_range():
    state = [held(PAIR, 0, 1, [{0}]), held(PAIR, 1, 2, [{1}])]
    fails(PAIR, state, "AllReduce(InsideGroup(a))", "one range", "[0,1)", "[1,2)")


def test_all_reduce_needs_data_on_every_member():
    fails(PAIR, [held(PAIR, 0, 2, [{0}, {0}]), None], "AllReduce(InsideGroup(a))", "hold data", "empty")


def test_all_reduce_refuses_to_count_twice():
    state = [held(PAIR, 0, 2, [{0}, {0, 1}]), held(PAIR, 0, 2, [{1}, {1}])]
    fails(PAIR, state, "AllReduce(InsideGroup(a))", "twice")


# --- ReduceScatter -------------------------------------------------------------------------------


def test_reduce_scatter_gives_member_i_the_ith_block():
    after = apply(QUAD, QUAD.initial, "ReduceScatter(InsideGroup(a))")
    assert [member[:2] for member in after] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert all(QUAD.chunk_sets(member) == [0b1111] for member in after)
    assert [member[3] for member in after] == [1, 1, 1, 1]


def test_reduce_scatter_splits_a_partial_range_into_consecutive_blocks():
    state = [held(PAIR, 0, 2, [{0}, {0}]), held(PAIR, 0, 2, [{1}, {1}])]
    after = apply(PAIR, state, "ReduceScatter(InsideGroup(a))")
    assert after == (held(PAIR, 0, 1, [{0, 1}]), held(PAIR, 1, 2, [{0, 1}]))


def test_reduce_scatter_needs_an_even_split():
    state = [held(PAIR, 1, 2, [{0}]), held(PAIR, 1, 2, [{1}])]
    fails(PAIR, state, "ReduceScatter(InsideGroup(a))", "cannot split", "evenly")


def test_reduce_scatter_shares_all_reduce_preconditions():
    fails(PAIR, [held(PAIR, 0, 1, [{0}]), held(PAIR, 1, 2, [{1}])], "ReduceScatter(InsideGroup(a))", "one range")
    fails(PAIR, [None, held(PAIR, 0, 2, [{1}, {1}])], "ReduceScatter(InsideGroup(a))", "hold data")
    fails(PAIR, [held(PAIR, 0, 2, [{0, 1}, {0}]), held(PAIR, 0, 2, [{1}, {1}])], "ReduceScatter(InsideGroup(a))", "twice")


# --- AllGather ------------------------------------------------------------------------------------


def test_all_gather_joins_blocks_in_member_order_keeping_each_owners_sets():
    state = [held(QUAD, 0, 1, [{0}]), held(QUAD, 1, 2, [{1, 2}]), held(QUAD, 2, 3, [{3}]), held(QUAD, 3, 4, [{0, 1, 2, 3}])]
    after = apply(QUAD, state, "AllGather(InsideGroup(a))")
    assert after == (held(QUAD, 0, 4, [{0}, {1, 2}, {3}, {0, 1, 2, 3}]),) * 4
    assert after[0][3] == 4


def test_all_gather_needs_contiguous_blocks_in_member_order():
    reversed_blocks = [held(PAIR, 1, 2, [{0, 1}]), held(PAIR, 0, 1, [{0, 1}])]
    fails(PAIR, reversed_blocks, "AllGather(InsideGroup(a))", "start where", "[1,2)", "[0,1)")
    fails(PAIR, PAIR.initial, "AllGather(InsideGroup(a))", "start where")


def test_all_gather_needs_equal_lengths_and_data_everywhere():
    state = [held(QUAD, 0, 1, [{0}]), held(QUAD, 1, 3, [{1}, {1}]), held(QUAD, 3, 4, [{2}]), held(QUAD, 3, 4, [{3}])]
    fails(QUAD, state, "AllGather(InsideGroup(a))", "equal range lengths")
    fails(PAIR, [held(PAIR, 0, 1, [{0}]), None], "AllGather(InsideGroup(a))", "hold data")


# --- Reduce and Broadcast --------------------------------------------------------------------------


def test_reduce_leaves_the_sum_on_the_root_and_empties_the_others():
    after = apply(CPU_GPU, CPU_GPU.initial, "Reduce(InsideGroup(gpu))")
    assert after[1] is None and after[3] is None
    assert CPU_GPU.chunk_sets(after[0]) == [0b0011] * 4
    assert CPU_GPU.chunk_sets(after[2]) == [0b1100] * 4


def test_reduce_shares_all_reduce_preconditions():
    fails(PAIR, [held(PAIR, 0, 1, [{0}]), held(PAIR, 1, 2, [{1}])], "Reduce(InsideGroup(a))", "one range")
    fails(PAIR, [held(PAIR, 0, 2, [{0}, {0}]), None], "Reduce(InsideGroup(a))", "hold data")
    fails(PAIR, [held(PAIR, 0, 2, [{0, 1}, {0}]), held(PAIR, 0, 2, [{1}, {1}])], "Reduce(InsideGroup(a))", "twice")


def test_broadcast_copies_the_root_even_onto_empty_members():
    root = held(PAIR, 0, 1, [{0, 1}])
    assert apply(PAIR, [root, None], "Broadcast(InsideGroup(a))") == (root, root)
    assert apply(PAIR, [root, held(PAIR, 1, 2, [{1}])], "Broadcast(InsideGroup(a))") == (root, root)


def test_broadcast_needs_data_on_the_root():
    fails(PAIR, [None, held(PAIR, 0, 2, [{1}, {1}])], "Broadcast(InsideGroup(a))", "root", "empty")


def test_master_steps_leave_non_masters_alone():
    after = apply(CPU_GPU, CPU_GPU.initial, "AllReduce(Master(cpu))")
    assert after[1] == CPU_GPU.initial[1] and after[3] == CPU_GPU.initial[3]
    assert CPU_GPU.chunk_sets(after[0]) == [0b0101] * 4 == CPU_GPU.chunk_sets(after[2])


# --- program validity -----------------------------------------------------------------------------


def test_no_op_steps_are_rejected():
    error = rejects(CPU_GPU, "AllReduce(InsideGroup(gpu)); Broadcast(InsideGroup(gpu)); AllReduce(Parallel(cpu))", "step 2", "no-op")
    assert error.step_index == 1


def test_steps_after_the_goal_are_rejected():
    error = rejects(CPU_GPU, "AllReduce(InsideGroup(cpu)); Broadcast(InsideGroup(gpu))", "step 2", "already reached")
    assert error.step_index == 1


def test_programs_ending_short_are_rejected():
    rejects(CPU_GPU, "AllReduce(InsideGroup(gpu))", "ends before the goal", "miss contributions")
    rejects(CPU_GPU, "ReduceScatter(InsideGroup(cpu))", "ends before the goal", "only part")
    rejects(CPU_GPU, "Reduce(InsideGroup(cpu))", "ends before the goal", "hold nothing")


def test_failing_steps_are_named_in_the_program_error():
    error = rejects(CPU_GPU, "AllReduce(InsideGroup(gpu)); AllReduce(InsideGroup(cpu))", "step 2 AllReduce(InsideGroup(cpu)) is invalid", "twice")
    assert error.step_index == 1


def test_one_member_groups_make_a_step_that_does_nothing():
    semantics = explicit(("node", 2), ("gpu", 1))
    rejects(semantics, "AllReduce(InsideGroup(gpu))", "one member")


def test_unknown_level_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown level 'node'"):
        CPU_GPU.run(parse_program("AllReduce(InsideGroup(node))"))


PAPER_STRATEGIES = [
    "AllReduce(InsideGroup(cpu))",
    "Reduce(InsideGroup(gpu)); AllReduce(Master(cpu)); Broadcast(InsideGroup(gpu))",
    "AllReduce(InsideGroup(gpu)); AllReduce(Parallel(cpu))",
]
CLASSIC = "ReduceScatter(InsideGroup(gpu)); AllReduce(Parallel(cpu)); AllGather(InsideGroup(gpu))"


def paper_hierarchy():
    topology = topology_from_levels("server=2,cpu=2,gpu=4")
    (placement,) = [p for p in enumerate_placements(topology, parse_axes("4,4")) if p.matrix == ((1, 2, 2), (2, 1, 2))]
    return build_hierarchy(placement, ("a0",))


def test_paper_example_hierarchy_is_cpu_by_gpu():
    built = paper_hierarchy()
    assert (built.level_names, built.sizes) == (("cpu", "gpu"), (2, 2))


@pytest.mark.parametrize("quotient", [False, True])
@pytest.mark.parametrize("text", PAPER_STRATEGIES + [CLASSIC])
def test_paper_strategies_and_the_classic_are_valid(text, quotient):
    built = paper_hierarchy()
    semantics = Semantics(built.level_names, built.sizes, quotient=quotient)
    trace = semantics.run(parse_program(text))
    assert trace[-1].after == semantics.goal


# --- the quotient machine decides as the explicit one does ------------------------------------------


def _draw_steps(draw, oracle, spellings) -> Program:
    """1..5 steps of `spellings`, each half the time drawn among those the explicit machine
    accepts from the current state (until the goal is reached or a step is refused)."""
    steps, state = [], oracle.initial
    for _ in range(draw(st.integers(1, 5))):
        accepted = []
        if state is not None and not oracle.is_goal(state):
            for step in spellings:
                try:
                    accepted.append((step, oracle.apply(state, oracle.instruction_of(step))))
                except StepFailure:
                    pass
        if accepted and draw(st.booleans()):
            step, state = draw(st.sampled_from(accepted))
        else:
            step = draw(st.sampled_from(spellings))
            state = None
        steps.append(step)
    return Program(tuple(steps))


@st.composite
def hierarchy_and_program(draw):
    """A hierarchy of 1..3 levels of sizes 1..4 and a program of 1..5 steps. Half of the steps
    are drawn among those the explicit machine accepts from the current state, so valid
    programs and late failures are common, not just first-step failures."""
    sizes = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    assert product(sizes) <= 64
    names = tuple(f"l{i}" for i in range(len(sizes)))
    oracle = Semantics(names, sizes, quotient=False)
    spellings = [Step(c, f, n) for c in collective_names() for f in form_names() for n in names]
    return names, sizes, _draw_steps(draw, oracle, spellings)


def _verdict(semantics: Semantics, program: Program):
    try:
        semantics.run(program)
    except InvalidProgramError as error:
        return error.step_index
    return "valid"


@settings(max_examples=300, deadline=None)
@given(hierarchy_and_program())
def test_quotient_and_explicit_agree_on_validity(case):
    names, sizes, program = case
    explicit_verdict = _verdict(Semantics(names, sizes, quotient=False), program)
    quotient_verdict = _verdict(Semantics(names, sizes, quotient=True), program)
    assert quotient_verdict == explicit_verdict, (sizes, str(program))


@pytest.mark.parametrize("sizes", [(3,), (2, 3), (3, 2), (4, 3), (2, 1, 4), (2, 2, 3)])
def test_quotient_and_explicit_enumerate_the_same_programs(sizes):
    names = tuple(f"l{i}" for i in range(len(sizes)))
    found = {}
    for quotient in (True, False):
        enumerator = Enumerator(Semantics(names, sizes, quotient=quotient), SearchOptions(max_len=4, prune_dead=False))
        found[quotient] = {str(program) for program in enumerator.programs()}
    assert found[True] == found[False]
    assert found[True]


# --- goals other than all-reduce (docs/model.md section 7, "Goals") ---------------------------------------

NODE_GPU = ("node", "gpu"), (2, 4)


def goal_semantics(goal: str, quotient: bool = False, levels=NODE_GPU) -> Semantics:
    return Semantics(*levels, quotient=quotient, goal=goal)


@pytest.mark.parametrize("quotient", [False, True])
@pytest.mark.parametrize("goal, text", [
    ("reducescatter", "ReduceScatter(InsideGroup(node))"),
    ("reducescatter", "ReduceScatter(Parallel(node)); ReduceScatter(InsideGroup(gpu))"),
    ("reducescatter", "Permute(gpu,node); ReduceScatter(InsideGroup(gpu)); ReduceScatter(Parallel(node))"),
    ("allgather", "AllGather(InsideGroup(gpu)); AllGather(Parallel(node))"),
    ("allgather", "Permute(gpu,node); AllGather(Parallel(node)); AllGather(InsideGroup(gpu)); Permute(node,gpu)"),
    ("allgather", "AllGather(InsideGroup(gpu)); AllGather(Master(node)); Broadcast(InsideGroup(gpu))"),
    ("alltoall", "AllToAll(InsideGroup(node))"),
    ("alltoall", "AllToAll(Parallel(node)); Permute(gpu,node); AllToAll(InsideGroup(gpu)); Permute(node,gpu)"),
    ("broadcast", "Broadcast(Master(node)); Broadcast(InsideGroup(gpu))"),
    ("reduce", "Reduce(InsideGroup(gpu)); Reduce(Master(node))"),
    ("reduce", "ReduceScatter(InsideGroup(gpu)); AllReduce(Parallel(node)); AllGather(InsideGroup(gpu))"),
])
def test_hierarchical_programs_of_every_goal_are_valid(goal, text, quotient):
    semantics = goal_semantics(goal, quotient)
    trace = semantics.run(parse_program(text))
    assert semantics.is_goal(trace[-1].after)


@pytest.mark.parametrize("goal, text, fragments", [
    # The cheap order would leave member (n, g) with block 2g+n: a wrong block order is a refusal.
    ("reducescatter", "ReduceScatter(InsideGroup(gpu)); ReduceScatter(Parallel(node))",
     ["step 1", "across its level digits", "wrong order", "a Permute can put (gpu) first"]),
    ("allgather", "AllGather(Parallel(node)); AllGather(InsideGroup(gpu))", ["start where member 0's ends"]),
    ("allgather", "Permute(gpu,node); AllGather(Parallel(node)); AllGather(InsideGroup(gpu))", ["level order (gpu,node)"]),
    ("alltoall", "AllToAll(Parallel(node)); AllToAll(InsideGroup(gpu))", ["step 2", "wrong order"]),
    ("alltoall", "AllReduce(InsideGroup(node))", ["AllReduce takes no part in all-to-all programs"]),
    ("allreduce", "Permute(gpu,node); AllReduce(InsideGroup(node))", ["all-reduce programs have no Permute step"]),
    ("reducescatter", "Permute(gpu,node); ReduceScatter(InsideGroup(gpu)); Permute(node,gpu)",
     ["whole buffer or places one block"]),
    ("reducescatter", "Permute(node,gpu); ReduceScatter(InsideGroup(node))", ["already in that order"]),
])
def test_programs_missing_a_goal_say_why(goal, text, fragments):
    for quotient in (False, True):
        rejects(goal_semantics(goal, quotient), text, *fragments)


def test_permute_names_every_level_once():
    semantics = goal_semantics("reducescatter")
    for text in ("Permute(gpu)", "Permute(gpu,gpu)", "Permute(gpu,rack)"):
        with pytest.raises(UsageError):
            semantics.run(parse_program(text))


def test_all_to_all_moves_block_j_of_member_i_to_block_i_of_member_j():
    semantics = goal_semantics("alltoall", levels=(("a",), (4,)))
    after = apply(semantics, semantics.initial, "AllToAll(InsideGroup(a))")
    assert after == semantics.goal
    assert [member.tags for member in after] == [(j,) * 4 for j in range(4)]
    assert all(semantics.chunk_sets(member) == [1, 2, 4, 8] for member in after)


def test_reduce_scatter_and_all_gather_start_and_end_as_torch_lays_them_out():
    rs = goal_semantics("reducescatter", levels=(("a",), (4,)))
    assert [m[:2] for m in rs.initial] == [(0, 4)] * 4
    after = apply(rs, rs.initial, "ReduceScatter(InsideGroup(a))")
    assert rs.is_goal(after) and [m.tags for m in after] == [(r,) for r in range(4)]
    ag = goal_semantics("allgather", levels=(("a",), (4,)))
    assert [m[:2] for m in ag.initial] == [(r, r + 1) for r in range(4)]
    assert apply(ag, ag.initial, "AllGather(InsideGroup(a))") == ag.goal


@st.composite
def goal_hierarchy_and_program(draw):
    """A goal, a hierarchy of 1..3 levels of sizes 1..4 and a program of 1..5 steps of the
    goal's alphabet (Permute in every order), half drawn among the steps the explicit machine
    accepts from the current state."""
    goal = draw(st.sampled_from(["reducescatter", "allgather", "alltoall", "broadcast", "reduce"]))
    sizes = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    names = tuple(f"l{i}" for i in range(len(sizes)))
    oracle = Semantics(names, sizes, quotient=False, goal=goal)
    spellings = [Step(c, f, n) for c in oracle.goal_kind.alphabet for f in form_names() for n in names]
    spellings += [step for step, instruction in oracle.alphabet if instruction.is_permute]
    return goal, names, sizes, _draw_steps(draw, oracle, spellings)


@settings(max_examples=300, deadline=None)
@given(goal_hierarchy_and_program())
def test_quotient_and_explicit_agree_on_validity_for_every_goal(case):
    goal, names, sizes, program = case
    explicit_verdict = _verdict(Semantics(names, sizes, quotient=False, goal=goal), program)
    quotient_verdict = _verdict(Semantics(names, sizes, quotient=True, goal=goal), program)
    assert quotient_verdict == explicit_verdict, (goal, sizes, str(program))
