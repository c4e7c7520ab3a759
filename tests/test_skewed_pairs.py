"""Dispatch and combine under a skewed routing (docs/model.md section 8, "Dispatch and
combine"): every pair priced at its own expected bytes. The per-class pricing held equal to a
brute force over every pair (link loads, each member's NCCL schedule over NCCL's own rounds,
the step); the expected bytes per pair held to the executor's counts over sampled routings;
a skewed time between the uniform routing's and the every-pair-at-the-hottest estimate."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synth.goals import DELIVERED
from synth.hierarchy import build_hierarchy
from synth.model import cost_context
from synth.model.engine import CostEngine, StepCalls
from synth.model.fanout import step_pairs
from synth.model.nccl import p2p
from synth.model.nccl.backend import _all_to_all_site, _network_nodes
from synth.model.network import network_for
from synth.model.weighted import PairBytes, keyed_loads, node_split, weighted_step_s
from synth.placement import enumerate_placements, parse_axes
from synth.routed import RoutedSemantics
from synth.routed_interpreter import make_tokens, run_combine, run_dispatch
from synth.routing import Routing, RoutingError, parse_routing
from synth.search.routed_rank import RoutedPrograms
from synth.semantics import FORMS
from synth.topology_file import load_topology

SYSTEMS = [("emu-2x4", "ep=8"), ("hgx-h100-ib-4x8", "ep=32"), ("dgx-h100-2x8x8", "ep=128"),
           ("dgx-h100-2x8x8", "ep=32,dp=4")]
# Bytes per pair around NCCL's point-to-point breakpoints (LL threshold, chunk steps) and beyond.
SIZES = st.one_of(st.integers(1, 1 << 12), st.integers(1 << 12, 1 << 17), st.integers(1 << 17, 1 << 24),
                  st.sampled_from([16384, 32768, 32769, 65536, 65537, 131072, 131073, 1 << 20, (1 << 20) + 1]))


def _context(name: str, axes: str, backend: str = "nccl"):
    system = load_topology(name)
    return cost_context(build_hierarchy(enumerate_placements(system, parse_axes(axes))[0], ("ep",)), system, backend)


def _steps(context):
    """Every (form, level) step's calls on the context's hierarchy, of two members or more."""
    sizes = tuple(context.hierarchy.sizes)
    found = []
    for form in ("InsideGroup", "Parallel"):
        for level in range(len(sizes)):
            calls = tuple(sorted(FORMS[form](sizes, level)[0]))
            if len(calls[0]) > 1 and calls not in found:
                found.append(calls)
    return found


# --- link loads: per prefix equals every pair -----------------------------------------------------


def _pair_loads(network, sets, weight, by_receiver):
    """Network.loads over every ordered pair of each row, the brute force."""
    src, dst, nbytes = [], [], []
    for row, devices in enumerate(sets):
        for a in range(len(devices)):
            for b in range(len(devices)):
                if a != b:
                    level = int(network.first_difference(devices[a], devices[b]))
                    src.append(devices[a])
                    dst.append(devices[b])
                    nbytes.append(weight[row, b if by_receiver else a, level])
    return network.loads(np.array(src), np.array(dst), np.array(nbytes))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(system=st.sampled_from(["emu-2x4", "dgx-h100-2x8x8", "selene", "hgx-h100-ib-4x8"]), data=st.data())
def test_keyed_loads_equal_every_pair(system, data):
    network = network_for(load_topology(system))
    rows = data.draw(st.integers(1, 3))
    k = data.draw(st.integers(2, min(12, network.device_count // rows)))
    order = np.array(data.draw(st.permutations(range(network.device_count))))[:rows * k].reshape(rows, k)
    weight = np.array(data.draw(st.lists(st.floats(0, 1e6), min_size=rows * k * network.depth,
                                         max_size=rows * k * network.depth))).reshape(rows, k, network.depth)
    by_receiver = data.draw(st.booleans())
    expected = _pair_loads(network, order, weight, by_receiver)
    assert np.allclose(keyed_loads(network, order, weight, by_receiver), expected, rtol=1e-9, atol=1e-6)


# --- each member's NCCL schedule: per class equals NCCL's own rounds -------------------------------


def _rounds(node: np.ndarray, member: int) -> list[tuple[int, int]]:
    """(send peer, receive peer) of each of the member's rounds but its own, as NCCL 2.26's
    init.cc builds p2pSchedule: node deltas, then local deltas, by the quadratic walk."""
    nodes = sorted(set(node.tolist()))
    ranks = [[m for m in range(len(node)) if node[m] == n] for n in nodes]
    mine, local = nodes.index(int(node[member])), ranks[nodes.index(int(node[member]))].index(member)
    n_nodes, n_locals = len(nodes), len(ranks[0])
    found = []
    node_round = node_delta = 0
    while True:
        if node_delta < n_nodes:
            send_node, recv_node = (mine + node_delta) % n_nodes, (mine - node_delta) % n_nodes
            local_round = local_delta = 0
            while True:
                if local_delta < n_locals:
                    found.append((ranks[send_node][(local + local_delta) % n_locals],
                                  ranks[recv_node][(local - local_delta) % n_locals]))
                local_round += 1
                local_delta = (local_delta + local_round) & (p2p.pow2_up(n_locals) - 1)
                if local_round == p2p.pow2_up(n_locals):
                    break
        node_round += 1
        node_delta = (node_delta + node_round) & (p2p.pow2_up(n_nodes) - 1)
        if node_round == p2p.pow2_up(n_nodes):
            break
    assert len(found) == len(node) and found[0] == (member, member)
    return found[1:]


def _member_brute(comm, hardware, values, node, efficiency, by_receiver):
    """Each member's parts, posts and proxy seconds, round by round, operation by operation."""
    known = {}

    def figures(nbytes, network):  # one operation's figures, asked once per size
        if (nbytes, network) not in known:
            known[nbytes, network] = p2p.op_figures(comm, hardware, np.array([nbytes]), network, efficiency)
        return known[nbytes, network]

    node = np.zeros(len(values), dtype=np.int64) if node is None else node
    parts, posts, proxy = [], [], []
    for i in range(len(values)):
        total = p2p.operation(comm, math.ceil(values[i]), False, True).channels
        sent = spent = 0.0
        for send_to, recv_from in _rounds(node, i):
            network = bool(node[send_to] != node[i])
            send = figures(values[send_to] if by_receiver else values[i], network)
            recv = figures(values[i] if by_receiver else values[recv_from], network)
            total += max(send.channels[0], recv.channels[0])
            if network:
                sent += send.posts[0] + recv.posts[0]
                spent += send.proxy_s[0] + recv.proxy_s[0]
        parts.append(total)
        posts.append(sent)
        proxy.append(spent)
    return np.array(parts), np.array(posts), np.array(proxy)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(system=st.sampled_from(SYSTEMS[:3]), data=st.data())
def test_member_loads_equal_every_round(system, data):
    context = _context(*system)
    engine = CostEngine(context)
    calls = data.draw(st.sampled_from(_steps(context)))
    call = engine.call("AllToAll", calls[0])
    hardware, cost = _all_to_all_site(call.site)
    values = np.array(data.draw(st.lists(SIZES, min_size=len(calls[0]), max_size=len(calls[0]))), dtype=float)
    efficiency = {plan.algorithm.rsplit("/", 1)[-1]: plan.efficiency for plan in call.plans}
    node = _network_nodes(call.site)
    loads = p2p.member_loads(cost.comm, hardware, values, node, efficiency)
    for by_receiver in (True, False):
        parts, posts, proxy = _member_brute(cost.comm, hardware, values, node, efficiency, by_receiver)
        assert np.array_equal(loads.parts, parts)
        assert np.allclose(loads.posts, posts, rtol=1e-12) and np.allclose(loads.proxy_s, proxy, rtol=1e-12)


def _step_brute(engine, calls, pairs: PairBytes) -> float:
    """The step priced pair by pair: every flow of every group through Network.loads, each
    member's schedule over its own rounds, the slowest member."""
    network = engine.context.network_of("AllToAll")
    src, dst, nbytes, members = [], [], [], []
    for ranks in calls:
        call = engine.call("AllToAll", ranks)
        hardware, cost = _all_to_all_site(call.site)
        efficiency = {plan.algorithm.rsplit("/", 1)[-1]: plan.efficiency for plan in call.plans}
        flows = call.plans[0].phases[0].flows
        node = _network_nodes(call.site)
        for a in range(len(ranks)):
            for b in range(len(ranks)):
                if a == b:
                    continue
                nbytes_ab = pairs.between(np.array([ranks[a]]), np.array([ranks[b]]))[0]
                weighed = p2p.op_figures(cost.comm, hardware, np.array([nbytes_ab]), False, efficiency).weighed[0]
                divisor = flows.intra if node is None or node[a] == node[b] else flows.inter
                for group in range(len(engine.devices)):
                    src.append(engine.devices[group, ranks[a]])
                    dst.append(engine.devices[group, ranks[b]])
                    nbytes.append(weighed / divisor)
        values = pairs.values[np.array(ranks)]
        parts, posts, proxy = _member_brute(cost.comm, hardware, values, node, efficiency, pairs.by_receiver)
        hop = max(sum(phase.latency_s for phase in plan.phases) for plan in call.plans)
        members.append((cost, hardware, p2p.MemberLoads(parts, posts, proxy), hop))
    drain = float((network.loads(np.array(src), np.array(dst), np.array(nbytes)) / network.capacity).max())
    from synth.model.nccl.backend import ALL_TO_ALL_LAUNCH_S

    return max(float(p2p.member_times_s(cost, hardware, loads, drain, hop, ALL_TO_ALL_LAUNCH_S).max())
               for cost, hardware, loads, hop in members)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(system=st.sampled_from([SYSTEMS[0], SYSTEMS[1], SYSTEMS[3]]), data=st.data())
def test_weighted_step_equals_every_pair(system, data):
    """The property: the per-class step time equals the brute force over every pair, on
    random unequal bytes keyed by either end."""
    context = _context(*system)
    engine = CostEngine(context)
    calls = data.draw(st.sampled_from(_steps(context)))
    values = np.array(data.draw(st.lists(SIZES, min_size=context.group_size, max_size=context.group_size)), dtype=float)
    pairs = PairBytes(values, data.draw(st.booleans()))
    assert weighted_step_s(engine, calls, pairs) == pytest.approx(_step_brute(engine, calls, pairs), rel=1e-9)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_backend_without_a_schedule_takes_hop_and_drain(data):
    """gloo: its launch, the call's hop latency and the drain of every pair's own bytes."""
    context = _context("hgx-h100-ib-4x8", "ep=32", "gloo")
    engine = CostEngine(context)
    calls = data.draw(st.sampled_from(_steps(context)))
    values = np.array(data.draw(st.lists(SIZES, min_size=32, max_size=32)), dtype=float)
    pairs = PairBytes(values, data.draw(st.booleans()))
    network = context.network_of("AllToAll")
    src, dst, nbytes, hops = [], [], [], []
    for ranks in calls:
        plan = engine.call("AllToAll", ranks).plans[0]
        hops.append(sum(phase.latency_s for phase in plan.phases))
        for a in ranks:
            for b in ranks:
                if a != b:
                    src.append(engine.devices[0, a])
                    dst.append(engine.devices[0, b])
                    nbytes.append(pairs.between(np.array([a]), np.array([b]))[0] / plan.efficiency)
    drain = float((network.loads(np.array(src), np.array(dst), np.array(nbytes)) / network.capacity).max())
    expected = context.backend.launch_s + max(hops) + drain
    assert weighted_step_s(engine, calls, pairs) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("system", SYSTEMS)
@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_equal_pairs_price_as_the_engine_prices_an_equal_split(system, backend):
    """Every pair at one size: the engine's own all-to-all time (away from the breakpoints
    where a uniform call takes a larger call's time, never more than it)."""
    context = _context(*system, backend)
    engine = CostEngine(context)
    n = context.group_size
    for calls in _steps(context):
        k = len(calls[0])
        for per_peer in (3000, 1 << 20, 3 << 22):
            expected = float(engine.figures([StepCalls("AllToAll", calls, (n,) * len(calls))], [per_peer * k]).time_s[0, 0])
            for by_receiver in (True, False):
                found = weighted_step_s(engine, calls, PairBytes(np.full(n, float(per_peer)), by_receiver))
                assert found == pytest.approx(expected, rel=1e-9)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(system=st.sampled_from(SYSTEMS), data=st.data())
def test_a_step_never_gets_faster_as_a_pair_grows(system, data):
    """Monotone in every pair's bytes (each operation at the least figures of any as large),
    so never above every pair at the largest, the engine's equal split of that size."""
    context = _context(*system)
    engine = CostEngine(context)
    calls = data.draw(st.sampled_from(_steps(context)))
    n = context.group_size
    values = np.array(data.draw(st.lists(SIZES, min_size=n, max_size=n)), dtype=float)
    grown = values + np.array(data.draw(st.lists(st.sampled_from([0, 0, 1, 100, 4096, 1 << 16, 1 << 20]),
                                                 min_size=n, max_size=n)), dtype=float)
    by_receiver = data.draw(st.booleans())
    time = weighted_step_s(engine, calls, PairBytes(values, by_receiver))
    assert time <= weighted_step_s(engine, calls, PairBytes(grown, by_receiver)) * (1 + 1e-12)
    k = len(calls[0])
    hottest = float(engine.figures([StepCalls("AllToAll", calls, (n,) * len(calls))], [int(values.max()) * k]).time_s[0, 0])
    assert time <= hottest * (1 + 1e-9)


def test_node_split_finds_the_level_of_the_nodes():
    context = _context("dgx-h100-2x8x8", "ep=128")
    engine = CostEngine(context)
    call = engine.call("AllToAll", tuple(range(128)))
    network = context.network_of("AllToAll")
    split, inter, intra = node_split(network, engine.devices[0, :128], call.plans[0].phases[0].flows)
    assert split == 2 and inter != intra  # rack, node: the nodes are the units of the second level


# --- the expected bytes per pair against the executor -----------------------------------------------


@pytest.mark.parametrize("routing", [Routing(1, 3, 12, hidden=1, element_bytes=1, zipf=1.2),
                                     Routing(1, 2, 12, hidden=1, element_bytes=1, weights=(9, 1, 1, 5, 1, 1, 1, 1, 3, 1, 1, 1)),
                                     Routing(1, 3, 12, hidden=1, element_bytes=1, zipf=1.0, node_limit=2)])
@pytest.mark.parametrize("goal", ["dispatch", "combine"])
def test_expected_pairs_match_the_executor(routing, goal):
    """Every program over two levels: per step and ordered pair, the expected copies
    (partials) per token owned equal the executor's mean over tokens the router draws, within
    sampling noise; zero outside the step's groups."""
    names, sizes, count = ("node", "gpu"), (3, 2), 3000
    members, per_member = 6, 2
    rng = np.random.default_rng(11)
    experts = routing.sample(rng, members * count, sizes[0]).reshape(members, count, routing.topk)
    tokens = make_tokens(rng, experts, per_member, hidden=1)
    semantics = RoutedSemantics(names, sizes, goal)
    for parsed in semantics.programs(2):
        _check_pairs(routing, goal, semantics, parsed, tokens, count)


def _check_pairs(routing, goal, semantics, parsed, tokens, count):
    names, sizes, members = semantics.level_names, semantics.sizes, len(tokens.experts)
    _, sent = (run_dispatch if goal == "dispatch" else run_combine)(parsed, names, sizes, tokens)
    for entry, counts in zip(semantics.run(parsed), sent):
        moving = entry.after - entry.before
        classes = entry.after if goal == "dispatch" else semantics.levels - entry.before
        pairs = step_pairs(routing, sizes, classes, moving, goal == "combine")
        groups, _ = FORMS[entry.step.form](sizes, names.index(entry.step.level))
        expected = np.zeros((members, members))
        for group in groups:
            for a in group:
                for b in group:
                    if a != b:
                        expected[a, b] = pairs.between(np.array([a]), np.array([b]))[0]
        assert np.allclose(counts / count, expected, rtol=0.08, atol=0.02), (counts / count, expected)


def test_capacity_caps_the_hottest_pair():
    sizes, classes = (4, 8), frozenset({0, 1})
    free = step_pairs(Routing(1, 8, 256, zipf=1.0), sizes, classes, classes, False).values
    capped = step_pairs(Routing(1, 8, 256, zipf=1.0, capacity=1.25), sizes, classes, classes, False).values
    assert free.max() > 1.25 * free.mean() and capped.max() <= 1.25 * free.mean() * (1 + 1e-12)


# --- between the uniform routing and every pair at the hottest --------------------------------------


def _hottest(programs: RoutedPrograms, program, routing: Routing) -> float:
    """Every pair of every step at the step's hottest pair's bytes, as one equal-split call."""
    total = 0.0
    n = programs.context.group_size
    for entry in programs.semantics.run(program):
        moving = entry.after - entry.before
        dispatch = programs.goal.end == DELIVERED
        classes = entry.after if dispatch else programs.semantics.levels - entry.before
        hot = step_pairs(routing, programs.sizes, classes, moving, not dispatch).values.max()
        calls = programs._step_calls(entry.step)
        step = StepCalls("AllToAll", calls, (n,) * len(calls))
        total += float(programs.engine.figures([step], [max(1, round(hot * len(calls[0])))]).time_s[0, 0])
    return total


@pytest.mark.parametrize("system", [("hgx-h100-ib-4x8", "ep=32"), ("dgx-h100-2x8x8", "ep=128"),
                                    ("dgx-h100-2x8x8", "ep=32,dp=4")])
@pytest.mark.parametrize("routing", [Routing(4096, 8, 256, node_limit=4), Routing(128, 8, 256),
                                     Routing(4096, 2, 128, hidden=4096)])
def test_skewed_time_lies_between_uniform_and_the_hottest(system, routing):
    """On these systems and routings (the links bound the hottest member) a Zipf skew costs at
    least the uniform routing; at most every pair at the hottest pair's bytes always (the
    property above)."""
    from dataclasses import replace

    context = _context(*system)
    skewed = replace(routing, zipf=1.0)
    for goal in ("dispatch", "combine"):
        uniform = RoutedPrograms(context, goal, routing)
        programs = RoutedPrograms(context, goal, skewed)
        for program in programs.programs:
            time = programs.time(program, skewed)
            assert uniform.time(program, routing) <= time * (1 + 1e-9)
            assert time <= _hottest(programs, program, skewed) * (1 + 1e-9)


# --- a measured histogram --------------------------------------------------------------------------


def test_a_histogram_file_is_read_as_the_weights(tmp_path):
    path = tmp_path / "loads.txt"
    path.write_text("# tokens per expert\n5, 1 1\n1\n")
    assert parse_routing(f"tokens=4,topk=2,experts=4,weights=@{path}").weights == (5.0, 1.0, 1.0, 1.0)


@pytest.mark.parametrize("content, fragment", [(None, "cannot read it"), ("1 2 x", "'x' is not a number"),
                                               ("# none\n", "holds no numbers"), ("1 2 3", "has 3 values for 4 experts"),
                                               ("1 -1 1 1", "non-negative"), ("1 0 0 0", "fewer than topk=2")])
def test_bad_histograms_are_refused_in_one_line(tmp_path, content, fragment):
    path = tmp_path / "loads.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(RoutingError, match=fragment):
        parse_routing(f"tokens=4,topk=2,experts=4,weights=@{path}")


def test_rank_reads_a_histogram_file_and_refuses_a_bad_one(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "loads.txt"
    path.write_text("# tokens per expert, experts 0..7\n900 300 120 80\n60 30 10 0\n")
    common = ("rank", "--topology", "emu-2x4", "--axes", "8", "--reduce", "a0", "--collective", "dispatch", "--routing")
    run = lambda routing: subprocess.run([sys.executable, "-m", "synth", *common, routing],  # noqa: E731
                                         capture_output=True, text=True, timeout=300)
    good = run(f"tokens=64,topk=2,experts=8,weights=@{path}")
    assert good.returncode == 0, good.stderr
    path.write_text("900 300 x\n")
    for routing in (f"tokens=64,topk=2,experts=8,weights=@{path}", f"tokens=64,topk=2,experts=8,weights=@{tmp_path}/none"):
        bad = run(routing)
        assert bad.returncode == 2 and "--routing: routing weights=@" in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1


def test_a_skew_can_cost_less_where_the_proxy_bounds_the_step():
    """Not a theorem: a Zipf skew sends fewer copies (a token's experts crowd onto the first
    members) and posts the hot pairs in larger chunks (NCCL's network chunk doubles from 8
    steps of bytes), so where the proxy's posts bound every member, the skewed flat dispatch
    is the cheaper (results/moe-dispatch counts these rows)."""
    from dataclasses import replace

    context = _context("aws-p6-b200-2x8", "ep=16")
    uniform = Routing(128, 8, 128, 4096)
    skewed = replace(uniform, zipf=1.0)
    flat = RoutedPrograms(context, "dispatch", uniform)
    assert flat.time(flat.baseline, uniform) > RoutedPrograms(context, "dispatch", skewed).time(flat.baseline, skewed)
    sizes, levels = tuple(context.hierarchy.sizes), frozenset({0, 1})
    engine = CostEngine(context)
    call = engine.call("AllToAll", tuple(range(16)))
    for routing in (uniform, skewed):
        priced = context.backend.pair_call(call.site, call.plans, step_pairs(routing, sizes, levels, levels, False).values)
        slowest = int(np.argmax(priced.times_s(0.0)))
        assert priced.loads.proxy_s[slowest] > 0 and priced.times_s(0.0)[slowest] == priced.times_s(1e-5)[slowest]
