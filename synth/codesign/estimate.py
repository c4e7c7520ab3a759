"""What a sweep costs before it starts, from the planner's own estimate of each point.

Each point's search is counted by the planner (synth.plan.search.estimate: its candidates,
first bounds, placements, gradient schedules and group shapes, each unit at its measured CPU
seconds). Shared work is counted once: points with the same system (the same base, device and
level figures) share their priced collectives (synth/codesign/run.py), so the group-shape
part of a system's points is counted as the largest of them, not their sum (the
points differ in model and batch, whose shapes are mostly the same ones). Every point adds the
engine's own overhead (SECONDS_PER_POINT, benchmarks/codesign.py). A point whose request cannot
be built or whose search the planner refuses costs nothing here: it fails fast and is recorded.

Memory: each worker holds the largest point's search and, at most, every system's memo.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from synth.codesign.run import RunOptions, request_of, search_size

SHARED_UNITS = ("group_shapes",)
# CPU seconds a point costs beyond what the planner's units count: building its system and
# request, the row, and the fixed costs of a small plan the units leave out (a placement listing's
# solver set-up, the first costing of each kernel shape). The points' measured CPU less the
# planner's estimate of them, per point, was 11 ms (240 consecutive points of
# benchmarks/grids/codesign-10k.toml) to 28 ms (240 points of 48 systems, results/codesign/README.md)
# on the project's 2-core VM, loaded: 15 ms taken.
SECONDS_PER_POINT = 15e-3


@dataclass(frozen=True)
class SweepEstimate:
    points: int
    failing: int  # points whose request or search the planner refuses (recorded as errors)
    systems: int  # distinct systems: the memo's groups
    cpu_s: float
    shared_s: float  # of cpu_s, the group-shape work, counted once per system
    unshared_s: float  # what the shared part would have been, point by point
    worker_bytes: float  # one worker's peak

    def wall_s(self, workers: int) -> float:
        return self.cpu_s / max(1, workers)

    def to_json(self) -> dict:
        return {"points": self.points, "failing": self.failing, "systems": self.systems, "cpu_s": self.cpu_s,
                "shared_s": self.shared_s, "unshared_s": self.unshared_s, "worker_bytes": self.worker_bytes}


def estimate_sweep(points: Iterable, options: RunOptions) -> SweepEstimate:
    from synth.plan.search import BASE_BYTES, check_size

    count = failing = 0
    rest = unshared = 0.0
    largest = float(BASE_BYTES)
    systems: dict[tuple, tuple[float, float]] = {}  # system -> (largest shared seconds, largest memo bytes)
    for point in points:
        count += 1
        try:
            request = request_of(point, options)
            size = search_size(request)
            check_size(size, request)
        except Exception:  # the point fails when planned, quickly, and is recorded there
            failing += 1
            continue
        units = size.seconds_by_unit()
        shared = sum(units[name] for name in SHARED_UNITS)
        rest += sum(units.values()) - shared
        unshared += shared
        key = point.system_values()
        seconds, memo = systems.get(key, (0.0, 0.0))
        systems[key] = (max(seconds, shared), max(memo, size.estimated_bytes - BASE_BYTES))
        largest = max(largest, size.estimated_bytes)
    shared_s = sum(seconds for seconds, _ in systems.values())
    memo_bytes = sum(memo for _, memo in systems.values())
    cpu = rest + shared_s + count * SECONDS_PER_POINT
    return SweepEstimate(count, failing, len(systems), cpu, shared_s, unshared, largest + memo_bytes)
