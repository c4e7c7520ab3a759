"""ZeRO-3 (Megatron-FSDP) with experts: dense weights sharded over the whole data-parallel group,
routed experts over the expert data-parallel group only (megatron-core's expt_dp group), each
checked against hand-worked figures; HSDP with experts refused with its fix."""

from __future__ import annotations

import dataclasses

import pytest

from synth.plan import formulas, moe
from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import Degrees
from synth.plan.launch import published_placement
from synth.plan.model import PRESETS
from synth.plan.step import Compute, Settings, predict, settings_problem
from synth.topology_file import load_topology
from tests.test_plan_moe import TINY


def test_moe_layer_parameters_split_into_dense_part_and_experts_by_hand():
    # TINY, tp = 2: a dense layer holds attention 256 / 2 + norms 16 + FFN 384 / 2 per device.
    # A MoE layer swaps the dense FFN (192) for the shared FFN / tp (144 / 2 = 72) and the whole
    # router (h E = 32): dense part 128 + 16 + 72 + 32 = 248; its routed experts, 4 x 96 = 384,
    # split over ep = 2 and tp = 2: 96.
    dense_layer = formulas.layer_shape(TINY).per_device(2)
    assert dense_layer == 128 + 16 + 192
    assert moe.moe_layer_parameters_per_device(TINY, dense_layer, 2, 2) == (248, 96)
    # The two parts are the layer's whole per device (stage_parameter_delta's figure for one MoE layer).
    assert sum(moe.moe_layer_parameters_per_device(TINY, dense_layer, 2, 2)) == \
        dense_layer + moe.stage_parameter_delta(TINY, 2, 2, 1, 2)


def _mixtral_small():
    return dataclasses.replace(PRESETS["mixtral-8x7b"], name="mixtral-small", layers=8, hidden=1024, heads=8,
                               kv_heads=8, ffn=2048, seq_len=2048, global_batch=64)


def _zero3(model, degrees, **overrides):
    topology = load_topology("dgx-a100-x4")
    costs = CommunicationCosts(topology)
    compute = Compute(312e12, 0.5, 80 * 2 ** 30, 2e12)
    settings = Settings(1, sequence_parallel=degrees.tp > 1, sharded_optimizer=True, zero=3, **overrides)
    assert settings_problem(model, degrees, settings) is None
    placement = published_placement(degrees, topology)
    return predict(model, compute, costs, degrees, placement, settings), costs, placement


def test_zero3_with_experts_is_plannable_and_shards_experts_over_expert_dp():
    model = _mixtral_small()
    degrees = Degrees(8, 2, 2, 1, 2)  # expert data parallelism 4
    prediction, costs, placement = _zero3(model, degrees)
    assert prediction.step_s == pytest.approx(prediction.breakdown.total)
    # Memory by hand: every parameter's weights, gradients, fp32 copies and Adam states sharded
    # over dp = 8, the routed experts' over dp / ep = 4 only.
    per_dense = formulas.state_bytes_per_parameter(model, 8, True, 3)
    per_expert = formulas.state_bytes_per_parameter(model, 4, True, 3)
    params = formulas.stage_parameters(model, 2, 2, formulas.stage_layers(model.layers, 2), 2)
    experts = moe.expert_parameters_per_device(model, 2, 2, 0, 4)
    dense_layer = formulas.layer_shape(model).per_device(2)
    largest = max(dense_layer, sum(moe.moe_layer_parameters_per_device(model, dense_layer, 2, 2)))
    gathered = largest * (2 * model.bytes_per_value + model.grad_bytes_per_value)
    assert prediction.memory.states_first == pytest.approx((params.first - experts) * per_dense
                                                           + experts * per_expert + gathered)
    # The experts' gathers and scatters run over the expert data-parallel axis (dp, size 4), one
    # pair per MoE layer per micro-batch, of E/ep experts split by tp.
    routes = {route.name: route for route in prediction.routes}
    expert = routes["expert-data"]
    assert expert.axes == ("dp",) and expert.calls == prediction.microbatches * moe.moe_layer_count(model)
    local = moe.routed_expert_parameters(model) / (2 * 2)
    assert expert.bytes == int(local * model.bytes_per_value)
    gather = costs.all_gather(placement, ("dp",), expert.bytes)
    scatter = costs.reduce_scatter(placement, ("dp",), int(local * model.grad_bytes_per_value))
    assert expert.time_s == pytest.approx(gather.time_s + scatter.time_s)
    # The dense weights' gathers run over the whole data-parallel group: the dp and ep axes.
    assert routes["data"].axes == ("dp", "ep")


def test_zero3_with_experts_costs_more_exposed_than_without_the_expert_gathers():
    """Unoverlapped (no prefetch), a MoE layer pays its dense part's and its experts' gathers and
    scatters: the data-parallel term grows by exactly those calls per MoE layer per micro-batch."""
    model = _mixtral_small()
    degrees = Degrees(8, 2, 2, 1, 2)
    prediction, costs, placement = _zero3(model, degrees, overlap_gradients=False)
    dense_layer = formulas.layer_shape(model).per_device(2)
    dense_part, experts = moe.moe_layer_parameters_per_device(model, dense_layer, 2, 2)
    axes, value, grad = ("dp", "ep"), model.bytes_per_value, model.grad_bytes_per_value
    pair = lambda axes, size: (2 * costs.all_gather(placement, axes, int(size * value)).time_s  # noqa: E731
                               + costs.reduce_scatter(placement, axes, int(size * grad)).time_s)
    per_dense, per_moe = pair(axes, dense_layer), pair(axes, dense_part) + pair(("dp",), experts)
    layers = formulas.stage_layers(model.layers, 2)
    ranges = moe.stage_ranges(model, layers)
    # the slowest stage is the last (it runs the output layer too); all its layers are MoE here
    moe_last = moe.moe_layers_in(model, *ranges[-1])
    expected = prediction.microbatches * (layers.last * per_dense + moe_last * (per_moe - per_dense))
    assert moe_last == layers.last
    assert prediction.breakdown.data_parallel == pytest.approx(expected, rel=1e-9)


def test_zero3_with_experts_when_ep_is_dp_gathers_no_experts():
    model = _mixtral_small()
    prediction, _, _ = _zero3(model, Degrees(8, 2, 2, 1, 8))
    assert "expert-data" not in {route.name for route in prediction.routes}


def test_hsdp_with_experts_is_refused_naming_the_fix():
    problem = settings_problem(PRESETS["mixtral-8x7b"], Degrees(8, 1, 1, 1, 8),
                               Settings(1, sharded_optimizer=True, zero=3, hsdp=True))
    assert "HSDP with experts" in problem and "use ZeRO-3 without HSDP" in problem


def test_the_command_names_the_fix_when_no_settings_are_runnable():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "synth", "plan", "--topology", "selene", "--model", "mixtral-8x7b",
                           "--tp", "1", "--pp", "2", "--ep", "8", "--zero1", "on", "--zero-stage", "3", "--hsdp", "on"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "use ZeRO-3 without HSDP" in done.stderr and "Traceback" not in done.stderr
