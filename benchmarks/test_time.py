"""The test suite's time, as `.ci/run` measures it: written by the run, not by hand.

    python -m benchmarks.test_time --log PYTEST_OUTPUT --wall-s SECONDS [--cpu-s SECONDS] --load-before LOAD [-o results]

`.ci/run` times its `pytest -n 2 -q` (wall, and CPU where GNU time is) and hands the output here;
this reads pytest's summary line (passed, skipped, ... and pytest's own seconds), adds the
machine, the date and the load before and after, and writes results/test-time/README.md, which
the README points to. The CPU time says what the wall time would be on an idle machine: on a
shared one the wall time grows with the load, the CPU time much less.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from benchmarks.index import write_index
from benchmarks.record import REPORT, header, study_dir
from synth.output_files import write_text

COMMAND = ".ci/run"
TEST_COMMAND = "pytest -n 2 -q"
STUDY = "test-time"
_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|deselected|xfailed|xpassed|errors?|warnings?)")
_SECONDS = re.compile(r" in ([0-9.]+)s")


def summary(log: str) -> tuple[dict[str, int], float | None]:
    """pytest's last summary line: counts by outcome, and its own seconds."""
    lines = [line for line in log.splitlines() if _COUNTS.search(line) and _SECONDS.search(line)]
    if not lines:
        return {}, None
    last = lines[-1]
    counts = {kind.rstrip("s") if kind.startswith(("error", "warning")) else kind: int(number)
              for number, kind in _COUNTS.findall(last)}
    return counts, float(_SECONDS.search(last).group(1))


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def render(counts: dict[str, int], pytest_s: float | None, wall_s: float, load_before: float, load_after: float,
           exit_code: int, cpu_s: float | None = None, command: str = COMMAND, note: str = "") -> str:
    ran = sum(counts.get(kind, 0) for kind in ("passed", "failed", "error", "xfailed", "xpassed"))
    outcome = ", ".join(f"{number} {kind}" for kind, number in counts.items()) or "no summary line"
    lines = ["# Test suite time", "", header(command), "",
             f"`{TEST_COMMAND}` (two workers; the default selection: `-m 'not slow'`) after the installs: "
             f"{ran} tests run ({outcome}), exit status {exit_code}.", "",
             f"| tests run | pytest's time | wall time of `{TEST_COMMAND}` | CPU time (user + system) | cores | "
             "load before | load after |",
             "|---:|---:|---:|---:|---:|---:|---:|",
             f"| {ran} | {minutes(pytest_s) if pytest_s is not None else '-'} | {minutes(wall_s)} | "
             f"{minutes(cpu_s) if cpu_s is not None else '-'} | {os.cpu_count()} | {load_before:.1f} | {load_after:.1f} |",
             "",
             "The load is the 1-minute load average (on 2 cores, above 2 means the tests shared the cores with "
             "other work, and the wall time grows with it); the CPU time is the workers' and every process they "
             "waited for (torch ranks, the CLI runs), so CPU time / 2 bounds the wall time on an idle 2-core "
             "machine from below. Slow tests (`@pytest.mark.slow`: the long end-to-end runs that repeat what a "
             "faster test shows, the documents' benchmark examples) run apart with `pytest -m slow`."]
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", required=True, help="pytest's output")
    parser.add_argument("--wall-s", type=float, required=True, help="the wall time of the pytest run")
    parser.add_argument("--cpu-s", type=float, help="the CPU time (user + system) of the run and its children")
    parser.add_argument("--load-before", type=float, required=True, help="the 1-minute load average before it")
    parser.add_argument("--load-after", type=float, help="the 1-minute load average after it (default: now)")
    parser.add_argument("--command", default=COMMAND, help="what ran the tests (default %(default)s)")
    parser.add_argument("--note", default="", help="a paragraph on the run (what else shared the machine)")
    parser.add_argument("--exit-code", type=int, default=0, help="pytest's exit status")
    parser.add_argument("-o", "--output", default="results", help="the results directory (default results/)")
    args = parser.parse_args(argv)
    counts, pytest_s = summary(Path(args.log).read_text(encoding="utf-8", errors="replace"))
    load_after = os.getloadavg()[0] if args.load_after is None else args.load_after
    text = render(counts, pytest_s, args.wall_s, args.load_before, load_after, args.exit_code, args.cpu_s,
                  args.command, args.note)
    path = study_dir(STUDY, args.output) / REPORT
    write_text(path, text)
    write_index(args.output)  # results/README.md lists the study
    ran = sum(counts.get(kind, 0) for kind in ("passed", "failed", "error", "xfailed", "xpassed"))
    print(f"test time: {ran} tests, {TEST_COMMAND} took {minutes(args.wall_s)} wall at a load of {args.load_before:.1f} "
          f"on {os.cpu_count()} cores (written to {path})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
