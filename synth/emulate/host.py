"""The one module that changes the machine: it creates and removes the namespaces of a
layout and keeps the state file that says what exists.

Every link, bridge and qdisc of a cluster lives inside namespaces it created, so removing
those namespaces (after stopping the processes still in them, which would keep a deleted
namespace alive) removes everything. The state file is written before the first namespace is
made and removed after the last one is gone, so `down` can always finish what a crashed `up`
started; a failure or Ctrl-C during `up` removes what was made before re-raising.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from synth.emulate.layout import DEFAULT_NAME, Cluster, auto_scale, blueprint, check_name, format_scale
from synth.errors import SynthError, UsageError
from synth.topology import Topology
from synth.topology_file import load_topology

STATE_DIR = Path("/run/synth-emulate")
STOP_GRACE = 3.0  # seconds a process in a namespace gets between SIGTERM and SIGKILL


class EmulationError(SynthError):
    """An ip/tc command failed, or the state on the machine is not what was recorded (exit 1).
    `cluster` names the cluster whose removal cleans it up, when there is one."""

    def __init__(self, message: str, cluster: str | None = None):
        super().__init__(message)
        self.cluster = cluster


class ClusterInUse(UsageError):
    """A cluster of that name is already up (or partly up, or being brought up): it can be used,
    removed, or another name chosen (exit 2)."""

    def __init__(self, message: str, cluster: str):
        super().__init__(message)
        self.cluster = cluster


@dataclass(frozen=True)
class UnreadableState:
    """A state file that cannot be read (cut short, edited): its cluster can only be removed."""

    name: str
    path: Path
    reason: str


Step = Callable[[Sequence[str]], str]


def require_host() -> None:
    """Root and iproute2, or one line saying what is missing (exit 2)."""
    if os.geteuid() != 0:
        raise UsageError("synth emulate needs root (it creates network namespaces and tc qdiscs): run it as root, "
                         "e.g. sudo synth emulate up emu-2x4")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise UsageError(f"synth emulate needs '{tool}' from iproute2: apt-get install iproute2")


def run(argv: Sequence[str]) -> str:
    """Run one ip/tc command; its failure is an EmulationError carrying its own message."""
    completed = subprocess.run(list(argv), capture_output=True, text=True)
    if completed.returncode != 0:
        message = " ".join((completed.stderr or completed.stdout).split()) or f"exit code {completed.returncode}"
        raise EmulationError(f"'{' '.join(argv)}' failed: {message}")
    return completed.stdout


def namespaces() -> set[str]:
    """Every network namespace `ip netns` knows on this machine."""
    return {entry["name"] for entry in json.loads(run(("ip", "-j", "netns", "list")) or "[]")}


# --- state files -------------------------------------------------------------------------------


def state_path(name: str) -> Path:
    return STATE_DIR / f"{check_name(name)}.json"


def runs_path(name: str) -> Path:
    """Where ranks launched in cluster `name` keep their logs and reports while they run; `down`
    removes it with the cluster, so a launcher killed with SIGKILL leaves nothing behind."""
    return STATE_DIR / f"{check_name(name)}.runs"


def _state(cluster: Cluster, complete: bool) -> str:
    return json.dumps(dict(cluster.to_json(), complete=complete, created=datetime.now().astimezone().isoformat(
        timespec="seconds"), pid=os.getpid()), indent=1)


def find_cluster(name: str = DEFAULT_NAME) -> Cluster | None:
    """The cluster recorded under `name`, or None."""
    path = state_path(name)
    try:
        return Cluster.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as error:
        raise EmulationError(f"cannot read the state file {path} ({_one_line(error)})", cluster=name) from None


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:200] or type(error).__name__


def recorded() -> list[Cluster | UnreadableState]:
    """Every cluster with a state file, by name; a file that cannot be read is listed as such
    rather than hiding the others."""
    if not STATE_DIR.is_dir():
        return []
    found: list[Cluster | UnreadableState] = []
    for path in sorted(STATE_DIR.glob("*.json")):
        try:
            cluster = find_cluster(path.stem)
        except EmulationError as error:
            found.append(UnreadableState(path.stem, path, str(error)))
        except UsageError:  # not a name this tool gives: not ours
            continue
        else:
            if cluster is not None:
                found.append(cluster)
    return found


def clusters() -> list[Cluster]:
    """Every cluster whose state file can be read, by name."""
    return [entry for entry in recorded() if isinstance(entry, Cluster)]


# --- up and down -------------------------------------------------------------------------------


def bring_up(topology: Topology, spec: str, scale: float | None = None, name: str = DEFAULT_NAME,
             step: Step = run) -> Cluster:
    """Create the cluster `name`; on any failure or interruption remove what was made and re-raise.

    `step` runs each ip/tc command (tests inject failures through it); teardown never uses it.
    """
    require_host()
    plan = blueprint(topology, spec, auto_scale(topology) if scale is None else scale, name)
    cluster = plan.cluster
    path = state_path(name)
    taken = sorted(namespaces() & set(cluster.namespaces))
    if path.exists() or taken:
        what = f"namespace {taken[0]} exists" if taken else f"{path} exists"
        raise ClusterInUse(f"an emulated cluster named {name!r} is already up ({what})", name)
    _claim(path, _state(cluster, complete=False))
    try:
        with sigterm_interrupts():
            for argv in plan.commands:
                step(argv)
            _write_atomically(path, _state(cluster, complete=True))
    except BaseException:
        _remove(cluster)
        raise
    return cluster


def tear_down(name: str = DEFAULT_NAME) -> Cluster | UnreadableState | None:
    """Remove the cluster `name` (None when there is none): stop the processes left in its
    namespaces, delete the namespaces, its run directory, then the state file. A state file
    that cannot be read still names the cluster: every namespace with its names goes."""
    require_host()
    try:
        cluster = find_cluster(name)
    except EmulationError as error:
        path = state_path(name)
        _remove_named(name)
        return UnreadableState(name, path, str(error))
    if cluster is not None:
        _remove(cluster)
    elif runs_path(name).exists():  # a run directory left without its cluster
        shutil.rmtree(runs_path(name), ignore_errors=True)
    return cluster


def _remove_named(name: str) -> None:
    """Remove what a cluster named `name` can have made, from the names alone: its switch and
    node namespaces (`name-sw`, `name-n<i>`), its run directory and its state file."""
    pattern = re.compile(rf"{re.escape(name)}-(sw|n[0-9]+)\Z")
    ours = sorted(namespace for namespace in namespaces() if pattern.match(namespace))
    cluster = Cluster(name, "?", "?", (), (), 1.0, tuple(ours), (), (), complete=False)
    _remove(cluster)


@contextmanager
def use_cluster(topology: Topology, spec: str, scale: float | None = None,
                name: str = DEFAULT_NAME) -> Iterator[tuple[Cluster, bool]]:
    """The cluster `name` for the block: the one already up when it is of `topology` (and
    `scale`, when given), used as it is and left up, else a new one removed on the way out.
    Yields (cluster, reused)."""
    existing = find_cluster(name)
    if existing is not None:
        if (existing.sizes, existing.level_names) != (topology.sizes, topology.level_names):
            raise ClusterInUse(f"emulated cluster {name!r} is up with {existing.topology}, not {topology.name}", name)
        if scale is not None and abs(existing.scale - scale) > 1e-12 * scale:
            raise ClusterInUse(f"emulated cluster {name!r} is up at scale {format_scale(existing.scale)}, not "
                               f"{format_scale(scale)} (leave the scale out to use it as it is)", name)
        if not existing.complete or set(existing.namespaces) - namespaces():
            raise EmulationError(f"emulated cluster {name!r} is only partly there (an 'up' failed or is running)",
                                 cluster=name)
        yield existing, True
        return
    cluster = bring_up(topology, spec, scale, name)
    try:
        yield cluster, False
    finally:
        tear_down(cluster.name)


@contextmanager
def emulated_cluster(topology: Topology | str | os.PathLike, scale: float | None = None,
                     name: str = DEFAULT_NAME) -> Iterator[Cluster]:
    """An emulated cluster of `topology` (a Topology, built-in name or path) for the duration of
    the block, removed on the way out whatever happens (an error, Ctrl-C, SIGTERM).

        with emulated_cluster("emu-2x4", scale=1/64) as cluster:
            run_ranks(cluster, script, cluster.device_count, ["--backend", "gloo"])
    """
    if isinstance(topology, Topology):
        spec = topology.source_path or topology.name
    else:
        spec = os.fspath(topology)
        topology = load_topology(spec)
    with sigterm_interrupts():
        cluster = bring_up(topology, spec, scale, name)
        try:
            yield cluster
        finally:
            _remove(cluster)


def _remove(cluster: Cluster) -> None:
    """Delete every namespace of `cluster` that exists, then its state file; Ctrl-C and SIGTERM
    wait until this is done, since half a teardown is the one state nobody can clean."""
    with _signals_held():
        failures = []
        present = namespaces()
        for namespace in reversed(cluster.namespaces):
            if namespace not in present:
                continue
            try:
                _stop_processes(namespace)
                run(("ip", "netns", "del", namespace))
            except (EmulationError, OSError) as error:
                failures.append(str(error))
        if failures:
            raise EmulationError(f"could not remove all of cluster {cluster.name!r}: {failures[0]}", cluster=cluster.name)
        shutil.rmtree(runs_path(cluster.name), ignore_errors=True)
        path = state_path(cluster.name)
        path.unlink(missing_ok=True)
        try:
            STATE_DIR.rmdir()  # only when no other cluster is recorded
        except OSError:
            pass


def _stop_processes(namespace: str) -> None:
    """SIGTERM, then SIGKILL, every process in a namespace of ours (ranks left by a crash)."""
    pids = [int(text) for text in run(("ip", "netns", "pids", namespace)).split()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [pid for pid in pids if _signal(pid, sig)]
        deadline = time.monotonic() + STOP_GRACE
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [pid for pid in alive if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
        if not alive:
            return
        pids = alive


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _claim(path: Path, text: str) -> None:
    """Create the state file; "x" mode means two concurrent `up`s cannot both get it. Retried
    because another cluster's teardown removes the directory when it leaves it empty."""
    for attempt in range(3):
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        try:
            with open(path, "x", encoding="utf-8") as handle:
                handle.write(text)
            return
        except FileExistsError:
            raise UsageError(f"an emulated cluster named {path.stem!r} is being brought up by another process") from None
        except FileNotFoundError:
            if attempt == 2:
                raise


def _write_atomically(path: Path, text: str) -> None:
    from synth.output_files import write_text

    write_text(path, text)


# --- signals -----------------------------------------------------------------------------------


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt, so the cleanup a Ctrl-C gets also runs on `kill`."""
    if not _in_main_thread() or signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt("terminated")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _signals_held() -> Iterator[None]:
    """Defer SIGINT and SIGTERM to the end of the block, then act on them as an interrupt."""
    if not _in_main_thread():
        yield
        return
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        raise KeyboardInterrupt("interrupted (after cleaning up)")


# --- status ------------------------------------------------------------------------------------


def link_counters(cluster: Cluster) -> dict[tuple[str, str], dict]:
    """Bytes sent, drops and backlog of every tbf of `cluster`, keyed (namespace, device)."""
    counters = {}
    present = namespaces()
    for link in cluster.links:
        if link.namespace not in present:
            continue
        try:  # a cluster cut short (its `up` killed) lacks some devices: they show as missing
            shown = json.loads(run(("tc", "-s", "-j", "-n", link.namespace, "qdisc", "show", "dev", link.device))
                               or "[]")
        except (EmulationError, ValueError):
            continue
        for qdisc in shown:
            if isinstance(qdisc, dict) and qdisc.get("kind") == "tbf":
                counters[link.namespace, link.device] = qdisc
    return counters
