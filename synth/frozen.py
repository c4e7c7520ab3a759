"""A frozen dataclass's hash kept after its first computation, for values that key many caches.

A frozen dataclass hashes the tuple of its fields every time it is hashed, and the planner's
caches are keyed by values that hold deep trees (a topology: its levels, their figures and
sources; a model; a settings choice): hundreds of thousands of lookups each rebuilt the same
hash. A class opts in with `__hash__ = cached_hash` and `__getstate__ = state_without_hash`
in its body (an explicit `__hash__` is kept by `dataclass`). The hash is the generated one's
value: the fields that take part in comparisons, as a tuple, so equal values hash alike. It is
never pickled: a string's hash differs from process to process.
"""

from __future__ import annotations

from dataclasses import fields

_HASH = "_hash"


def cached_hash(value) -> int:
    found = value.__dict__.get(_HASH)
    if found is None:
        found = value.__dict__[_HASH] = hash(tuple(getattr(value, field.name) for field in fields(value)
                                                    if (field.hash is None and field.compare) or field.hash))
    return found


def state_without_hash(value) -> dict:
    return {key: item for key, item in value.__dict__.items() if key != _HASH}
