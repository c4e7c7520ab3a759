"""Values that key the planner's caches keep their hash (synth/frozen.py): the same value as
the dataclass's own hash would give, equal values alike, never carried through a pickle."""

from __future__ import annotations

import dataclasses
import pickle

from synth.plan.model import read_model
from synth.plan.step import Settings
from synth.topology_file import load_topology


def _fields_hash(value) -> int:
    return hash(tuple(getattr(value, field.name) for field in dataclasses.fields(value) if field.compare))


def test_kept_hashes_are_the_fields_hash_and_follow_equality():
    topology = load_topology("dgx-h100-2x8x8")
    model = read_model("deepseek-v3", "--model").model
    settings = Settings(2, sequence_parallel=True)
    for value in (topology, model, settings):
        assert hash(value) == _fields_hash(value) == hash(value)  # computed once, then kept
        copy = pickle.loads(pickle.dumps(value))
        assert "_hash" not in copy.__dict__ and copy == value and hash(copy) == hash(value)
        assert dataclasses.asdict(copy) == dataclasses.asdict(value)
    changed = dataclasses.replace(topology, name="other")
    assert changed != topology and "_hash" not in changed.__dict__
    assert {settings: 1}[Settings(2, sequence_parallel=True)] == 1
