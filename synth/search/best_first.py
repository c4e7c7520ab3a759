"""The K cheapest programs without listing every program: a best-first search over prefixes.

A node is a program prefix with its quotient state (synth/search/walker.py), an edge a valid
step; a prefix's key is the estimate's `value` (synth/model/estimate.py), a lower bound on
every program that extends it which equals the program's time once it is complete (the
estimate module proves both for each estimate). So complete programs are popped in exactly
the order of the full ranking, (time, text) included (a prefix's text sorts before its
extensions'). The value is raised by what any completion must still add: an exact bound over
a small abstraction of the prefix's state (synth/search/completion.py; infinite when the
state cannot reach the goal in the steps left, so such a prefix is never pushed), computed
once per abstract state. The enumerator's Z3 dead-prefix oracle is not asked: the bound
already refuses most dead prefixes, for far less than a solver call per state.

Three kinds of entries share one heap, each keyed by a lower bound on every program below it:

* a prefix (its state, its estimate so far): key = its value raised by the completion bound
  of its state;
* the steps not yet taken from a prefix (edges): key = the prefix's value raised by the bound
  on completions that begin with the first of them, known from the prefix's abstraction
  alone. Taking a step (applying it, costing it exactly) waits until its entry is popped; a
  prefix's edges are pushed one at a time, in (key, text) order, the next one when the
  previous is popped, so an edge's key and text never exceed those of the edges behind it;
* a complete program: key = its time.

Every program below an entry has a time at least its key and a text that extends its text,
so complete programs come out in (time, text) order: the full ranking's.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from enum import IntEnum
from typing import NamedTuple

from synth.language import Program
from synth.model.engine import CostEngine, StepCalls
from synth.search.completion import INFINITY, Abstract, CompletionBound
from synth.search.walker import StateWalker

_UNSET = object()


class EntryKind(IntEnum):
    PREFIX = 0  # a prefix whose steps are not yet listed
    STEPS = 1  # the untaken steps of a prefix, from a position on
    PROGRAM = 2  # a complete program


class Edge(NamedTuple):
    """A valid step from a state: the bound on every completion that begins with it, its
    text rank (ties), its alphabet index, and the state it leads to."""

    least: float
    rank: int
    index: int
    after: tuple[int, ...]


class Edges(NamedTuple):
    """A state's edges worth taking with some steps left, by (least, rank), and for each
    position the smallest rank from there on (the text key of the edges behind it)."""

    kept: tuple[Edge, ...]
    smallest: tuple[int, ...]


class Untaken(NamedTuple):
    """What a STEPS entry carries: a state's edges and the position of the next one to take."""

    edges: Edges
    position: int


class Prefix(NamedTuple):
    """What a prefix has cost so far: the estimate's running value of its collective steps
    (synth/model/estimate.py), its Permute steps' copied shares of the buffer summed in
    program order, and whether its last step is a Permute."""

    estimate: object
    copied: float
    after_permute: bool


class Entry(NamedTuple):
    """One heap entry. Ordered by (key, text, tie): `tie` is unique, so nothing after it is
    ever compared. `extra` is the abstract state of a PREFIX, the `Untaken` of a STEPS entry,
    None for a PROGRAM."""

    key: float
    text: tuple[int, ...]  # the prefix's steps as text ranks (with STEPS: the smallest untaken one appended)
    tie: int
    kind: EntryKind
    depth: int
    state: tuple[int, ...]
    prefix: Prefix
    extra: Abstract | Untaken | None


def text_ranks(walker: StateWalker) -> tuple[list[int], dict[int, int]]:
    """Each alphabet entry's place in text order, and back. A prefix's text is the tuple of
    its steps' places: no step's text is a proper beginning of another's (each ends with its
    closing brackets), so tuples compare as the "; "-joined texts do."""
    texts = [str(step) for step, _ in walker.alphabet]
    order = sorted(range(len(texts)), key=texts.__getitem__)
    for a, b in zip(order, order[1:]):
        if texts[b].startswith(texts[a]):
            raise AssertionError(f"step text {texts[a]!r} begins {texts[b]!r}: text ranks would misorder ties")
    rank_of = [0] * len(texts)
    for place, index in enumerate(order):
        rank_of[index] = place
    return rank_of, {place: index for place, index in enumerate(order)}


def cheapest_programs(walker: StateWalker, engine: CostEngine, estimate, size: int, max_len: int,
                      copy_bytes_per_s: float | None = None) -> Iterator[tuple[float, Program]]:
    """Every valid program of the walker's goal up to `max_len` steps with its time at `size`
    bytes per device, cheapest first (ties by text), lazily (see the module docstring).

    A program's time is the estimate's time of its collective steps plus its Permute steps'
    copies at `copy_bytes_per_s` (each copies the share `StateWalker.copied` of the buffer),
    added as the full ranking adds them: (copied shares summed in program order) x size /
    rate. The key of an entry adds the copies of its prefix the same way: both terms only
    grow along a program, so keys stay lower bounds and end at the program's time. A goal
    whose programs may permute needs the rate (ValueError without it)."""
    size = int(size)
    permutes = walker.permutes
    if any(permutes) and copy_bytes_per_s is None:
        raise ValueError(f"the {walker.semantics.goal_kind.title} search needs a copy rate for its Permute steps")
    rate = copy_bytes_per_s
    machine, abstraction = walker.machine, walker.abstraction
    bound = CompletionBound(walker.semantics, walker.calls, engine, size)
    is_goal, alphabet = machine.is_goal, walker.alphabet
    rank_of, index_of = text_ranks(walker)
    value, extend = estimate.value, estimate.extend
    costed: dict[StepCalls, object] = {}
    count = len(alphabet)
    tie = itertools.count()
    push, pop = heapq.heappush, heapq.heappop
    orders: dict[tuple, list] = {}
    followers: dict[tuple, Edges] = {}
    applied: dict[tuple[int, ...], dict[int, tuple[int, ...] | None]] = {}  # state -> {index: next state}
    PREFIX, STEPS, PROGRAM = EntryKind.PREFIX, EntryKind.STEPS, EntryKind.PROGRAM
    new = tuple.__new__  # Entry(...) without NamedTuple's Python-level __new__: entries are many

    def steps_from(state: tuple[int, ...], a: Abstract, left: int, after_permute: bool) -> Edges:
        """The valid steps from a state that may begin a completion of at most `left` steps,
        `least` bounding every completion that begins with the step (from the state's
        abstraction alone); no Permute right after a Permute (docs/model.md section 7)."""
        found = followers.get((state, left, after_permute))
        if found is None:
            firsts = orders.get((a, left))
            if firsts is None:
                firsts = orders[(a, left)] = sorted(
                    (least, rank_of[index], index) for index in range(count)
                    if (least := bound.edge(a, index, left)) != INFINITY)
            kept = []
            known = applied.get(state)
            if known is None:
                known = applied[state] = {}
            for least, rank, index in firsts:
                if after_permute and permutes[index]:
                    continue
                after = known.get(index, _UNSET)
                if after is _UNSET:
                    after = known[index] = machine.apply(state, index)
                if after is None:
                    continue
                if left > 1 or is_goal(after):
                    kept.append(Edge(least, rank, index, after))
            kept.sort()
            smallest = [0] * len(kept)
            lowest = count
            for position in range(len(kept) - 1, -1, -1):
                lowest = min(lowest, kept[position].rank)
                smallest[position] = lowest
            found = followers[(state, left, after_permute)] = Edges(tuple(kept), tuple(smallest))
        return found

    def copies(prefix) -> float:
        """The time of a prefix's copies so far."""
        return prefix[1] * size / rate if prefix[1] else 0.0

    def push_steps(text, depth, state, prefix, edges: Edges, position: int) -> None:
        """The untaken steps edges[position:] of a prefix as one entry: keyed by the first's
        bound (the least of them) and the smallest text among them."""
        if position < len(edges.kept):
            push(heap, new(Entry, (value(prefix[0], size, (edges.kept[position].least,)) + copies(prefix),
                                   text + (edges.smallest[position],), next(tie), STEPS, depth, state, prefix,
                                   Untaken(edges, position))))

    initial = machine.initial
    a = abstraction.of(initial)
    if a is None:
        return
    start = Prefix(estimate.start(engine, size), 0.0, False)
    least = bound.bound(a, max_len)
    if least == INFINITY:
        return
    heap = [Entry(value(start[0], size, (least,)), (), next(tie), PREFIX, 0, initial, start, a)]
    while heap:
        key, text, _, kind, depth, state, prefix, extra = pop(heap)
        if kind == PROGRAM:
            yield key, Program(tuple(alphabet[index_of[rank]][0] for rank in text))
            continue
        if kind == PREFIX:
            push_steps(text, depth, state, prefix, steps_from(state, extra, max_len - depth, prefix[2]), 0)
            continue
        # the untaken steps of a prefix: take the first, keep the rest as one entry
        edges, position = extra
        text = text[:-1]
        push_steps(text, depth, state, prefix, edges, position + 1)
        _, rank, index, after = edges.kept[position]
        text += (rank,)
        done = is_goal(after)
        if not done:
            following = abstraction.of(after)
            if following is None:
                continue
            least = bound.bound(following, max_len - depth - 1)
            if least == INFINITY:
                continue
        if permutes[index]:
            extended = new(Prefix, (prefix[0], prefix[1] + walker.copied(state), True))
        else:
            step = walker.interned_step(state, index)
            figures = costed.get(step)
            if figures is None:
                figures = costed[step] = engine.figures([step], [size])
            extended = new(Prefix, (extend(engine, prefix[0], figures, 0), prefix[1], False))
        if done:
            push(heap, new(Entry, (value(extended[0], size) + copies(extended), text, next(tie), PROGRAM, depth + 1,
                                   after, extended, None)))
            continue
        push(heap, new(Entry, (max(key, value(extended[0], size, (least,)) + copies(extended)), text, next(tie), PREFIX,
                               depth + 1, after, extended, following)))


__all__ = ["Edge", "Edges", "Entry", "EntryKind", "Prefix", "Untaken", "cheapest_programs", "text_ranks"]
