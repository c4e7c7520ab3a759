"""Shared fixtures and helpers for the test suite."""

from __future__ import annotations

import pytest

from synth.cli import main


@pytest.fixture
def run_cli(capsys):
    """Run `synth ARGS...` in-process; returns (exit code, stdout, stderr)."""

    def run(*args: str):
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run
