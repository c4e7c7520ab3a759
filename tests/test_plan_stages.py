"""Uneven pipeline stages (Megatron-LM's --decoder-first/last-pipeline-num-layers): the split,
its step time and memory, and its launch arguments."""

from __future__ import annotations

import dataclasses

import pytest

from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import Degrees, model_problem
from synth.plan.formulas import StageLayers, stage_layers, stage_parameters
from synth.plan.launch import megatron_arguments, published_placement
from synth.plan.model import PRESETS
from synth.plan.step import Settings, compute_of, predict
from synth.topology_file import load_topology


@pytest.mark.parametrize("layers, pp, split", [
    (70, 12, StageLayers(5, 6, 5)),  # 10 middle stages of 6, the first and last 5 each
    (126, 16, StageLayers(7, 8, 7)),  # Llama 3 405B's 126 layers on 16 stages: 14 x 8 + 7 + 7
    (96, 8, StageLayers(12, 12, 12)),  # divisible: even
    (9, 2, StageLayers(5, 0, 4)),  # two stages: the last (with the output layer) the smaller half
])
def test_published_uneven_splits(layers, pp, split):
    found = stage_layers(layers, pp)
    assert found == split
    assert found.first + found.middle * max(pp - 2, 0) + found.last == layers


def test_explicit_first_and_last_counts():
    assert stage_layers(126, 16, first=7, last=7) == StageLayers(7, 8, 7)
    assert stage_layers(126, 16, first=6, last=8) == StageLayers(6, 8, 8)
    assert stage_layers(126, 16, first=5, last=7) is None  # 114 does not split over 14 middle stages
    assert stage_layers(10, 12) is None  # more stages than layers


def _model(layers):
    return dataclasses.replace(PRESETS["llama2-70b"], layers=layers, global_batch=96)


def test_layers_not_divisible_by_stages_can_be_planned():
    topology = load_topology("dgx-h100-2x8x8")  # 128 GPUs
    model = _model(70)
    degrees = Degrees(1, 8, 16)
    assert model_problem(model, Degrees(1, 8, 12)) is None
    assert model_problem(_model(126), degrees) is None
    compute = compute_of(topology.device, model.precision)
    costs = CommunicationCosts(topology)
    settings = Settings(1, 1, True, "full", True)
    uneven = predict(_model(126), compute, costs, degrees, published_placement(degrees, topology), settings)
    even = predict(_model(128), compute, costs, degrees, published_placement(degrees, topology), settings)
    # 126 layers run as 7 + 14 x 8 + 7: the busiest stage has 8 layers, as with 128 layers on 16 stages, but the
    # last stage (output layer) holds one layer fewer, so the step is not slower and its memory is smaller.
    assert uneven.step_s <= even.step_s
    assert uneven.memory.last < even.memory.last
    assert uneven.memory.first < even.memory.first


def test_uneven_stage_parameters_follow_the_split():
    model = _model(70)
    stages = stage_layers(70, 12)
    params = stage_parameters(model, 8, 12, stages)
    per_layer = stage_parameters(model, 8, 12, StageLayers(6, 6, 6)).first - params.first
    assert per_layer > 0  # one layer fewer on the first stage than an even 6


def test_launch_names_the_first_and_last_stage_layers():
    topology = load_topology("dgx-h100-2x8x8")
    model = _model(126)
    degrees = Degrees(1, 8, 16)
    prediction = predict(model, compute_of(topology.device, model.precision), CommunicationCosts(topology), degrees,
                         published_placement(degrees, topology), Settings(1, 1, True, "full", False))
    args = megatron_arguments(model, prediction)
    assert args[args.index("--decoder-first-pipeline-num-layers") + 1] == "7"
    assert args[args.index("--decoder-last-pipeline-num-layers") + 1] == "7"
