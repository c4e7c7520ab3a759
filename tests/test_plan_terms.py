"""Each typed term of the step model on its own (synth/plan/terms/), and `predict` as their sum."""

from __future__ import annotations

import dataclasses

import pytest

from synth.plan.degrees import Degrees
from synth.plan.step import Settings, compute_of, predict
from synth.plan.terms.compute import layer_compute
from synth.plan.terms.context import context_parallel
from synth.plan.terms.expert import expert_parallel
from synth.plan.terms.pipeline import pipeline_bubble, pipeline_transfer
from synth.plan.terms.tensor import tensor_parallel
from synth.topology_file import load_topology
from tests.plan_cases import h100_step


@pytest.fixture(scope="module")
def dense():
    return h100_step("llama2-7b", Degrees(4, 4, 4, 2))


@pytest.fixture(scope="module")
def mixture():
    return h100_step("mixtral-8x7b", Degrees(32, 2, 2, 1, 8))


def test_compute_adds_forward_backward_and_recomputation(dense):
    model, compute, *_ = dense
    plain = layer_compute(model, compute, Settings(1), 4, 2, 1)
    full = layer_compute(model, compute, Settings(1, recompute="full"), 4, 2, 1)
    selective = layer_compute(model, compute, Settings(1, recompute="selective"), 4, 2, 1)
    assert plain.recompute == 0 and full.recompute == full.forward and selective.recompute == selective.scores
    assert full.layer == max(full.forward + full.backward + full.recompute, compute.kernels.host_s)
    assert plain.head == plain.head_forward + plain.head_backward > 0


def test_compute_without_kernels_is_flops_at_the_stated_efficiency(dense):
    model, compute, *_ = dense
    by_rate = compute_of(load_topology("dgx-h100-2x8x8").device, model.precision, 0.5)
    layer = layer_compute(model, by_rate, Settings(1), 4, 2, 1)
    assert layer.backward == 2 * layer.forward and layer.layer == 3 * layer.forward


def test_tensor_parallel_counts_four_calls_six_with_full_recomputation(dense):
    model, compute, costs, degrees, placement = dense
    activation = model.seq_len // 2 * model.hidden * model.bytes_per_value
    assert tensor_parallel(model, compute, costs, placement, Settings(1), 1, 2, activation).layer == 0
    plain = tensor_parallel(model, compute, costs, placement, Settings(1), 4, 2, activation)
    full = tensor_parallel(model, compute, costs, placement, Settings(1, recompute="full"), 4, 2, activation)
    assert plain.calls == 4 and plain.layer == 4 * plain.per_call and plain.head == plain.per_call
    assert full.calls == 6 and full.layer == 6 * full.per_call and full.backward == 4 * full.per_call
    paired = tensor_parallel(model, compute, costs, placement, Settings(1, sequence_parallel=True), 4, 2, activation)
    assert paired.per_call == paired.gather_s + paired.scatter_s and ";" in paired.program
    overlapped = tensor_parallel(model, compute, costs, placement,
                                 Settings(1, sequence_parallel=True, tp_overlap=True), 4, 2, activation)
    assert 0 <= overlapped.layer <= paired.layer


def test_context_exchange_shows_only_beyond_the_attention(dense):
    model, compute, costs, degrees, placement = dense
    assert context_parallel(model, costs, placement, Settings(1), 4, 1, 1000, 1.0).layer == 0
    hidden = context_parallel(model, costs, placement, Settings(1), 4, 2, model.seq_len // 2, 1.0)  # a second of attention
    shown = context_parallel(model, costs, placement, Settings(1), 4, 2, model.seq_len // 2, 0.0)
    assert hidden.layer == 0 and shown.layer == shown.exchange > 0 and hidden.exchange == shown.exchange


def test_expert_traffic_is_four_all_to_alls_per_moe_layer(mixture):
    model, compute, costs, degrees, placement = mixture
    tokens = model.seq_len
    activation = tokens * model.hidden * model.bytes_per_value
    none = expert_parallel(model, costs, placement, Settings(1), 1, 1, tokens, activation)
    assert none.layer == 0 and none.calls == 0
    alone = expert_parallel(model, costs, placement, Settings(1), 1, 8, tokens, activation)
    assert alone.calls == 4 and alone.layer == 4 * alone.call_s and alone.backward == 2 * alone.call_s
    full = expert_parallel(model, costs, placement, Settings(1, recompute="full"), 1, 8, tokens, activation)
    assert full.calls == 6
    assert alone.bytes == int(tokens * model.top_k * model.hidden * model.bytes_per_value)


def test_pipeline_transfers_and_bubble(dense):
    model, compute, costs, degrees, placement = dense
    activation = model.seq_len // 2 * model.hidden * model.bytes_per_value
    assert pipeline_transfer(costs, placement, Settings(1), 4, 1, activation).blocking == 0
    transfer = pipeline_transfer(costs, placement, Settings(1, virtual=2), 4, 4, activation)
    assert transfer.sent == activation // 4 and transfer.blocking == 4 * transfer.seconds > 0
    assert pipeline_bubble([1.0] * 4, 8) == pytest.approx(3.0)
    assert pipeline_bubble([1.0] * 4, 8, virtual=3) == pytest.approx(1.0)
    assert pipeline_bubble([1.0], 8) == 0


@pytest.mark.parametrize("settings", [Settings(1), Settings(1, sequence_parallel=True, recompute="full",
                                                            sharded_optimizer=True)])
def test_predict_is_the_sum_of_its_terms_and_explains_each(mixture, settings):
    model, compute, costs, degrees, placement = mixture
    prediction = predict(model, compute, costs, degrees, placement, dataclasses.replace(settings))
    terms = prediction.breakdown.terms()
    assert sum(term.seconds for term in terms) == prediction.breakdown.total
    assert prediction.step_s == pytest.approx(prediction.breakdown.total, rel=1e-12)
    assert {term.name for term in terms} >= {"compute", "tensor_parallel", "expert_parallel", "pipeline_bubble"}
    text = prediction.breakdown.explain()
    assert "expert_parallel" in text and "all-to-all" in text and len(text.splitlines()) == sum(
        1 for term in terms if term.seconds)


def test_sharded_layers_only_with_zero3_and_expose_what_compute_cannot_hide(mixture):
    from synth.plan.terms.sharded import sharded_layers

    model, compute, costs, degrees, placement = mixture
    layer = layer_compute(model, compute, Settings(1), 2, 1, 8)
    off = sharded_layers(model, costs, degrees, placement, Settings(1, sharded_optimizer=True), 8, layer, 0.0, 0.0, 0.0)
    assert not off.zero3 and off.layer == off.moe_layer == 0 and off.routes == ()
    zero3 = Settings(1, sharded_optimizer=True, zero=3)
    on = sharded_layers(model, costs, degrees, placement, zero3, 8, layer, 0.0, 0.0, 0.0)
    assert on.zero3 and on.shard == degrees.dp and on.layer >= 0 and {r.name for r in on.routes} == {"data", "expert-data"}
    blocking = sharded_layers(model, costs, degrees, placement, dataclasses.replace(zero3, overlap_gradients=False), 8,
                              layer, 0.0, 0.0, 0.0)
    # without the prefetch every gather and scatter is exposed: at least the route's gather and scatter
    assert blocking.layer >= blocking.routes[0].time_s > 0 and blocking.layer >= on.layer


def test_offload_costs_nothing_without_offloaded_layers(dense):
    from synth.plan.terms.offload import offload_seconds

    model, compute, *_ = dense
    assert offload_seconds(model, compute, Settings(1), 4, 2, 1.0, 2.0) == 0
    hidden = offload_seconds(model, compute, Settings(1, offload_layers=3), 4, 2, 10.0, 20.0)
    shown = offload_seconds(model, compute, Settings(1, offload_layers=3), 4, 2, 0.0, 0.0)
    assert hidden == 0 < shown


def test_data_parallel_term_is_nothing_for_the_bound_and_counts_the_experts_own_reduction(mixture):
    from synth.plan import formulas, moe
    from synth.plan.terms.data import data_parallel_terms
    from synth.plan.terms.sharded import sharded_layers

    model, compute, costs, degrees, placement = mixture
    settings = Settings(1)
    layer = layer_compute(model, compute, settings, 2, 1, 8)
    stages = formulas.stage_layers(model.layers, degrees.pp)
    first_range = moe.stage_ranges(model, stages)[0]
    params = formulas.stage_parameters(model, 2, 2, stages, 8)
    experts = moe.expert_parameters_per_device(model, 2, 8, *first_range)
    sharded = sharded_layers(model, costs, degrees, placement, settings, 8, layer, 0.0, 0.0, 0.0)

    def term(data_parallel):
        return data_parallel_terms(model, costs, degrees, placement, settings, stages.first, first_range, params,
                                   experts, layer, 0.0, 0.0, {}, {}, sharded, data_parallel)
    assert term(False).exposed == term(False).overlapped == 0 and term(False).routes == ()
    full = term(True)
    assert {route.name for route in full.routes} == {"data", "expert-data"}
    assert full.exposed >= 0 and full.overlapped >= 0
