"""The winner's gain over the next layout, term by term (synth/plan/gain.py): the terms add up to
the gain, the next layout differs in degrees or placement, and the plan's JSON carries it."""

from __future__ import annotations

import json

import pytest

from synth.plan import PRESETS, PlanRequest, compute_of, plan
from synth.plan.gain import BASIS, carried_by, gain_json, next_layout
from synth.topology_file import load_topology


@pytest.fixture(scope="module")
def ranked():
    topology = load_topology("dgx-a100-x4")
    model = PRESETS["gpt3-1.3b"]
    return plan(PlanRequest(model, topology, compute_of(topology.device, model.precision), top=30)).ranked


def test_the_terms_add_up_to_the_gain(ranked):
    winner, other = ranked[0], next_layout(ranked)
    assert (other.degrees, other.placement.to_text()) != (winner.degrees, winner.placement.to_text())
    assert all((r.degrees, r.placement.to_text()) == (winner.degrees, winner.placement.to_text())
               for r in ranked[1:ranked.index(other)])
    carries = carried_by(winner, other)
    assert sum(c.seconds for c in carries) == pytest.approx(other.step_s - winner.step_s, rel=1e-9, abs=1e-12)
    assert [c.seconds for c in carries] == sorted((c.seconds for c in carries), reverse=True)
    assert all(c.term in BASIS for c in carries)  # every term named with what it rests on


def test_gain_json_splits_carried_and_given_up(ranked):
    document = gain_json(ranked)
    assert document["seconds_saved"] >= 0
    assert all(c["seconds_saved"] > 0 for c in document["carried_by"])
    assert all(c["seconds_saved"] < 0 for c in document["given_up"])
    json.dumps(document)
    assert gain_json(ranked[:1]) is None
