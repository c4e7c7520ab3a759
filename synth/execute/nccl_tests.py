"""nccl-tests' table, for `synth bench` to print its measurements as all_reduce_perf does.

The exported scripts print the same rows themselves (synth/export/torch_runtime.py carries its
own copy, since a script imports nothing of synth); tests hold the two equal. Columns: size
(B), count (elements), type, redop, root, then time (us), algbw and busbw (GB/s) and #wrong
out of place and in place, and "Avg bus bandwidth" last, as nccl-tests' common.cu prints them.
Programs and torch's all_reduce run in place only, so their out-of-place cells read N/A.
"""

from __future__ import annotations

HEADER = (f"#{'':<47} {'out-of-place':^31} {'in-place':^31}\n"
          f"#{'size':>11} {'count':>12} {'type':>8} {'redop':>6} {'root':>6} "
          f"{'time':>8} {'algbw':>7} {'busbw':>7} {'#wrong':>6} {'time':>8} {'algbw':>7} {'busbw':>7} {'#wrong':>6}\n"
          f"#{'(B)':>11} {'(elements)':>12} {'':>8} {'':>6} {'':>6} "
          f"{'(us)':>8} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6} {'(us)':>8} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}")


def format_row(values: dict) -> str:
    """One row from {bytes, count, type, time_us, algbw_gbs, busbw_gbs, wrong (None: N/A)}."""
    wrong = "N/A" if values["wrong"] is None else str(values["wrong"])
    return (f"{values['bytes']:>12} {values['count']:>12} {values['type']:>8} {'sum':>6} {-1:>6} "
            f"{'N/A':>8} {'N/A':>7} {'N/A':>7} {'N/A':>6} "
            f"{values['time_us']:>8.2f} {values['algbw_gbs']:>7.2f} {values['busbw_gbs']:>7.2f} {wrong:>6}")


def footer(rows: list[dict]) -> str:
    """nccl-tests' closing line: the mean bus bandwidth over the rows above."""
    return f"# Avg bus bandwidth    : {sum(r['busbw_gbs'] for r in rows) / max(1, len(rows)):.6g} "
