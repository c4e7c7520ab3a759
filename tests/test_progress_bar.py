"""Progress on a terminal whenever a command may run over two seconds (synth/commands/progress_bar.py),
shown on a fake terminal: at once when the estimate's upper bound passes two seconds, else once
the elapsed time does; never off a terminal."""

from __future__ import annotations

import io
import time

from synth.commands import progress_bar as bars


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def fake_terminal(monkeypatch) -> FakeTerminal:
    """A fake terminal as stderr, installed in the test body (pytest's capture sets sys.stderr
    again between a fixture's setup and the test)."""
    fake = FakeTerminal()
    monkeypatch.delenv("TERM", raising=False)
    monkeypatch.setattr("sys.stderr", fake)
    return fake


def test_the_upper_bound_decides_not_the_estimate():
    # an estimate of 1.5 s may be 3 s: shown; 0.9 s (upper bound 1.8 s) waits for the clock
    assert bars.shows_at_once(1.5) and bars.shows_at_once(1.0)
    assert not bars.shows_at_once(0.9)


def test_an_estimate_whose_bound_passes_two_seconds_shows_at_once(monkeypatch):
    terminal = fake_terminal(monkeypatch)
    bar = bars.progress_bar("40 candidates", 4, estimated_s=1.5)
    assert bar is not None and bar.shown
    bar(1, 4)
    bar.stop()
    assert terminal.getvalue(), "nothing was drawn on the terminal"


def test_a_short_estimate_still_shows_once_the_elapsed_time_passes(monkeypatch):
    terminal = fake_terminal(monkeypatch)
    bar = bars.ProgressBar("4 candidates", 4, estimated_s=0.01, show_after_s=0.05)
    assert not bar.shown
    deadline = time.monotonic() + 5
    while not bar.shown and time.monotonic() < deadline:
        time.sleep(0.01)
    assert bar.shown, "a run past the threshold must show progress even when estimated short"
    bar.stop()
    assert terminal.getvalue()


def test_a_short_run_stays_silent(monkeypatch):
    terminal = fake_terminal(monkeypatch)
    bar = bars.ProgressBar("4 candidates", 4, estimated_s=0.01, show_after_s=0.2)
    bar(4, 4)  # finished before the threshold: stopped, the timer cancelled
    time.sleep(0.3)
    assert not bar.shown and terminal.getvalue() == ""


def test_no_bar_off_a_terminal(monkeypatch):
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert bars.progress_bar("x", 1, estimated_s=100) is None


def test_plan_shows_its_bar_on_a_terminal_for_a_search_estimated_under_two_seconds(monkeypatch):
    terminal = fake_terminal(monkeypatch)
    """The planner's own hook: an estimate of 1.2 s (under the old 2 s threshold, with an upper bound over it) shows at once."""
    from synth.commands.plan import _progress
    from synth.plan.search import SearchSize

    size = SearchSize(degrees=1, placements=3, candidates=30, estimated_s=1.2, refused=())
    bar = _progress(size)
    assert bar is not None and bar.shown
    bar(3, 3)
    assert terminal.getvalue()


def test_commands_without_an_estimate_show_a_bar_once_two_seconds_pass(monkeypatch):
    """rank, explore and explore --reduction: the bar appears after the threshold and is gone
    (stopped) when the block ends, before the results are printed."""
    terminal = fake_terminal(monkeypatch)
    with bars.working("3 placement(s)", 3, show_after_s=0.05) as bar:
        deadline = time.monotonic() + 5
        while not bar.shown and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bar.shown
    assert terminal.getvalue()
    assert not bar._timer.is_alive()


def test_rank_runs_with_its_bar_and_prints_the_same(run_cli):
    """The ranking's loop through the bar prints what it printed (off a terminal: no bar)."""
    code, out, _ = run_cli("rank", "--topology", "emu-2x4", "--axes", "data=8", "--reduce", "data", "--bytes", "1MiB",
                           "--top", "2")
    assert code == 0 and "AllReduce" in out
