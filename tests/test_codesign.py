"""synth codesign: the grid, its points, one point planned, the executors agreeing point for
point, resume, failures recorded, the estimate's refusal and the command's outputs."""

from __future__ import annotations

import csv
import sys

import pytest

from synth.cli import main
from synth.codesign.errors import GridError, MissingExtraError, UnreachableClusterError
from synth.codesign.grid import grid_from_text
from synth.codesign.points import chunks, points
from synth.codesign.results import ResultsFile, read_rows
from synth.codesign.run import MEASURED, plan_point
from synth.codesign.sweep import options_for, results_file, run_sweep

# Small systems (4 and 8 devices of Selene's kind) and small models, the planner's settings
# fixed: a point costs tens of milliseconds. The 2-device points fail (no runnable setting).
GRID = """
[sweep]
token_budget = 1e9
prices = { selene = 1.8, dgx-h100 = 3.0 }
[axes]
topology = ["selene"]
device = ["selene", "dgx-h100"]
model = ["gpt3-1.3b", "llama3.2-1b"]
global_batch = [16]
[axes.levels.node]
size = [1, 2]
nics = [4, 8]
[axes.levels.gpu]
size = [2, 4]
[axes.plan]
recompute = ["none"]
sequence_parallel = ["on"]
zero1 = ["on"]
offload = ["off"]
"""


@pytest.fixture(scope="module")
def grid():
    return grid_from_text(GRID, "test grid")


@pytest.fixture(scope="module")
def options(grid):
    return options_for(grid, 300.0, float(1 << 36))


@pytest.fixture(scope="module")
def serial(grid, options):
    return [plan_point(point, options) for point in points(grid)]


def _plans(rows):
    """The rows without what differs run to run (CPU time, memo counts), by key."""
    return {row["key"]: {name: value for name, value in row.items() if name not in MEASURED} for row in rows}


def _sweep(grid, options, tmp_path, executor, workers, address=None, name="r.csv"):
    with results_file(grid, tmp_path / name) as results:
        run_sweep(grid, results, options, executor, workers, address, chunk=3)
    return read_rows(tmp_path / name)


# --- the grid and its points ------------------------------------------------------------------------


def test_grid_axes_in_order_and_size(grid):
    assert [axis.name for axis in grid.axes] == ["topology", "device", "node.size", "node.nics", "gpu.size", "model",
                                                 "global_batch", "plan.recompute", "plan.sequence_parallel",
                                                 "plan.zero1", "plan.offload"]
    assert grid.size == 32 and grid.price("dgx-h100") == 3.0


def test_points_are_lazy_and_keyed(grid):
    every = list(points(grid))
    assert len(every) == grid.size and [p.index for p in every] == list(range(grid.size))
    assert len({p.key for p in every}) == grid.size
    assert list(points(grid, start=30))[0] == every[30]
    assert [len(c) for c in chunks(iter(range(7)), 3)] == [3, 3, 1]


@pytest.mark.parametrize("text, named", [
    ("[axes]\nmodel=['gpt3-1.3b']", "axes.topology is missing"),
    ("[axes]\ntopology=['selene']\nmodel=[]", "non-empty list"),
    ("[axes]\ntopology=['selene']\nmodel=['x']\ncolour=[1]", "unknown key axes.colour"),
    ("[axes]\ntopology=['selene']\nmodel=['x']\n[axes.levels.node]\nbandwidth=['fast']", "bandwidth"),
    ("[axes]\ntopology=['selene']\nmodel=['x']\n[axes.levels.node]\nnics=[0]", "positive integers"),
    ("[axes]\ntopology=['selene']\nmodel=['x']\n[axes.plan]\nrecompute=['some']", "none, selective, full"),
    ("[sweep]\ntoken_budget=-1\n[axes]\ntopology=['selene']\nmodel=['x']", "token_budget"),
    ("[axes\n", "not valid TOML"),
    ("[axes]\ntopology=['selene']\nmodel=[" + "1" * 4400 + "]", "4,400 digits"),
])
def test_bad_grids_are_refused_naming_the_key(text, named):
    with pytest.raises(GridError, match=named):
        grid_from_text(text, "g")


# --- a point planned --------------------------------------------------------------------------------


def test_point_rows_have_the_plan_and_its_cost(serial):
    ok = [row for row in serial if row["status"] == "ok"]
    failed = [row for row in serial if row["status"] == "error"]
    assert ok and failed  # the 2-device points have no runnable setting: recorded, not raised
    assert all("no settings" in row["error"] for row in failed)
    row = ok[0]
    tokens = 16 * 2048  # global batch x gpt3's sequence length
    assert row["tokens_per_s"] == pytest.approx(tokens / row["step_s"])
    price = 1.8 if row["device"] == "selene" else 3.0
    assert row["cost_per_token"] == pytest.approx(price * row["devices"] / 3600 / row["tokens_per_s"])
    assert row["time_to_train_s"] == pytest.approx(1e9 / row["tokens_per_s"])
    assert 0 < row["mfu"] < 1 and row["memory_bytes"] > 0


def test_nics_change_the_uplinks_only_where_swept(grid):
    from synth.codesign.run import system_of

    point = next(p for p in points(grid) if p.get("node.size") == 2 and p.get("node.nics") == 4
                 and p.get("gpu.size") == 4)
    topology, device = system_of(point)
    assert topology.levels[0].uplinks.count == 4 and topology.device_count == 8 and device == point.get("device")


def test_shared_memo_gives_the_fresh_planners_rows(grid, options, serial):
    import dataclasses

    fresh = [plan_point(point, dataclasses.replace(options, share=False)) for point in points(grid)]
    assert _plans(fresh) == _plans(serial)
    assert sum(row["memo_hits"] for row in serial) > 0


# --- executors agree with the serial run --------------------------------------------------------------


def test_local_pool_two_workers_matches_serial(grid, options, serial, tmp_path):
    assert _plans(_sweep(grid, options, tmp_path, "local", 2)) == _plans(serial)


def test_ray_matches_serial(grid, options, serial, tmp_path):
    ray = pytest.importorskip("ray", reason="ray is not installed (extra codesign-ray)")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        rows = _sweep(grid, options, tmp_path, "ray", 2)
    finally:
        ray.shutdown()
    assert _plans(rows) == _plans(serial)


def test_dask_matches_serial(grid, options, serial, tmp_path):
    distributed = pytest.importorskip("dask.distributed", reason="dask.distributed is not installed (extra codesign-dask)")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        rows = _sweep(grid, options, tmp_path, "dask", 2, address=cluster.scheduler_address)
    assert _plans(rows) == _plans(serial)


def test_missing_extra_is_named(grid, options, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingExtraError, match="codesign-ray"):
        _sweep(grid, options, tmp_path, "ray", 1)


def test_unreachable_cluster_is_named(grid, options, monkeypatch, tmp_path):
    ray = pytest.importorskip("ray", reason="ray is not installed (extra codesign-ray)")

    def refuse(**_):
        raise ConnectionError("no cluster at 10.0.0.1:6379")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(UnreachableClusterError, match="no cluster at 10.0.0.1:6379"):
        _sweep(grid, options, tmp_path, "ray", 1, address="10.0.0.1:6379")


# --- resume ------------------------------------------------------------------------------------------


def test_resume_recomputes_nothing_finished(grid, options, serial, tmp_path, monkeypatch):
    path = tmp_path / "resume.csv"
    with results_file(grid, path) as results:
        results.append(serial[:20])
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(serial[20]["key"] + ",20,selene")  # a row cut short by the interruption
    planned = []
    import synth.codesign.run as run

    original = run.plan_point
    monkeypatch.setattr(run, "plan_point", lambda point, opts: planned.append(point.index) or original(point, opts))
    with results_file(grid, path) as results:
        assert len(results.finished) == 20
    with results_file(grid, path) as results:
        counts = run_sweep(grid, results, options, "serial", 1)
    assert planned == list(range(20, grid.size)) and counts.planned == grid.size - 20
    assert _plans(read_rows(path)) == _plans(serial)


def test_results_file_of_another_grid_is_refused(grid, tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("key,index,colour\n")
    with pytest.raises(Exception, match="another grid's columns"):
        ResultsFile(path, ("key", "index", "size"))


# --- the command -------------------------------------------------------------------------------------


def test_command_writes_results_plot_and_parquet(tmp_path, capsys):
    grid_path = tmp_path / "g.toml"
    grid_path.write_text(GRID)
    out = tmp_path / "g.csv"
    args = ["codesign", str(grid_path), "-o", str(out), "--executor", "serial", "--plot", str(tmp_path / "g.png")]
    if _has("pyarrow"):
        args += ["--parquet", str(tmp_path / "g.parquet")]
    if not _has("matplotlib"):
        args = args[:6]
    assert main(args) == 0
    assert "Pareto front" in capsys.readouterr().out
    assert len(list(csv.DictReader(open(out, encoding="utf-8")))) == 32
    if _has("matplotlib"):
        assert (tmp_path / "g.png").stat().st_size > 1000
    if _has("pyarrow"):
        import pyarrow.parquet as pq

        assert pq.read_table(tmp_path / "g.parquet").num_rows == 32
    assert main(["codesign", str(grid_path), "-o", str(out), "--executor", "serial", "--json"]) == 0  # resumed: none left
    assert '"planned": 0' in capsys.readouterr().out


def test_command_refuses_over_budget_and_bad_flags(tmp_path, capsys):
    grid_path = tmp_path / "g.toml"
    grid_path.write_text(GRID)
    out = str(tmp_path / "g.csv")
    assert main(["codesign", str(grid_path), "-o", out, "--budget", "0.0001"]) == 2
    assert "--budget" in capsys.readouterr().err
    assert main(["codesign", str(grid_path), "-o", out, "--address", "tcp://x:1"]) == 2
    assert main(["codesign", str(tmp_path / "missing.toml")]) == 2
    assert main(["codesign", str(grid_path), "-o", out, "--estimate", "--json"]) == 0
    assert '"to_plan": 32' in capsys.readouterr().out


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# --- the NCCL version and symmetric registration as axes ------------------------------------------------

NCCL_GRID = """
[axes]
topology = ["dgx-h100"]
nccl_version = ["2.26", "2.28"]
nccl_symmetric = [false, true]
model = ["gpt3-1.3b"]
global_batch = [16]
[axes.plan]
recompute = ["none"]
sequence_parallel = ["on"]
zero1 = ["on"]
offload = ["off"]
"""


def test_nccl_version_and_symmetric_are_axes_of_the_system():
    import dataclasses

    from synth.codesign.run import system_of

    grid = grid_from_text(NCCL_GRID, "nccl grid")
    assert [axis.name for axis in grid.axes][:3] == ["topology", "nccl_version", "nccl_symmetric"]
    options = options_for(grid, 300.0, float(1 << 36))
    rows = {(p.get("nccl_version"), p.get("nccl_symmetric")): (p, plan_point(p, options)) for p in points(grid)}
    for (version, symmetric), (point, row) in rows.items():
        nccl = system_of(point)[0].nccl
        assert (nccl.version, nccl.symmetric) == (version, symmetric) and row["status"] == "ok", row
        fresh = plan_point(point, dataclasses.replace(options, share=False))  # the memo keys on the version
        assert fresh["step_s"] == row["step_s"]
    step = {key: row["step_s"] for key, (_, row) in rows.items()}
    # 2.27+ runs registered buffers on the symmetric kernels inside the node: faster collectives;
    # 2.26 has none, and without registration 2.26 and 2.28 price an H100 node alike
    assert step[("2.28", True)] < step[("2.26", True)]
    assert step[("2.26", True)] == step[("2.26", False)] == step[("2.28", False)]


@pytest.mark.parametrize("axis, named", [
    ("nccl_version = ['2.25']", "axes.nccl_version holds '2.25'"),
    ("nccl_version = [2.27]", "as strings"),
    ("nccl_symmetric = ['yes']", "true and/or false"),
])
def test_bad_nccl_axes_are_refused(axis, named):
    with pytest.raises(GridError, match=named):
        grid_from_text(f"[axes]\ntopology=['selene']\nmodel=['x']\n{axis}", "g")


def test_a_system_without_nccl_table_fails_its_point_only():
    from synth.codesign.run import system_of
    from synth.errors import UsageError

    grid = grid_from_text("[axes]\ntopology=['emu-2x2']\nmodel=['gpt3-1.3b']\nnccl_version=['2.27']", "g")
    with pytest.raises(UsageError, match=r"no \[nccl\] table"):
        system_of(next(points(grid)))


ETP_GRID = """
[sweep]
token_budget = 1e9
[axes]
topology = ["dgx-a100-x4"]
model = ["mixtral-8x7b"]
[axes.plan]
tp = [2]
pp = [2]
ep = [8]
etp = [1, 2]
recompute = ["full"]
sequence_parallel = ["on"]
zero1 = ["on"]
offload = ["off"]
"""


def test_etp_is_a_fixed_degree_of_the_grid():
    """`etp` fixes the expert tensor-parallel degree as `synth plan --etp` does: the folded
    layout (etp 1 under tp 2) at one point, the classic one (etp = tp) at the other."""
    grid = grid_from_text(ETP_GRID, "etp grid")
    assert [axis.values for axis in grid.axes if axis.name == "plan.etp"] == [(1, 2)]
    options = options_for(grid, 300.0, float(1 << 36))
    rows = {point.get("plan.etp"): plan_point(point, options) for point in points(grid)}
    assert all(row["status"] == "ok" for row in rows.values()), rows
    assert "etp=1" in rows[1]["degrees"] and "etp=" not in rows[2]["degrees"]
    with pytest.raises(GridError, match="axes.plan.etp"):
        grid_from_text(ETP_GRID.replace("etp = [1, 2]", "etp = [0]"), "g")
