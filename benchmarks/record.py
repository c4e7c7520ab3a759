"""Where benchmark figures go and what they carry: the command, the machine and the date."""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path


def machine_description() -> str:
    cores = os.cpu_count()
    processor = platform.processor() or platform.machine()
    return f"{platform.node() or 'unknown host'}, {processor}, {cores} cores, Python {platform.python_version()}, {platform.system()} {platform.release()}"


def header(command: str) -> str:
    """The provenance block every results file starts with."""
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"Command: `{command}`\n\nMachine: {machine_description()}\n\nDate: {today}\n"


def results_dir(path: str | os.PathLike = "results") -> Path:
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    return directory
