"""A progress bar on a terminal for work that may run over two seconds of wall time.

The planner's estimate is CPU time and can be low by a factor of two, and a loaded machine adds
wall time on top: a bar that waited for the estimate to reach two seconds left an MoE plan of
100 s silent. So the bar shows at once when the estimate's upper bound (ESTIMATE_LOW_BY times
the estimate) may pass SHOW_AFTER_S, and otherwise as soon as the elapsed wall time passes it
(a timer, so one long step cannot keep it hidden). Off a terminal there is no bar.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager

SHOW_AFTER_S = 2.0  # wall time a command may stay silent on a terminal
ESTIMATE_LOW_BY = 2.0  # the CPU estimate's error bound (a factor), before load adds wall time


def shows_at_once(estimated_s: float) -> bool:
    """Whether the estimate's upper bound of wall time may exceed SHOW_AFTER_S."""
    return estimated_s * ESTIMATE_LOW_BY >= SHOW_AFTER_S


class ProgressBar:
    """`update(done, total)` after each unit of work; `stop()` before printing results (also
    after an interruption). The rich bar starts at once or after SHOW_AFTER_S (module docstring)."""

    def __init__(self, description: str, total: int | None, estimated_s: float, console=None,
                 show_after_s: float = SHOW_AFTER_S):
        from rich.progress import Progress

        from synth.commands.terminal import console as text_console

        self._progress = Progress(transient=True, console=console or text_console(stderr=True))
        self._task = self._progress.add_task(description, total=total)
        self._lock = threading.Lock()
        self._started = self._stopped = False
        self._timer = None
        if shows_at_once(estimated_s):
            self._start()
        else:
            self._timer = threading.Timer(show_after_s, self._start)
            self._timer.daemon = True
            self._timer.start()

    @property
    def shown(self) -> bool:
        return self._started

    def _start(self) -> None:
        with self._lock:
            if not self._started and not self._stopped:
                self._progress.start()
                self._started = True

    def update(self, done: int, total: int) -> None:
        self._progress.update(self._task, completed=done, total=total)
        if done >= total:
            self.stop()

    __call__ = update

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            if self._timer is not None:
                self._timer.cancel()
            if self._started:
                self._progress.stop()


def progress_bar(description: str, total: int | None, estimated_s: float,
                 show_after_s: float = SHOW_AFTER_S) -> ProgressBar | None:
    """A ProgressBar on a terminal (stderr); None when stderr is not one."""
    if not sys.stderr.isatty():
        return None
    return ProgressBar(description, total, estimated_s, show_after_s=show_after_s)


@contextmanager
def working(description: str, total: int | None = None, show_after_s: float = SHOW_AFTER_S):
    """A bar (None off a terminal) for work with no estimate: it shows once two seconds have
    passed, and goes when the block ends, before the command prints its results."""
    bar = progress_bar(description, total, 0.0, show_after_s)
    try:
        yield bar
    finally:
        if bar is not None:
            bar.stop()
