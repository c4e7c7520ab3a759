"""Run a torch.distributed script with every rank inside its node's namespace.

No torchrun: each rank is `ip netns exec NODE python SCRIPT ...` with the env:// variables
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) set by hand, which also spares 2
cores an elastic agent per node. The store runs in rank 0, on node 0's address, which every
namespace reaches over the bridges. gloo binds each rank to one address, GLOO_SOCKET_IFNAME's;
peers connect to it. That is the node's uplink interface, yet ranks of one node still talk
over loopback, since Linux routes traffic to one of its own addresses through `lo`: so
intra-node traffic stays in the node (and its loopback shaping) and inter-node traffic takes
the shaped uplinks. The result is a launch.LaunchResult, as from launch.torchrun.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from synth.emulate.host import EmulationError, namespaces, require_host, run, runs_path
from synth.emulate.layout import Cluster
from synth.errors import UsageError
from synth.execute.launch import LaunchError, LaunchResult

# What a bench runs a script with: (script, processes, script arguments, timeout) -> result.
Launcher = Callable[..., LaunchResult]

FAILURE_GRACE = 10.0  # seconds the other ranks get to notice that one rank failed
STOP_GRACE = 3.0
_FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


def run_ranks(cluster: Cluster, script: Path, nproc: int, script_args: list[str],
              timeout: float = 1800.0) -> LaunchResult:
    """Launch `script` on every device of `cluster`, `--json-out` added as torchrun() does;
    never raises on a failing script, only on a timeout or a cluster that is not there."""
    if nproc != cluster.device_count:
        raise UsageError(f"{nproc} processes but the emulated cluster {cluster.name!r} has {cluster.device_count} "
                         "devices: a program runs one process per device")
    require_host()
    missing = sorted(set(cluster.namespaces) - namespaces())
    if missing:
        raise EmulationError(f"emulated cluster {cluster.name!r} lacks namespace {missing[0]}: remove it and bring "
                             f"it up again", cluster=cluster.name)
    master = cluster.nodes[0]
    port = run(("ip", "netns", "exec", master.namespace, sys.executable, "-c", _FREE_PORT)).strip()
    # Logs and the report live under the cluster's run directory, which `down` removes: a
    # launcher killed by SIGKILL leaves neither ranks (they are in the namespaces) nor files.
    runs = runs_path(cluster.name)
    runs.mkdir(parents=True, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=f"run-{os.getpid()}-", dir=runs)
    try:
        report_path = Path(scratch) / "report.json"
        logs = [Path(scratch) / f"rank{rank}.log" for rank in range(nproc)]
        processes: list[subprocess.Popen] = []
        try:
            for rank in range(nproc):
                node = cluster.node_of(rank)
                environment = dict(os.environ, PYTHONUNBUFFERED="1", RANK=str(rank), WORLD_SIZE=str(nproc),
                                   LOCAL_RANK=str(rank - node.ranks[0]), LOCAL_WORLD_SIZE=str(len(node.ranks)),
                                   GROUP_RANK=str(node.index), MASTER_ADDR=master.address, MASTER_PORT=port,
                                   GLOO_SOCKET_IFNAME=node.interface)
                environment.setdefault("OMP_NUM_THREADS", "1")
                command = ["ip", "netns", "exec", node.namespace, sys.executable, str(script), *script_args,
                           "--json-out", str(report_path)]
                with open(logs[rank], "w", encoding="utf-8") as log:
                    processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment,
                                                      start_new_session=True))
            code = _wait(processes, timeout)
        finally:
            _stop(processes)
        text = "".join(_section(cluster, rank, path) for rank, path in enumerate(logs))
        if code is None:
            raise LaunchError(f"the ranks did not finish within {timeout:.0f} s and were stopped")
        report = json.loads(report_path.read_text(encoding="utf-8")) if report_path.exists() else None
        return LaunchResult(code, text, report)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def cluster_launcher(cluster: Cluster) -> Launcher:
    """A launcher with torchrun()'s signature that runs every rank in its node of `cluster`:

        with emulated_cluster("emu-2x4", scale=1/64) as cluster:
            result = cluster_launcher(cluster)(script, cluster.device_count, ["--backend", "gloo"])
    """
    return partial(run_ranks, cluster)


def _wait(processes: list[subprocess.Popen], timeout: float) -> int | None:
    """The exit code to report: 0, or the first failure seen (not the stops it caused); None on
    the timeout. Once a rank fails, the rest get FAILURE_GRACE to finish before they are
    stopped (a dead peer otherwise leaves them waiting for gloo's 30-minute timeout)."""
    deadline = time.monotonic() + timeout
    failure, failed_at = None, None
    while True:
        codes = [process.poll() for process in processes]
        now = time.monotonic()
        if failure is None:
            failure = next((code for code in codes if code not in (None, 0)), None)
            failed_at = now if failure is not None else None
        if all(code is not None for code in codes):
            return failure or 0
        if failure is not None and now - failed_at > FAILURE_GRACE:
            _stop(processes)
            return failure
        if now >= deadline:
            return None
        time.sleep(0.05)


def _stop(processes: list[subprocess.Popen]) -> None:
    """SIGTERM then SIGKILL the sessions of the ranks still running (each rank leads its own)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        running = [process for process in processes if process.poll() is None]
        for process in running:
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_GRACE
        while any(process.poll() is None for process in running) and time.monotonic() < deadline:
            time.sleep(0.05)


def _section(cluster: Cluster, rank: int, path: Path) -> str:
    node = cluster.node_of(rank)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    return f"==> rank {rank} (node {node.index}, namespace {node.namespace}, {node.address}) <==\n{text}\n"
