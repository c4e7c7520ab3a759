"""Where benchmark figures go and what they carry: the command, the machine and the date.

Every study has its folder under the results directory (`results/<study>/`): its report is
the folder's README.md (so a repository browser shows it), its data files sit beside it.
A benchmark's `-o DIR` names the results directory, not the study's folder."""

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


REPORT = "README.md"  # a study's report, the page a browser shows for its folder


def results_dir(path: str | os.PathLike = "results") -> Path:
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def study_dir(study: str, results: str | os.PathLike = "results") -> Path:
    """The folder of one study under the results directory, made if missing."""
    return results_dir(Path(results) / study)
