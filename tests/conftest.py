"""Shared fixtures and helpers for the test suite."""

from __future__ import annotations

import fcntl
import os
import re
import sys
from pathlib import Path

import pytest

# The benchmarks live beside the package, not in it; appended (not prepended) so `synth`
# still resolves to the installed package, as CI tests it.
REPOSITORY = Path(__file__).resolve().parent.parent
if str(REPOSITORY) not in sys.path:
    sys.path.append(str(REPOSITORY))

from synth.cli import main


@pytest.fixture
def run_cli(capsys):
    """Run `synth ARGS...` in-process; returns (exit code, stdout, stderr)."""

    def run(*args: str):
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


# --- running on two workers (`pytest -n 2`, the README's command; `--dist loadscope` is in addopts) ---
# Each test module runs whole on one worker, in file order, so what a module builds up (a cache, a
# module fixture) is never split; the docs examples run per document, since a document's examples
# run in order in one workspace. xdist schedules by test id (its `xdist_group` suffix no longer
# reaches the id under pytest 9), hence a scheduler whose scope is read off the id.

DOCS_EXAMPLE = re.compile(r"^(tests/test_docs_examples\.py)::test_example_runs_as_written\[(.+):\d+\]$")


def scope_of(nodeid: str) -> str:
    """The work unit a test runs in: its document for a docs example, else its module."""
    example = DOCS_EXAMPLE.match(nodeid)
    return f"{example.group(1)}::{example.group(2)}" if example else nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleOrDocumentScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return ModuleOrDocumentScheduling(config, log)


def _heavy(item) -> bool:
    return any(item.get_closest_marker(name) for name in ("torchrun", "emulate")) or bool(DOCS_EXAMPLE.match(item.nodeid))


def pytest_collection_modifyitems(config, items):
    """On a worker, the units that take minutes (docs examples, torch ranks, emulated clusters)
    come first, in file order otherwise: xdist hands units out in this order (with
    --no-loadscope-reorder), so the last to start is a short one and neither worker idles long."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    units = {}
    for item in items:
        units.setdefault(scope_of(item.nodeid), []).append(item)
    heavy = {scope for scope, members in units.items() if any(_heavy(item) for item in members)}
    items[:] = [item for scope in sorted(units, key=lambda scope: scope not in heavy) for item in units[scope]]


@pytest.fixture(autouse=True)
def _one_emulated_cluster_at_a_time(request, tmp_path_factory):
    """Emulate tests (network namespaces and tc shaping: they measure rates, and docs examples
    share the default cluster name) run one at a time across this run's workers."""
    if request.node.get_closest_marker("emulate") is None or not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    lock = tmp_path_factory.getbasetemp().parent / "emulate.lock"  # the run's folder, above each worker's
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
