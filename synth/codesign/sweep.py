"""A sweep run: the grid's unfinished points, in chunks, through an executor, into the results file."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from synth.codesign.executors import run_tasks
from synth.codesign.grid import Grid
from synth.codesign.points import chunks, points
from synth.codesign.results import ResultsFile, columns_for
from synth.codesign.run import RunOptions


def options_for(grid: Grid, point_budget_s: float, point_memory_bytes: float) -> RunOptions:
    return RunOptions(grid.token_budget, grid.prices, grid.max_len, grid.backend, grid.memory_headroom,
                      point_budget_s, point_memory_bytes)


def results_file(grid: Grid, path) -> ResultsFile:
    return ResultsFile(path, columns_for(tuple(axis.name for axis in grid.axes)))


def unfinished(grid: Grid, finished: set[str]):
    """The grid's points not in the results file yet, lazily."""
    return (point for point in points(grid) if point.key not in finished)


@dataclass
class SweepCounts:
    planned: int = 0
    failed: int = 0
    memo_hits: int = 0
    memo_misses: int = 0
    cpu_s: float = 0.0

    @property
    def hit_rate(self) -> float:
        lookups = self.memo_hits + self.memo_misses
        return self.memo_hits / lookups if lookups else 0.0


def run_sweep(grid: Grid, results: ResultsFile, options: RunOptions, executor: str = "local", workers: int = 1,
              address: str | None = None, chunk: int = 8,
              progress: Callable[[SweepCounts], None] | None = None, limit: int | None = None) -> SweepCounts:
    """Plan every point not in `results` (the first `limit` of them) and append its row as its chunk finishes."""
    counts = SweepCounts()
    todo = unfinished(grid, set(results.finished))
    tasks = chunks(todo if limit is None else itertools.islice(todo, limit), chunk)
    for rows in run_tasks(executor, tasks, options, workers, address):
        results.append(rows)
        for row in rows:
            counts.planned += 1
            counts.failed += row["status"] != "ok"
            counts.memo_hits += row["memo_hits"]
            counts.memo_misses += row["memo_misses"]
            counts.cpu_s += row["cpu_s"]
        if progress is not None:
            progress(counts)
    return counts
