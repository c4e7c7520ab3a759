"""The emulated cluster: its plan (no root needed), then for real as root: up/down and every
failure path leave the machine as they found it, tbf shaping holds the configured rates, and
a 2x2 bench runs end to end with each rank in its node's namespace.

Select with `pytest -m emulate`; the tests that touch the machine skip without root or
without `ip netns`. Clusters get a per-process name, so a user's `synth` cluster is never hit.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from synth.emulate import host
from synth.emulate.host import bring_up, emulated_cluster, find_cluster, tear_down
from synth.emulate.layout import (AUTO_BUDGET, NODE_INTERFACE, auto_scale, blueprint, format_scale, parse_scale,
                                  shaped_topology)
from synth.errors import UsageError
from synth.topology_file import load_topology

pytestmark = pytest.mark.emulate

NAME = f"t{os.getpid()}"
# How long a process may take to tear its cluster down (dozens of ip/tc calls) or to exit: generous,
# since on a loaded 2-core machine a teardown that takes 3 s alone has taken over 30 s.
TEARDOWN_S = 300
PROGRAMS = ("ReduceScatter(InsideGroup(gpu)); AllReduce(Parallel(node)); AllGather(InsideGroup(gpu))",
            "AllReduce(InsideGroup(gpu)); AllReduce(Parallel(node))")


def _netns_problem() -> str | None:
    if os.geteuid() != 0:
        return "needs root: emulated clusters are network namespaces and tc qdiscs"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs ip and tc (apt-get install iproute2)"
    probe = f"{NAME}-probe"
    added = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if added.returncode != 0:
        return f"ip netns is unavailable here: {' '.join(added.stderr.split())}"
    try:
        for argv in (["ip", "-n", probe, "link", "add", "name", "a", "type", "veth", "peer", "name", "b"],
                     ["ip", "-n", probe, "link", "add", "name", "br", "type", "bridge"],
                     ["tc", "-n", probe, "qdisc", "add", "dev", "a", "root", "tbf", "rate", "1mbit", "burst", "16k",
                      "limit", "64k"]):
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                return f"'{' '.join(argv[3:])}' fails here: {' '.join(done.stderr.split())}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


PROBLEM = _netns_problem()
needs_netns = pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")


def machine_snapshot() -> tuple:
    """What a cluster may change on this machine: the host's links, and namespaces and state
    files of our clusters (all named NAME...; other runs of this suite may be up at once)."""
    spaces = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    names = sorted(entry["name"] for entry in json.loads(spaces or "[]") if entry["name"].startswith(f"{NAME}-"))
    host_links = sorted(line.split(":")[1].strip() for line in links.splitlines())
    states = sorted(path.name for path in host.STATE_DIR.glob(f"{NAME}*")) if host.STATE_DIR.is_dir() else []
    return names, host_links, states


# --- the plan, no root needed ------------------------------------------------------------------


def test_every_link_is_shaped_both_ways_and_every_command_stays_in_our_namespaces():
    topology = load_topology("emu-2x2x2")
    plan = blueprint(topology, "emu-2x2x2", 1 / 64, "x")
    cluster = plan.cluster
    assert cluster.namespaces == ("x-sw", "x-n0", "x-n1", "x-n2", "x-n3")
    veth_ends = set()
    for argv in plan.commands:
        if argv[:3] == ("ip", "netns", "add"):
            assert argv[3] in cluster.namespaces
            continue
        assert argv[1] == "-n" and argv[2] in cluster.namespaces, argv  # never the host's namespace
        if "veth" in argv:
            veth_ends.add((argv[2], argv[argv.index("name") + 1]))
            peer_namespace = argv[argv.index("netns") + 1] if "netns" in argv else argv[2]
            veth_ends.add((peer_namespace, argv[argv.index("peer") + 2]))
    shaped = {(link.namespace, link.device): link.rate for link in cluster.links}
    assert veth_ends and veth_ends <= set(shaped)  # both ends of every veth pair: both directions
    assert all(len(device) <= 15 for _, device in shaped)
    gigabyte = 1e9
    assert shaped["x-n0", NODE_INTERFACE] == shaped["x-sw", "node0"] == pytest.approx(gigabyte / 64)
    assert shaped["x-sw", "up0-1"] == shaped["x-sw", "dn0-1"] == pytest.approx(4 * gigabyte / 64)  # a rack: 4 devices
    assert shaped["x-n3", "lo"] == pytest.approx(2 * gigabyte / 64)  # a node's 2 devices
    assert [node.address for node in cluster.nodes] == ["10.213.0.1", "10.213.0.2", "10.213.0.3", "10.213.0.4"]
    assert [cluster.node_of(rank).index for rank in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_auto_scale_puts_the_busiest_node_queue_at_the_budget_and_keeps_ratios():
    topology = load_topology("emu-2x4")  # loopback 4 x 1 GB/s, uplink 1 GB/s
    scale = auto_scale(topology)
    assert format_scale(scale) == "1/64"
    rates = {link.device: link.rate for link in blueprint(topology, "emu-2x4", scale).cluster.links}
    assert rates["lo"] <= AUTO_BUDGET and rates["lo"] == pytest.approx(4 * rates[NODE_INTERFACE])
    shaped = shaped_topology(topology, scale)
    assert shaped.levels[0].uplinks.bandwidth.value == pytest.approx(1e9 / 64)
    assert shaped.levels[1].latency == topology.levels[1].latency


@pytest.mark.parametrize("text, value", [("1/2000", 1 / 2000), ("0.0005", 0.0005), ("5e-4", 5e-4), ("auto", None)])
def test_scale_parses(text, value):
    assert parse_scale(text) == value


@pytest.mark.parametrize("text", ["0", "-1/2", "1/0", "half", "1/2/3", "nan"])
def test_bad_scales_are_refused(text):
    with pytest.raises(UsageError):
        parse_scale(text)


def test_without_root_one_line_says_so(run_cli, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for args in (("emulate", "up", "emu-2x2"), ("emulate", "down"), ("emulate", "status"),
                 ("bench", "--emulate", "emu-2x2", "-a", "data=4", "-r", "data", "--program", PROGRAMS[0])):
        code, out, err = run_cli(*args)
        assert code == 2 and out == ""
        assert err.count("\n") == 1 and "needs root" in err, err


def test_emulate_needs_link_figures_and_gloo(run_cli):
    code, _, err = run_cli("bench", "--emulate", "emu-2x2", "-a", "data=4", "-r", "data", "--backend", "nccl",
                           "--program", PROGRAMS[0])
    assert code == 2 and "gloo" in err
    code, _, err = run_cli("bench", "--scale", "1/2", "-t", "emu-2x2", "-a", "data=4", "-r", "data",
                           "--program", PROGRAMS[0])
    assert code == 2 and "--scale is for --emulate" in err


# --- on the machine ----------------------------------------------------------------------------


@needs_netns
def test_up_then_down_leaves_nothing_behind(run_cli):
    before = machine_snapshot()
    code, out, err = run_cli("emulate", "up", "emu-2x2x2", "--name", NAME, "--scale", "1/100")
    assert code == 0, err
    assert "rack 1 uplink" in out and "1/100" in out
    names, host_links, states = machine_snapshot()
    assert {f"{NAME}-sw", f"{NAME}-n0", f"{NAME}-n3"} <= set(names) and host_links == before[1]
    assert f"{NAME}.json" in states
    qdiscs = subprocess.run(["tc", "-n", f"{NAME}-sw", "qdisc", "show"], capture_output=True, text=True).stdout
    assert qdiscs.count("tbf") == 8  # 4 node ports, 2 rack uplinks x 2 directions
    code, out, _ = run_cli("emulate", "status", "--name", NAME)
    assert code == 0 and "node 3 uplink, inbound" in out
    code, _, err = run_cli("emulate", "up", "emu-2x2", "--name", NAME)
    assert code == 2 and "already up" in err
    code, out, _ = run_cli("emulate", "down", "--name", NAME)
    assert code == 0 and "removed" in out
    assert machine_snapshot() == before
    code, out, _ = run_cli("emulate", "down", "--name", NAME)
    assert code == 0 and "nothing to remove" in out


class Injected(Exception):
    pass


@needs_netns
@pytest.mark.parametrize("fail_at, error", [(0, Injected), (1, Injected), (9, Injected), (17, KeyboardInterrupt),
                                             (-1, Injected)])
def test_a_failure_or_ctrl_c_during_up_removes_what_was_made(fail_at, error):
    topology = load_topology("emu-2x2")
    commands = blueprint(topology, "emu-2x2", 1 / 100, NAME).commands
    failing = fail_at % len(commands)
    calls = []

    def step(argv):
        if len(calls) == failing:
            raise error("injected")
        calls.append(argv)
        return host.run(argv)

    before = machine_snapshot()
    with pytest.raises(error):
        bring_up(topology, "emu-2x2", 1 / 100, NAME, step=step)
    assert len(calls) == failing
    assert machine_snapshot() == before


@needs_netns
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_or_kill_inside_the_context_manager_removes_the_cluster(tmp_path, sig):
    before = machine_snapshot()
    # SIGINT as a terminal gives it, even when the tests run as a background job (whose children
    # start with SIGINT ignored: the Ctrl-C was then lost and the block slept its 60 s).
    code = (f"import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
            f"from synth.emulate import emulated_cluster\nimport time\n"
            f"with emulated_cluster('emu-2x2', scale=1/100, name={NAME!r}):\n"
            f"    print('up', flush=True)\n    time.sleep(60)\n")
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "up"
        assert find_cluster(NAME) is not None
        process.send_signal(sig)
        process.wait(timeout=TEARDOWN_S)
    finally:
        if process.poll() is None:
            process.kill()
            tear_down(NAME)
    assert process.returncode != 0 and "KeyboardInterrupt" in process.stderr.read()
    assert machine_snapshot() == before


SOCKET_PROBE = """
import json, socket, sys, time
role, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if role == "recv":
    server = socket.create_server((host, port))
    print("ready", flush=True)
    server.settimeout(20)
    conn, _ = server.accept()
    total, first, last = 0, None, None
    while True:
        data = conn.recv(1 << 20)
        if not data:
            break
        first = first or time.perf_counter()
        total, last = total + len(data), time.perf_counter()
    print(json.dumps({"bytes": total, "seconds": last - first}))
else:
    seconds, limit = float(sys.argv[4]), int(sys.argv[5])
    conn = socket.create_connection((host, port), timeout=10)
    block, sent, end = bytes(65536), 0, time.perf_counter() + seconds
    while time.perf_counter() < end and sent < limit:
        conn.sendall(block)
        sent += len(block)
    conn.close()
"""


def throughput(script, receiver_ns: str, address: str, sender_ns: str, seconds: float = 1.5,
               limit: int = 200 * 2**20) -> float:
    """Payload bits/s of one TCP stream, for at most `seconds` and `limit` bytes."""
    receiver = subprocess.Popen(["ip", "netns", "exec", receiver_ns, sys.executable, str(script), "recv", address, "5201"],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout.readline().strip() == "ready"
        subprocess.run(["ip", "netns", "exec", sender_ns, sys.executable, str(script), "send", address, "5201",
                        str(seconds), str(limit)], check=True, timeout=30)
        result = json.loads(receiver.stdout.readline())
        receiver.wait(timeout=10)
    finally:
        if receiver.poll() is None:
            receiver.kill()
    return result["bytes"] * 8 / result["seconds"]


@needs_netns
def test_shaping_holds_the_configured_rates(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SOCKET_PROBE)
    scale = 1 / 80  # emu-2x2: uplinks 1 GB/s -> 100 Mbit/s, a node's loopback 2 GB/s -> 200 Mbit/s
    with emulated_cluster("emu-2x2", scale=scale, name=NAME) as cluster:
        rates = {(link.namespace, link.device): link.rate * 8 for link in cluster.links}
        uplink, loopback = rates[f"{NAME}-n0", NODE_INTERFACE], rates[f"{NAME}-n0", "lo"]
        assert (uplink, loopback) == (pytest.approx(100e6), pytest.approx(200e6))
        across = throughput(script, f"{NAME}-n1", cluster.nodes[1].address, f"{NAME}-n0")
        inside = throughput(script, f"{NAME}-n0", cluster.nodes[0].address, f"{NAME}-n0")
        unshaped = throughput(script, f"{NAME}-sw", "127.0.0.1", f"{NAME}-sw")  # the switch's own loopback
    print(f"node to node {across / 1e6:.1f} Mbit/s (tbf {uplink / 1e6:.0f}), inside a node {inside / 1e6:.1f} "
          f"Mbit/s (tbf {loopback / 1e6:.0f}), unshaped loopback {unshaped / 1e6:.0f} Mbit/s")
    assert across == pytest.approx(uplink, rel=0.3)
    assert inside == pytest.approx(loopback, rel=0.3)
    assert unshaped > 5 * loopback


@needs_netns
@pytest.mark.torchrun
def test_bench_on_an_emulated_2x2_runs_every_rank_in_its_node(run_cli, tmp_path):
    pytest.importorskip("torch")
    before = machine_snapshot()
    args = ["bench", "--emulate", "emu-2x2", "--emulate-name", NAME, "-a", "data=4", "-r", "data", "-p", "[[2,2]]",
            "--bytes", "64KiB", "--iters", "3", "--warmup", "1", "-o", str(tmp_path), "--timeout", "120"]
    for program in PROGRAMS:
        args += ["--program", program]
    started = time.monotonic()
    code, out, err = run_cli(*args)
    print(f"emulated 2x2 bench: {time.monotonic() - started:.1f} s")
    assert code == 0, err
    assert machine_snapshot() == before  # brought up and down around the run
    [path] = tmp_path.glob("*.csv")
    lines = path.read_text().splitlines()
    assert any(line.startswith("# emulated: emu-2x2") for line in lines)
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    checked = [row for row in rows if row["role"] != "baseline all_reduce"]
    assert {row["program"] for row in checked} >= set(PROGRAMS) and len(checked) == 3
    assert all(row["check"] == "ok" for row in checked)
    assert all(row["predicted_time_us"] for row in checked)  # on the shaped figures
    log = path.with_suffix(".log").read_text()
    for rank, node in enumerate((0, 0, 1, 1)):
        assert f"==> rank {rank} (node {node}, namespace {NAME}-n{node}, 10.213.0.{node + 1}) <==" in log


@needs_netns
@pytest.mark.torchrun
def test_bench_reuses_a_cluster_that_is_up_and_leaves_it_up(run_cli, tmp_path):
    pytest.importorskip("torch")
    before = machine_snapshot()
    common = ["-a", "data=4", "-r", "data", "--program", PROGRAMS[0], "--emulate-name", NAME]
    try:
        assert run_cli("emulate", "up", "emu-2x4", "--name", NAME, "--scale", "1/100")[0] == 0
        code, _, err = run_cli("bench", "--emulate", "emu-2x2", *common)
        assert code == 2 and "is up with emu-2x4" in err
        assert run_cli("emulate", "down", "--name", NAME)[0] == 0
        assert run_cli("emulate", "up", "emu-2x2", "--name", NAME, "--scale", "1/100")[0] == 0
        code, _, err = run_cli("bench", "--emulate", "emu-2x2", "--scale", "1/50", *common)
        assert code == 2 and "at scale 1/100, not 1/50" in err
        code, _, err = run_cli("bench", "--emulate", "emu-2x2", *common, "--bytes", "4KiB", "--iters", "1",
                               "--warmup", "0", "-o", str(tmp_path))
        assert code == 0, err
        assert find_cluster(NAME) is not None  # still up
        [path] = tmp_path.glob("*.csv")
        assert "(reused, left up) at scale 1/100" in path.read_text()
    finally:
        tear_down(NAME)
    assert machine_snapshot() == before


@needs_netns
def test_ranks_run_in_their_node_with_the_env_and_a_failing_rank_stops_the_rest(tmp_path, monkeypatch):
    from synth.emulate import ranks

    monkeypatch.setattr(ranks, "FAILURE_GRACE", 1.0)
    script = tmp_path / "rank.py"
    script.write_text("import os, sys, time, socket, json\n"
                      "keys = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'GLOO_SOCKET_IFNAME')\n"
                      "print(json.dumps({k: os.environ[k] for k in keys}), os.listdir('/sys/class/net'), flush=True)\n"
                      "if os.environ['RANK'] == '3' and '--fail' in sys.argv:\n    sys.exit(3)\n"
                      "time.sleep(0 if '--fail' not in sys.argv else 60)\n")
    with emulated_cluster("emu-2x2", scale=1 / 100, name=NAME) as cluster:
        result = ranks.run_ranks(cluster, script, 4, [])
        assert result.returncode == 0, result.log
        assert '"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "10.213.0.1"' in result.log
        assert f"==> rank 3 (node 1, namespace {NAME}-n1, 10.213.0.2) <==" in result.log
        assert result.log.count("['eth0', 'lo']") + result.log.count("['lo', 'eth0']") == 4  # in a node namespace
        started = time.monotonic()
        result = ranks.run_ranks(cluster, script, 4, ["--fail"])
        assert result.returncode == 3 and time.monotonic() - started < 15
        assert not subprocess.run(["ip", "netns", "pids", f"{NAME}-n0"], capture_output=True, text=True).stdout


# --- after kill -9 -------------------------------------------------------------------------------

UP_THEN_HANG = """
import sys, time
from synth.emulate import host
from synth.topology_file import load_topology
calls = []
def step(argv):
    if len(calls) == int(sys.argv[2]):
        print("cut", flush=True)
        time.sleep(600)
    calls.append(argv)
    return host.run(argv)
host.bring_up(load_topology("emu-2x2x2"), "emu-2x2x2", 1 / 100, sys.argv[1], step=step)
"""


def _kill_9_during_up(name: str, after: int) -> None:
    process = subprocess.Popen([sys.executable, "-c", UP_THEN_HANG, name, str(after)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "cut"
    finally:
        process.kill()  # SIGKILL: no cleanup runs
        process.wait(timeout=TEARDOWN_S)


@needs_netns
def test_after_kill_9_of_up_status_shows_it_incomplete_and_down_removes_it(run_cli):
    before = machine_snapshot()
    broken, other = f"{NAME}b", f"{NAME}c"
    try:
        assert run_cli("emulate", "up", "emu-2x2", "--name", other, "--scale", "1/100")[0] == 0
        _kill_9_during_up(broken, 20)
        assert find_cluster(broken) is not None and not find_cluster(broken).complete
        code, out, err = run_cli("emulate", "status")
        assert code == 0, err
        assert f"cluster {broken!r}" in out and "INCOMPLETE" in out and f"cluster {other!r}" in out
        code, out, err = run_cli("emulate", "status", "--json")
        listed = {entry["name"]: entry for entry in json.loads(out)}
        assert code == 0 and listed[broken]["complete"] is False and listed[other]["complete"] is True
        code, out, _ = run_cli("emulate", "down", "--name", broken)
        assert code == 0 and "removed" in out
        assert find_cluster(broken) is None and find_cluster(other) is not None
    finally:
        tear_down(other)
        tear_down(broken)
    assert machine_snapshot() == before


@needs_netns
def test_a_corrupt_state_file_hides_no_other_cluster_and_down_still_removes_it(run_cli):
    before = machine_snapshot()
    broken, other = f"{NAME}d", f"{NAME}e"
    try:
        assert run_cli("emulate", "up", "emu-2x2", "--name", broken, "--scale", "1/100")[0] == 0
        assert run_cli("emulate", "up", "emu-2x2", "--name", other, "--scale", "1/100")[0] == 0
        host.state_path(broken).write_text('{"name": "cut sh')
        code, out, err = run_cli("emulate", "status")
        assert code == 0, err
        assert f"cluster {broken!r}: INCOMPLETE, its state file cannot be read" in out
        assert f"cluster {other!r}: emu-2x2" in out
        code, out, err = run_cli("emulate", "status", "--name", broken)
        assert code == 0 and "cannot be read" in out
        code, out, _ = run_cli("emulate", "down", "--name", broken)
        assert code == 0 and "by its names" in out
        spaces = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True).stdout
        assert not any(entry["name"].startswith(f"{broken}-") for entry in json.loads(spaces or "[]"))
        assert not host.state_path(broken).exists() and find_cluster(other) is not None
    finally:
        tear_down(other)
        if host.state_path(broken).exists():
            tear_down(broken)
    assert machine_snapshot() == before


@needs_netns
@pytest.mark.torchrun
def test_after_kill_9_of_an_emulated_bench_down_stops_its_ranks_and_removes_its_run_directory(tmp_path):
    pytest.importorskip("torch")
    before = machine_snapshot()
    name = f"{NAME}f"
    bench = [sys.executable, "-m", "synth", "bench", "--emulate", "emu-2x2", "--emulate-name", name, "-a", "data=4",
             "-r", "data", "-p", "[[2,2]]", "--program", PROGRAMS[0], "--bytes", "64KiB", "--iters", "100000",
             "--warmup", "0", "-o", str(tmp_path), "--timeout", "600"]
    process = subprocess.Popen(bench, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        runs = host.runs_path(name)
        while time.monotonic() < deadline and not list(runs.glob("run-*/rank3.log")):
            time.sleep(0.2)
        assert list(runs.glob("run-*/rank3.log")), "the ranks never started"
        process.kill()
        process.wait(timeout=TEARDOWN_S)
        pids = subprocess.run(["ip", "netns", "pids", f"{name}-n1"], capture_output=True, text=True).stdout.split()
        assert pids  # the ranks outlive their launcher
        code = subprocess.run([sys.executable, "-m", "synth", "emulate", "down", "--name", name], capture_output=True,
                              text=True)
        assert code.returncode == 0, code.stderr
        assert not runs.exists()
        assert not any(Path(f"/proc/{int(pid)}").exists() and not host._zombie(int(pid)) for pid in pids)  # zombies: init reaps them
    finally:
        if process.poll() is None:
            process.kill()
        tear_down(name)
    assert machine_snapshot() == before
