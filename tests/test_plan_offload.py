"""Activation offload (synth/plan/offload.py): megatron-core's rules, the host link per device,
the exposed copies by hand, and in the step: the memory it saves and the time it adds."""

from __future__ import annotations

import dataclasses

import pytest

from synth.errors import UsageError
from synth.plan import formulas, offload
from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import Degrees
from synth.plan.launch import published_placement
from synth.plan.model import PRESETS
from synth.plan.search import SearchSpace
from synth.plan.step import Compute, Settings, compute_of, predict, settings_problem
from synth.topology_file import load_topology


def test_exposed_copies_by_hand():
    # 1 GB at 16 GB/s: 62.5 ms each way; behind a 50 ms forward 12.5 ms shows, behind a 100 ms backward none
    assert offload.exposed_seconds(1e9, 16e9, 0.05, 0.1) == pytest.approx(0.0125)
    assert offload.exposed_seconds(1e9, 16e9, 0.1, 0.1) == 0.0


def test_megatron_cores_rules():
    assert offload.offload_problem(24, 0, 4, "full") is None
    assert "every layer" in offload.offload_problem(24, 24, 1, "none")
    assert "pipeline" in offload.offload_problem(24, 23, 2, "none")
    assert "recomputation" in offload.offload_problem(24, 23, 1, "selective")
    assert offload.offload_problem(24, 23, 1, "none") is None
    model = PRESETS["gpt3-1.3b"]
    assert "pipeline" in settings_problem(model, Degrees(16, 1, 2), Settings(1, offload_layers=23))


def test_host_link_per_device():
    assert offload.host_link(load_topology("selene").device.name).bytes_per_s == 16e9  # PCIe Gen4, 2 GPUs a switch
    assert offload.host_link(load_topology("dgx-h100-2x8x8").device.name).bytes_per_s == 32e9  # Gen5
    assert offload.host_link("a GPU nobody describes") is None
    assert compute_of(load_topology("selene").device, "bf16").host_bandwidth == 16e9


def test_offload_in_the_step_saves_l_minus_one_layers_and_adds_only_the_exposed_copies():
    topology = load_topology("dgx-a100-x4")
    model = PRESETS["gpt3-1.3b"]
    costs = CommunicationCosts(topology)
    compute = compute_of(topology.device, model.precision)
    degrees = Degrees(32, 1, 1)
    placement = published_placement(degrees, topology)
    plain = predict(model, compute, costs, degrees, placement, Settings(1, sharded_optimizer=True))
    moved = predict(model, compute, costs, degrees, placement,
                    Settings(1, sharded_optimizer=True, offload_layers=model.layers - 1))
    per_layer = formulas.layer_activation_bytes(model, 1, 1, 1, False, "none")
    assert plain.memory.activations_first - moved.memory.activations_first == pytest.approx(
        per_layer * (model.layers - 1))
    assert moved.step_s - plain.step_s == pytest.approx(moved.breakdown.offload, rel=1e-6, abs=1e-12)
    assert moved.step_s == pytest.approx(moved.breakdown.total)
    # the copies of one layer's activations (A / B each way) outlast the layer's forward here: exposed
    assert moved.breakdown.offload > 0
    assert "offload=23" in moved.settings.text


def test_offload_needs_a_host_link_figure():
    topology = load_topology("dgx-a100-x4")
    model = PRESETS["gpt3-1.3b"]
    compute = Compute(312e12, 0.5, 40 * 2 ** 30, 1.5e12)  # no device description: no host link
    degrees = Degrees(32, 1, 1)
    with pytest.raises(UsageError, match="host link"):
        predict(model, compute, CommunicationCosts(topology), degrees, published_placement(degrees, topology),
                Settings(1, offload_layers=23))
    space = SearchSpace()
    assert any(s.offload_layers for s in space.settings(model, degrees))
    assert not any(s.offload_layers for s in space.settings(model, degrees, host_link=False))
    assert not any(s.offload_layers for s in dataclasses.replace(space, activation_offload=(False,))
                   .settings(model, degrees))


def test_the_megatron_line_carries_the_offload():
    from synth.plan.launch import megatron_parallel_arguments

    topology = load_topology("dgx-a100-x4")
    model = PRESETS["gpt3-1.3b"]
    degrees = Degrees(32, 1, 1)
    prediction = predict(model, compute_of(topology.device, model.precision), CommunicationCosts(topology), degrees,
                         published_placement(degrees, topology), Settings(1, offload_layers=23))
    args = megatron_parallel_arguments(model, prediction)
    assert args[args.index("--cpu-offloading-num-layers") + 1] == "23" and "--cpu-offloading" in args
