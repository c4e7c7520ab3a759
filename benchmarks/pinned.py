"""A pinned earlier commit, exported beside this checkout, to time against in the same run.

A speed figure from another day on another load says little: a benchmark that guards one
runs the same command on the code of a pinned commit (its tracked files, `git archive` to a
temporary directory, first on the path) and on this checkout, alternately, on the same
machine at the same load, and reports both and their ratio.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from contextlib import contextmanager
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent


def label(commit: str) -> str:
    return f"commit {commit[:7]} (pinned), `git archive` to a directory"


@contextmanager
def exported(commit: str):
    """A temporary directory holding the commit's tracked files (its synth/ first on the path
    when a process runs there or with `environment(directory)`)."""
    directory = Path(tempfile.mkdtemp(prefix=f"synth-{commit[:7]}-"))
    try:
        archive = directory / "source.tar"
        with open(archive, "wb") as out:
            done = subprocess.run(["git", "archive", "--format=tar", commit], cwd=REPOSITORY, stdout=out,
                                  stderr=subprocess.PIPE, text=False)
        if done.returncode != 0:
            raise SystemExit(f"cannot export the pinned commit {commit}: {done.stderr.decode().strip()} "
                             f"(the benchmark needs a git checkout holding it)")
        with tarfile.open(archive) as tar:
            tar.extractall(directory, filter="data")
        archive.unlink()
        for data in ("grammar", "topologies"):
            # Its own grammar and topologies as synth.grammar and synth.topologies: an editable
            # install maps those names to this checkout's files, which older code may not read.
            own = directory / "synth" / data
            if (directory / data).is_dir() and not own.exists():
                own.symlink_to(directory / data, target_is_directory=True)
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def environment(source: Path | str | None) -> dict[str, str]:
    """This process's environment with `source` (an exported commit) first on PYTHONPATH."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(source), env.get("PYTHONPATH"))))
    return env
