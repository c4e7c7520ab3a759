"""Shared fixtures and helpers for the test suite."""

from __future__ import annotations

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
