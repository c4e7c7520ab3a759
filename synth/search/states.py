"""Semantic states as people read them: each member's chunk range and, per chunk, whose data
has been summed into it (docs/model.md section 7 writes its worked examples this way).

    member 1 (cpu 0, gpu 1): [2,4) {0,1} {0,1}

is member 1 of the reduction group, at position 0 of level cpu and 1 of level gpu, holding
chunks 2 and 3, each the sum of members 0 and 1's data. `empty` is a member holding nothing.
Sets of three or more consecutive members are written as ranges, `{0-3}`. For goals whose
blocks move (reduce-scatter, all-gather, all-to-all) each chunk is written `block<-{set}`,
and a line `layout: gpu,cpu` follows the members while the buffers are permuted.
"""

from __future__ import annotations

from itertools import product as cartesian

from synth.semantics import Semantics, StepTrace


def format_members(members: int) -> str:
    """A contributor bitmask as `{0,1}` or `{0-3}`."""
    ranks = [rank for rank in range(members.bit_length()) if members >> rank & 1]
    parts, start = [], 0
    while start < len(ranks):
        end = start
        while end + 1 < len(ranks) and ranks[end + 1] == ranks[end] + 1:
            end += 1
        if end - start >= 2:
            parts.append(f"{ranks[start]}-{ranks[end]}")
        else:
            parts.extend(str(rank) for rank in ranks[start:end + 1])
        start = end + 1
    return "{" + ",".join(parts) + "}"


def format_state(semantics: Semantics, state: tuple) -> list[str]:
    """One line per member, in member-rank order."""
    positions = list(cartesian(*(range(size) for size in semantics.sizes)))
    lines = []
    for rank, (member, position) in enumerate(zip(state, positions)):
        where = ", ".join(f"{name} {p}" for name, p in zip(semantics.level_names, position))
        label = f"member {rank} ({where})" if where else f"member {rank}"
        if member is None:
            lines.append(f"{label}: empty")
        elif member.tags is None:
            sets = " ".join(format_members(chunk) for chunk in semantics.chunk_sets(member))
            lines.append(f"{label}: [{member[0]},{member[1]}) {sets}")
        else:  # goals whose blocks move: each chunk as block<-contributors
            chunks = " ".join(f"{tag}<-{format_members(chunk)}" for tag, chunk in zip(member.tags, semantics.chunk_sets(member)))
            lines.append(f"{label}: [{member[0]},{member[1]}) {chunks}")
    if state and any(member is not None and member.order is not None for member in state):
        order = next(member.order for member in state if member is not None)
        if order != semantics.canonical_order:
            lines.append("layout: " + ",".join(semantics.level_names[level] for level in order))
    return lines


def format_trace(semantics: Semantics, trace: list[StepTrace]) -> str:
    """The start state and the state after each step of a checked program."""
    if not trace:
        return "\n".join(["start", *("  " + line for line in format_state(semantics, semantics.initial))])
    lines = ["start", *("  " + line for line in format_state(semantics, trace[0].before))]
    for index, step in enumerate(trace, 1):
        lines.append(f"after step {index}, {step.step}")
        lines += ["  " + line for line in format_state(semantics, step.after)]
    return "\n".join(lines)
