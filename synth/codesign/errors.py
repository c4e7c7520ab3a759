"""The sweep's errors: values only, for the command to name its options."""

from __future__ import annotations

from synth.errors import UsageError


class GridError(UsageError):
    """A grid file that cannot be read or holds a value no point could use (exit 2)."""


class MissingExtraError(UsageError):
    """An executor or output format whose library is not installed (exit 2): `extra` names the
    pyproject extra that installs it."""

    def __init__(self, message: str, *, extra: str):
        super().__init__(message)
        self.extra = extra


class SweepBudgetError(UsageError):
    """A sweep estimated over its time or memory budget, refused before it starts (exit 2):
    `over` is "time" or "memory", `estimate` and `budget` in seconds or bytes."""

    def __init__(self, message: str, *, over: str, estimate: float, budget: float):
        super().__init__(message)
        self.over = over
        self.estimate = estimate
        self.budget = budget


class UnreachableClusterError(UsageError):
    """A Ray or Dask cluster that cannot be reached at the address given (exit 2)."""
