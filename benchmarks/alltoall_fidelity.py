"""Which published nccl-tests logs could judge the all-to-all model (NCCL's point-to-point
schedule, synth/model/nccl/p2p.py), and what the held-out check needs.

Scans a folder of nccl-tests logs (default ../shared/nccl-logs; each log's first line names its
source and hardware) for `alltoall_perf` runs: by file name, and by nccl-tests' own banner
(`# Collective test starting: alltoall_perf`) or the all-to-all's `redop none` rows with an
`alltoall` name in the first lines. Writes results/alltoall-fidelity/README.md and
inventory.json: the logs read, their collectives, and the all-to-all runs found. The
leave-one-source-out errors per size band, before and after the p2p schedule, need such runs
(benchmarks/fidelity.py then gains their sources); with none, the report says so and nothing is
scored. The repository does not depend on LOG_DIR.

    python -m benchmarks.alltoall_fidelity [LOG_DIR] [-o results]
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from benchmarks.record import DEFAULT_LOGS, REPORT, header, log_folder, log_folder_parser, study_dir

STUDY = "alltoall-fidelity"
COLLECTIVE = re.compile(r"(all_reduce|all_gather|reduce_scatter|alltoall|all_to_all|broadcast|reduce|sendrecv)_perf")


def collective_of(path: Path) -> str:
    """The nccl-tests program a log ran: from its name, else from its first lines."""
    found = COLLECTIVE.search(path.name)
    if found:
        return found.group(1)
    with open(path, errors="replace") as handle:
        head = "".join(handle.readline() for _ in range(40))
    found = COLLECTIVE.search(head)
    return found.group(1) if found else "unknown"


def inventory(log_dir: Path) -> list[dict]:
    rows = []
    for path in sorted(log_dir.iterdir()):
        if not path.is_file():
            continue
        with open(path, errors="replace") as handle:
            first = handle.readline().strip()
        rows.append({"file": path.name, "collective": collective_of(path), "source": first.lstrip("# ")[:160]})
    return rows


def render(rows: list[dict], command: str) -> str:
    exchanges = [row for row in rows if row["collective"] in ("alltoall", "all_to_all")]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["collective"]] = counts.get(row["collective"], 0) + 1
    lines = ["# All-to-all against published nccl-tests runs", "", header(command), "",
             f"Load average (1/5/15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())} (an inventory: the load "
             f"changes nothing here)", "",
             f"Logs read: {len(rows)} ({', '.join(f'{n} {name}' for name, n in sorted(counts.items()))}).", ""]
    if not exchanges:
        lines += ["**No `alltoall_perf` run among them**, so the all-to-all model has no held-out error to report, "
                  "before or after NCCL's point-to-point schedule (synth/model/nccl/p2p.py) was added: no band "
                  "is scored, and no figure of the schedule was fitted on any log. Every figure it uses is read "
                  "from NCCL 2.26.2's source (channels per peer, the 16 KiB LL threshold per channel, chunk sizes, "
                  "8 operations per batch, 4 KiB of kernel arguments, getNetOverhead per post) or is a NIC "
                  "datasheet's message rate (`DEFAULT_MESSAGE_RATE`, a topology figure where a cluster gives its "
                  "own).", "",
                  "What scoring it needs: `alltoall_perf` logs from two or more sources (a first line naming the "
                  "source and hardware, as the others), each source added to `benchmarks/fidelity.py`'s SOURCES; "
                  "`synth calibrate` already reads them (synth/calibrate/all_to_all.py, whose fitted figures are "
                  "the all-to-all's own per level, refitted per fold).", ""]
    else:
        lines += ["All-to-all runs found (not yet scored: add their sources to `benchmarks/fidelity.py`):", ""]
        lines += [f"* {row['file']}: {row['source']}" for row in exchanges]
        lines.append("")
    lines += ["| log | collective |", "|---|---|"]
    lines += [f"| {row['file']} | {row['collective']} |" for row in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = log_folder_parser("alltoall_fidelity", __doc__.splitlines()[0], STUDY)
    args = parser.parse_args(argv)
    log_dir = log_folder(args.logs, "alltoall_fidelity")
    if log_dir is None:
        return 2
    rows = inventory(log_dir)
    folder = study_dir(STUDY, args.output)
    command = "python -m benchmarks.alltoall_fidelity" + ("" if args.logs == DEFAULT_LOGS else " LOG_DIR")
    (folder / REPORT).write_text(render(rows, command))
    (folder / "inventory.json").write_text(json.dumps({"command": command, "logs": rows}, indent=1) + "\n")
    print(f"wrote {folder / REPORT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
