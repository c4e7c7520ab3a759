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


DEFAULT_LOGS = "../shared/nccl-logs"


def log_folder_parser(module: str, description: str, study: str):
    """The command line every study of a folder of nccl-tests logs takes: the folder (the shared
    logs beside the checkout by default) and the results directory its `study` folder goes in."""
    import argparse

    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{module}", description=description)
    parser.add_argument("logs", nargs="?", default=DEFAULT_LOGS, help="folder of nccl-tests logs")
    parser.add_argument("-o", "--output", default="results",
                        help=f"the results directory (default results/); writes its {study}/ folder")
    return parser


def log_folder(logs: str, module: str) -> Path | None:
    """The logs' folder, or None after a one-line error naming it (the caller exits 2)."""
    import sys

    folder = Path(logs)
    if not folder.is_dir():
        print(f"{module}: {folder} is not a folder of nccl-tests logs: give the folder of nccl-tests logs",
              file=sys.stderr)
        return None
    return folder
