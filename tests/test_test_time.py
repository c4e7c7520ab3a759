"""`.ci/run` writes the suite's time from pytest's own summary (benchmarks/test_time.py)."""

from benchmarks import test_time


def test_the_summary_line_gives_the_counts_and_pytest_s_seconds(tmp_path):
    log = "....\n= 2 failed, 2109 passed, 40 skipped, 3 deselected, 1 error in 721.31s (0:12:01) =\n"
    counts, seconds = test_time.summary(log)
    assert counts == {"failed": 2, "passed": 2109, "skipped": 40, "deselected": 3, "error": 1} and seconds == 721.31
    (tmp_path / "log").write_text(log)
    assert test_time.main(["--log", str(tmp_path / "log"), "--wall-s", "725", "--load-before", "2.5",
                           "--exit-code", "1", "-o", str(tmp_path)]) == 0
    text = (tmp_path / "test-time" / "README.md").read_text()
    assert "Command: `.ci/run`" in text and "| 2112 | 12 min 1 s | 12 min 5 s |" in text and "exit status 1" in text
    assert "| - |" in text  # no CPU time given: said, not guessed


def test_the_cpu_time_and_the_command_are_recorded(tmp_path):
    (tmp_path / "log").write_text("= 10 passed in 60.00s =\n")
    assert test_time.main(["--log", str(tmp_path / "log"), "--wall-s", "61", "--cpu-s", "130", "--load-before", "1",
                           "--load-after", "3.5", "--command", "pytest -n 2 -q", "--note", "Shared.", "-o", str(tmp_path)]) == 0
    text = (tmp_path / "test-time" / "README.md").read_text()
    assert "Command: `pytest -n 2 -q`" in text and "| 10 | 1 min 0 s | 1 min 1 s | 2 min 10 s | " in text
    assert "| 1.0 | 3.5 |" in text and text.rstrip().endswith("Shared.")


def test_no_summary_line_is_said_not_guessed():
    assert test_time.summary("collected 0 items\n") == ({}, None)
