"""One row of a ranking: a program at one size with its time and the objectives a Pareto front
compares (its own module so the rankers of every goal share it without importing each other)."""

from __future__ import annotations

from dataclasses import dataclass

from synth.language import Program


@dataclass(frozen=True)
class RankedProgram:
    program: Program
    matrix: tuple[tuple[int, ...], ...]
    bytes: int
    time_s: float
    algbw_GBps: float
    busbw_GBps: float
    speedup: float  # baseline time / this time
    bound_ratio: float  # this time / lower bound, >= 1
    baseline: bool
    extra_memory_bytes: int
    communicators: int
    calls_per_device: int
    length: int

    @property
    def objectives(self) -> tuple[float, int, int, int]:
        return (self.time_s, self.extra_memory_bytes, self.communicators, self.calls_per_device)

    def to_json(self) -> dict:
        return {
            "program": str(self.program), "matrix": [list(row) for row in self.matrix], "bytes": self.bytes,
            "time_s": self.time_s, "algbw_GBps": self.algbw_GBps, "busbw_GBps": self.busbw_GBps,
            "speedup": self.speedup, "bound_ratio": self.bound_ratio, "baseline": self.baseline,
            "extra_memory_bytes": self.extra_memory_bytes, "communicators": self.communicators,
            "calls_per_device": self.calls_per_device, "length": self.length,
        }
