"""One record per collective of the language: the single place that says what it needs and does.

A collective acting on a group of k members (root first, docs/model.md section 7) is two choices:

* how the members' data combine (`Combine`): summed over one shared range (nothing may be
  counted twice), joined from consecutive equal blocks in member order, or the root's as it is;
* who receives the result (`Delivery`): every member, the root alone (the others become
  empty), or member i the i-th of k equal consecutive blocks.

AllToAll is the one collective that combines nothing: every member's range is cut into k
blocks and member j receives block j of every member i as its own i-th block (`EXCHANGE`,
`TRANSPOSE`); ranges stay where they were, the data in them moves.

Everything else follows from those two, here and nowhere else: the precondition and the
range each member is left with (semantics, quotient, lowering, interpreter), what the pruning
oracle may assume (which steps leave partial or empty members, which widen or refill them,
which grow contributor sets), the root, the chunk span a call covers (plan offsets and
costs), and the bytes factor a ring backend pays (nccl-tests' busbw). This follows
msccl-tools, which keeps each collective as one object with its pre- and postconditions and a
flag saying whether it combines; adding a collective here means adding one record and its call
in each runtime, and naming it in grammar/program.lark (checked against these records at first
use).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache


class Combine(Enum):
    """How the members' inputs become the result."""

    SUM = "sum"  # one range on every member, contributor sets pairwise disjoint, summed
    JOIN = "join"  # equal-length blocks, member i+1's starting where member i's ends, joined
    ROOT = "root"  # the root's data as it is; the other members need hold nothing
    EXCHANGE = "exchange"  # one range on every member, cut into k equal blocks; nothing is summed


class Delivery(Enum):
    """Which members hold the result afterwards, and which part of it."""

    EVERY = "every"  # every member holds the whole result
    ROOT = "root"  # the root holds it, every other member becomes empty
    BLOCKS = "blocks"  # member i holds the i-th of k equal consecutive blocks
    TRANSPOSE = "transpose"  # member j holds, as its i-th block, block j of member i


def ring_twice(k: int) -> float:
    """A reduce-scatter then an all-gather around a ring: 2(k-1)/k of the buffer per member."""
    return 2 * (k - 1) / k


def ring_once(k: int) -> float:
    """One pass around a ring: (k-1)/k of the buffer per member."""
    return (k - 1) / k


def whole_buffer(k: int) -> float:
    """A pipelined chain from or to the root: the whole buffer per hop."""
    return 1.0


@dataclass(frozen=True)
class Collective:
    """One collective of the language. `bus_factor(k)` is nccl-tests' busbw / algbw (its
    doc/PERFORMANCE.md): the share of the buffer a ring backend moves per member."""

    name: str
    combine: Combine
    delivery: Delivery
    bus_factor: Callable[[int], float]

    @property
    def reduces(self) -> bool:
        """Sums contributions: the only kind that grows a chunk's contributor set."""
        return self.combine is Combine.SUM

    @property
    def rooted(self) -> bool:
        """Has a root (the group's first member, rank 0 in its communicator)."""
        return self.combine is Combine.ROOT or self.delivery is Delivery.ROOT

    @property
    def snake_name(self) -> str:
        """`all_reduce`: the spelling of torch.distributed, nccl-tests (`all_reduce_perf`) and
        the C runtime's `OP_ALL_REDUCE`."""
        return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(self.name))

    # --- what a call spans -------------------------------------------------------------------

    def span(self, held) -> tuple[int, int]:
        """The chunk range a call covers, from the ranges its members hold (root first, None
        when empty) before it: the joined output for a join, else the root's range."""
        return (held[0][0], held[-1][1]) if self.combine is Combine.JOIN else held[0]

    def span_factor(self, k: int) -> int:
        """The span's length over the root's range length, for a group of k members."""
        return k if self.combine is Combine.JOIN else 1

    def ranges_after(self, lo: int, hi: int, k: int) -> list[tuple[int, int] | None]:
        """The range each of the k members holds after a call spanning [lo, hi) (None: empty)."""
        if self.delivery is Delivery.BLOCKS:
            block = (hi - lo) // k
            return [(lo + i * block, lo + (i + 1) * block) for i in range(k)]
        if self.delivery is Delivery.ROOT:
            return [(lo, hi)] + [None] * (k - 1)
        return [(lo, hi)] * k

    def block_of_input(self) -> bool:
        """Member i passes only its block of the span as input (in-place AllGather)."""
        return self.combine is Combine.JOIN

    def block_of_output(self) -> bool:
        """Member i receives only its block of the span as output (in-place ReduceScatter)."""
        return self.delivery is Delivery.BLOCKS

    # --- what the pruning oracle may assume (each an over-approximation, so pruning is sound) --

    @property
    def leaves_partial(self) -> bool:
        """Always leaves some member holding part of the buffer (k >= 2 blocks of one range)."""
        return self.delivery is Delivery.BLOCKS

    @property
    def leaves_empty(self) -> bool:
        """Always leaves some member empty (every member but the root)."""
        return self.delivery is Delivery.ROOT

    @property
    def widens(self) -> bool:
        """Can leave a member holding a range longer than before: a sum needs one range on every
        member and never lengthens it; a join or a copy of the root's range can."""
        return self.combine is Combine.JOIN or self.combine is Combine.ROOT

    @property
    def fills_empty(self) -> bool:
        """Can give data to an empty member: only a root's data reaches members that held none
        (a sum and a join need data on every member)."""
        return self.combine is Combine.ROOT and self.delivery is not Delivery.ROOT

    def growth(self, k: int) -> int:
        """Doublings a chunk's largest contributor set can gain in one step over groups of k:
        a union of k disjoint sets is at most k times the largest, ceil(log2 k) doublings."""
        return max(k - 1, 0).bit_length() if self.reduces else 0

    @property
    def pruning_facts(self) -> tuple[bool, bool, bool, bool, bool]:
        """Everything the dead-prefix oracle reads of a collective, besides its growth."""
        return (self.reduces, self.leaves_partial, self.leaves_empty, self.widens, self.fills_empty)


RECORDS: dict[str, Collective] = {
    record.name: record
    for record in (
        Collective("AllReduce", Combine.SUM, Delivery.EVERY, ring_twice),
        Collective("ReduceScatter", Combine.SUM, Delivery.BLOCKS, ring_once),
        Collective("AllGather", Combine.JOIN, Delivery.EVERY, ring_once),
        Collective("Reduce", Combine.SUM, Delivery.ROOT, whole_buffer),
        Collective("Broadcast", Combine.ROOT, Delivery.EVERY, whole_buffer),
        Collective("AllToAll", Combine.EXCHANGE, Delivery.TRANSPOSE, ring_once),
    )
}


class AlphabetMismatch(RuntimeError):
    """The grammar and the records disagree: a defect of the installation, not of the input."""


def check_records(grammar_names, records: dict[str, Collective]) -> tuple[Collective, ...]:
    """The records in grammar order; AlphabetMismatch naming the first name one side lacks."""
    grammar_names = tuple(grammar_names)
    for name in grammar_names:
        if name not in records:
            raise AlphabetMismatch(
                f"the grammar (grammar/program.lark) names collective {name!r}, which has no record in synth/collectives.py"
            )
    for name in records:
        if name not in grammar_names:
            raise AlphabetMismatch(
                f"synth/collectives.py has a record for {name!r}, which the grammar (grammar/program.lark) does not name"
            )
    return tuple(records[name] for name in grammar_names)


@lru_cache(maxsize=1)
def collectives() -> tuple[Collective, ...]:
    """Every collective of the language, in grammar order, checked against the grammar once."""
    from synth.language import collective_names  # builds the parser: only on first use

    return check_records(collective_names(), RECORDS)


@lru_cache(maxsize=1)
def _by_name() -> dict[str, Collective]:
    return {record.name: record for record in collectives()}


def collective(name: str) -> Collective:
    """The record of a grammar name (KeyError for a name the grammar does not have)."""
    return _by_name()[name]
