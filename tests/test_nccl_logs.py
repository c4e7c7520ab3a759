"""Real nccl-tests logs users posted (copies shipped under docs/examples/ and tests/data/nccl-logs/,
each with its source line first): every one is read, with its launcher prefixes, several hosts,
-g N, one size, or ranks sharing a GPU; broken ones get an nccl-tests error, not a CSV one;
`synth calibrate` fits them and says how well; a calibrated topology answers how sure it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synth.calibrate import read_measurements
from synth.calibrate.confidence import model_error, model_error_for_group
from synth.errors import UsageError
from synth.topology_file import load_topology

ROOT = Path(__file__).resolve().parent.parent
LOGS = sorted([*ROOT.glob("docs/examples/*_perf-*.txt"), *ROOT.glob("tests/data/nccl-logs/*.txt")])

# file -> (collective, hosts, ranks per host, sizes, GPU, GPUs per process, ranks share a GPU)
EXPECTED = {
    "all_reduce_perf-h100-ib-2x8.txt": ("AllReduce", 2, 8, 32, "NVIDIA H100 80GB HBM3", 1, False),
    "all_reduce_perf-h100-ib-4x8.txt": ("AllReduce", 4, 8, 32, "NVIDIA H100 80GB HBM3", 1, False),
    "all_reduce_perf-h100-1x8-nvls.txt": ("AllReduce", 1, 8, 4, "NVIDIA H100 80GB HBM3", 8, False),
    "h100-1x8-nvls-pinned-all_reduce_perf.txt": ("AllReduce", 1, 8, 4, "NVIDIA H100 80GB HBM3", 8, False),
    "all_gather_perf-rtx5090-socket.txt": ("AllGather", 1, 2, 8, "NVIDIA GeForce RTX 5090", 1, True),
    "h100-gcp-a3mega-2x8-all_reduce_perf.txt": ("AllReduce", 2, 8, 31, "NVIDIA H100 80GB HBM3", 1, False),
    "h100-2x8-dgx0607-all_reduce_perf.txt": ("AllReduce", 2, 8, 32, "NVIDIA H100 80GB HBM3", 8, False),
    "h100-2x4-dgx0607-all_reduce_perf.txt": ("AllReduce", 2, 4, 31, "NVIDIA H100 80GB HBM3", 4, False),
    "h100-2x2-dgx0607-all_reduce_perf.txt": ("AllReduce", 2, 2, 31, "NVIDIA H100 80GB HBM3", 2, False),
    "h100-ib-2x8-nt309b-all_reduce_perf.txt": ("AllReduce", 2, 8, 14, "NVIDIA H100 80GB HBM3", 1, False),
}


def test_every_shared_log_is_shipped_with_its_source_line():
    assert {path.name for path in LOGS} == set(EXPECTED)
    for path in LOGS:
        first = path.read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith("# SOURCE: ") and "HARDWARE" in first, path.name


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_every_log_is_read(path):
    kind, measurements = read_measurements(str(path))
    collective, hosts, per_host, sizes, gpu, per_process, shared = EXPECTED[path.name]
    assert kind == "nccl-tests text"
    assert {m.collective for m in measurements} == {collective}
    span = measurements[0].span
    assert (span.hosts, span.per_unit if hosts > 1 else span.units) == (hosts, per_host)
    assert len(measurements) == sizes and len({m.bytes for m in measurements}) == sizes
    run = measurements[0].run
    assert run.devices == (gpu,) and run.gpus_per_process == per_process and run.shared_device == shared
    assert all(m.time_s > 0 for m in measurements)


def test_the_in_place_time_of_a_row_is_read():
    _, measurements = read_measurements(str(ROOT / "docs/examples/all_reduce_perf-h100-ib-2x8.txt"))
    first = measurements[0]
    assert (first.bytes, first.time_s) == (8, pytest.approx(24.70e-6)) and first.run.nccl_version == "2.26.2"


# --- variants made from the shipped logs --------------------------------------------------------------


def _log(name: str) -> str:
    found = next(path for path in LOGS if path.name == name)
    return found.read_text(encoding="utf-8")


def test_mpirun_tag_output_and_srun_labels(tmp_path):
    """`mpirun --tag-output` (the RTX 5090 log as printed) and `srun --label` prefixes."""
    tagged = _log("all_gather_perf-rtx5090-socket.txt")
    assert "[1,0]<stdout>:" in tagged and "[1,1]<stderr>:" in tagged
    labelled = tmp_path / "all_reduce_perf-srun.txt"
    labelled.write_text("\n".join(f"0: {line}" for line in _log("all_reduce_perf-h100-ib-2x8.txt").splitlines()[1:]))
    _, measurements = read_measurements(str(labelled))
    assert len(measurements) == 32 and measurements[-1].span.hosts == 2


def test_one_size_and_several_runs_in_one_file(tmp_path):
    text = _log("all_reduce_perf-h100-ib-4x8.txt")
    lines = text.splitlines()
    rows = [i for i, line in enumerate(lines) if line.strip()[:1].isdigit() and len(line.split()) == 13]
    one_size = tmp_path / "all_reduce_perf-one-size.txt"
    one_size.write_text("\n".join(lines[:rows[0]] + [lines[rows[-1]]] + lines[rows[-1] + 1:]) + "\n")
    _, measurements = read_measurements(str(one_size))
    assert [m.bytes for m in measurements] == [17179869184]
    twice = tmp_path / "all_reduce_perf-twice.txt"
    twice.write_text(text + "\n" + text)
    _, measurements = read_measurements(str(twice))
    assert len(measurements) == 64 and {m.span.hosts for m in measurements} == {4}


def test_a_damaged_nccl_tests_file_gets_an_nccl_tests_error(tmp_path):
    text = _log("all_gather_perf-rtx5090-socket.txt")
    kept = [line for line in text.splitlines() if not line.split(":", 1)[-1].strip()[:1].isdigit()]
    broken = tmp_path / "all_gather_perf-broken.txt"
    broken.write_text("\n".join(kept) + "\n")
    with pytest.raises(UsageError) as error:
        read_measurements(str(broken))
    message = str(error.value)
    assert "looks like nccl-tests output" in message and "no result rows" in message and "CSV" not in message
    headerless = tmp_path / "all_gather_perf-noranks.txt"
    headerless.write_text("\n".join(line for line in text.splitlines() if "Rank" not in line) + "\n")
    with pytest.raises(UsageError, match="cannot tell the ranks"):
        read_measurements(str(headerless))


def test_synth_bench_csv_is_accepted(tmp_path):
    """What `synth bench` writes: the baseline all_reduce rows are calls of one group."""
    csv = tmp_path / "bench.csv"
    csv.write_text(
        "# command: synth bench --topology emu-2x4 --axes data=8 --reduce data --backend gloo -b 65536 -e 262144 -f 4\n"
        "# backend: gloo; 8 processes; 10 iteration(s) after 3 warm-up run(s)\n"
        "placement,hierarchy,role,program,bytes,count,time_us,algbw_gbs,busbw_gbs,check,measured_rank\n"
        '"[[2,4]]","node,gpu",synthesized,ReduceScatter(InsideGroup(gpu)); AllReduce(Parallel(node)); '
        'AllGather(InsideGroup(gpu)),65536,16384,20407.264,0.003,0.005,ok,2\n'
        '"[[2,4]]","node,gpu",default all-reduce,AllReduce(InsideGroup(node)),65536,16384,18000.0,0.003,0.006,ok,1\n'
        '"[[2,4]]","node,gpu",baseline all_reduce,torch.distributed.all_reduce,262144,65536,30000.0,0.008,0.015,not run,\n')
    kind, measurements = read_measurements(str(csv))
    assert kind == "synth bench CSV"
    assert [(m.collective, m.bytes, m.backend) for m in measurements] == [("AllReduce", 65536, "gloo"),
                                                                         ("AllReduce", 262144, "gloo")]
    assert measurements[0].span.level == "node" and measurements[0].span.units == 2
    assert measurements[0].span.per_unit == 4


# --- calibrating on them ------------------------------------------------------------------------------


def test_calibrate_on_a_real_log_prints_its_per_size_errors(tmp_path, run_cli):
    out = tmp_path / "h100-ib.toml"
    code, stdout, stderr = run_cli("calibrate", str(ROOT / "docs/examples/all_reduce_perf-h100-ib-2x8.txt"),
                                   "--topology", "hgx-h100-ib-4x8", "-o", str(out), "--json")
    assert code == 0, stderr
    result = json.loads(stdout)
    (fit,) = result["fits"]
    (group,) = fit["groups"]
    assert fit["level"] == "node" and len(group["sizes"]) == 32
    assert {size["bound_by"] for size in group["sizes"]} >= {"latency", "bandwidth"}
    assert {(s["algorithm"], s["protocol"]) for s in group["sizes"]} >= {("tree", "LL"), ("nvls_tree", "Simple")}
    assert group["relative_rms"] < 0.12
    written = load_topology(out)
    (record,) = written.calibration
    assert (record.level, record.nodes, record.ranks_per_node) == ("node", 2, 8)
    factors = dict(written.levels[0].protocols)
    assert factors["LL"].bandwidth.source.startswith("fitted by synth calibrate (NCCL model)")
    assert "at which NCCL picks LL" in factors["LL"].bandwidth.source


def test_a_poor_fit_is_flagged_and_a_multi_node_log_without_topology_says_what_it_assumed(run_cli):
    code, stdout, stderr = run_cli("calibrate", str(ROOT / "tests/data/nccl-logs/h100-2x8-dgx0607-all_reduce_perf.txt"))
    assert code == 0, stderr
    assert "assumed: between hosts: one 400 Gb/s InfiniBand NIC per GPU" in stderr
    assert "assumed: one process drove 8 GPUs (nccl-tests -g 8)" in stderr
    assert "warning: poor fit" in stderr and "per-size error" in stderr
    assert "[[calibration]]" in stdout


def test_a_log_of_ranks_sharing_one_gpu_calibrates_as_loopback(run_cli):
    code, stdout, stderr = run_cli("calibrate", str(ROOT / "docs/examples/all_gather_perf-rtx5090-socket.txt"))
    assert code == 0, stderr
    assert "assumed: ranks share one GPU: taken as separate NCCL hosts on loopback TCP" in stderr
    assert 'kind = "loopback"' in stdout and 'generation = "blackwell"' in stdout


def test_how_sure_a_ranking_is(tmp_path, run_cli):
    uncalibrated = load_topology("hgx-h100-ib-4x8")
    assert model_error(uncalibrated, "AllReduce", 2, 8, 2 ** 20).describe().startswith("uncalibrated")
    out = tmp_path / "cal.toml"
    assert run_cli("calibrate", str(ROOT / "docs/examples/all_reduce_perf-h100-ib-2x8.txt"), "-t", "hgx-h100-ib-4x8",
                   "-o", str(out))[0] == 0
    calibrated = load_topology(out)
    exact = model_error(calibrated, "AllReduce", 2, 8, 2 ** 20)
    assert exact.exact and exact.record.rms_error < 0.12 and "on the measured configuration" in exact.describe()
    near = model_error_for_group(calibrated, list(range(32)), "AllReduce", 2 ** 20)
    assert not near.exact and "nearest measured configuration" in near.describe() and near.record.nodes == 2
    # A data x model job whose reduction groups are the measured 2 nodes x 8 GPUs.
    code, stdout, stderr = run_cli("rank", "--topology", str(out), "--axes", "model=2,data=16", "--reduce", "data",
                                   "--placement", "[[2,1],[2,8]]", "--bytes", "1MiB", "--top", "1")
    assert code == 0, stderr
    assert "model error" in stdout and "on the measured configuration" in stdout
