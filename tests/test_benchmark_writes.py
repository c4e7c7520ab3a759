"""Benchmarks write their results through synth.output_files (atomic, never a half-written file
under results/), not with Path.write_text or open(..., "w"); only scratch files in a temporary
directory, which the run removes, are written plainly."""

import ast
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
# The benchmarks switched to the one writer, and the scratch files each may still write plainly
# (by the name of the path written to).
SWITCHED = {
    "accuracy.py": {"script"},  # the generated torch script, in a temporary directory
    "calibrate_read.py": {"path"},  # test files made in a temporary directory
    "estimates.py": set(),
    "index.py": set(),
    "microbench.py": {"case_path"},  # the case list handed to the ranks, in a temporary directory
    "quick_start.py": set(),
    "test_time.py": set(),
    "ranking.py": set(),
    "results.py": set(),
    "startup.py": set(),
    "sweep.py": set(),
    "synthesis.py": set(),
    "training.py": set(),
}


def _plain_writes(source: str, scratch: set[str]) -> list[int]:
    """Lines that write a file other than through synth.output_files."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        receiver = node.func.value
        name = receiver.id if isinstance(receiver, ast.Name) else None
        if node.func.attr in ("write_text", "write_bytes") and name not in scratch:
            lines.append(node.lineno)
        if node.func.attr == "open" and name not in scratch:
            modes = [arg.value for arg in node.args[:1] if isinstance(arg, ast.Constant)]
            modes += [kw.value.value for kw in node.keywords if kw.arg == "mode" and isinstance(kw.value, ast.Constant)]
            if any(isinstance(mode, str) and set(mode) & set("wax") for mode in modes):
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("name", sorted(SWITCHED))
def test_results_are_written_through_the_one_writer(name):
    path = BENCHMARKS / name
    if not path.exists():
        pytest.skip(f"benchmarks/{name} is not in this checkout")
    assert _plain_writes(path.read_text(encoding="utf-8"), SWITCHED[name]) == [], \
        f"benchmarks/{name}: write results with synth.output_files.write_text / writing"
