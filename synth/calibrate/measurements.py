"""What a measurement file gives the fit: one timed call of one collective on one group.

Every parser (nccl-tests text, nccl-tests CSV, our benchmark CSV) produces `Measurement`s;
the group is a `Span` that a topology turns into devices (synth/calibrate/groups.py), so a
file need not know the topology it is calibrating.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from synth.errors import InputRangeError, UsageError
from synth.names import echo
from synth.language import collective_names

# Collectives nccl-tests (and rccl-tests) measure that no program uses.
UNSUPPORTED = ("AllToAllv", "SendRecv", "Scatter", "Gather", "HyperCube")
# The collectives whose timings calibration fits: every collective a program uses (all-to-all
# through its pairwise send/recv flows: synth/calibrate/all_to_all.py under the NCCL model).
CALIBRATED = tuple(name for name in collective_names() if name not in UNSUPPORTED)


@dataclass(frozen=True)
class Span:
    """The members of a measured group: `units` units of level `level`, each contributing its
    first `per_unit` devices in rank order. `level` None means "decide from the topology":
    a group on one host spans the innermost level, a group on several hosts the level above
    it (`hosts` says which case this is)."""

    level: str | None
    units: int
    per_unit: int = 1
    hosts: int = 1

    @property
    def size(self) -> int:
        return self.units * self.per_unit

    def describe(self) -> str:
        if self.hosts > 1:
            return f"{self.hosts} hosts x {self.per_unit} ranks"
        if self.per_unit > 1:
            return f"{self.units} units x {self.per_unit} ranks"
        return f"{self.units} ranks"


@dataclass(frozen=True)
class RunInfo:
    """What an nccl-tests run says about its hardware beyond the group: the GPU names of its
    rank lines, how many GPUs one process drives (`-g N`, or ranks sharing a Pid), whether two
    ranks share one GPU of a host, the NCCL version when the output prints it, and the
    NCCL_ALGO the run was launched with when its command line or NCCL's log says."""

    devices: tuple[str, ...] = ()
    gpus_per_process: int = 1
    shared_device: bool = False
    nccl_version: str | None = None
    nccl_algo: str | None = None
    # CPU cores the launcher binds each process to (nccl_text.bound_cores: Open MPI's defaults and
    # --bind-to); None: not bound, or the command line does not say
    cpu_cores: int | None = None


@dataclass(frozen=True)
class Measurement:
    """One timed call: `bytes` is the call's range B as the simulator counts it (the input of
    ReduceScatter, the output of AllGather, the buffer otherwise: nccl-tests' size column)."""

    collective: str
    bytes: int
    time_s: float
    span: Span
    file: str
    line: int
    backend: str | None = None  # what the file says ran the call, when it says
    run: RunInfo | None = None  # nccl-tests: what the run's header and rank lines say

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def _key(text: str) -> str:
    return re.sub(r"[^a-z]", "", text.lower())


_KNOWN = {_key(name): name for name in CALIBRATED}
_KNOWN.update({"bcast": "Broadcast"})
_OTHER = {_key(name): name for name in UNSUPPORTED}
_OTHER.update({"alltoallv": "AllToAllv"})


def collective_from_name(text: str, where: str) -> str:
    """'AllReduce', 'all_reduce', 'ncclAllReduce', 'allreduce' -> 'AllReduce'; anything else
    is a one-line UsageError naming the collectives a program can use."""
    key = _key(text)
    key = key[4:] if key.startswith("nccl") and key[4:] in _KNOWN else key
    if key in _KNOWN:
        return _KNOWN[key]
    supported = ", ".join(CALIBRATED)
    if key in _OTHER:
        raise UsageError(f"{where}: {_OTHER[key]} is not a collective programs use; calibrate from {supported}")
    raise UsageError(f"{where}: unknown collective {text.strip()!r}; use one of {supported}")


# What a timed collective call can take: no launch completes in under a nanosecond, and a
# figure over a day is a corrupted column, not a measurement (the written topology refuses
# latencies past a day too); outside it the fit overflows.
SHORTEST_TIME_S = 1e-9
LONGEST_TIME_S = 86400.0


def check_time(value: float, text: str, where: str, scale: float = 1.0) -> float:
    """The time in seconds (`value * scale`, the file's unit), refused when not a positive
    finite number within a timed call's physical range."""
    if not value > 0 or value == float("inf"):
        raise UsageError(f"{where}: time {text.strip()!r} is not a positive number")
    seconds = value * scale
    if not SHORTEST_TIME_S <= seconds <= LONGEST_TIME_S:
        unit = "s" if scale == 1.0 else "us" if scale == 1e-6 else f"x {scale:g} s"
        raise InputRangeError(f"{where}: time {text.strip()[:40]!r} ({unit}) is outside what a collective call takes "
                              f"(1 ns to 1 day); check the file's time column")
    return seconds


# The rates a measurement may imply: no link or memory moves more than 100 TB/s (ten times
# the fastest GPU memory), and no network is slower than 1 MB/s after a minute's latency
# (the written topology's longest latency).
FASTEST_RATE = 1e14
SLOWEST_RATE = 1e6
LONGEST_LATENCY_S = 60.0


def check_rate(measurement: Measurement) -> None:
    """Refuse a time that no hardware could take for its bytes (module constants)."""
    seconds, size = measurement.time_s, measurement.bytes
    if size > FASTEST_RATE * seconds:  # not size / seconds: a size of 400 digits is no float
        raise InputRangeError(f"{measurement.where}: {size:,} bytes in {seconds:.3g} s is faster than any "
                              f"link (at most 100 TB/s); check the file's time and size columns")
    if seconds > LONGEST_LATENCY_S + size / SLOWEST_RATE:
        raise InputRangeError(f"{measurement.where}: {size:,} bytes in {seconds:.3g} s is slower than any network "
                              f"(over a minute beyond 1 MB/s); check the file's time and size columns")


def parse_float(text: str, what: str, where: str) -> float:
    try:
        if not text.isascii():  # float() reads other scripts' digits too
            raise ValueError(text)
        return float(text)
    except ValueError:
        raise UsageError(f"{where}: {what} {text.strip()!r} is not a number") from None


def parse_count(text: str, what: str, where: str, minimum: int = 0) -> int:
    """A whole number written as digits (nccl-tests sizes and counts)."""
    stripped = text.strip()
    if len(stripped) > 20:  # past 2^64: no count or size nccl-tests prints (and no int() of 5,000 digits)
        raise InputRangeError(f"{where}: {what} {echo(stripped)} has more digits than any count (at most 20)")
    if not re.fullmatch(r"\+?[0-9]+", stripped) or int(stripped) < minimum:
        kind = "a whole number" if minimum == 0 else f"a whole number of at least {minimum}"
        raise UsageError(f"{where}: {what} {stripped!r} is not {kind}")
    return int(stripped)
