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
    """Malformed input: a bad name, file, matrix, size or option. Exit code 2.

    `inputs` names the inputs that would fix it, as the library knows them ("topology",
    "level"); the command line names the option that sets each (the library never does)."""

    exit_code = 2
    inputs: tuple[str, ...] = ()

    def __init__(self, *args, inputs: tuple[str, ...] = ()):
        super().__init__(*args)
        if inputs:
            self.inputs = tuple(inputs)


class ProgramSyntaxError(UsageError):
    """A program text that does not parse; the message carries line, column and a caret."""


class InputRangeError(UsageError):
    """A figure read from an input file (a measured time, a model's ratio) outside what is
    physically possible: caught where the file is read, so nothing downstream overflows."""


class ExportTooLargeError(UsageError):
    """An export estimated, before any per-rank work, to be too large to write in reasonable time."""


class NoSolutionError(SynthError):
    """A well-formed request with no answer (no placement, no program). Exit code 1."""

    exit_code = 1


class InvalidProgramError(NoSolutionError):
    """A program that breaks a precondition, makes a no-op step or misses the goal."""

    def __init__(self, message: str, step_index: int | None = None):
        super().__init__(message)
        self.step_index = step_index


class SearchTooLargeError(UsageError):
    """A program search estimated not to finish in reasonable time, refused before it starts.

    A usage error (exit 2), not "no solution": programs exist, the request asks for more work
    than can be done, and the caller must change a value. The fields let a command name its
    own option: `max_len` asked for, `largest_length` the longest that fits the budget (0:
    none, the hierarchy itself is too deep), `depth` the hierarchy's levels of size > 1.
    """

    def __init__(self, message: str, *, depth: int, max_len: int, largest_length: int,
                 expansions: int, seconds: float):
        super().__init__(message)
        self.depth = depth
        self.max_len = max_len
        self.largest_length = largest_length
        self.expansions = expansions
        self.seconds = seconds


class PlanFileError(UsageError):
    """A plan file (or document) with a malformed field, or whose calls do not compute the goal
    its programs claim: a changed or damaged file. The message names the field. Exit code 2."""
