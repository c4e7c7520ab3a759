"""The accuracy campaign's analysis and the microbenchmarks' CSV, without spawning processes."""

from __future__ import annotations

import math

import pytest

from benchmarks import microbench
from benchmarks.accuracy_metrics import Measured, case_metrics, ranks, spearman, summarize
from synth.calibrate.readers import read_measurements
from synth.topology_file import load_topology


def table(predicted, measured, default=None):
    return [Measured(f"p{i}", p, m, i == default) for i, (p, m) in enumerate(zip(predicted, measured))]


def test_ranks_average_ties_like_scipy():
    assert list(ranks([3.0, 1.0, 3.0, 2.0])) == [3.5, 1.0, 3.5, 2.0]
    scipy = pytest.importorskip("scipy.stats")
    values = [5, 1, 4, 4, 2, 9, 1]
    assert list(ranks(values)) == list(scipy.rankdata(values))


def test_spearman_on_known_orders():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    # d = (0, 0, 1, -1): rho = 1 - 6 * 2 / (4 * 15)
    assert spearman([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(0.8)
    assert math.isnan(spearman([1, 2], [2, 1]))
    scipy = pytest.importorskip("scipy.stats")
    predicted, measured = [3, 1, 4, 1, 5, 9, 2, 6], [2.7, 1.8, 2.8, 1.8, 4.5, 9.0, 4.5, 2.3]
    assert spearman(predicted, measured) == pytest.approx(scipy.spearmanr(predicted, measured).statistic)


def test_case_metrics_top1_topk_slowdown_speedup():
    # 12 programs: the simulator's order is p0, p1, ..., p11; the measured best is p10 (1.0),
    # outside the simulator's top 10, whose best measured is p3 (1.2); the default is p11.
    predicted = list(range(1, 13))
    measured = [2.0, 3.0, 2.5, 1.2, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 1.0, 4.0]
    m = case_metrics(table(predicted, measured, default=11), k=10)
    assert (m.top1, m.topk) == (False, False)
    assert m.slowdown_topk == pytest.approx(1.2)
    assert m.speedup_first_over_default == pytest.approx(4.0 / 2.0)
    assert m.speedup_best_over_default == pytest.approx(4.0 / 1.0)
    assert m.first_within == pytest.approx(2.0) and m.best_program == "p10" and m.first_program == "p0"
    assert case_metrics(table(predicted, measured), k=11).topk
    assert math.isnan(case_metrics(table(predicted, measured)).speedup_first_over_default)


def test_perfect_prediction_and_summary():
    good = case_metrics(table([1, 2, 3], [10, 20, 30], default=2))
    assert (good.top1, good.topk, good.slowdown_topk, good.spearman) == (True, True, 1.0, pytest.approx(1.0))
    bad = case_metrics(table([1, 2, 3], [30, 20, 10], default=2), k=1)
    s = summarize([good, bad])
    assert (s.cases, s.top1, s.topk) == (2, 0.5, 0.5)
    assert s.spearman_mean == pytest.approx(0.0)
    assert s.slowdown_geomean == pytest.approx(math.sqrt(1.0 * 3.0)) and s.slowdown_max == pytest.approx(3.0)
    assert s.speedup_geomean == pytest.approx(math.sqrt(3.0 * (10 / 30)))
    assert s.possible_speedup_geomean == pytest.approx(math.sqrt(3.0 * 1.0)) and s.possible_speedup_max == pytest.approx(3.0)


def test_ties_in_prediction_break_by_program_text():
    rows = [Measured("b", 1.0, 2.0), Measured("a", 1.0, 1.0), Measured("c", 2.0, 3.0)]
    assert case_metrics(rows).first_program == "a"


def test_microbench_groups_cover_each_level_alone_and_full():
    groups = microbench.groups(load_topology("emu-2x4"))
    as_tuples = {(g.level, g.ranks, g.ranks_per_unit) for g in groups}
    assert ("gpu", (0, 1), 1) in as_tuples and ("gpu", (0, 1, 2, 3), 1) in as_tuples  # inside node 0
    assert ("node", (0, 4), 1) in as_tuples  # one rank per node
    assert ("node", tuple(range(8)), 4) in as_tuples and ("node", (0, 1, 4, 5), 2) in as_tuples
    for g in microbench.groups(load_topology("emu-2x2x2")):
        assert len(g.ranks) >= 2 and len(g.ranks) % g.ranks_per_unit == 0


def test_microbench_csv_is_what_calibrate_reads(tmp_path):
    report = {"cases": [{"collective": "AllGather", "level": "node", "ranks": [0, 1, 4, 5], "ranks_per_unit": 2,
                         "sizes": [65536], "times": {"65536": [0.012, 0.011, 0.013]}},
                        {"collective": "AllReduce", "level": "gpu", "ranks": [0, 1], "ranks_per_unit": 1,
                         "sizes": [65536, 262144], "times": {"65536": [0.008], "262144": [0.033]}}]}
    rows = microbench.rows_from_report(report)
    path = tmp_path / "mb.csv"
    microbench.write_csv(path, rows)
    assert path.read_text().splitlines()[0] == "collective,level,group_size,bytes,time_s,backend,ranks_per_unit"
    kind, measurements = read_measurements(str(path), None)
    assert kind == "benchmark CSV" and len(measurements) == 5
    first = measurements[0]
    assert (first.collective, first.bytes, first.time_s, first.backend) == ("AllGather", 65536, 0.012, "gloo")
    assert (first.span.level, first.span.units, first.span.per_unit) == ("node", 2, 2)
    assert microbench.medians(rows)[("AllGather", "node", 4, 2, 65536)] == pytest.approx(0.012)
