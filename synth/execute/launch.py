"""Run an exported torch script on this machine: one torchrun launch, one process per device.

`torchrun --standalone` picks a free port itself, so launches never collide. The script's
rank 0 writes its rows to a JSON file, which is what callers read; the combined output of
all ranks is kept as a log for when something fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from synth.errors import SynthError

# Every device is a local process here; past this a machine thrashes rather than measures.
MAX_LOCAL_PROCESSES = 16


class LaunchError(SynthError):
    """torchrun failed before the script could report (exit 1)."""


@dataclass(frozen=True)
class LaunchResult:
    returncode: int
    log: str  # stdout and stderr of torchrun and every rank
    report: dict | None  # the script's --json-out, when rank 0 got that far


def torchrun(script: Path, nproc: int, script_args: list[str], timeout: float = 1800.0) -> LaunchResult:
    """Launch `script` on `nproc` local processes with `--json-out` added; never raises on a
    failing script (the caller reads returncode and report), only on a timeout."""
    with tempfile.TemporaryDirectory(prefix="synth-run-") as scratch:
        report_path = Path(scratch) / "report.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                   "--max-restarts", "0", str(script), *script_args, "--json-out", str(report_path)]
        environment = dict(os.environ, PYTHONUNBUFFERED="1")
        environment.setdefault("OMP_NUM_THREADS", "1")
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env=environment, start_new_session=True)
        try:
            log, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)  # the session this call started: torchrun and its ranks
            log, _ = process.communicate()
            raise LaunchError(f"torchrun did not finish within {timeout:.0f} s and was stopped") from None
        report = json.loads(report_path.read_text(encoding="utf-8")) if report_path.exists() else None
        return LaunchResult(process.returncode, log, report)
