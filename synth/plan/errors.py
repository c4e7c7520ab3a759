"""The planner's errors: typed, carrying the values at fault, never an option name (the command,
synth/commands/plan.py, names the option that changes each value)."""

from __future__ import annotations

from synth.errors import UsageError


class SearchBudgetError(UsageError):
    """A plan search refused before it starts: estimated over its time or memory budget, or a
    degree choice with more placements than can be listed. The fields let the command name
    its options (exit 2: the request asks for more work than can be done)."""

    def __init__(self, facts: str, fix: str, *, size, over: str, budget: float):
        super().__init__(f"{facts}: {fix}")
        self.facts = facts  # what was estimated, against which budget (no fix)
        self.size = size  # the search's synth.plan.search.SearchSize (this module sits below the search)
        self.over = over  # "time", "memory" or "placements"
        self.budget = budget  # seconds, bytes or placements


class BudgetValueError(UsageError):
    """A budget that is not a positive, finite number (`nan` and `inf` would switch the refusal off)."""

    def __init__(self, message: str, *, which: str, value: float):
        super().__init__(message)
        self.which = which  # "time" or "memory"
        self.value = value


class LimitValueError(UsageError):
    """A degree limit that is not a positive integer."""

    def __init__(self, message: str, *, limit: str, value):
        super().__init__(message)
        self.limit = limit  # "dp", "tp", "pp", "cp" or "max_tp"
        self.value = value


class MissingFigureError(UsageError):
    """A figure the step model needs that the topology's [device] table lacks."""

    def __init__(self, message: str, *, figure: str):
        super().__init__(message)
        self.figure = figure  # e.g. "matmul_efficiency"
