"""The collective records (synth/collectives.py) against everything that reads them: the
grammar, the explicit semantics, lowering, the numpy interpreter, plan offsets, the runtimes'
op tables and the nccl-tests bus factors."""

from __future__ import annotations

import ast
import random
import re
from importlib import resources
from itertools import product as sequences

import pytest

import synth.collectives as collectives_module
import synth.language
from synth.collectives import (
    RECORDS,
    AlphabetMismatch,
    Collective,
    Combine,
    Delivery,
    check_records,
    collective,
    collectives,
)
from synth.errors import InvalidProgramError
from synth.goals import GOALS
from synth.export.plan import RankCall, call_buffers
from synth.interpreter import run_reference
from synth.language import Program, collective_names, parse_program
from synth.lowering import lower
from synth.search import Enumerator, SearchOptions
from synth.semantics import Holding, Semantics, StepFailure
from tests.test_search import hierarchy_of, names_for

SMALL = [(2, 2), (2, 3), (3, 2), (4,), (2, 2, 2)]


# --- the grammar and the records name the same collectives ---------------------------------------


def test_every_grammar_collective_has_a_record_in_grammar_order():
    assert tuple(record.name for record in collectives()) == collective_names()
    assert set(RECORDS) == set(collective_names())


@pytest.fixture
def fresh_alphabet():
    """Clear the once-per-process check before and after a test that breaks one side."""
    collectives_module.collectives.cache_clear()
    collectives_module._by_name.cache_clear()
    yield
    collectives_module.collectives.cache_clear()
    collectives_module._by_name.cache_clear()


def test_a_grammar_name_without_a_record_fails_loudly_naming_it(monkeypatch, fresh_alphabet):
    monkeypatch.setattr(synth.language, "collective_names", lambda: (*RECORDS, "Scatter"))
    with pytest.raises(AlphabetMismatch, match="'Scatter', which has no record"):
        collectives()
    with pytest.raises(AlphabetMismatch, match="Scatter"):
        _ = Semantics(("a",), (2,)).alphabet


def test_a_record_without_a_grammar_name_fails_loudly_naming_it(monkeypatch, fresh_alphabet):
    extra = Collective("Gather", Combine.JOIN, Delivery.ROOT, collectives_module.ring_once)
    monkeypatch.setitem(RECORDS, "Gather", extra)
    with pytest.raises(AlphabetMismatch, match="record for 'Gather', which the grammar"):
        collectives()


def test_check_records_in_both_directions():
    names = tuple(RECORDS)
    assert check_records(names, RECORDS) == tuple(RECORDS.values())
    with pytest.raises(AlphabetMismatch, match="'Broadcast'"):
        check_records(names, {name: record for name, record in RECORDS.items() if name != "Broadcast"})
    with pytest.raises(AlphabetMismatch, match="'Reduce'"):
        check_records(tuple(name for name in names if name != "Reduce"), RECORDS)


# --- what each record says --------------------------------------------------------------------------


def test_the_records_say_what_spec_section_7_says():
    table = {record.name: (record.reduces, record.rooted, record.span_factor(4)) for record in collectives()}
    assert table == {
        "AllReduce": (True, False, 1), "ReduceScatter": (True, False, 1), "AllGather": (False, False, 4),
        "Reduce": (True, True, 1), "Broadcast": (False, True, 1), "AllToAll": (False, False, 1),
    }
    assert collective("AllToAll").ranges_after(0, 4, 2) == [(0, 4), (0, 4)]
    assert collective("ReduceScatter").ranges_after(2, 6, 2) == [(2, 4), (4, 6)]
    assert collective("Reduce").ranges_after(0, 4, 3) == [(0, 4), None, None]
    assert collective("AllGather").span([(0, 1), (1, 2)]) == (0, 2)
    assert collective("Broadcast").span([(0, 2), None]) == (0, 2)


@pytest.mark.parametrize("k", [2, 3, 4, 8])
def test_bus_factors_are_nccl_tests(k):
    """nccl-tests doc/PERFORMANCE.md: busbw = algbw * factor."""
    from synth.calibrate.nccl_text import BUS_FACTOR

    expected = {"AllReduce": 2 * (k - 1) / k, "ReduceScatter": (k - 1) / k, "AllGather": (k - 1) / k,
                "Reduce": 1.0, "Broadcast": 1.0, "AllToAll": (k - 1) / k}
    assert {record.name: record.bus_factor(k) for record in collectives()} == pytest.approx(expected)
    assert {name: factor(k) for name, factor in BUS_FACTOR.items()} == pytest.approx(
        {name: expected[name] for name in BUS_FACTOR})


def test_snake_names_are_the_spelling_of_torch_and_nccl_tests():
    assert [record.snake_name for record in collectives()] == ["all_reduce", "reduce_scatter", "all_gather", "reduce", "broadcast",
                                                                      "all_to_all"]


def test_the_c_runtime_has_one_op_per_record_in_the_same_order():
    from synth.export.nccl_c import OPS

    source = resources.files("synth.export").joinpath("nccl_runtime.c").read_text(encoding="utf-8")
    enum = re.search(r"enum\s*\{([^}]*)\}", source).group(1)
    names = re.search(r"OP_NAMES\[\]\s*=\s*\{([^}]*)\}", source).group(1)
    # one op per collective record, in order, then the one local step (Permute: no communicator)
    assert [op.strip() for op in enum.split(",")] == [OPS[name] for name in collective_names()] + ["OP_PERMUTE"]
    assert re.findall(r'"(\w+)"', names) == list(collective_names()) + ["Permute"]


def test_the_torch_runtime_dispatches_every_record_and_nothing_else():
    """Read without importing torch: the runtime's CALLS table names exactly the records."""
    source = resources.files("synth.export").joinpath("torch_runtime.py").read_text(encoding="utf-8")
    (table,) = [node.value for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "CALLS" for t in node.targets)]
    assert [key.value for key in table.keys] == list(collective_names())


@pytest.mark.parametrize("name, send, receive", [
    ("AllReduce", (40, 20), (40, 20)), ("ReduceScatter", (40, 20), (45, 5)), ("AllGather", (45, 5), (40, 20)),
    ("Reduce", (40, 20), (40, 20)), ("Broadcast", (40, 20), (40, 20)),
])
def test_plan_buffers_follow_the_record(name, send, receive):
    """Chunks [4, 6) of 10 elements, member 1 of 4: in-place NCCL pointers."""
    buffers = call_buffers(name, RankCall(color=0, key=1, size=4, lo=4, hi=6, root=0), 10)
    assert (buffers.offset, buffers.count) == (40, 20)
    assert (buffers.send_offset, buffers.send_count) == send
    assert (buffers.recv_offset, buffers.recv_count) == receive


# --- each record's rules against the explicit semantics -----------------------------------------------


def reachable_states(semantics: Semantics, depth: int = 3, limit: int = 400) -> list[tuple]:
    """States reached by valid steps from the start, breadth first (the goal included)."""
    seen, frontier = {semantics.initial}, [semantics.initial]
    for _ in range(depth):
        following = []
        for state in frontier:
            for _, instruction in semantics.alphabet:
                try:
                    after = semantics.apply(state, instruction)
                except StepFailure:
                    continue
                if after not in seen:
                    seen.add(after)
                    following.append(after)
        frontier = following[:limit]
    return list(seen)


def best_counts(semantics: Semantics, state: tuple) -> list[int]:
    """Per chunk, the largest contributor set any member holds."""
    best = [0] * semantics.member_count
    for member in state:
        if member is not None:
            for chunk, sets in zip(range(member.lo, member.hi), semantics.chunk_sets(member)):
                best[chunk] = max(best[chunk], sets.bit_count())
    return best


@pytest.mark.parametrize("goal", list(GOALS))
@pytest.mark.parametrize("sizes", SMALL)
def test_pruning_facts_are_sound_on_every_reachable_step(sizes, goal):
    """What the oracle assumes of a record holds on every valid step of the explicit machine,
    for every goal: the facts it may rely on (leaves partial/empty) always happen, and what it
    rules out (widening, filling, growth beyond ceil(log2 k) doublings) never does. A Permute
    (no record: it sums, widens and fills nothing) only moves each member's chunks."""
    semantics = Semantics(names_for(sizes), sizes, quotient=False, goal=goal)
    n = semantics.member_count
    seen = {step.collective: 0 for step, _ in semantics.alphabet}
    for state in reachable_states(semantics):
        for step, instruction in semantics.alphabet:
            try:
                after = semantics.apply(state, instruction)
            except StepFailure:
                continue
            seen[step.collective] += 1
            if instruction.is_permute:
                assert [m is None for m in after] == [m is None for m in state]
                assert all(a is None or a.hi - a.lo == b.hi - b.lo for a, b in zip(after, state))
                assert sorted(best_counts(semantics, after)) == sorted(best_counts(semantics, state))
                continue
            record = instruction.record
            members = {m for group in instruction.groups for m in group}
            if record.leaves_partial:
                assert any(after[m] is not None and (after[m].lo, after[m].hi) != (0, n) for m in members)
            if record.leaves_empty:
                assert any(after[m] is None for m in members)
            if not record.widens:
                assert all(after[m] is None or (state[m] is not None and after[m].hi - after[m].lo <= state[m].hi - state[m].lo)
                           for m in members)
            if not record.fills_empty:
                assert all(after[m] is None for m in members if state[m] is None)
            k = instruction.real_group_size
            limit = 1 << record.growth(k)
            if record.combine is Combine.EXCHANGE:  # moves chunks between places, sums nothing
                assert sorted(best_counts(semantics, after)) == sorted(best_counts(semantics, state))
            else:
                assert all(a <= b * limit for a, b in zip(best_counts(semantics, after), best_counts(semantics, state)) if b)
    assert all(seen.values()), seen


@pytest.mark.parametrize("sizes", SMALL)
def test_ranges_and_spans_of_the_record_match_the_semantics(sizes):
    """The record's span and ranges_after (what lowering and plans use) are what the explicit
    semantics leaves on every member of every group."""
    semantics = Semantics(names_for(sizes), sizes, quotient=False)
    for state in reachable_states(semantics, depth=2):
        for step, instruction in semantics.alphabet:
            try:
                after = semantics.apply(state, instruction)
            except StepFailure:
                continue
            record = instruction.record
            spans = semantics.call_spans(state, step)
            for group, span in zip(semantics.real_calls(step), spans):
                held = [None if state[m] is None else (state[m].lo, state[m].hi) for m in group]
                lo, hi = record.span(held)
                assert hi - lo == span
                expected = record.ranges_after(lo, hi, len(group))
                assert [None if after[m] is None else (after[m].lo, after[m].hi) for m in group] == expected


@pytest.mark.parametrize("sizes", [(2, 2), (2, 3), (3, 2, 2), (4, 2)])
@pytest.mark.parametrize("quotient", [False, True])
def test_call_spans_equal_the_lowered_calls(sizes, quotient):
    """Semantics.call_spans (for costs, read from quotient states) = lowering's calls."""
    semantics = Semantics(names_for(sizes), sizes, quotient=quotient)
    for program in Enumerator(semantics, SearchOptions(max_len=4)).programs():
        lowered = lower(program, hierarchy_of(sizes))
        state = semantics.initial
        for step, lowered_step in zip(program.steps, lowered.steps):
            assert semantics.real_calls(step) == tuple(call.members for call in lowered_step.calls)
            assert semantics.call_spans(state, step) == tuple(call.chunks for call in lowered_step.calls)
            state = semantics.apply(state, semantics.instruction_of(step))


@pytest.mark.parametrize("sizes", [(2, 2), (2, 3)])
@pytest.mark.parametrize("goal", list(GOALS))
def test_interpreter_and_semantics_agree_on_every_short_sequence(sizes, goal):
    """Validity of every sequence of up to 2 steps (and a sample of 3 and of 4) is the same in
    the explicit semantics, the quotient one and the numpy interpreter over every device, for
    every goal, and every record appears in some valid program of some goal."""
    semantics = Semantics(names_for(sizes), sizes, quotient=False, goal=goal)
    quotient = Semantics(names_for(sizes), sizes, quotient=True, goal=goal)
    hierarchy = hierarchy_of(sizes)
    steps = [step for step, _ in semantics.alphabet]
    candidates = [seq for length in (1, 2) for seq in sequences(steps, repeat=length)]
    for length in (3, 4):
        every = list(sequences(steps, repeat=length))
        candidates += random.Random(0).sample(every, min(300, len(every)))
    # Every valid program up to 4 steps too: random sequences are rarely valid.
    candidates += [program.steps for program in Enumerator(semantics, SearchOptions(max_len=4)).programs()]
    used = set()
    for sequence in candidates:
        program = Program(tuple(sequence))
        try:
            semantics.run(program)
            valid = True
        except InvalidProgramError:
            valid = False
        try:
            run_reference(program, hierarchy, goal=goal)
            checked = True
        except InvalidProgramError:
            checked = False
        try:
            quotient.run(program)
            abstract = True
        except InvalidProgramError:
            abstract = False
        assert valid == checked == abstract, str(program)
        if valid:
            used.update(step.collective for step in sequence)
    USED.setdefault(sizes, set()).update(used)
    assert used >= set(GOALS[goal].alphabet) - {"AllToAll"} or goal != "allreduce"


USED: dict = {}


def test_every_record_appears_in_some_valid_program():
    """Run after the agreement test above (same module, file order): between the goals'
    programs every collective record and Permute took part."""
    if not USED:
        pytest.skip("runs after test_interpreter_and_semantics_agree_on_every_short_sequence, which did not run")
    for used in USED.values():
        assert used == set(RECORDS) | {"Permute"}


def test_holding_is_a_named_state_that_equals_its_tuple():
    member = Holding(0, 2, 0b0101, 2)
    assert member == (0, 2, 0b0101, 2, None, None) and member.length == 2 and member.tags is None
    semantics = Semantics(("a",), (2,), quotient=False)
    after = semantics.apply(semantics.initial, semantics.instruction_of(parse_program("ReduceScatter(InsideGroup(a))").steps[0]))
    assert all(isinstance(member, Holding) for member in after)
