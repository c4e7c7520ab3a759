"""`synth calibrate` (issues 3 and 9): measurements generated from known figures plus 3% noise
(by the NCCL model for nccl, by the link model for gloo), in every supported format, for two
levels and every collective, are fitted back within 5%; the written topology loads and
predicts the measurements within the noise; bad input is one line and exit code 2."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from synth.calibrate import read_measurements
from synth.errors import UsageError
from synth.hierarchy import build_hierarchy
from synth.calibrate.measurements import CALIBRATED


def collective_names():
    """The collectives the NCCL model's own fit covers (all-to-all, fitted apart through its
    send/recv flows, is tested in tests/test_calibrate_all_to_all.py)."""
    return tuple(name for name in CALIBRATED if name != "AllToAll")
from synth.placement import make_placement, parse_axes
from synth.model import CostEngine, StepCalls, cost_context
from synth.model.nccl.hardware import estimate_group
from synth.topology_file import load_topology

NODES, GPUS = 2, 4
SIZES = [2**e for e in range(3, 31)]  # 8 B .. 1 GiB, nccl-tests -b 8 -e 1G -f 2
NOISE = 0.03
CYCLES = 4  # each size measured this many times (nccl-tests -N 4), as a careful user would
BUS = {"AllReduce": lambda n: 2 * (n - 1) / n, "ReduceScatter": lambda n: (n - 1) / n,
       "AllGather": lambda n: (n - 1) / n, "Broadcast": lambda n: 1.0, "Reduce": lambda n: 1.0}
TEST_NAMES = {"AllReduce": "all_reduce", "ReduceScatter": "reduce_scatter", "AllGather": "all_gather",
              "Broadcast": "broadcast", "Reduce": "reduce"}

NCCL_TRUTH = """\
name = "truth-nccl"

[[levels]]
name = "node"
size = 2
bandwidth = { value = "400 Gb/s", source = "test truth" }
latency = { value = "9.6 us", source = "test truth" }
uplinks = { count = 4, bandwidth = "400 Gb/s", source = "test truth" }
link = { kind = "infiniband", source = "test truth" }
transport = { kind = "ib", source = "test truth" }
efficiency = { value = 0.9, source = "test truth" }
overhead = { value = "4 us", source = "test truth" }

[[levels]]
name = "gpu"
size = 4
bandwidth = { value = "450 GB/s", source = "test truth" }
latency = { value = "3.4 us", source = "test truth" }
link = { kind = "nvswitch", source = "test truth" }
efficiency = { value = 0.7, source = "test truth" }
overhead = { value = "2 us", source = "test truth" }

[nccl]
generation = "hopper"
source = "test truth"
"""

# The same system as NCCL_TRUTH with only its facts: line rates and link kinds.
NCCL_BASE = "\n".join(line for line in NCCL_TRUTH.replace("truth-nccl", "base-nccl").splitlines()
                      if not line.startswith(("efficiency", "overhead"))) + "\n"

# gloo's collectives differ from one another: per-collective figures at both levels.
GLOO_TRUTH = """\
name = "truth-gloo"

[[levels]]
name = "node"
size = 2
bandwidth = { value = "1.25 GB/s", source = "test truth" }
latency = { value = "60 us", source = "test truth" }
uplinks = { count = 4, bandwidth = "1.25 GB/s", source = "test truth" }

[levels.collectives.AllGather]
bandwidth = { value = "0.6 GB/s", source = "test truth" }
latency = { value = "90 us", source = "test truth" }

[levels.collectives.Broadcast]
bandwidth = { value = "2 GB/s", source = "test truth" }
latency = { value = "40 us", source = "test truth" }

[[levels]]
name = "gpu"
size = 4
bandwidth = { value = "3 GB/s", source = "test truth" }
latency = { value = "15 us", source = "test truth" }

[levels.collectives.ReduceScatter]
bandwidth = { value = "2 GB/s", source = "test truth" }
latency = { value = "25 us", source = "test truth" }
"""

BASE = """\
name = "base"

[[levels]]
name = "node"
size = 2
bandwidth = { value = "10 GB/s", source = "estimate: a guess the calibration replaces" }
latency = { value = "5 us", source = "estimate: a guess the calibration replaces" }
uplinks = { count = 4, bandwidth = "10 GB/s", source = "estimate: four NICs" }

[[levels]]
name = "gpu"
size = 4
bandwidth = { value = "100 GB/s", source = "estimate: a guess" }
latency = { value = "1 us", source = "estimate: a guess" }
"""


# --- measurements from known figures ---------------------------------------------------------------


class Truth:
    """Times of single calls alone, as the simulator costs them on a known topology."""

    def __init__(self, path, backend: str):
        self.topology = load_topology(path)
        self.backend = backend
        self.path = path
        placement = make_placement(self.topology, parse_axes(f"data={NODES * GPUS}"), [[NODES, GPUS]])
        hierarchy = build_hierarchy(placement, ("data",))
        self.engine = CostEngine(cost_context(hierarchy, self.topology, backend))
        self.member_of = {device: member for member, device in enumerate(hierarchy.groups[0])}

    def time(self, collective: str, devices: tuple[int, ...], nbytes: int) -> float:
        if self.backend == "nccl":  # the NCCL model (synth/model/nccl/) that synth calibrate fits for nccl
            return estimate_group(self.topology, devices, collective, nbytes).time_s
        members = tuple(sorted(self.member_of[d] for d in devices))
        # chunks = N of the all-device group: the call's range is then exactly nbytes
        step = StepCalls(collective, (members,), (NODES * GPUS,))
        return float(self.engine.figures([step], [nbytes]).time_s[0, 0])


ONE_HOST = tuple(range(GPUS))  # 4 ranks on one host: the gpu level
ALL_HOSTS = tuple(range(NODES * GPUS))  # 2 hosts x 4 ranks: the node level
ONE_PER_NODE = tuple(node * GPUS for node in range(NODES))  # one rank per node: the node level


def noisy(rng, seconds: float) -> float:
    return seconds * (1 + NOISE * rng.standard_normal())


def nccl_time_text(microseconds: float) -> str:
    """nccl-tests' own formatting of a time (src/common.cu)."""
    if microseconds >= 10000:
        return f"{microseconds:7.0f}"
    if microseconds >= 100:
        return f"{microseconds:7.1f}"
    return f"{microseconds:7.2f}"


def nccl_text(truth: Truth, collective: str, devices: tuple[int, ...], rng, named: bool = True) -> str:
    n = len(devices)
    hosts = sorted({d // GPUS for d in devices})
    lines = ["# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20 "
             "agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]
    for rank, device in enumerate(devices):
        lines.append(f"#  Rank {rank:2d} Group  0 Pid {1000 + rank:6d} on {'host' + str(device // GPUS):>10s} "
                     f"device {device % GPUS:2d} [0x{device:02x}] NVIDIA A100-SXM4-80GB")
    if len(hosts) > 1:
        lines.append("host0:1000:1000 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>")
    lines += ["#", "#                                                              out-of-place                  "
              "     in-place          ",
              "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
              "algbw   busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  "
              "(GB/s)  (GB/s)       "]
    redop = "none" if collective in ("AllGather", "Broadcast") else "sum"
    root = 0 if collective in ("Broadcast", "Reduce") else -1
    for cycle, nbytes in ((c, b) for c in range(CYCLES) for b in SIZES):
        if cycle and nbytes == SIZES[0]:
            lines.append(f"# Testing {cycle + 1} cycle.")
        count = nbytes // 4 // (n if collective in ("AllGather", "ReduceScatter") else 1)
        cells = []
        for _ in ("out-of-place", "in-place"):
            seconds = noisy(rng, truth.time(collective, devices, nbytes))
            algbw = nbytes / seconds / 1e9
            cells.append(f"{nccl_time_text(seconds * 1e6)}  {algbw:6.2f}  {algbw * BUS[collective](n):6.2f}  {0:5d}")
        lines.append(f"{nbytes:12d}  {count:12d}  {'float':>8s}  {redop:>6s}  {root:6d}  " + "  ".join(cells))
        if nbytes == 2**20 and len(hosts) > 1:
            lines.append("host1:1004:1010 [0] NCCL INFO comm 0x55d5 rank 4 nranks 8 - Init COMPLETE")
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 12.3456 ", "#"]
    command = f"$ mpirun -np {n} ./build/{TEST_NAMES[collective]}_perf -b 8 -e 1G -f 2\n" if named else ""
    return command + "\n".join(lines) + "\n"


def nccl_csv(truth: Truth, collective: str, devices: tuple[int, ...], rng) -> str:
    """rccl-tests --output_format csv: MPI rows carry an unnamed nodes value after the name."""
    n = len(devices)
    hosts = len({d // GPUS for d in devices})
    if hosts == 1:
        lines = ["collective, gpus, size, type, redop, inplace, time, algbw, busbw, #wrong"]
        group = f"{n}"
    else:
        lines = ["collective, ranks, rankspernode, gpusperrank, size, type, redop, inplace, time, algbw, busbw, #wrong"]
        group = f"{hosts}, {n}, {n // hosts}, 1"
    redop = "none" if collective in ("AllGather", "Broadcast") else "sum"
    for nbytes in SIZES * CYCLES:
        recorded = nbytes // n if collective == "ReduceScatter" else nbytes  # rccl-tests records expectedBytes
        for inplace in (0, 1):
            seconds = noisy(rng, truth.time(collective, devices, nbytes))
            algbw = nbytes / seconds / 1e9
            lines.append(f"{collective}, {group}, {recorded}, float, {redop}, {inplace}, {seconds * 1e6}, {algbw}, "
                         f"{algbw * BUS[collective](n)}, 0")
    return "\n".join(lines) + "\n"


def bench_csv(truth: Truth, rng) -> str:
    """Our CSV: every collective at both levels, groups of one rank per node and of all ranks."""
    lines = ["collective,level,group_size,bytes,time_s,backend,ranks_per_unit"]
    groups = [("gpu", ONE_HOST, 1), ("node", ONE_PER_NODE, 1), ("node", ALL_HOSTS, GPUS)]
    for collective in collective_names():
        for level, devices, per_unit in groups:
            for nbytes in SIZES * CYCLES:
                seconds = noisy(rng, truth.time(collective, devices, nbytes))
                lines.append(f"{collective},{level},{len(devices)},{nbytes},{seconds!r},{truth.backend},{per_unit}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def files(tmp_path):
    (tmp_path / "truth-nccl.toml").write_text(NCCL_TRUTH)
    (tmp_path / "base-nccl.toml").write_text(NCCL_BASE)
    (tmp_path / "truth-gloo.toml").write_text(GLOO_TRUTH)
    (tmp_path / "base.toml").write_text(BASE)
    return tmp_path


def write_nccl_files(tmp_path, kind: str, seed: int) -> list[str]:
    truth, rng, paths = Truth(tmp_path / "truth-nccl.toml", "nccl"), np.random.default_rng(seed), []
    for collective in collective_names():
        for where, devices in (("gpu", ONE_HOST), ("node", ALL_HOSTS)):
            if kind == "text":
                path = tmp_path / f"{TEST_NAMES[collective]}_perf-{where}.txt"
                path.write_text(nccl_text(truth, collective, devices, rng))
            else:
                path = tmp_path / f"{TEST_NAMES[collective]}-{where}.csv"
                path.write_text(nccl_csv(truth, collective, devices, rng))
            paths.append(str(path))
    return paths


def fits_of(stdout: str) -> dict[tuple[str, str], dict]:
    return {(fit["level"], fit["collective"]): fit for fit in json.loads(stdout)["fits"]}


def assert_recovered(fits, truth_path, collectives=collective_names()):
    truth = load_topology(truth_path)
    for level in ("node", "gpu"):
        for collective in collectives:
            fit = fits[(level, collective)]
            expected = truth.for_collective(collective).levels[truth.level_index(level)]
            assert fit["bandwidth_Bps"] == pytest.approx(expected.bandwidth.value, rel=0.05), (level, collective, fit)
            assert fit["latency_s"] == pytest.approx(expected.latency.value, rel=0.05), (level, collective, fit)
            assert fit["relative_rms"] < 2 * NOISE


# --- recovery and round trip ------------------------------------------------------------------------


def nccl_fits(stdout: str) -> dict[str, dict]:
    return {fit["level"]: fit for fit in json.loads(stdout)["fits"]}


@pytest.mark.parametrize("kind", ["text", "csv"])
def test_nccl_tests_output_recovers_the_figures(files, run_cli, kind):
    """The NCCL model's figures come back from its own times plus 3% noise: each level's
    efficiency (from the sizes its links bound) and overhead (from the latency-bound sizes);
    the written topology then predicts the truth's times (one fit per format checks both)."""
    paths = write_nccl_files(files, kind, seed=3)
    out = files / "calibrated.toml"
    code, stdout, stderr = run_cli("calibrate", *paths, "--topology", str(files / "base-nccl.toml"), "-o", str(out),
                                   "--json")
    assert code == 0, stderr
    result = json.loads(stdout)
    assert result["model"] == "nccl"
    assert {f["format"] for f in result["files"]} == {"nccl-tests text" if kind == "text" else "nccl-tests CSV"}
    fits = nccl_fits(stdout)
    assert fits["gpu"]["efficiencies"]["gpu"] == pytest.approx(0.7, rel=0.05)
    assert fits["node"]["efficiencies"]["node"] == pytest.approx(0.9, rel=0.05)
    assert fits["gpu"]["overhead_s"] == pytest.approx(2e-6, abs=1e-6)
    assert fits["node"]["overhead_s"] == pytest.approx(4e-6, abs=1.5e-6)
    assert result["replay_relative_rms"] < 2 * NOISE
    written = load_topology(out)
    assert written.levels[1].efficiency.value == pytest.approx(0.7, rel=0.05)
    assert written.levels[1].efficiency.source.startswith("fitted by synth calibrate (NCCL model)")
    assert written.levels[0].bandwidth.value == pytest.approx(50e9)  # the line rate stays the fact
    records = {(r.level, r.collective, r.nodes, r.ranks_per_node) for r in written.calibration}
    assert ("node", "AllGather", 2, 4) in records and ("gpu", "AllReduce", 1, 4) in records
    assert all(r.rms_error < 2 * NOISE for r in written.calibration)
    assert_round_trip(files, out)


def assert_round_trip(files, out):
    """The written topology predicts what the truth does, every collective within and across
    hosts, from latency- to bandwidth-bound sizes (the round trip through the model)."""
    truth, written = Truth(files / "truth-nccl.toml", "nccl"), Truth(out, "nccl")
    for collective in collective_names():
        for devices in (ONE_HOST, ALL_HOSTS):
            for nbytes in (8, 2**16, 2**24, 2**30):
                expected = truth.time(collective, devices, nbytes)
                assert written.time(collective, devices, nbytes) == pytest.approx(expected, rel=0.05)


def test_benchmark_csv_recovers_per_collective_figures_for_gloo(files, run_cli):
    path = files / "bench.csv"
    path.write_text(bench_csv(Truth(files / "truth-gloo.toml", "gloo"), np.random.default_rng(5)))
    out = files / "calibrated.toml"
    code, stdout, stderr = run_cli("calibrate", str(path), "-t", str(files / "base.toml"), "-o", str(out), "--json")
    assert code == 0, stderr
    assert json.loads(stdout)["backend"] == "gloo"  # from the backend column
    fits = fits_of(stdout)
    assert_recovered(fits, files / "truth-gloo.toml")
    written = load_topology(out)
    node, gpu = written.levels
    assert [name for name, _ in node.collectives] == ["ReduceScatter", "AllGather", "Reduce", "Broadcast"]
    assert node.figures_for("AllGather")[0].value == pytest.approx(0.6e9, rel=0.05)
    assert node.uplinks.count == 4  # uplinks keep the base ratio to the level's bandwidth
    assert node.uplinks.bandwidth.value == pytest.approx(node.bandwidth.value * 10e9 / 10e9)
    assert "fitted by synth calibrate (backend gloo, AllReduce) from" in node.bandwidth.source
    assert "R^2=" in node.bandwidth.source and "relative RMS error" in node.bandwidth.source


def test_the_written_topology_predicts_the_measurements_in_the_simulator(files, run_cli):
    """Round trip: load the file, cost every measured call with the simulator itself."""
    truth = Truth(files / "truth-gloo.toml", "gloo")
    path = files / "bench.csv"
    path.write_text(bench_csv(truth, np.random.default_rng(11)))
    out = files / "calibrated.toml"
    code, stdout, stderr = run_cli("calibrate", str(path), "-t", str(files / "base.toml"), "-o", str(out))
    assert code == 0, stderr
    assert f"wrote {out}" in stdout and "AllGather" in stdout  # with -o the table goes to standard output
    predicted = Truth(out, "gloo")
    errors = []
    for number, line in enumerate(path.read_text().splitlines()[1:]):
        collective, level, size, nbytes, seconds, _, per_unit = line.split(",")
        devices = {"gpu": ONE_HOST, "node": ALL_HOSTS if per_unit == str(GPUS) else ONE_PER_NODE}[level]
        errors.append(predicted.time(collective, devices, int(nbytes)) / float(seconds) - 1)
    errors = np.array(errors)
    assert np.sqrt(np.mean(errors ** 2)) < 1.5 * NOISE
    assert np.max(np.abs(errors)) < 5 * NOISE




def test_without_a_base_nccl_tests_hosts_and_ranks_define_the_levels(files, run_cli):
    """Without --topology the rank lines make the system (2 hosts of 4 A100 here) and every
    figure the output cannot tell is assumed, and said."""
    paths = write_nccl_files(files, "text", seed=4)
    code, stdout, stderr = run_cli("calibrate", *paths)
    assert code == 0, stderr
    assert 'name = "nccl-tests-calibrated"' in stdout
    assert "assumed: between hosts: one 200 Gb/s InfiniBand NIC per GPU" in stderr
    assert "assumed: GPU NVIDIA A100-SXM4-80GB: ampere, nvswitch" in stderr
    written = files / "inferred.toml"
    written.write_text(stdout)
    topology = load_topology(written)
    assert topology.level_names == ("node", "gpu") and topology.sizes == (2, 4)
    assert topology.nccl.generation == "ampere" and topology.levels[0].link.kind == "infiniband"
    assert topology.levels[1].bandwidth.value == pytest.approx(300e9)  # the A100's NVLink line rate


def test_level_option_applies_to_a_whole_file(files, run_cli):
    truth, rng = Truth(files / "truth-nccl.toml", "nccl"), np.random.default_rng(1)
    inner = files / "all_reduce_perf.txt"
    inner.write_text(nccl_text(truth, "AllReduce", ONE_HOST, rng))
    base = str(files / "base-nccl.toml")
    code, stdout, stderr = run_cli("calibrate", str(inner), "-t", base, "--level", "gpu", "--json")
    assert code == 0, stderr
    assert set(nccl_fits(stdout)) == {"gpu"}
    code, _, stderr = run_cli("calibrate", str(inner), "-t", base, "--level", "node")
    assert code == 2 and "does not fit level node" in stderr


def test_table_columns_tell_the_collective_when_nothing_names_it(files):
    truth, rng = Truth(files / "truth-nccl.toml", "nccl"), np.random.default_rng(2)
    for collective in collective_names():
        path = files / f"run-{collective}.log"
        path.write_text(nccl_text(truth, collective, ALL_HOSTS, rng, named=False))
        if collective == "AllGather":  # alltoall_perf prints the same redop, root and busbw factor
            with pytest.raises(UsageError, match="fits AllGather or AllToAll.*all_gather_perf.txt or alltoall_perf.txt"):
                read_measurements(str(path))
            continue
        kind, measurements = read_measurements(str(path))
        assert kind == "nccl-tests text"
        assert {m.collective for m in measurements} == {collective}
        assert {m.span.hosts for m in measurements} == {2} and len(measurements) == len(SIZES) * CYCLES


# --- parsers on real-looking output -----------------------------------------------------------------


OLD_NCCL_TESTS = """\
# nThread 1 nGpus 8 minBytes 8 maxBytes 268435456 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#   Rank  0 Pid  40210 on    dgx01 device  0 [0x07] Tesla V100-SXM2-32GB
#   Rank  1 Pid  40210 on    dgx01 device  1 [0x0a] Tesla V100-SXM2-32GB
#
#                                                     out-of-place                       in-place
#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2   float     sum    14.95    0.00    0.00  0e+00    14.82    0.00    0.00  0e+00
     1048576        262144   float     sum    31.60   33.18   33.18  0e+00    31.47   33.32   33.32  0e+00
   268435456      67108864   float     sum   3690.0   72.75   72.75  0e+00   3689.4   72.76   72.76  0e+00
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 35.4
"""


def test_older_nccl_tests_output_without_group_or_root(tmp_path):
    path = tmp_path / "all_reduce_perf.out"
    path.write_text(OLD_NCCL_TESTS)
    kind, measurements = read_measurements(str(path))
    assert kind == "nccl-tests text"
    assert [(m.collective, m.bytes, m.time_s) for m in measurements] == [
        ("AllReduce", 8, pytest.approx(14.82e-6)), ("AllReduce", 1048576, pytest.approx(31.47e-6)),
        ("AllReduce", 268435456, pytest.approx(3689.4e-6))]
    assert measurements[0].span.units == 2 and measurements[0].span.hosts == 1
    assert measurements[0].where == f"{path}:10"
    noisy_path = tmp_path / "all_reduce_perf.noisy"
    noisy_path.write_text(OLD_NCCL_TESTS.replace("     1048576", "[dgx01:40210] mca: warning: a message\n     1048576"))
    assert len(read_measurements(str(noisy_path))[1]) == 3


def test_rccl_tests_csv_single_process(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text(textwrap.dedent("""\
        collective, gpus, size, type, redop, inplace, time, algbw, busbw, #wrong
        ReduceScatter, 8, 131072, float, sum, 0, 30.5, 34.38, 30.08, 0
        ReduceScatter, 8, 131072, float, sum, 1, 30.1, 34.84, 30.48, N/A
        """))
    kind, [measurement] = read_measurements(str(path))
    assert kind == "nccl-tests CSV"
    assert measurement.collective == "ReduceScatter" and measurement.bytes == 8 * 131072  # B from the per-rank size
    assert measurement.time_s == pytest.approx(30.1e-6) and measurement.span.units == 8


# --- bad input: one line, exit 2 -----------------------------------------------------------------------


BENCH_HEADER = "collective,level,group_size,bytes,time_s\n"
GLOO_HEADER = "collective,level,group_size,bytes,time_s,backend\n"


@pytest.mark.parametrize("name, text, fragment", [
    ("empty.csv", "", "empty"),
    ("notes.txt", "hello\nworld\n", "not a measurement file"),
    ("header.csv", BENCH_HEADER, "no rows"),
    ("other.csv", "a,b,c\n1,2,3\n", "neither our benchmark CSV"),
    ("typo.csv", "collective,level,group_size,bytes,time_us\nAllReduce,gpu,4,8,1e-5\n", "did you mean 'time_s'"),
    ("alltoallv.csv", BENCH_HEADER + "AllToAllv,gpu,4,1024,1e-5\n", "AllToAllv is not a collective programs use"),
    ("unknown.csv", BENCH_HEADER + "Gossip,gpu,4,1024,1e-5\n", "unknown collective 'Gossip'"),
    ("size.csv", BENCH_HEADER + "AllReduce,gpu,4,12x,1e-5\n", "size.csv:2: bytes"),
    ("fraction.csv", BENCH_HEADER + "AllReduce,gpu,4,1.5,1e-5\n", "whole number of bytes"),
    ("time.csv", BENCH_HEADER + "AllReduce,gpu,4,1024,-3\n", "time '-3' is not a positive number"),
    ("fields.csv", BENCH_HEADER + "AllReduce,gpu,4,1024\n", "4 fields where the header has 5"),
    ("level.csv", BENCH_HEADER + "AllReduce,rack,2,1024,1e-5\nAllReduce,rack,2,4096,2e-5\n",
     "level 'rack' is not a level of topology base"),
    ("big.csv", BENCH_HEADER + "AllReduce,gpu,8,1024,1e-5\n", "does not fit level gpu"),
    ("one_size.csv", GLOO_HEADER + "AllReduce,gpu,4,1024,1e-5,gloo\nAllReduce,gpu,4,1024,1.1e-5,gloo\n",
     "at least two sizes"),
    ("flat.csv", GLOO_HEADER + "AllReduce,gpu,4,1024,1e-3,gloo\nAllReduce,gpu,4,1048576,1e-5,gloo\n",
     "do not grow with the size"),
    ("backend.csv", "collective,level,group_size,bytes,time_s,backend\nAllReduce,gpu,4,8,1e-5,mpi\n", "unknown backend 'mpi'"),
    ("nccl_norows.txt", OLD_NCCL_TESTS.split("           8")[0], "no result rows"),
    ("nccl_badsize.txt", OLD_NCCL_TESTS.replace("     1048576", "     1O48576"), "size '1O48576' is not a whole number"),
    ("nccl_short.txt", OLD_NCCL_TESTS.replace("   3690.0   72.75", "   3690.0"), "fields where the header has 12"),
    ("nccl_noranks.txt", "\n".join(line for line in OLD_NCCL_TESTS.splitlines() if "Rank" not in line),
     "cannot tell the ranks"),
    ("alltoall_perf.txt", OLD_NCCL_TESTS, "named alltoall_perf but its table (redop, root, count, busbw/algbw) fits "
     "AllReduce, Reduce"),
    ("sendrecv_perf.txt", OLD_NCCL_TESTS, "SendRecv is not a collective programs use"),
    ("all_gather_perf.txt", OLD_NCCL_TESTS, "named all_gather_perf but its table (redop, root, count, busbw/algbw) fits "
     "AllReduce, Reduce"),
    ("nccl_unnamed.txt", OLD_NCCL_TESTS, "cannot tell which collective"),
    ("mixed_hosts.txt", OLD_NCCL_TESTS.replace("on    dgx01 device  1", "on    dgx02 device  1")
     .replace("#   Rank  1", "#   Rank  2 Pid  40211 on    dgx02 device  2 [0x0b] x\n#   Rank  1"),
     "hosts run different numbers of ranks"),
    ("rccl.csv", "collective, size, time\nAllReduce, 1024, 10\n", "no gpus or ranks column"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, run_cli, name, text, fragment):
    (tmp_path / "base.toml").write_text(BASE)
    path = tmp_path / name
    path.write_text(text)
    code, stdout, stderr = run_cli("calibrate", str(path), "--topology", str(tmp_path / "base.toml"))
    assert code == 2, (stdout, stderr)
    assert stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("synth calibrate: "), stderr
    assert fragment in lines[0], lines[0]


def test_cli_misuse_is_exit_2(tmp_path, run_cli, files):
    csv = files / "b.csv"
    csv.write_text(BENCH_HEADER + "AllReduce,gpu,4,8,1e-5\nAllReduce,gpu,4,1024,2e-5\n")
    cases = [
        (("calibrate", str(tmp_path / "missing.csv")), "no such file"),
        (("calibrate", str(csv)), "give a base topology"),
        (("calibrate", str(csv), "--level", "gpu"), "give --topology BASE too"),
        (("calibrate", str(csv), "-t", "no-such-topology"), "unknown topology"),
        (("calibrate", str(csv), "-t", str(files / "base.toml"), "--backend", "mpi"), "invalid choice"),
    ]
    gloo = files / "g.csv"
    gloo.write_text("collective,level,group_size,bytes,time_s,backend\nAllReduce,gpu,4,8,1e-5,gloo\n")
    cases.append((("calibrate", str(gloo), "-t", str(files / "base.toml"), "--backend", "nccl"), "measured with gloo"))
    for args, fragment in cases:
        code, _, stderr = run_cli(*args)
        assert code == 2 and fragment in stderr and len(stderr.strip().splitlines()) == 1, (args, stderr)


def test_a_multi_host_group_needs_inner_figures(files, run_cli):
    (files / "bare.toml").write_text("name = \"bare\"\n[[levels]]\nname = \"node\"\nsize = 2\n"
                                     "[[levels]]\nname = \"gpu\"\nsize = 4\n")
    truth, rng = Truth(files / "truth-nccl.toml", "nccl"), np.random.default_rng(0)
    path = files / "all_gather_perf.txt"
    path.write_text(nccl_text(truth, "AllGather", ALL_HOSTS, rng))
    code, _, stderr = run_cli("calibrate", str(path), "-t", str(files / "bare.toml"))
    assert code == 2 and "level(s) gpu have no bandwidth and latency" in stderr
    code, _, stderr = run_cli("calibrate", str(path), "-t", str(files / "bare.toml"), "--backend", "gloo")
    assert code == 2 and "measured with nccl" in stderr


def test_reading_a_directory_or_binary_is_refused(tmp_path):
    with pytest.raises(UsageError, match="not a file"):
        read_measurements(str(tmp_path))
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UsageError, match="cannot read it as UTF-8"):
        read_measurements(str(binary))


def test_level_option_fills_an_empty_level_column_and_must_name_a_base_level(files, run_cli):
    truth, rng = Truth(files / "truth-gloo.toml", "gloo"), np.random.default_rng(6)
    rows = [f"Broadcast,,4,{nbytes},{noisy(rng, truth.time('Broadcast', ONE_HOST, nbytes))!r}" for nbytes in SIZES]
    path = files / "no-level.csv"
    path.write_text(BENCH_HEADER + "\n".join(rows) + "\n")
    base = str(files / "base.toml")
    code, stdout, stderr = run_cli("calibrate", str(path), "-t", base, "--level", "gpu", "--backend", "gloo", "--json")
    assert code == 0, stderr
    fit = fits_of(stdout)[("gpu", "Broadcast")]
    assert fit["bandwidth_Bps"] == pytest.approx(3e9, rel=0.05) and fit["level_figure"]  # the only one: the level's
    code, _, stderr = run_cli("calibrate", str(path), "-t", base)
    assert code == 2 and "empty level" in stderr
    code, _, stderr = run_cli("calibrate", str(path), "-t", base, "--level", "rack")
    assert code == 2 and "level 'rack' is not a level of topology base (node, gpu)" in stderr


def test_a_negative_latency_is_clamped_with_a_note(files, run_cli):
    """Calls faster than gloo's modelled launch cost (20 us) alone: no latency is left for the level."""
    rows = [f"AllReduce,gpu,4,{nbytes},{5e-6 + 1.5 * nbytes / 1e9!r},gloo" for nbytes in SIZES]
    path = files / "fast.csv"
    path.write_text("collective,level,group_size,bytes,time_s,backend\n" + "\n".join(rows) + "\n")
    out = files / "fast.toml"
    code, stdout, stderr = run_cli("calibrate", str(path), "-t", str(files / "base.toml"), "-o", str(out), "--json")
    assert code == 0, stderr
    fit = fits_of(stdout)[("gpu", "AllReduce")]
    assert fit["latency_s"] == 1e-9 and "clamped to 1 ns" in fit["notes"][0]
    assert fit["relative_rms"] > 0.5  # the model cannot fit calls below its launch cost: the table says so
    level = load_topology(out).levels[1]
    assert level.latency.value == pytest.approx(1e-9) and "clamped to 1 ns" in level.latency.source
