"""Exception classes. The CLI maps them to exit codes, so a user never sees a traceback.

`UsageError` (exit 2) means the caller asked for something malformed or impossible to
interpret. `NoSolutionError` (exit 1) means the question was well formed but has no answer:
no program, an invalid program, a goal not reached.
"""

from __future__ import annotations


class SynthError(Exception):
    """Base class of every error the tool reports to a user."""

    exit_code = 1


class UsageError(SynthError, ValueError):
    """Malformed input: a bad name, file, matrix, size or option. Exit code 2."""

    exit_code = 2


class ProgramSyntaxError(UsageError):
    """A program text that does not parse; the message carries line, column and a caret."""


class NoSolutionError(SynthError):
    """A well-formed request with no answer (no placement, no program). Exit code 1."""

    exit_code = 1


class InvalidProgramError(NoSolutionError):
    """A program that breaks a precondition, makes a no-op step or misses the goal."""

    def __init__(self, message: str, step_index: int | None = None):
        super().__init__(message)
        self.step_index = step_index
