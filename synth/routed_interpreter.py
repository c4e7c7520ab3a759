"""Dispatch and combine programs run over every member with real tokens (numpy): the
reference the resolved-levels machine (synth/routed.py) is tested against.

Dispatch: member o owns tokens (o, i), each an activation vector and a set of experts
(expert e on member e // experts_per_member). A member holds *copies*: (token, the experts
of the token still to be reached through this copy, the vector). A step over a form's groups
moves every copy a grouped member holds: its experts are split by the member of the group
that agrees with each expert's host on the step's levels (and with the holder elsewhere), and
one copy goes to each such member with the experts under it (kept when it is the holder).
The goal: for every token and each of its experts, the expert's host holds exactly one copy
of the token naming that expert, with the token's vector, and nothing else is held.

Combine: the host of expert e of token t starts with the expert's output times its gate
weight; a member holds *partials*: (token, experts summed in, the sum). A step moves each
partial toward its token's owner along the step's levels, and partials of one token that
meet at one member are summed there (before it forwards them). The goal: each owner holds,
per token, one partial of all its experts equal to the weighted sum of their outputs.

Every step counts the copies (partials) each member sends to each other member: the traffic
synth/model/fanout.py predicts in expectation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from synth.language import Program
from synth.semantics import FORMS


@dataclass(frozen=True)
class Tokens:
    """A concrete routing: experts[o, i] the sorted experts of member o's token i; vectors
    the activations [o, i, h]; outputs [e, o, i, h] what expert e returns for that token (used
    where it is routed); gates[o, i, j] the weight of experts[o, i, j]."""

    experts: np.ndarray
    vectors: np.ndarray
    outputs: np.ndarray
    gates: np.ndarray
    experts_per_member: int


def make_tokens(rng: np.random.Generator, experts: np.ndarray, experts_per_member: int, hidden: int = 4) -> Tokens:
    """Random vectors, outputs and gates for the routing `experts` [member, token, k]."""
    members, count, k = experts.shape
    total = members * experts_per_member
    return Tokens(experts, rng.standard_normal((members, count, hidden)),
                  rng.standard_normal((total, members, count, hidden)), rng.random((members, count, k)),
                  experts_per_member)


def _positions(sizes):
    return [tuple(int(d) for d in np.unravel_index(m, sizes)) for m in range(int(np.prod(sizes)))]


def _step_groups(sizes, step, level_names):
    groups, varying = FORMS[step.form](tuple(sizes), level_names.index(step.level))
    return groups, tuple(varying)


def _toward(holder, target, varying, sizes):
    """The member agreeing with `target` on the levels `varying` and with `holder` elsewhere."""
    digits = list(holder)
    for level in varying:
        digits[level] = target[level]
    return int(np.ravel_multi_index(digits, sizes))


def run_dispatch(program: Program, level_names, sizes, tokens: Tokens):
    """(what every member holds after the program, [N, N] copies sent per step)."""
    sizes = tuple(sizes)
    positions = _positions(sizes)
    n = len(positions)
    host = lambda e: e // tokens.experts_per_member  # noqa: E731
    held = [[((o, i), tuple(int(e) for e in tokens.experts[o, i]), tokens.vectors[o, i])
             for i in range(tokens.experts.shape[1])] for o in range(n)]
    sent = []
    for step in program.steps:
        groups, varying = _step_groups(sizes, step, level_names)
        grouped = {m for group in groups for m in group}
        after = [[] if m in grouped else list(held[m]) for m in range(n)]
        counts = np.zeros((n, n), dtype=np.int64)
        for m in grouped:
            for token, experts, vector in held[m]:
                split: dict[int, list[int]] = {}
                for e in experts:
                    split.setdefault(_toward(positions[m], positions[host(e)], varying, sizes), []).append(e)
                for target, part in split.items():
                    after[target].append((token, tuple(part), vector.copy()))
                    counts[m, target] += target != m
        held, sent = after, sent + [counts]
    return held, sent


def dispatch_reached(held, tokens: Tokens) -> bool:
    """The dispatch goal (module docstring), checked copy by copy."""
    wanted = {}
    for o in range(tokens.experts.shape[0]):
        for i in range(tokens.experts.shape[1]):
            for e in tokens.experts[o, i]:
                wanted[((o, i), int(e))] = 0
    for m, copies in enumerate(held):
        for token, experts, vector in copies:
            if not np.array_equal(vector, tokens.vectors[token]):
                return False
            for e in experts:
                if e // tokens.experts_per_member != m or (token, e) not in wanted:
                    return False
                wanted[(token, e)] += 1
    return all(count == 1 for count in wanted.values())


def run_combine(program: Program, level_names, sizes, tokens: Tokens):
    """(what every member holds after the program, [N, N] partials sent per step)."""
    sizes = tuple(sizes)
    positions = _positions(sizes)
    n = len(positions)
    held: list[dict] = [{} for _ in range(n)]
    members, count, _ = tokens.experts.shape
    for o in range(members):
        for i in range(count):
            for j, e in enumerate(tokens.experts[o, i]):
                m = int(e) // tokens.experts_per_member
                value = tokens.gates[o, i, j] * tokens.outputs[e, o, i]
                _add(held[m], (o, i), (int(e),), value)
    sent = []
    for step in program.steps:
        groups, varying = _step_groups(sizes, step, level_names)
        grouped = {m for group in groups for m in group}
        after: list[dict] = [{} if m in grouped else dict(held[m]) for m in range(n)]
        counts = np.zeros((n, n), dtype=np.int64)
        for m in grouped:
            for token, (experts, value) in held[m].items():
                target = _toward(positions[m], positions[token[0]], varying, sizes)
                _add(after[target], token, experts, value)
                counts[m, target] += target != m
        held, sent = after, sent + [counts]
    return held, sent


def _add(member: dict, token, experts, value) -> None:
    """Partials of one token meeting at one member are summed there."""
    found = member.get(token)
    member[token] = (experts, value) if found is None else (tuple(sorted(found[0] + experts)), found[1] + value)


def combine_reached(held, tokens: Tokens) -> bool:
    """The combine goal (module docstring), checked partial by partial."""
    members, count, _ = tokens.experts.shape
    for m, partials in enumerate(held):
        for (o, i), (experts, value) in partials.items():
            if o != m or tuple(experts) != tuple(int(e) for e in tokens.experts[o, i]):
                return False
            expected = sum(tokens.gates[o, i, j] * tokens.outputs[e, o, i] for j, e in enumerate(tokens.experts[o, i]))
            if not np.allclose(value, expected):
                return False
    return all(len(held[o]) == count for o in range(members))
