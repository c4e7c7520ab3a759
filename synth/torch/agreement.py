"""Ranks that would run different programs fail at once, with the difference named, instead
of hanging in mismatched collectives.

A program's calls depend on the plan, the program chosen for the tensor's size in bytes, the
element count and the type: two ranks of a reduction group that differ in any of these make
different calls (one rank in float32 runs the program for twice the bytes of its bfloat16
neighbours) and wait on each other until the group's timeout. So the ranks compare before:
the plan (every rank, once, when the reducer is built) and, the first time this rank reduces a
tensor of a given (program, type, element count, op), that signature over the reduction group
(one all_gather of five integers). Ranks that agree on every first use run the same calls
until their sequences diverge on signatures both have seen; that later divergence is caught
by the groups' timeout, which is the job's own (`default_timeout`), not the backend's 30 minutes.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import torch
import torch.distributed as dist

from synth.torch.errors import RankDisagreementError

DTYPE_CODES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32,
               torch.int16, torch.int8, torch.uint8, torch.bool)
OPS = ("sum", "avg", "premul_sum")  # codes compared across ranks (synth.torch.collectives adds FSDP's premul_sum)


def default_timeout() -> timedelta | None:
    """The timeout the default process group was started with (`init_process_group(timeout=...)`,
    or the backend's default), read from its backend's options; None where torch does not say."""
    group = dist.distributed_c10d._get_default_group()
    for device in getattr(group, "_device_types", ()):
        try:
            timeout = getattr(group._get_backend(device).options, "_timeout", None)
        except (AttributeError, RuntimeError):
            continue
        if isinstance(timeout, timedelta) and timeout > timedelta(0):
            return timeout
    return None


def group_timeout(group) -> timedelta | None:
    """The timeout of a process group's first backend (for reports and tests)."""
    for device in getattr(group, "_device_types", ()):
        try:
            return group._get_backend(device).options._timeout
        except (AttributeError, RuntimeError):
            continue
    return None


def digest(document) -> int:
    """A 63-bit digest of a JSON document, the same on every rank."""
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


def dtype_code(dtype: torch.dtype) -> int:
    return DTYPE_CODES.index(dtype) if dtype in DTYPE_CODES else len(DTYPE_CODES) + digest(str(dtype)) % 1000


def dtype_name(code: int) -> str:
    return str(DTYPE_CODES[code]).removeprefix("torch.") if 0 <= code < len(DTYPE_CODES) else f"type #{code}"


def gather(values: list[int], group, device) -> list[tuple[int, ...]]:
    """Every member's `values` (same length on all), in group rank order."""
    tensor = torch.tensor(values, dtype=torch.int64, device=device)
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, tensor, group=group)
    return [tuple(int(v) for v in t.tolist()) for t in gathered]


def _by_value(gathered, group) -> dict[tuple[int, ...], list[int]]:
    """{values: global ranks holding them}"""
    held: dict[tuple[int, ...], list[int]] = {}
    for group_rank, values in enumerate(gathered):
        rank = group_rank if group is None else dist.get_global_rank(group, group_rank)
        held.setdefault(values, []).append(rank)
    return held


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks[:8]))}" + (
        f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def agree_on_plan(plan_digest: int, op: str, device) -> None:
    """Every rank of the world built the reducer from the same plan with the same op."""
    held = _by_value(gather([plan_digest, OPS.index(op)], None, device), None)
    if len(held) > 1:
        parts = [f"{_ranks(ranks)}: plan {values[0]:016x}, op {OPS[values[1]]!r}" for values, ranks in held.items()]
        raise RankDisagreementError(
            f"ranks built their reducers from different plans or ops ({'; '.join(parts)}): every rank must use the "
            "same plan (build it the same way on every rank, or save it on rank 0 and load_plan it on the others) "
            "and the same op")


def agree_on_tensor(signature: tuple[int, int, int, int, int], group, device, describe) -> None:
    """The members of `group` reduce tensors of the same (plan, program, type, elements, op).
    `describe(program, dtype name, elements, op)` words one member's side for the message."""
    held = _by_value(gather(list(signature), group, device), group)
    if len(held) > 1:
        parts = [f"{_ranks(ranks)}: {describe(values[1], dtype_name(values[2]), values[3], OPS[values[4]])}"
                 + (" (another plan)" if values[0] != signature[0] else "") for values, ranks in held.items()]
        raise RankDisagreementError(
            f"the ranks of a reduction group would run different programs ({'; '.join(parts)}): every rank must "
            "reduce the same tensors in the same order. Check that all ranks train the same model with the same "
            "type (mixed-precision settings, param_dtype/reduce_dtype) and the same bucket or shard sizes")
