"""benchmarks/moe_dispatch.py on one small system: its rows and its report (the study itself
is results/moe-dispatch, written by the benchmark, not by this test)."""

from __future__ import annotations

from benchmarks.moe_dispatch import render, rows_for, won
from synth.topology_file import load_topology


def test_rows_and_report_on_a_two_node_system():
    rows = rows_for(load_topology("emu-2x4"))
    assert {row.goal for row in rows} == {"dispatch", "combine"}
    deepseek = [row for row in rows if row.model == "deepseek-v3" and row.skew == "uniform" and row.goal == "dispatch"]
    assert deepseek and all(won(row) for row in deepseek)
    assert deepseek[0].best_program == "AllToAll(Parallel(node)); AllToAll(InsideGroup(gpu))"
    text = render(rows, 1.0)
    assert "Command: `python -m benchmarks.moe_dispatch`" in text and "Machine:" in text and "Date:" in text
    assert "there is no held-out all-to-all figure" in text
