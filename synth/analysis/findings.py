"""What sweeps say about placements and programs: the placement spread and the share of wins.

Both are computed from sweep rows (synth/analysis/sweep.py), so every figure is a simulated
time of a real program on a real placement:

* placement spread, per (job, request, size), as `synth explore` defines it:
  best spread = slowest placement's best time / fastest placement's best time, and the same
  over the default all-reduce's times; plus the gap a user can fall into, the slowest
  placement running the default all-reduce against the fastest placement running its best
  program.
* share of wins, over (placement, request) pairs at a size: how often the best synthesized
  program beats the default all-reduce (by more than float rounding, `SweepRow.beats_baseline`),
  the largest speedup, and the mean speedup over all pairs (a pair the default already serves
  best counts as 1x) and over the wins alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from synth.placement import Axis
from synth.analysis.sweep import SweepRow
from synth.topology import Topology
from synth.topology_file import builtin_topology_names, load_topology


def multi_level_topologies() -> list[Topology]:
    """Built-in systems with two levels or more and the link figures costs need."""
    systems = [load_topology(name) for name in builtin_topology_names()]
    return [system for system in systems if len(system.levels) >= 2 and system.has_link_figures]


def data_model_jobs(topology: Topology) -> list[tuple[Axis, Axis]]:
    """Every data x model job filling the system with both axes of size 2 or more."""
    devices = topology.device_count
    return [(Axis("data", d), Axis("model", devices // d)) for d in range(2, devices // 2 + 1) if devices % d == 0]


def job_text(axes: Iterable[Axis]) -> str:
    return ",".join(f"{axis.name}={axis.size}" for axis in axes)


@dataclass(frozen=True)
class Spread:
    """Across the placements of one job, for one request and size."""

    topology: str
    axes: str
    reduce: str
    bytes: int
    placements: int
    best_fastest_s: float
    best_fastest_matrix: str
    best_slowest_s: float
    best_slowest_matrix: str
    baseline_fastest_s: float
    baseline_fastest_matrix: str
    baseline_slowest_s: float
    baseline_slowest_matrix: str

    @property
    def best_spread(self) -> float:
        return self.best_slowest_s / self.best_fastest_s

    @property
    def baseline_spread(self) -> float:
        return self.baseline_slowest_s / self.baseline_fastest_s

    @property
    def worst_over_best(self) -> float:
        """Slowest placement with the default all-reduce over fastest placement with its best program."""
        return self.baseline_slowest_s / self.best_fastest_s

    def to_json(self) -> dict:
        return dict(self.__dict__, best_spread=self.best_spread, baseline_spread=self.baseline_spread,
                    worst_over_best=self.worst_over_best)


def placement_spreads(rows: Iterable[SweepRow], axes: str) -> list[Spread]:
    """One Spread per (request, size) of one job's sweep; ties go to the first placement listed."""
    groups: dict[tuple[str, int], list[SweepRow]] = {}
    for row in rows:
        groups.setdefault((row.reduce, row.bytes), []).append(row)
    result = []
    for (reduce, size), members in groups.items():
        best_fast = min(members, key=lambda r: r.best_time_s)
        best_slow = max(members, key=lambda r: r.best_time_s)
        base_fast = min(members, key=lambda r: r.baseline_time_s)
        base_slow = max(members, key=lambda r: r.baseline_time_s)
        result.append(Spread(
            members[0].topology, axes, reduce, size, len(members), best_fast.best_time_s, best_fast.matrix,
            best_slow.best_time_s, best_slow.matrix, base_fast.baseline_time_s, base_fast.matrix,
            base_slow.baseline_time_s, base_slow.matrix))
    return result


@dataclass(frozen=True)
class Wins:
    """How often, and by how much, the best synthesized program beats the default all-reduce."""

    pairs: int
    wins: int
    max_speedup: float
    mean_speedup: float  # over every pair, 1x where the default is best
    mean_win_speedup: float  # over the wins only (1.0 when there are none)
    winners: tuple[tuple[str, int], ...]  # the programs that win most often, with their counts

    @property
    def share(self) -> float:
        return self.wins / self.pairs if self.pairs else 0.0

    def to_json(self) -> dict:
        return dict(self.__dict__, share=self.share, winners=[list(w) for w in self.winners])


def win_share(rows: Iterable[SweepRow], winners: int = 3) -> Wins:
    rows = list(rows)
    won = [row for row in rows if row.beats_baseline]
    speedups = [row.speedup for row in rows]
    counted = Counter(row.best_program for row in won).most_common(winners)
    return Wins(
        pairs=len(rows), wins=len(won), max_speedup=max(speedups, default=1.0),
        mean_speedup=sum(speedups) / len(speedups) if speedups else 1.0,
        mean_win_speedup=sum(row.speedup for row in won) / len(won) if won else 1.0,
        winners=tuple(counted),
    )
