"""The end every torch test worker shares: each rank's report gathered, written by rank 0 as
the JSON the test reads, and the process group closed on every rank together."""

from __future__ import annotations

import json
from pathlib import Path

import torch.distributed as dist


def finish(report: dict, json_out: str | None) -> int:
    reports = [None] * dist.get_world_size()
    dist.all_gather_object(reports, report)
    if dist.get_rank() == 0 and json_out:
        Path(json_out).write_text(json.dumps({"ranks": reports}))
    dist.barrier()
    dist.destroy_process_group()
    return 0
