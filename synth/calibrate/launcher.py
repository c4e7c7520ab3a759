"""The CPU cores a launcher binds each process of a run to, read off the captured command line.

A process that drives several GPUs runs a proxy thread per GPU within its CPU set
(synth/model/nccl/proxy.py cpu_share), so how many cores it was given is part of how the run
was launched. Open MPI's mpirun binds by default (mpirun(1), "Quick Summary" of mapping and
binding since v1.8): to a core when it starts at most two processes, to a package (socket)
otherwise; `--bind-to core|none|...` overrides it and `--map-by <object>:PE=n` gives each process
n cores. Other launchers (srun, MPICH's mpiexec, torchrun) are not read: None, not bound as far
as the model knows.
"""

from __future__ import annotations

import re

LAUNCH = re.compile(r"(?:^|[\s/$])(?:mpirun|mpiexec|orterun)(?=\s|$)")
# Open MPI's own options (-x VAR, --mca / -mca), or an Open MPI install path
OPEN_MPI = re.compile(r"(?:^|\s)(?:-x\s|--?mca\s)|open-?mpi|\bompi")
PROCESSES = re.compile(r"(?:^|\s)(?:-n|-np|--np|-c)\s+(\d{1,9})\b")
BIND = re.compile(r"(?:^|\s)--?bind-to\s+(\w+)")
PER_PROCESS = re.compile(r"(?:^|\s)--?map-by\s+\S*:PE=(\d{1,9})", re.IGNORECASE)
PROGRAM = re.compile(r"\s(?:\./|\S*/)?\S*_perf\b|\s\./")  # where the launched program's own arguments begin


def is_launch_line(line: str) -> bool:
    """Whether the line runs mpirun (or mpiexec, orterun)."""
    return ("mpi" in line or "orterun" in line) and LAUNCH.search(line) is not None


def launcher_options(command: str) -> str | None:
    """The launcher's part of a command line (before the program and its arguments, whose
    `-n 30` is nccl-tests' iterations), None when it is not an Open MPI launch."""
    found = LAUNCH.search(command)
    if found is None:
        return None
    rest = command[found.end():]
    program = PROGRAM.search(rest)
    options = rest[:program.start()] if program else rest
    return options if OPEN_MPI.search(command) else None


def bound_cores(command: str | None, processes: int) -> int | None:
    """Cores Open MPI binds each process to for this command line (module docstring), given
    the run's processes where the command does not state them; None: not bound to a few cores,
    or not an Open MPI launch."""
    options = launcher_options(command) if command else None
    if options is None:
        return None
    stated = PROCESSES.search(options)
    count = int(stated.group(1)) if stated else processes
    per = PER_PROCESS.search(options)
    bind = BIND.search(options)
    if bind is not None and bind.group(1).lower() != "core":
        return None  # none, package, socket, numa, l3cache, hwthread: not a count of cores
    if per is not None:
        return int(per.group(1))
    if bind is not None or count <= 2:
        return 1
    return None
