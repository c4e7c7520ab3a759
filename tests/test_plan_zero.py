"""ZeRO-2 and ZeRO-3 (FSDP): memory per device and the per-layer gathers and scatters."""

from __future__ import annotations

import dataclasses

import pytest

from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import Degrees
from synth.plan.formulas import state_bytes_per_parameter
from synth.plan.launch import published_placement
from synth.plan.model import PRESETS
from synth.plan.step import Settings, compute_of, predict, settings_problem
from synth.topology_file import load_topology


def test_state_bytes_per_zero_stage():
    """Mixed-precision Adam, fp16 weights and fp32 gradients: 2 + 4 bytes of weights and gradients,
    4 + 8 of main weights and moments (no fp32 main gradients: the gradients already are)."""
    model = PRESETS["gpt3-175b"]
    d = 124
    assert state_bytes_per_parameter(model, d, False) == pytest.approx(18)
    assert state_bytes_per_parameter(model, d, True, 1) == pytest.approx(6 + 12 / d)
    assert state_bytes_per_parameter(model, d, True, 2) == pytest.approx(2 + 16 / d)
    assert state_bytes_per_parameter(model, d, True, 3) == pytest.approx(18 / d)


def _selene(nodes):
    topology = load_topology("selene")
    node = dataclasses.replace(topology.levels[0], size=nodes)
    return dataclasses.replace(topology, levels=(node,) + topology.levels[1:])


def _opt_175b():
    """GPT-3 175B on 992 Selene A100s, tensor parallelism 8 within the node (as OPT-175B was trained)."""
    model = dataclasses.replace(PRESETS["gpt3-175b"], global_batch=992)
    topology = _selene(124)
    degrees = Degrees(124, 8, 1)
    return (model, compute_of(topology.device, model.precision), CommunicationCosts(topology), degrees,
            published_placement(degrees, topology))


def test_175b_on_992_a100_fits_with_zero3_only():
    """A 175B model on 992 A100 80GB with tensor parallelism 8 (124 replicas, as OPT-175B was
    trained): the ZeRO-1 states alone exceed 80 GiB, ZeRO-3 fits, ZeRO-2 in between."""
    model, compute, costs, degrees, placement = _opt_175b()
    memory = {}
    for zero in (1, 2, 3):
        settings = Settings(8, 1, True, "full", True, True, zero=zero)
        assert settings_problem(model, degrees, settings) is None
        prediction = predict(model, compute, costs, degrees, placement, settings)
        memory[zero] = prediction.memory.peak
        assert prediction.breakdown.total == pytest.approx(prediction.step_s)
    limit = 80 * 2**30
    assert memory[1] > limit > memory[3]
    assert memory[1] > memory[2] > memory[3]


def test_zero3_gathers_every_layer_every_micro_batch():
    """Smaller micro-batches re-gather the weights more often per token: the exposed data-parallel
    time per step grows as the micro-batch shrinks, and overlapping never costs more."""
    model, compute, costs, degrees, placement = _opt_175b()
    exposed = []
    for micro in (1, 2, 8):
        overlapped = predict(model, compute, costs, degrees, placement, Settings(micro, 1, True, "full", True, True, zero=3))
        serial = predict(model, compute, costs, degrees, placement, Settings(micro, 1, True, "full", True, False, zero=3))
        assert overlapped.step_s <= serial.step_s
        exposed.append(overlapped.breakdown.data_parallel)
    assert exposed[0] > exposed[1] > exposed[2]


def test_zero_stage_needs_the_sharded_optimizer():
    model = PRESETS["gpt3-1.3b"]
    assert settings_problem(model, Degrees(8, 1, 1), Settings(1, zero=3)) is not None
    assert settings_problem(model, Degrees(8, 1, 1), Settings(1, sharded_optimizer=True, zero=4)) is not None


def test_hsdp_shards_inside_the_node_and_replicates_across():
    """Llama 2 7B on 128 H100 (16 nodes of 8), data parallel only: HSDP shards over the 8 GPUs of
    a node (its states / 8) and all-reduces the shards across the 16 nodes; its memory lies between
    ZeRO-1's and ZeRO-3's over all 128."""
    from synth.plan.step import hsdp_placement

    topology = load_topology("dgx-h100-2x8x8")
    model = dataclasses.replace(PRESETS["llama2-7b"], global_batch=256)
    compute = compute_of(topology.device, model.precision)
    costs = CommunicationCosts(topology)
    degrees = Degrees(128, 1, 1)
    placement = published_placement(degrees, topology)
    split = hsdp_placement(placement)
    assert split.axis_names == ("dp_replica", "dp") and split.axis_sizes == (16, 8)
    assert sorted(map(sorted, split.groups_over(("dp",)))) == [list(range(8 * n, 8 * n + 8)) for n in range(16)]
    memory = {}
    for name, settings in (("zero1", Settings(2, 1, False, "full", True, True, zero=1)),
                           ("zero3", Settings(2, 1, False, "full", True, True, zero=3)),
                           ("hsdp", Settings(2, 1, False, "full", True, True, zero=3, hsdp=True))):
        assert settings_problem(model, degrees, settings) is None
        prediction = predict(model, compute, costs, degrees, placement, settings)
        assert prediction.breakdown.total == pytest.approx(prediction.step_s)
        memory[name] = prediction.memory.peak
    assert memory["zero1"] > memory["hsdp"] > memory["zero3"]
    assert settings_problem(model, degrees, Settings(2, sharded_optimizer=True, zero=2, hsdp=True)) is not None
