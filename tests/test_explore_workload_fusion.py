"""Placement exploration, workloads and fusion planning (issue 3): every placement listed once
with a best time no worse than its baseline, workload totals as sums of their terms and equal
to exploration for one reduction, the fusion DP against brute force, fusion against DDP's
default buckets, and the commands' JSON and one-line errors."""

from __future__ import annotations

import itertools
import json
import math
import random

import pytest

from synth.hierarchy import build_hierarchy
from synth.placement import enumerate_placements, make_placement, parse_axes
from synth.search import BestPrograms, enumerate_programs, grid_sizes
from synth.analysis.explore import explore_placements
from synth.analysis.fusion import (DDP_BUCKET_CAP, DDP_FIRST_BUCKET_CAP, bucket_chooser, ddp_ranges, merge_idle, optimal_ranges,
                                   plan_fusion, ready_times, schedule)
from synth.search.rank import rank_programs
from synth.model import ESTIMATES, cost_context
from synth.analysis.workload import Reduction, evaluate_workload, parse_reduction
from synth.errors import UsageError
from synth.topology_file import load_topology

KiB, MiB, GiB = 2**10, 2**20, 2**30
H100 = ("dgx-h100-2x8x8", "data=16,model=8")
A2 = ("gcp-a2-2x16", "data=16,model=2")


def transformer_gradients(layers: int = 4, hidden: int = 512) -> list[int]:
    """fp32 gradient sizes of a small transformer in backward order: final norm, then per layer
    (last first) the MLP out, MLP in, attention out and QKV weights with biases, then embeddings."""
    h, sizes = hidden, [2 * hidden * 4]
    for _ in range(layers):
        sizes += [(4 * h * h + h) * 4, (4 * h * h + 4 * h) * 4, (h * h + h) * 4, (3 * h * h + 3 * h) * 4]
    sizes.append(50257 * h * 4)
    return sizes


def one_placement(name: str, axes: str, matrix, reduce=("data",)):
    topology = load_topology(name)
    return topology, build_hierarchy(make_placement(topology, parse_axes(axes), matrix), reduce)


# --- explore --------------------------------------------------------------------------------------


def test_explore_lists_every_placement_once_with_best_no_slower_than_baseline():
    topology, axes = load_topology(H100[0]), parse_axes(H100[1])
    result = explore_placements(topology, axes, ("data",), 64 * MiB)
    matrices = [row.matrix for row in result.rows]
    assert sorted(matrices) == sorted(p.matrix for p in enumerate_placements(topology, axes))
    assert len(set(matrices)) == len(matrices)
    for row in result.rows:
        assert row.best_time_s <= row.baseline_time_s
        assert row.speedup == pytest.approx(row.baseline_time_s / row.best_time_s)
        assert row.bound_ratio >= 1 and row.bound_ratio == pytest.approx(row.best_time_s / row.lower_bound_s)
    keys = [(row.best_time_s, row.placement) for row in result.rows]
    assert keys == sorted(keys)
    assert result.best_spread >= 1 and result.baseline_spread >= 1
    assert result.best_spread == pytest.approx(result.rows[-1].best_time_s / result.rows[0].best_time_s)
    assert result.baseline_spread == pytest.approx(max(r.baseline_time_s for r in result.rows)
                                                   / min(r.baseline_time_s for r in result.rows))
    assert result.rows[0].spread_vs_best == 1.0


def test_explore_best_is_the_head_of_the_full_ranking():
    topology, axes = load_topology("gcp-n1-v100-4x8"), parse_axes("data=8,model=4")
    result = explore_placements(topology, axes, ("data",), 16 * MiB, max_len=4)
    for row in result.rows:
        hierarchy = build_hierarchy(make_placement(topology, axes, row.matrix), ("data",))
        full = rank_programs(cost_context(hierarchy, topology), 16 * MiB, max_len=4,
                             programs=list(enumerate_programs(hierarchy, max_len=4)))
        assert (row.best_program, row.best_time_s) == (full[0].program, full[0].time_s)
        assert row.baseline_time_s == next(r.time_s for r in full if r.baseline)


def test_explore_json_fields(run_cli):
    code, out, err = run_cli("explore", "--topology", A2[0], "--axes", A2[1], "--reduce", "data",
                             "--bytes", "256MiB", "--json")
    assert code == 0 and err == ""
    rows = json.loads(out)
    assert isinstance(rows, list) and len(rows) == 2
    for row in rows:
        for key in ("matrix", "best_program", "best_time_s", "baseline_time_s", "speedup", "bound_ratio",
                    "spread_vs_best", "baseline_spread_vs_best", "lower_bound_s"):
            assert key in row
        assert row["best_time_s"] <= row["baseline_time_s"]
    assert [row["best_time_s"] for row in rows] == sorted(row["best_time_s"] for row in rows)
    assert rows[0]["spread_vs_best"] == 1.0 and rows[-1]["spread_vs_best"] >= 1


def test_explore_table_shows_the_spread(run_cli):
    code, out, _ = run_cli("explore", "--topology", A2[0], "--axes", A2[1], "--reduce", "data", "--bytes", "256MiB")
    assert code == 0
    assert "spread between placements" in out and "[[1,16],[2,1]]" in out and "[[2,8],[1,2]]" in out


# --- workload -------------------------------------------------------------------------------------


def test_workload_totals_are_sums_of_their_terms():
    topology, axes = load_topology(H100[0]), parse_axes(H100[1])
    reductions = [Reduction(("data",), GiB, 1), Reduction(("model",), 64 * MiB, 96), Reduction(("data", "model"), MiB, 3)]
    result = evaluate_workload(topology, axes, reductions)
    assert len(result.rows) == len(enumerate_placements(topology, axes))
    for row in result.rows:
        assert [term.reduction for term in row.terms] == reductions
        assert row.total_s == pytest.approx(sum(term.reduction.count * term.time_s for term in row.terms), rel=1e-12)
        assert row.baseline_total_s == pytest.approx(
            sum(term.reduction.count * term.baseline_time_s for term in row.terms), rel=1e-12)
        assert row.total_s <= row.baseline_total_s
    keys = [(row.total_s, row.placement) for row in result.rows]
    assert keys == sorted(keys)
    assert result.spread >= 1 and result.baseline_spread >= 1


def test_workload_of_one_reduction_agrees_with_explore():
    topology, axes = load_topology(H100[0]), parse_axes(H100[1])
    explored = explore_placements(topology, axes, ("data",), 64 * MiB)
    single = evaluate_workload(topology, axes, [Reduction(("data",), 64 * MiB, 1)])
    assert [row.placement for row in single.rows] == [row.placement for row in explored.rows]
    for workload_row, explore_row in zip(single.rows, explored.rows):
        assert workload_row.total_s == explore_row.best_time_s
        assert workload_row.baseline_total_s == explore_row.baseline_time_s
        assert workload_row.terms[0].program == explore_row.best_program
    repeated = evaluate_workload(topology, axes, [Reduction(("data",), 64 * MiB, 5)])
    for row, explore_row in zip(repeated.rows, explored.rows):
        assert row.total_s == pytest.approx(5 * explore_row.best_time_s)


def test_reduction_syntax():
    names = ("data", "model")
    assert parse_reduction("data:1GiB", names) == Reduction(("data",), GiB, 1)
    assert parse_reduction("model:64MiBx96", names) == Reduction(("model",), 64 * MiB, 96)
    assert parse_reduction("model+data:8MiB", names) == Reduction(("data", "model"), 8 * MiB, 1)
    assert parse_reduction(" data , model : 8 MiB x 2 ", names) == Reduction(("data", "model"), 8 * MiB, 2)
    assert parse_reduction("data:4096x3", names) == Reduction(("data",), 4096, 3)
    assert parse_reduction("model:64MiBx96", names).text == "model:64MiBx96"


@pytest.mark.parametrize("text", ["data", "data:", ":1GiB", "foo:1GiB", "data+data:1MiB", "data+:1MiB",
                                  "data:1GiBx", "data:1GiBx0", "data:1GiBx2.5", "data:-1MiB", "data:1Gb"])
def test_bad_reduction_specs(text):
    with pytest.raises(UsageError):
        parse_reduction(text, ("data", "model"))


def test_workload_json(run_cli):
    code, out, err = run_cli("workload", "--topology", A2[0], "--axes", A2[1], "--reduction", "data:256MiB",
                             "--reduction", "model:8MiBx24", "--json")
    assert code == 0 and err == ""
    rows = json.loads(out)
    assert len(rows) == 2
    for row in rows:
        assert {"matrix", "total_s", "baseline_total_s", "speedup", "spread_vs_best", "reductions"} <= set(row)
        assert row["total_s"] == pytest.approx(sum(term["total_s"] for term in row["reductions"]))
        assert [term["reduction"] for term in row["reductions"]] == ["data:256MiB", "model:8MiBx24"]


# --- fusion ---------------------------------------------------------------------------------------


def brute_force_finish(tensors, ready, seconds) -> float:
    """The earliest finish over every bucketing of consecutive tensors (2^(n-1) of them)."""
    n, best = len(tensors), math.inf
    for cuts in itertools.product((False, True), repeat=n - 1):
        ranges, first = [], 0
        for index, cut in enumerate(cuts):
            if cut:
                ranges.append((first, index))
                first = index + 1
        ranges.append((first, n - 1))
        best = min(best, schedule(tensors, ready, ranges, lambda size: ("", seconds(size))).finish_s)
    return best


def dp_finish(tensors, ready, seconds) -> float:
    """The DP's finish; merging its idle buckets must keep it exactly."""
    finishes = []
    optimal = optimal_ranges(tensors, ready, seconds)
    merged = merge_idle(tensors, ready, optimal, seconds)
    assert len(merged) <= len(optimal)
    for ranges in (optimal, merged):
        assert [first for first, _ in ranges] == [0] + [last + 1 for _, last in ranges[:-1]]
        assert ranges[-1][1] == len(tensors) - 1
        finishes.append(schedule(tensors, ready, ranges, lambda size: ("", seconds(size))).finish_s)
    assert finishes[1] == finishes[0]
    return finishes[0]


SYNTHETIC_COSTS = [
    lambda size: 20e-6 + size / 10e9,  # alpha-beta
    lambda size: 5e-3 + size / 100e9,  # latency-heavy: fuse everything
    lambda size: 1e-6 + (size / 1e9) ** 1.5,  # superlinear: split
    lambda size: 1e-5 + size / 1e9 + (2e-3 if size > 3 * MiB else 0.0),  # a protocol switch
]


@pytest.mark.parametrize("cost", range(len(SYNTHETIC_COSTS)))
def test_fusion_dp_is_optimal_against_brute_force_on_synthetic_costs(cost):
    rng = random.Random(cost)
    for _ in range(12):
        n = rng.randint(1, 8)
        tensors = tuple(rng.randint(1, 4 * MiB) for _ in range(n))
        rate = rng.choice([math.inf, 1e9, 10e9, 200e9])
        ready = ready_times(tensors, rate)
        seconds = SYNTHETIC_COSTS[cost]
        assert dp_finish(tensors, ready, seconds) == brute_force_finish(tensors, ready, seconds)


@pytest.mark.parametrize("exact", [False, True])
def test_fusion_dp_is_optimal_against_brute_force_on_simulated_costs(exact):
    topology, hierarchy = one_placement(*A2, ((2, 8), (1, 2)))
    best = BestPrograms(cost_context(hierarchy, topology))
    rng = random.Random(7)
    for rate in (math.inf, 5e9, 30e9):
        tensors = tuple(rng.choice([8 * KiB, 256 * KiB, 2 * MiB, 12 * MiB, 24 * MiB]) for _ in range(8))
        chooser = bucket_chooser(best, tensors, exact)
        ready = ready_times(tensors, rate)
        seconds = lambda size: chooser(size).time_s  # noqa: E731
        assert dp_finish(tensors, ready, seconds) == brute_force_finish(tensors, ready, seconds)
        plan = plan_fusion(cost_context(hierarchy, topology), tensors, compute_rate=rate, exact=exact)
        assert plan.plan.finish_s == brute_force_finish(tensors, ready, seconds)


@pytest.mark.parametrize("estimate", ESTIMATES)
def test_grid_candidates_agree_with_the_exact_search(estimate):
    topology, hierarchy = one_placement(*H100, ((2, 2, 4), (1, 4, 2)))
    best = BestPrograms(cost_context(hierarchy, topology), estimate=estimate)
    candidates = best.candidates((4 * KiB, 256 * MiB))
    assert candidates.grid == grid_sizes(4 * KiB, 256 * MiB)
    rng = random.Random(3)
    for size in (4 * KiB, 5000, 3 * MiB + 17, 40 * MiB, 256 * MiB, *(rng.randint(4 * KiB, 256 * MiB) for _ in range(20))):
        chosen, exact = candidates(size), best.best(size)
        assert chosen.time_s <= chosen.baseline_time_s
        assert chosen.program == exact.program
        # every candidate is costed exactly by the engine, at every size
        assert (chosen.time_s, chosen.baseline_time_s) == (exact.time_s, exact.baseline_time_s)


@pytest.mark.parametrize("case", [
    ("gcp-a2-2x16", "data=16,model=2", ((2, 8), (1, 2))),
    ("dgx-a100-x4", "data=32", ((4, 8),)),
    ("dgx-h100-2x8x8", "data=16,model=8", ((2, 2, 4), (1, 4, 2))),
    ("gcp-n1-v100-4x8", "data=8,model=4", ((4, 2), (1, 4))),
])
def test_fusion_is_never_worse_than_ddp_default_buckets(case):
    topology, hierarchy = one_placement(*case)
    tensors = transformer_gradients()
    for rate in (math.inf, 2e9, 30e9, 1e12):
        plan = plan_fusion(cost_context(hierarchy, topology), tensors, compute_rate=rate)
        assert plan.plan.finish_s <= plan.baseline.finish_s and plan.gain >= 1
        assert plan.plan.finish_s <= min(plan.buckets_only.finish_s, plan.programs_only.finish_s)
        assert plan.programs_only.finish_s <= plan.baseline.finish_s
        for schedule_ in (plan.plan, plan.baseline):
            assert [(b.first, b.last) for b in schedule_.buckets][0][0] == 0
            assert schedule_.buckets[-1].last == len(tensors) - 1
            assert sum(b.bytes for b in schedule_.buckets) == sum(tensors)
            for before, after in zip(schedule_.buckets, schedule_.buckets[1:]):
                assert after.first == before.last + 1 and after.start_s >= before.end_s
            assert all(b.start_s >= b.ready_s for b in schedule_.buckets)
        assert plan.plan.compute_end_s == (0.0 if math.isinf(rate) else sum(tensors) / rate)


def test_hidden_reductions_are_merged_into_few_buckets():
    """While backward is still running, reducing every tensor alone and reducing them together
    finish at the same time; the plan keeps the finish and drops the needless calls."""
    tensors, ready = (MiB,) * 6, tuple(float(i + 1) for i in range(6))
    seconds = lambda size: 1e-3 + size / 1e12  # noqa: E731
    assert len(optimal_ranges(tensors, ready, seconds)) == 6
    merged = merge_idle(tensors, ready, optimal_ranges(tensors, ready, seconds), seconds)
    assert merged == [(0, 4), (5, 5)]


def test_ddp_buckets_close_when_they_reach_their_cap():
    assert ddp_ranges((512 * KiB, 512 * KiB, 10 * MiB, 20 * MiB, 20 * MiB)) == [(0, 1), (2, 3), (4, 4)]
    assert ddp_ranges((4 * KiB,) * 3) == [(0, 2)]
    assert ddp_ranges((30 * MiB, 30 * MiB)) == [(0, 0), (1, 1)]
    assert ddp_ranges((MiB, MiB, MiB), bucket_cap=2 * MiB, first_bucket_cap=2 * MiB) == [(0, 1), (2, 2)]
    assert (DDP_BUCKET_CAP, DDP_FIRST_BUCKET_CAP) == (25 * MiB, MiB)


def test_ready_times_follow_the_compute_rate():
    assert ready_times((1000, 3000), 1e3) == (1.0, 4.0)
    assert ready_times((1000, 3000), math.inf) == (0.0, 0.0)


def test_fusion_json_from_a_tensors_file(run_cli, tmp_path):
    sizes = transformer_gradients(layers=2)
    path = tmp_path / "gradients.txt"
    path.write_text("# backward order\n" + "\n".join(f"{size / KiB:g}KiB" for size in sizes) + "\n\n")
    code, out, err = run_cli("fusion", "--topology", A2[0], "--axes", A2[1], "--reduce", "data",
                             "--placement", "[[2,8],[1,2]]", "--tensors-file", str(path), "--compute-rate", "inf",
                             "--json")
    assert code == 0 and err == ""
    plan = json.loads(out)
    assert plan["tensors"] == len(sizes) and plan["bytes"] == sum(sizes)
    assert plan["compute_rate_Bps"] is None
    assert plan["plan"]["finish_s"] <= plan["baseline"]["finish_s"]
    assert plan["gain"] == pytest.approx(plan["baseline"]["finish_s"] / plan["plan"]["finish_s"])
    assert plan["baseline"]["bucket_cap_bytes"] == 25 * MiB
    assert plan["plan"]["finish_s"] <= min(plan["buckets_only_finish_s"], plan["programs_only_finish_s"])
    assert sum(bucket["bytes"] for bucket in plan["plan"]["buckets"]) == sum(sizes)


def test_fusion_table(run_cli):
    code, out, _ = run_cli("fusion", "--topology", A2[0], "--axes", A2[1], "--reduce", "data",
                           "--placement", "[[2,8],[1,2]]", "--tensors", "4MiB,16MiB,8KiB,30MiB")
    assert code == 0
    assert "planned buckets" in out and "DDP default" in out and "gain:" in out


# --- bad input ------------------------------------------------------------------------------------

JOB = ["--topology", A2[0], "--axes", A2[1]]
FUSION = ["fusion", *JOB, "--reduce", "data", "--placement", "[[2,8],[1,2]]"]


@pytest.mark.parametrize("argv, message", [
    (["workload", *JOB, "--reduction", "data"], "AXES:BYTES"),
    (["workload", *JOB, "--reduction", "data:1GiBx0"], "count"),
    (["workload", *JOB, "--reduction", "expert:1GiB"], "unknown axis 'expert'"),
    (["explore", *JOB, "--reduce", "expert", "--bytes", "1MiB"], "unknown axis 'expert'"),
    (["explore", *JOB, "--reduce", "data", "--bytes=-1MiB"], "not a positive byte size"),
    ([*FUSION, "--tensors", ""], "no tensor sizes"),
    ([*FUSION, "--tensors", " , "], "no tensor sizes"),
    ([*FUSION, "--tensors", "4MiB,-16MiB"], "not a positive byte size"),
    ([*FUSION, "--tensors", "4MiB,0"], "not a positive byte size"),
    ([*FUSION, "--tensors", "4MiB,,8MiB"], "empty"),
    ([*FUSION, "--tensors-file", "/nonexistent/gradients.txt"], "cannot read"),
    ([*FUSION, "--tensors", "4MiB", "--compute-rate", "fast"], "--compute-rate"),
    (["fusion", *JOB, "--reduce", "data", "--tensors", "4MiB"], "give --placement"),
    (["explore", "--levels", "vm=2,gpu=16", "--axes", A2[1], "--reduce", "data", "--bytes", "1MiB"], "no link figures"),
    (["workload", "--levels", "vm=2,gpu=16", "--axes", A2[1], "--reduction", "data:1MiB"], "no link figures"),
    (["fusion", "--levels", "vm=2,gpu=16", "--axes", A2[1], "--reduce", "data", "--placement", "[[2,8],[1,2]]",
      "--tensors", "4MiB"], "no link figures"),
])
def test_bad_input_is_one_line_and_exit_2(run_cli, argv, message):
    code, out, err = run_cli(*argv)
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_tensors_file_with_a_bad_line_names_it(run_cli, tmp_path):
    path = tmp_path / "gradients.txt"
    path.write_text("4MiB\n-2MiB\n")
    code, _, err = run_cli(*FUSION, "--tensors-file", str(path))
    assert code == 2 and "line 2" in err and err.count("\n") == 1


def test_nothing_to_reduce_exits_1(run_cli):
    code, _, err = run_cli("explore", "--topology", A2[0], "--axes", "data=32,model=1", "--reduce", "model",
                           "--bytes", "1MiB")
    assert code == 1 and "nothing to reduce" in err and err.count("\n") == 1
