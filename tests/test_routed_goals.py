"""Dispatch and combine (docs/model.md section 7, "Dispatch and combine"): the routing value
and its parser, the resolved-levels machine held equal to the executor over real tokens on
random and adversarial routings, the expected traffic held to what the executor sends, and
the commands."""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synth.errors import InvalidProgramError, UsageError
from synth.goals import GOALS, ROUTED_GOALS, parse_goal
from synth.language import Program, Step, form_names, parse_program
from synth.model.fanout import step_traffic
from synth.routed import RoutedSemantics
from synth.routed_interpreter import combine_reached, dispatch_reached, make_tokens, run_combine, run_dispatch
from synth.routing import Routing, RoutingError, parse_routing


# --- the routing value ---------------------------------------------------------------------------


def test_parse_routing_reads_every_field():
    routing = parse_routing("tokens=4096,topk=8,experts=256,node-limit=4,hidden=7168,bytes=2,capacity=1.25,zipf=1.1")
    assert routing == Routing(4096, 8, 256, 7168, 2, 4, 1.25, 1.1)
    assert routing.bytes_per_token == 14336 and routing.buffer_bytes == 4096 * 14336
    assert parse_routing("tokens=2,topk=1,experts=2,weights=3/1").weights == (3.0, 1.0)


@pytest.mark.parametrize("text, fragment", [
    ("tokens=4,topk=9,experts=8", "topk=9 is above experts=8"),
    ("tokens=0,topk=1,experts=8", "tokens=0"),
    ("tokens=4,topk=2", "lacks experts"),
    ("tokens=4,topk=2,experts=8,speed=3", "speed=3"),
    ("tokens=4,topk=2,experts=8,zipf=-1", "zipf=-1"),
    ("tokens=4,topk=2,experts=8,capacity=0.5", "capacity=0.5"),
    ("tokens=4,topk=2,experts=2,weights=1", "1 values for 2 experts"),
    ("tokens=4,topk=2,experts=8,zipf=1,weights=1/1/1/1/1/1/1/1", "both zipf and weights"),
    ("tokens=four,topk=2,experts=8", "'four' is not a number"),
])
def test_bad_routings_are_refused_naming_the_value(text, fragment):
    with pytest.raises(RoutingError, match=fragment):
        parse_routing(text)


def test_experts_must_spread_evenly():
    with pytest.raises(RoutingError, match="do not spread evenly over 8 members"):
        Routing(4, 2, 12).experts_per_member(8)


def test_sampled_tokens_take_distinct_experts_within_the_node_limit():
    routing = Routing(1, 8, 64, node_limit=2)
    experts = routing.sample(np.random.default_rng(0), 500, nodes=8)
    assert experts.shape == (500, 8)
    assert all(len(set(row)) == 8 for row in experts.tolist())
    assert max(len(set(e // 8 for e in row)) for row in experts.tolist()) <= 2


def test_goals_sit_beside_the_others():
    assert set(ROUTED_GOALS) == {"dispatch", "combine"} and not set(ROUTED_GOALS) & set(GOALS)
    assert parse_goal("Dispatch").routed and not parse_goal("alltoall").routed
    with pytest.raises(UsageError, match="dispatch, combine"):
        parse_goal("gossip")


# --- the machine against the executor ---------------------------------------------------------------


def every_step(names):
    return [Step("AllToAll", form, name) for form in form_names() for name in names]


def abstract_valid(semantics, program) -> bool:
    try:
        semantics.run(program)
    except InvalidProgramError:
        return False
    return True


def adversarial(sizes, count=2):
    """Each token of member m routed to one expert on the member whose every digit is m's + 1:
    a copy differs from its destination on every level of more than one member."""
    members = int(np.prod(sizes))
    experts = np.zeros((members, count, 1), dtype=np.int64)
    for m in range(members):
        digits = np.unravel_index(m, sizes)
        target = np.ravel_multi_index(tuple((d + 1) % s for d, s in zip(digits, sizes)), sizes)
        experts[m, :, 0] = target
    return experts


def concrete_ok(program, names, sizes, goal="dispatch") -> bool:
    """The rules of synth/routed.py read off the executor under the adversarial routing:
    no step after the goal, every step carries copies across each of its levels, the goal at
    the end; and, as a rule of the language the executor cannot see, no `Master` step that
    idles members (one with a level of more than one unit below it: a flat step after it
    still delivers every copy)."""
    from synth.semantics import FORMS

    run, reached = (run_dispatch, dispatch_reached) if goal == "dispatch" else (run_combine, combine_reached)
    if any(step.form == "Master" and np.prod(sizes[names.index(step.level) + 1:]) > 1 for step in program.steps):
        return False  # the language's rule, not the executor's: a form that idles members (docs/model.md)
    tokens = make_tokens(np.random.default_rng(0), adversarial(sizes), 1)
    positions = [np.unravel_index(m, sizes) for m in range(int(np.prod(sizes)))]
    for length in range(len(program.steps)):
        held, _ = run(Program(program.steps[:length]), names, sizes, tokens)
        if length and reached(held, tokens):
            return False
    held, sent = run(program, names, sizes, tokens)
    for step, counts in zip(program.steps, sent):
        _, varying = FORMS[step.form](tuple(sizes), names.index(step.level))
        for level in (level for level in varying if sizes[level] > 1):
            if not any(counts[a, b] and positions[a][level] != positions[b][level]
                       for a, b in zip(*np.nonzero(counts))):
                return False
        if not counts.any():
            return False
    return reached(held, tokens)


hierarchies = st.lists(st.integers(1, 3), min_size=1, max_size=3).filter(lambda s: np.prod(s) > 1)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=hierarchies, data=st.data())
def test_machine_equals_executor(sizes, data):
    names = tuple(f"l{i}" for i in range(len(sizes)))
    sizes = tuple(sizes)
    steps = data.draw(st.lists(st.sampled_from(every_step(names)), min_size=1, max_size=3))
    program = Program(tuple(steps))
    valid = abstract_valid(RoutedSemantics(names, sizes, "dispatch"), program)
    assert valid == concrete_ok(program, names, sizes), program
    assert abstract_valid(RoutedSemantics(names, sizes, "combine"), program) == valid
    assert valid == concrete_ok(program, names, sizes, "combine"), program
    if valid:  # any routing: random tokens, experts and gates reach both goals
        members = int(np.prod(sizes))
        per_member = data.draw(st.integers(1, 3))
        topk = data.draw(st.integers(1, min(4, members * per_member)))
        rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
        experts = np.stack([np.stack([np.sort(rng.choice(members * per_member, topk, replace=False))
                                      for _ in range(3)]) for _ in range(members)])
        tokens = make_tokens(rng, experts, per_member)
        held, _ = run_dispatch(program, names, sizes, tokens)
        assert dispatch_reached(held, tokens)
        back = Program(tuple(reversed(program.steps)))
        assert abstract_valid(RoutedSemantics(names, sizes, "combine"), back)
        held, _ = run_combine(back, names, sizes, tokens)
        assert combine_reached(held, tokens)


def test_every_program_of_three_levels():
    semantics = RoutedSemantics(("rack", "node", "gpu"), (2, 2, 2), "dispatch")
    programs = [str(p) for p in semantics.programs(5)]
    assert programs[0] == "AllToAll(InsideGroup(rack))"
    assert "AllToAll(Parallel(rack)); AllToAll(InsideGroup(node))" in programs
    assert len(programs) == 9 == len(set(programs))  # flat, 2 splits in two orders, 3! orders of three
    names = ("rack", "node", "gpu")
    for length in range(1, 4):  # a brute force over every spelling agrees, spellings of one instruction as one
        for steps in itertools.product(every_step(names), repeat=length):
            text = str(Program(steps))
            for spelling in ("Parallel(gpu)", "Master(gpu)"):
                text = text.replace(spelling, "InsideGroup(gpu)")
            assert abstract_valid(semantics, Program(steps)) == (text in programs), text


@pytest.mark.parametrize("text, fragment", [
    ("AllToAll(Parallel(node))", "a step over (gpu) is missing"),
    ("AllToAll(InsideGroup(gpu))", "a step over (node) is missing"),
    ("AllToAll(Master(node)); AllToAll(InsideGroup(gpu))", "idles members"),
    ("AllToAll(Parallel(node)); AllToAll(InsideGroup(node))", "exchange nothing"),
    ("AllToAll(InsideGroup(node)); AllToAll(InsideGroup(gpu))", "already reached"),
    ("ReduceScatter(Parallel(node)); AllToAll(InsideGroup(gpu))", "takes no part"),
    ("Permute(gpu,node); AllToAll(InsideGroup(node))", "no Permute"),
])
def test_wrong_programs_are_refused(text, fragment):
    with pytest.raises(InvalidProgramError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        RoutedSemantics(("node", "gpu"), (2, 4), "dispatch").run(parse_program(text))


# --- expected traffic against the executor ----------------------------------------------------------


@pytest.mark.parametrize("program, goal", [
    ("AllToAll(InsideGroup(node))", "dispatch"),
    ("AllToAll(Parallel(node)); AllToAll(InsideGroup(gpu))", "dispatch"),
    ("AllToAll(InsideGroup(gpu)); AllToAll(Parallel(node))", "dispatch"),
    ("AllToAll(InsideGroup(gpu)); AllToAll(Parallel(node))", "combine"),
    ("AllToAll(Parallel(node)); AllToAll(InsideGroup(gpu))", "combine"),
])
def test_expected_copies_match_the_executor(program, goal):
    """Uniform routing: the closed form per step equals the executor's mean copies per token
    (over 3 x 600 tokens per member), within sampling noise; deduplication shows as fewer
    copies across the nodes for the two-stage dispatch."""
    names, sizes, per_member, topk, count = ("node", "gpu"), (3, 2), 2, 3, 600
    members = 6
    rng = np.random.default_rng(7)
    experts = np.stack([np.stack([np.sort(rng.choice(members * per_member, topk, replace=False))
                                  for _ in range(count)]) for _ in range(members)])
    tokens = make_tokens(rng, experts, per_member, hidden=1)
    parsed = parse_program(program)
    run = run_dispatch if goal == "dispatch" else run_combine
    _, sent = run(parsed, names, sizes, tokens)
    semantics = RoutedSemantics(names, sizes, goal)
    routing = Routing(count, topk, members * per_member)
    for entry, counts in zip(semantics.run(parsed), sent):
        moving = entry.after - entry.before
        classes = entry.after if goal == "dispatch" else semantics.levels - entry.before
        expected = step_traffic(routing, sizes, classes, moving, goal == "combine").copies
        assert counts.sum() / (members * count) == pytest.approx(expected, rel=0.06)


def test_node_limit_sampling_agrees_with_the_closed_form_when_it_binds_nothing():
    sizes, classes = (4, 8), frozenset({0})
    exact = step_traffic(Routing(1, 8, 256), sizes, classes, classes, False).copies
    sampled = step_traffic(Routing(1, 8, 256, node_limit=4), sizes, classes, classes, False).copies
    limited = step_traffic(Routing(1, 8, 256, node_limit=2), sizes, classes, classes, False).copies
    assert sampled == pytest.approx(exact, rel=0.03)
    assert limited < sampled and limited <= 2


# --- the commands ------------------------------------------------------------------------------


def synth(*args):
    return subprocess.run([sys.executable, "-m", "synth", *args], capture_output=True, text=True, timeout=300)


def test_check_accepts_and_refuses():
    common = ("check", "--levels", "node=2,gpu=4", "--axes", "8", "--reduce", "a0", "--collective")
    assert synth(*common, "dispatch", "AllToAll(Parallel(node)); AllToAll(InsideGroup(gpu))").returncode == 0
    assert synth(*common, "combine", "AllToAll(InsideGroup(gpu)); AllToAll(Parallel(node))").returncode == 0
    missing = synth(*common, "dispatch", "AllToAll(Parallel(node))")
    assert missing.returncode == 1 and "missing" in missing.stderr


def test_rank_finds_the_two_stage_dispatch_on_four_nodes():
    result = synth("rank", "--topology", "hgx-h100-ib-4x8", "--axes", "ep=32", "--reduce", "ep", "--collective",
                   "dispatch", "--routing", "tokens=4096,topk=8,experts=256,node-limit=2", "--json")
    assert result.returncode == 0, result.stderr
    import json

    rows = json.loads(result.stdout)
    assert rows[0]["program"] == "AllToAll(Parallel(node)); AllToAll(InsideGroup(gpu))"
    assert rows[0]["speedup"] > 1.5 and any(row["baseline"] for row in rows)


@pytest.mark.parametrize("args, fragment", [
    (("--collective", "dispatch"), "needs --routing"),
    (("--collective", "dispatch", "--routing", "tokens=4,topk=9,experts=8"), "--routing: routing topk=9"),
    (("--routing", "tokens=4,topk=2,experts=8"), "--routing is read by --collective dispatch|combine"),
    (("--collective", "dispatch", "--routing", "tokens=4,topk=2,experts=12"), "experts=12 do not spread evenly"),
])
def test_rank_refuses_bad_routing_in_one_line(args, fragment):
    result = synth("rank", "--topology", "emu-2x4", "--axes", "8", "--reduce", "a0", *args)
    assert result.returncode == 2 and fragment in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_export_writes_each_steps_calls_as_global_ranks(tmp_path):
    import json

    out = tmp_path / "plan.json"
    result = synth("export", "--topology", "emu-2x4", "--axes", "8", "--reduce", "a0", "--collective", "dispatch",
                   "--program", "AllToAll(Parallel(node)); AllToAll(InsideGroup(gpu))", "--format", "json", "-o", str(out))
    assert result.returncode == 0, result.stderr
    plan = json.loads(out.read_text())
    assert plan["format"] == "synth-routed-plan" and plan["collective"] == "dispatch" and plan["routing"] is None
    first, second = plan["programs"][0]["steps"]
    assert first["levels"] == ["node"] and first["calls"] == [[[0, 4], [1, 5], [2, 6], [3, 7]]]
    assert second["levels"] == ["gpu"] and second["calls"] == [[[0, 1, 2, 3], [4, 5, 6, 7]]]
    refused = synth("export", "--topology", "emu-2x4", "--axes", "8", "--reduce", "a0", "--collective", "combine",
                    "--top", "1", "--format", "torch", "-o", str(tmp_path / "x.py"))
    assert refused.returncode == 2 and "--format json" in refused.stderr


def test_programs_lists_every_order_and_grouping():
    result = synth("programs", "--levels", "rack=2,node=2,gpu=2", "--axes", "8", "--reduce", "a0", "--collective",
                   "dispatch", "--count")
    assert result.returncode == 0 and "9 program(s)" in result.stdout


@pytest.mark.parametrize("topology, axes", [("hgx-h100-ib-4x8", "ep=32"), ("dgx-h100-2x8x8", "ep=128"),
                                            ("emu-2x4", "ep=8")])
@pytest.mark.parametrize("routing", [Routing(4096, 8, 256), Routing(128, 8, 256, node_limit=4),
                                     Routing(4096, 2, 128, zipf=1.0)])
def test_no_program_beats_the_lower_bound(topology, axes, routing):
    from synth.search.routed_rank import RoutedPrograms
    from synth.hierarchy import build_hierarchy
    from synth.model import cost_context
    from synth.placement import enumerate_placements, parse_axes
    from synth.topology_file import load_topology

    system = load_topology(topology)
    hierarchy = build_hierarchy(enumerate_placements(system, parse_axes(axes))[0], ("ep",))
    for goal in ("dispatch", "combine"):
        rows = RoutedPrograms(cost_context(hierarchy, system, "nccl"), goal, routing).rank(routing.buffer_bytes)
        assert rows and all(row.bound_ratio >= 1 for row in rows)
        assert sum(row.baseline for row in rows) == 1


def test_commands_without_routed_goals_say_which_take_them():
    result = synth("explore", "--topology", "emu-2x4", "--axes", "8", "--reduce", "a0", "--collective", "dispatch",
                   "--bytes", "1MiB")
    assert result.returncode == 2 and "does not take dispatch or combine yet" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_one_ranker_ranks_routed_goals_as_their_program_list_does():
    """Dispatch and combine go through the one `Ranker` (given the routing): its rows, top K and
    bound are the routed program list's own, and a routing is asked for exactly when the goal
    moves tokens by one."""
    from synth.goals import ALL_REDUCE
    from synth.hierarchy import build_hierarchy
    from synth.model import cost_context
    from synth.placement import enumerate_placements, parse_axes
    from synth.search.rank import Ranker
    from synth.search.routed_rank import RoutedPrograms, routing_at
    from synth.topology_file import load_topology

    system = load_topology("hgx-h100-ib-4x8")
    context = cost_context(build_hierarchy(enumerate_placements(system, parse_axes("ep=32"))[0], ("ep",)), system, "nccl")
    routing = Routing(4096, 8, 256, node_limit=2)
    for name in ("dispatch", "combine"):
        goal = parse_goal(name)
        ranker = Ranker(context, 4, goal=goal, routing=routing)
        size = 512 * routing.bytes_per_token
        listed = RoutedPrograms(context, goal, routing, 4).rank(size)
        assert ranker.rank([size])[0] == listed
        assert ranker.top(size, 2) == listed[:2] + [row for row in listed[2:] if row.baseline]
        assert ranker.lower_bound(size) == RoutedPrograms(context, goal, routing, 4).bound(routing_at(routing, size))
        assert ranker.achievable_bound(size) is None
        with pytest.raises(ValueError, match="give one"):
            Ranker(context, 4, goal=goal)
    with pytest.raises(ValueError, match="takes no routing"):
        Ranker(context, 4, goal=ALL_REDUCE, routing=routing)


def test_fanout_keeps_one_draw_of_keys_for_every_node_count():
    """fanout's draws from its kept keys are the draws made afresh (Routing.sample with the seed)."""
    from synth.model import fanout

    for nodes, limit in ((8, 4), (16, 8), (64, 32), (4, None)):
        limited = Routing(1, 8, 256, node_limit=limit)
        experts, state = fanout._experts(limited, nodes)
        rng = np.random.default_rng(fanout.SEED)
        assert np.array_equal(experts, limited.sample(rng, fanout.SAMPLES, nodes))
        assert state == rng.bit_generator.state


@pytest.mark.parametrize("routing", [Routing(1, 8, 256, node_limit=4), Routing(1, 4, 64, zipf=1.1),
                                     Routing(1, 8, 64, node_limit=2, zipf=0.8)])
def test_sampled_copies_are_the_distinct_projections_token_by_token(routing):
    """fanout's sampled copies (kept per-level digit keys, copies compared column by column)
    equal the definition counted token by token: per token, the distinct classes on `classes`
    of its experts' hosts whose digits on `moving` differ from the owner's."""
    from synth.model import fanout

    sizes = (2, 4, 8)
    members = 64
    nodes = members // sizes[-1]
    experts, state = fanout._experts(routing, nodes)
    rng = np.random.default_rng(fanout.SEED)
    rng.bit_generator.state = state
    owners = np.array(np.unravel_index(rng.integers(members, size=fanout.SAMPLES), sizes)).T
    hosts = np.array(np.unravel_index(experts // (routing.experts // members), sizes)).transpose(1, 2, 0)
    for classes, moving in (({0}, {0}), ({0, 1}, {1}), ({0, 1, 2}, {2}), ({1, 2}, {1, 2}), ({0, 2}, set())):
        counted = sum(len({tuple(host[level] for level in sorted(classes)) for host in hosts[token]
                           if any(host[level] != owners[token][level] for level in moving)})
                      for token in range(fanout.SAMPLES))
        fanout._traffic.cache_clear()
        found = fanout.step_traffic(routing, sizes, frozenset(classes), frozenset(moving), False).copies
        assert found == counted / fanout.SAMPLES
