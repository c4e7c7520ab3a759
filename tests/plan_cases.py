"""Shared step-model setups for the plan tests (imported by them, not collected)."""

from __future__ import annotations

import dataclasses

from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import Degrees
from synth.plan.launch import published_placement
from synth.plan.model import PRESETS
from synth.plan.step import compute_of
from synth.topology_file import load_topology


def h100_step(model_name="llama2-7b", degrees=Degrees(16, 8, 1)):
    """(model, compute, costs, degrees, placement) of `model_name` on dgx-h100-2x8x8 at the
    published placement of `degrees`, global batch 64."""
    topology = load_topology("dgx-h100-2x8x8")
    model = dataclasses.replace(PRESETS[model_name], global_batch=64)
    return (model, compute_of(topology.device, model.precision), CommunicationCosts(topology), degrees,
            published_placement(degrees, topology))
