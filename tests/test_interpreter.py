"""The reference interpreter against the enumerator and the explicit semantics.

The interpreter runs programs on real arrays over every device, so agreement here checks
the set bookkeeping, the quotient the search uses, and the member -> global rank mapping
at once.
"""

from __future__ import annotations

import random
import time
from itertools import product as sequences

import numpy as np
import pytest

from synth.errors import InvalidProgramError, UsageError
from synth.hierarchy import HIERARCHY_KINDS, build_hierarchy
from synth.collectives import collective
from synth.interpreter import ReferenceResult, _Failure, _Machine, run_collective, run_reference
from synth.language import Program, parse_program
from synth.placement import Placement, enumerate_placements, parse_axes
from synth.search import enumerate_programs
from synth.semantics import Semantics
from synth.topology import topology_from_levels

SYSTEMS = [
    ("server=2,cpu=2,gpu=4", "a0=4,a1=4", (("a0",), ("a1",), ("a0", "a1"))),
    ("node=2,gpu=4", "data=4,model=2", (("data",), ("model",), ("data", "model"))),
    ("l0=2,l1=3", "a0=6", (("a0",),)),
]


def placements(levels: str, axes: str) -> list[Placement]:
    return enumerate_placements(topology_from_levels(levels), parse_axes(axes))


def hierarchy(levels: str, axes: str, matrix, reduce, kind: str = "merged"):
    for placement in placements(levels, axes):
        if placement.matrix == tuple(tuple(row) for row in matrix):
            return build_hierarchy(placement, tuple(reduce), kind)
    raise AssertionError(f"no placement {matrix} of {axes} on {levels}")


def all_cases():
    for levels, axes, reductions in SYSTEMS:
        for placement in placements(levels, axes):
            for reduce in reductions:
                for kind in HIERARCHY_KINDS:
                    yield pytest.param(
                        levels, placement, reduce, kind, id=f"{levels}|{placement.to_text()}|{'+'.join(reduce)}|{kind}"
                    )


def paper_example(kind: str = "merged"):
    """docs/model.md's worked example: merged hierarchy cpu=2, gpu=2."""
    return hierarchy("server=2,cpu=2,gpu=4", "a0=4,a1=4", [[1, 2, 2], [2, 1, 2]], ["a0"], kind)


def raises_naming(program_text: str, hierarchy_, *fragments: str) -> InvalidProgramError:
    with pytest.raises(InvalidProgramError) as error:
        run_reference(parse_program(program_text), hierarchy_)
    for fragment in fragments:
        assert fragment in str(error.value), (fragment, str(error.value))
    return error.value


# --- every enumerated program runs correctly on real data -----------------------------------


@pytest.mark.parametrize("levels, placement, reduce, kind", list(all_cases()))
def test_every_enumerated_program_sums_correctly_on_every_device(levels, placement, reduce, kind):
    built = build_hierarchy(placement, reduce, kind)
    programs = list(enumerate_programs(built, max_len=4))
    assert programs, "the single AllReduce at least is valid"
    for program in programs:
        result = run_reference(program, built)
        assert result == ReferenceResult(True, 0, placement.device_count, len(built.groups)), str(program)


def test_result_counts_devices_and_groups():
    result = run_reference(parse_program("AllReduce(InsideGroup(cpu))"), paper_example())
    assert result == ReferenceResult(ok=True, max_abs_error=0, devices=16, groups=4)


@pytest.mark.parametrize("seed, chunk_elems", [(0, 1), (1, 3), (7, 16)])
def test_seeds_and_chunk_sizes_do_not_change_the_verdict(seed, chunk_elems):
    program = parse_program("ReduceScatter(InsideGroup(gpu)); AllReduce(Parallel(cpu)); AllGather(InsideGroup(gpu))")
    assert run_reference(program, paper_example(), chunk_elems=chunk_elems, seed=seed).ok
    with pytest.raises(InvalidProgramError):
        run_reference(parse_program("AllReduce(InsideGroup(gpu)); AllReduce(InsideGroup(cpu))"), paper_example(), chunk_elems, seed)


def test_a_few_hundred_devices_run_well_under_a_second():
    topology = topology_from_levels("rack=4,node=8,gpu=8")
    placement = Placement(topology.level_names, topology.sizes, ("a0",), (256,), ((4, 8, 8),))
    built = build_hierarchy(placement, ("a0",))
    program = parse_program(
        "ReduceScatter(InsideGroup(gpu)); ReduceScatter(Parallel(node)); AllReduce(Parallel(rack)); "
        "AllGather(Parallel(node)); AllGather(InsideGroup(gpu))"
    )
    started = time.perf_counter()
    assert run_reference(program, built).devices == 256
    assert time.perf_counter() - started < 1.0


# --- invalid programs are rejected -----------------------------------------------------------


def _check_agrees_with_explicit_semantics(built, programs) -> int:
    """run_reference raises exactly when the explicit semantics rejects; returns the number
    of rejected programs seen."""
    semantics = Semantics(built.level_names, built.sizes, quotient=False)
    rejected = 0
    for program in programs:
        try:
            semantics.run(program)
        except InvalidProgramError:
            rejected += 1
            with pytest.raises(InvalidProgramError):
                run_reference(program, built)
        else:
            assert run_reference(program, built).ok, str(program)
    return rejected


def test_every_short_sequence_rejected_by_the_semantics_is_rejected_non_power_of_two():
    built = hierarchy("l0=2,l1=3", "a0=6", [[2, 3]], ["a0"])
    steps = [step for step, _ in Semantics(built.level_names, built.sizes, quotient=False).alphabet]
    programs = [Program(sequence) for length in (1, 2, 3) for sequence in sequences(steps, repeat=length)]
    assert _check_agrees_with_explicit_semantics(built, programs) > 8000


@pytest.mark.parametrize(
    "levels, axes, matrix, reduce, kind",
    [
        ("server=2,cpu=2,gpu=4", "a0=4,a1=4", [[1, 2, 2], [2, 1, 2]], ["a0"], "merged"),
        ("server=2,cpu=2,gpu=4", "a0=4,a1=4", [[1, 2, 2], [2, 1, 2]], ["a0", "a1"], "merged"),
        ("server=2,cpu=2,gpu=4", "a0=4,a1=4", [[1, 2, 2], [2, 1, 2]], ["a0", "a1"], "split"),
        ("server=2,cpu=2,gpu=4", "a0=4,a1=4", [[2, 1, 2], [1, 2, 2]], ["a0", "a1"], "system"),
        ("node=2,gpu=4", "data=4,model=2", [[2, 2], [1, 2]], ["data", "model"], "split"),
        ("node=2,gpu=4", "data=4,model=2", [[1, 4], [2, 1]], ["data", "model"], "merged"),
    ],
)
def test_sampled_short_sequences_rejected_by_the_semantics_are_rejected(levels, axes, matrix, reduce, kind):
    built = hierarchy(levels, axes, matrix, reduce, kind)
    steps = [step for step, _ in Semantics(built.level_names, built.sizes, quotient=False).alphabet]
    rng = random.Random(f"{levels}{matrix}{reduce}{kind}")
    programs = [Program(tuple(rng.choice(steps) for _ in range(rng.randint(1, 3)))) for _ in range(600)]
    assert _check_agrees_with_explicit_semantics(built, programs) > 300


def test_double_counting_shows_as_a_wrong_sum_naming_device_and_chunk():
    error = raises_naming(
        "AllReduce(InsideGroup(gpu)); AllReduce(InsideGroup(cpu))", paper_example(), "wrong sum", "device ", "chunk ", "reduction group"
    )
    assert error.step_index == 2


@pytest.mark.parametrize(
    "text, step, fragments",
    [
        ("ReduceScatter(InsideGroup(cpu)); AllReduce(InsideGroup(cpu))", 2, ("one range",)),
        ("Reduce(InsideGroup(cpu)); AllReduce(InsideGroup(cpu))", 2, ("empty",)),
        ("Reduce(InsideGroup(cpu)); AllGather(InsideGroup(cpu))", 2, ("empty",)),
        ("AllGather(InsideGroup(cpu))", 1, ("start where",)),
        ("ReduceScatter(Master(cpu)); AllGather(InsideGroup(cpu))", 2, ("equal range lengths",)),
        ("Reduce(InsideGroup(cpu)); Broadcast(InsideGroup(gpu))", 2, ("root",)),
        ("AllReduce(InsideGroup(gpu)); Broadcast(InsideGroup(gpu))", 2, ("no-op",)),
        ("AllReduce(InsideGroup(cpu)); AllReduce(InsideGroup(gpu))", 2, ("goal was already reached",)),
    ],
)
def test_precondition_failures_name_the_step_and_the_reason(text, step, fragments):
    program = parse_program(text)
    error = raises_naming(text, paper_example(), f"step {step} {program.steps[step - 1]}", *fragments)
    assert error.step_index == step - 1


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("ReduceScatter(InsideGroup(cpu))", ("ends before the goal", "chunks [0,1)")),
        ("Reduce(InsideGroup(cpu))", ("ends before the goal", "holds nothing")),
        ("AllReduce(InsideGroup(gpu))", ("wrong sum",)),
    ],
)
def test_programs_stopping_short_say_which_device(text, fragments):
    raises_naming(text, paper_example(), "device ", *fragments)


def test_uneven_split_is_rejected():
    """No program reaches an uneven split on a real hierarchy, so build the state by hand:
    two members holding the same one-chunk range."""
    machine = _Machine(np.zeros(2, dtype=np.int64), np.ones(2, dtype=np.int64), np.zeros((2, 2, 1), dtype=np.int64))
    with pytest.raises(_Failure, match="cannot split a range of 1 chunks evenly"):
        run_collective(machine, np.array([[0, 1]]), collective("ReduceScatter"))


def test_unknown_level_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown level 'node'"):
        run_reference(parse_program("AllReduce(InsideGroup(node))"), paper_example())

