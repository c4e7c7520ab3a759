"""The simulator and the ranking (issue 3): sanity properties of the cost model, the lower
bound, top-K against the full ranking, determinism, and the `synth rank` command."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from synth.cli import main
from synth.hierarchy import build_hierarchy
from synth.language import parse_program
from synth.lowering import lower
from synth.placement import enumerate_placements, make_placement, parse_axes
from synth.search import enumerate_programs
from synth.search.rank import Ranker, pareto_front, rank_programs
from synth.model import (ESTIMATES, LOCKSTEP, CostEngine, cost_context, lower_bound, network_for,
                         program_cost, simulate)
from synth.model.algorithms import GLOO, NCCL_FLOWS, btree_parent, dtree_parents
from synth.model.cost import baseline_cost, baseline_program
from synth.topology_file import load_topology

MiB, GiB = 2**20, 2**30
HIERARCHICAL = "ReduceScatter(InsideGroup(gpu)); AllReduce(Parallel(node)); AllGather(InsideGroup(gpu))"
THROUGH_MASTERS = "Reduce(InsideGroup(gpu)); AllReduce(Master(node)); Broadcast(InsideGroup(gpu))"


def hierarchy_of(topology_name: str, axes: str, reduce: str, matrix=None):
    topology = load_topology(topology_name)
    axes_parsed = parse_axes(axes)
    placement = (make_placement(topology, axes_parsed, matrix) if matrix is not None
                 else enumerate_placements(topology, axes_parsed)[0])
    return topology, build_hierarchy(placement, tuple(reduce.split(",")))


def cost_of(text: str, hierarchy, topology, size: int, backend: str = "nccl", estimate=LOCKSTEP) -> float:
    return simulate(lower(parse_program(text), hierarchy), cost_context(hierarchy, topology, backend), size,
                    estimate).time_s


def with_level(topology, index: int, factor: float):
    """The topology with one level's per-device bandwidth (and its uplinks) scaled by `factor`."""
    level = topology.levels[index]
    bandwidth = dataclasses.replace(level.bandwidth, value=level.bandwidth.value * factor)
    uplinks = level.uplinks
    if uplinks is not None:
        uplinks = dataclasses.replace(uplinks, bandwidth=dataclasses.replace(
            uplinks.bandwidth, value=uplinks.bandwidth.value * factor))
    levels = list(topology.levels)
    levels[index] = dataclasses.replace(level, bandwidth=bandwidth, uplinks=uplinks)
    return dataclasses.replace(topology, levels=tuple(levels))


CASES = [
    ("dgx-a100-x4", "data=32", "data", None),
    ("gcp-a2-2x16", "data=16,model=2", "data", [[2, 8], [1, 2]]),
    ("dgx-h100-2x8x8", "data=16,model=8", "data", [[2, 2, 4], [1, 4, 2]]),
    ("emu-2x2x2", "data=8", "data", None),
]


# --- the network ----------------------------------------------------------------------------------


def test_routes_on_the_graph_match_the_costing_tables():
    network = network_for(load_topology("dgx-h100-2x8x8"))
    rng = np.random.default_rng(0)
    for src, dst in rng.integers(0, network.device_count, size=(40, 2)):
        if src == dst:
            continue
        route = network.route(int(src), int(dst))
        loads = network.loads(np.array([src]), np.array([dst]), np.array([1.0]))
        assert sorted(network.link_names[i] for i in np.nonzero(loads)[0]) == sorted(route)


def test_a_flow_between_nodes_uses_both_nics_and_both_uplink_sets():
    network = network_for(load_topology("dgx-a100-x4"))
    assert network.route(0, 9) == ("node0.gpu0 node-link out", "node0 uplinks out",
                                   "node1 uplinks in", "node1.gpu1 node-link in")
    assert network.route(0, 1) == ("node0.gpu0 gpu-link out", "node0.gpu1 gpu-link in")


def test_double_binary_tree_is_nccls():
    # The illustration in NCCL's src/graph/trees.cc: 0 -> 8, 8 -> {4, 12}, 4 -> {2, 6}, ...
    assert [btree_parent(14, r) for r in range(14)] == [-1, 2, 4, 2, 8, 6, 4, 6, 0, 10, 12, 10, 8, 12]
    first, second = dtree_parents(12)
    assert second[11] == -1 and first[0] == -1  # mirrored: the second tree's root is n-1
    assert all(first[r] != -1 or second[r] != -1 for r in range(12))


# --- sanity properties of the cost model -----------------------------------------------------------


@pytest.mark.parametrize("estimate", ESTIMATES)
@pytest.mark.parametrize("topology_name,axes,reduce,matrix", CASES)
def test_time_grows_with_bytes(topology_name, axes, reduce, matrix, estimate):
    topology, hierarchy = hierarchy_of(topology_name, axes, reduce, matrix)
    context = cost_context(hierarchy, topology)
    engine = CostEngine(context)
    sizes = [2**10, 2**16, 2**20, 2**24, 2**28]
    for program in list(enumerate_programs(hierarchy, max_len=4))[:60]:
        lowered = lower(program, hierarchy)
        times = [program_cost(context, lowered, size, estimate, engine).time_s for size in sizes]
        assert all(a < b for a, b in zip(times, times[1:])), (str(program), times)


@pytest.mark.parametrize("backend", [NCCL_FLOWS, GLOO], ids=["nccl-flows", "gloo"])
@pytest.mark.parametrize("estimate", ESTIMATES)
@pytest.mark.parametrize("topology_name,axes,reduce,matrix", CASES)
def test_a_slower_link_never_makes_a_program_faster(topology_name, axes, reduce, matrix, estimate, backend):
    """For the flow backends, which run the algorithm their flows say is fastest. Not for NCCL
    as measured: NCCL decides from its own view of the links, e.g. on dgx-a100-x4 half as fast
    NVLink gives a communicator 10 channels instead of 16, and a 4 KiB tree/LL all-reduce on one
    of them is capped at a larger share of LL's ceiling (39 us instead of 42)."""
    topology, hierarchy = hierarchy_of(topology_name, axes, reduce, matrix)
    programs = list(enumerate_programs(hierarchy, max_len=4))[:40]
    fast = cost_context(hierarchy, topology, backend)
    for level in range(len(topology.levels)):
        slow = cost_context(hierarchy, with_level(topology, level, 0.5), backend)
        for size in (2**12, 2**26):
            for program in programs:
                lowered = lower(program, hierarchy)
                assert (program_cost(slow, lowered, size, estimate).time_s
                        >= program_cost(fast, lowered, size, estimate).time_s)


def test_more_groups_through_an_uplink_never_make_a_step_faster():
    # 16 groups of 2, each across the two VMs, all through the VMs' one 100 Gb/s NIC.
    topology, hierarchy = hierarchy_of("gcp-a2-2x16", "data=2,model=16", "data", [[2, 1], [1, 16]])
    lowered = lower(baseline_program(hierarchy), hierarchy)
    context = cost_context(hierarchy, topology)
    times = []
    for groups in range(1, len(hierarchy.groups) + 1):
        engine = CostEngine(context, context.devices[:groups])  # cost only the first `groups` groups
        times.append(program_cost(context, lowered, 64 * MiB, LOCKSTEP, engine).time_s)
    assert all(a <= b for a, b in zip(times, times[1:]))
    assert times[-1] > 10 * times[0]  # 16 groups share what one group had alone


def test_groups_sharing_a_node_nics_are_slower_than_groups_on_their_own_nics():
    # data groups across the VMs: every group crosses the VM NIC; inside a VM: none does.
    topology = load_topology("gcp-a2-2x16")
    _, crossing = hierarchy_of("gcp-a2-2x16", "data=16,model=2", "data", [[2, 8], [1, 2]])
    _, inside = hierarchy_of("gcp-a2-2x16", "data=16,model=2", "data", [[1, 16], [2, 1]])
    for estimate in ESTIMATES:
        assert (baseline_cost(cost_context(crossing, topology), 256 * MiB, estimate).time_s
                > 10 * baseline_cost(cost_context(inside, topology), 256 * MiB, estimate).time_s)


def test_inside_one_nvswitch_node_a_single_all_reduce_is_best():
    topology, hierarchy = hierarchy_of("dgx-a100", "data=8", "data")
    for estimate in ESTIMATES:
        for size in (2**10, 2**20, 2**26, 2**30):
            rows = rank_programs(cost_context(hierarchy, topology), size, max_len=4, estimate=estimate)
            assert rows[0].baseline and str(rows[0].program) == "AllReduce(InsideGroup(gpu))"


def test_baseline_busbw_on_a_single_level_ring_is_the_link_bandwidth():
    """On datasheet links (the flow model) the ring's busbw is the link's rate; as NCCL runs it,
    the rate NCCL reaches on the link (its efficiency figure), with the Simple protocol."""
    topology, hierarchy = hierarchy_of("dgx-a100", "data=8", "data")
    link = topology.levels[0].bandwidth.value
    cost = baseline_cost(cost_context(hierarchy, topology, NCCL_FLOWS), 4 * GiB, LOCKSTEP)
    assert cost.steps[0].algorithm == "ring"
    assert abs(cost.busbw - link) / link < 0.05
    cost = baseline_cost(cost_context(hierarchy, topology), 4 * GiB, LOCKSTEP)
    reached = link * topology.levels[0].efficiency.value
    assert cost.steps[0].algorithm == "ring/Simple"
    assert abs(cost.busbw - reached) / reached < 0.05


def test_four_dgx_nodes_masters_are_slower_than_rings():
    topology, hierarchy = hierarchy_of("dgx-a100-x4", "data=32", "data")
    size = 256 * MiB
    baseline = baseline_cost(cost_context(hierarchy, topology), size, LOCKSTEP).time_s
    hierarchical = cost_of(HIERARCHICAL, hierarchy, topology, size)
    masters = cost_of(THROUGH_MASTERS, hierarchy, topology, size)
    # Through masters, each node's data crosses one GPU's NIC instead of all eight: ~8x the
    # inter-node time; the single NCCL all-reduce already spreads over all NICs and overlaps
    # NVLink with InfiniBand, so the explicit RS/AR/AG does not beat it.
    assert masters > 3 * hierarchical
    assert masters > 3 * baseline
    assert hierarchical > baseline


def test_oversubscribed_rack_uplinks_reward_a_hierarchical_program():
    topology, hierarchy = hierarchy_of("dgx-h100-2x8x8", "data=16,model=8", "data", [[2, 2, 4], [1, 4, 2]])
    for estimate in ESTIMATES:
        rows = rank_programs(cost_context(hierarchy, topology), GiB, top=3, estimate=estimate)
        assert not rows[0].baseline and rows[0].speedup > 1.0


def test_gloo_reduce_scatter_pays_a_full_all_reduce_and_a_copy():
    topology, hierarchy = hierarchy_of("emu-2x4", "data=8", "data")
    size = 64 * MiB
    rs_ag = "ReduceScatter(InsideGroup(node)); AllGather(InsideGroup(node))"
    nccl = cost_of(rs_ag, hierarchy, topology, size, NCCL_FLOWS)  # NCCL's rings on the same links
    gloo = cost_of(rs_ag, hierarchy, topology, size, "gloo")
    assert gloo > 1.5 * nccl
    rows = {str(row.program): row for row in rank_programs(cost_context(hierarchy, topology, "gloo"), size, max_len=3)}
    assert rows[rs_ag].extra_memory_bytes == size
    assert rows["AllReduce(InsideGroup(node))"].extra_memory_bytes == 0


# --- the lower bound -----------------------------------------------------------------------------------


@pytest.mark.parametrize("estimate", ESTIMATES)
@pytest.mark.parametrize("backend", ["nccl", "gloo"])
@pytest.mark.parametrize("topology_name,axes,reduce,matrix", CASES + [("paper-fig3", "data=4,model=4", "data", None)])
def test_every_program_is_at_least_the_lower_bound(topology_name, axes, reduce, matrix, backend, estimate):
    topology, hierarchy = hierarchy_of(topology_name, axes, reduce, matrix)
    ranker = Ranker(cost_context(hierarchy, topology, backend), 4, estimate)
    for size, rows in zip((2**10, 2**22, 2**30), ranker.rank((2**10, 2**22, 2**30))):
        assert rows and all(row.bound_ratio >= 1.0 for row in rows)
        # the estimate's bound is the line of synth/model/bound.py or, pipelined, the larger of its parts
        bound = lower_bound(ranker.context, size)
        assert ranker.lower_bound(size).time_s == (bound.time_s if estimate == "lockstep"
                                                   else max(bound.latency_s, bound.transfer_s))


def test_bound_for_one_device_per_unit_is_the_classic_per_device_bound():
    topology, hierarchy = hierarchy_of("dgx-a100", "data=8", "data")
    bound = lower_bound(cost_context(hierarchy, topology), GiB)
    assert bound.transfer_s == pytest.approx(2 * 7 / 8 * GiB / topology.levels[0].bandwidth.value)
    assert bound.latency_s == topology.levels[0].latency.value


# --- ranking -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("estimate", ESTIMATES)
@pytest.mark.parametrize("topology_name,axes,reduce", [
    ("paper-fig3", "data=16", "data"),
    ("dgx-a100-x4", "data=32", "data"),
])
def test_top_k_is_the_head_of_the_full_ranking(topology_name, axes, reduce, estimate):
    topology, hierarchy = hierarchy_of(topology_name, axes, reduce)
    context = cost_context(hierarchy, topology)
    programs = list(enumerate_programs(hierarchy, max_len=5))
    for size in (2**16, 2**28):
        full = rank_programs(context, size, programs=programs, estimate=estimate)
        for k in (1, 5, 12):
            top = rank_programs(context, size, top=k, estimate=estimate)
            ranked = [row for row in top if not (row.baseline and row not in full[:k])]
            assert ranked == full[:k]
            assert any(row.baseline for row in top)


@pytest.mark.parametrize("estimate", ESTIMATES)
def test_the_full_ranking_costs_are_the_simulated_costs_of_the_lowered_programs(estimate):
    topology, hierarchy = hierarchy_of("paper-fig3", "data=4,model=4", "data")
    context = cost_context(hierarchy, topology)
    engine = CostEngine(context)
    for row in rank_programs(context, 2**22, max_len=4, estimate=estimate):
        assert row.time_s == program_cost(context, lower(row.program, hierarchy), 2**22, estimate, engine).time_s


@pytest.mark.parametrize("estimate", ESTIMATES)
def test_the_search_pops_programs_in_cost_order_with_the_simulated_costs(estimate):
    topology, hierarchy = hierarchy_of("dgx-a100-x4", "data=32", "data")
    context = cost_context(hierarchy, topology)
    engine = CostEngine(context)
    popped = []
    for cost, program in Ranker(context, 5, estimate).cheapest(2**24):
        assert cost == program_cost(context, lower(program, hierarchy), 2**24, estimate, engine).time_s
        popped.append((cost, str(program)))
    assert popped == sorted(popped)
    assert len(popped) == len(list(enumerate_programs(hierarchy, max_len=5)))


def test_ranking_is_deterministic():
    topology, hierarchy = hierarchy_of("paper-fig3", "data=16", "data")
    first = rank_programs(cost_context(hierarchy, topology), 2**24, max_len=4)
    second = rank_programs(cost_context(hierarchy, topology), 2**24, max_len=4)
    assert first == second
    keys = [(row.time_s, str(row.program)) for row in first]
    assert keys == sorted(keys)
    assert sum(row.baseline for row in first) == 1


def test_objectives_and_pareto_front():
    topology, hierarchy = hierarchy_of("dgx-a100-x4", "data=32", "data")
    rows = rank_programs(cost_context(hierarchy, topology), 2**26, max_len=4)
    by_text = {str(row.program): row for row in rows}
    assert by_text[HIERARCHICAL].communicators == 2 and by_text[HIERARCHICAL].calls_per_device == 3
    assert by_text[THROUGH_MASTERS].calls_per_device == 3
    assert by_text["AllReduce(InsideGroup(node))"].communicators == 1
    front = pareto_front(rows)
    assert any(row.baseline for row in front)
    for row in front:
        assert not any(all(x <= y for x, y in zip(o.objectives, row.objectives)) and o.objectives != row.objectives
                       for o in rows)


def test_a_group_of_one_member_is_not_ranked():
    topology, hierarchy = hierarchy_of("dgx-a100", "data=1,model=8", "data")
    assert rank_programs(cost_context(hierarchy, topology), 2**20) == []


# --- the command -----------------------------------------------------------------------------------------


def test_rank_json_fields(capsys):
    code = main(["rank", "--topology", "dgx-a100-x4", "--axes", "data=32", "--reduce", "data",
                 "--bytes", "256MiB", "--top", "3", "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    for key in ("program", "matrix", "bytes", "time_s", "busbw_GBps", "speedup", "baseline", "bound_ratio",
                "algbw_GBps"):
        assert all(key in row for row in rows)
    assert sum(row["baseline"] for row in rows) == 1
    baseline = next(row for row in rows if row["baseline"])
    assert baseline["program"] == "AllReduce(InsideGroup(node))" and baseline["speedup"] == 1.0
    assert all(row["bytes"] == 256 * MiB and row["matrix"] == [[4, 8]] for row in rows)
    assert [row["time_s"] for row in rows] == sorted(row["time_s"] for row in rows)


def test_rank_sweep_every_placement_and_nccl_tests_sizes(capsys):
    code = main(["rank", "-t", "gcp-a2-2x16", "-a", "data=16,model=2", "-r", "data",
                 "-b", "8M", "-e", "32M", "-f", "2", "--top", "2", "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted({row["bytes"] for row in rows}) == [8 * MiB, 16 * MiB, 32 * MiB]
    assert {json.dumps(row["matrix"]) for row in rows} == {"[[1, 16], [2, 1]]", "[[2, 8], [1, 2]]"}


def test_rank_table_marks_the_baseline(capsys):
    code = main(["rank", "-t", "dgx-a100", "-a", "data=8", "-r", "data", "--bytes", "1MiB", "--pareto"])
    assert code == 0
    out = capsys.readouterr().out
    assert "1 *" in out and "AllReduce(InsideGroup(gpu))" in out and "lower bound" in out


@pytest.mark.parametrize("argv,message", [
    (["--levels", "node=4,gpu=8", "-a", "data=32", "-r", "data", "--bytes", "1MiB"], "bandwidth and latency"),
    (["-t", "dgx-a100", "-a", "data=8", "-r", "data"], "give the size"),
    (["-t", "dgx-a100", "-a", "data=8", "-r", "data", "-b", "1M", "-e", "8M", "-f", "1"], "at least 2"),
    (["-t", "dgx-a100", "-a", "data=8", "-r", "data", "-b", "8M", "-e", "1M"], "MIN <= MAX"),
    (["-t", "dgx-a100", "-a", "data=8", "-r", "data", "--bytes", "1Mb"], "bits"),
    (["-t", "dgx-a100", "-a", "data=8", "-r", "data", "--bytes", "1MiB", "--top", "0"], "positive"),
    (["-t", "dgx-a100", "-a", "data=8", "-r", "data", "--bytes", "1MiB", "--backend", "mpi"], "invalid choice"),
])
def test_rank_usage_errors(capsys, argv, message):
    assert main(["rank", *argv]) == 2
    assert message in capsys.readouterr().err


def test_rank_with_nothing_to_reduce(capsys):
    assert main(["rank", "-t", "dgx-a100", "-a", "data=1,model=8", "-r", "data", "--bytes", "1MiB"]) == 1
    assert "nothing to rank" in capsys.readouterr().err


def test_calls_of_one_step_with_different_ranges_are_each_costed_by_their_own_range():
    """After a Master AllGather, Broadcast(Parallel(node)) groups hold ranges of different
    lengths; the walker (search and ranking) and lowering must agree call by call."""
    from synth.search import StateWalker
    from synth.model.engine import ProgramTable, steps_of

    topology = load_topology("emu-2x4")
    hierarchy = build_hierarchy(make_placement(topology, parse_axes("data=8"), [[2, 4]]), ("data",))
    program = parse_program("AllReduce(InsideGroup(gpu)); ReduceScatter(Parallel(node)); AllGather(Master(node)); "
                            "Broadcast(Parallel(node)); Broadcast(InsideGroup(node))")
    lowered = lower(program, hierarchy)
    uneven = lowered.steps[3]
    assert len({call.chunks for call in uneven.calls}) > 1
    walked = StateWalker(hierarchy).walk(program)
    assert walked == steps_of(lowered)
    size = 64 << 20
    context = cost_context(hierarchy, topology)
    engine = CostEngine(context)
    for estimate in ESTIMATES.values():
        via_walker = float(estimate.program_times(engine, ProgramTable.of([walked]), [size])[0, 0])
        assert via_walker == program_cost(context, lowered, size, estimate).time_s
    # Costing every call as large as the largest would overstate the uneven step.
    step = walked[3]
    evened = dataclasses.replace(step, chunks=(max(step.chunks),) * len(step.chunks))
    assert engine.figures([step], [size]).time_s[0, 0] < engine.figures([evened], [size]).time_s[0, 0]


def test_pipelined_estimate_reranks_every_program_and_never_exceeds_the_lockstep_sum(run_cli):
    """`synth rank --estimate pipelined`: groups do not wait between steps, so a program can
    only get faster than its lockstep sum; the baseline stays listed and --top keeps K rows,
    found by the search with the pipelined estimate itself."""
    import json

    common = ["rank", "--topology", "emu-2x4", "--axes", "data=4,model=2", "--placement", "[[2,2],[1,2]]",
              "--reduce", "data", "--bytes", "64KiB", "--backend", "gloo", "--max-len", "3", "--json"]
    code, out, _ = run_cli(*common, "--estimate", "lockstep")
    assert code == 0
    lockstep = {row["program"]: row["time_s"] for row in json.loads(out)}
    code, out, _ = run_cli(*common, "--estimate", "pipelined")
    assert code == 0
    rows = json.loads(out)
    assert {row["program"] for row in rows} == set(lockstep)
    assert all(row["estimate"] == "pipelined" for row in rows)
    assert [row["time_s"] for row in rows] == sorted(row["time_s"] for row in rows)
    for row in rows:
        assert row["time_s"] <= lockstep[row["program"]] * (1 + 1e-9)
    code, out, _ = run_cli(*common, "--estimate", "pipelined", "--top", "2")
    top = json.loads(out)
    assert [row["program"] for row in top[:2]] == [row["program"] for row in rows[:2]]
    assert any(row["baseline"] for row in top)
