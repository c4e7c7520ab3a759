"""The pipeline schedule's bubble with uneven stages and interleaved chunks, and the window the
tensor-parallel overlap hides its reduce-scatters in (hand-worked cases)."""

from __future__ import annotations

import dataclasses

import pytest

from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import Degrees
from synth.plan.kernels import layer_gemms
from synth.plan.launch import published_placement
from synth.plan.model import PRESETS
from synth.plan.step import (PIPELINE_SMS, Settings, _overlapped, compute_of, pipeline_bubble, predict,
                             tp_overlap_exposed)
from synth.topology_file import load_topology

from plan_cases import h100_step


def test_tp_overlap_hides_scatters_in_the_fused_weight_gradient_gemm():
    """With gradient-accumulation fusion the weight-gradient GEMM reads and writes fp32 main
    gradients: it runs longer, and that longer kernel is the window its reduce-scatter hides in."""
    model, compute, *_ = h100_step()
    tp, tokens = 8, model.seq_len
    kernels = compute.kernels
    assert kernels.grad_accumulation == "fused"
    gather_s, scatter_s = 2e-4, 3e-4
    _, backward = tp_overlap_exposed(model, compute, tokens, tp, gather_s, scatter_s)
    qkv, proj, fc1, fc2 = layer_gemms(model.hidden, model.ffn, model.query_groups * model.head_dim,
                                      model.gated_mlp, tokens, tp)
    sms = int(kernels.device.sms.value)
    plain = lambda g: kernels.gemm_seconds(g, model.bytes_per_value)  # noqa: E731
    fused = lambda g: kernels.gemm_seconds(g, model.bytes_per_value, 8)  # noqa: E731 (fp32 read + write)
    assert fused(qkv.backward()[1]) > plain(qkv.backward()[1])
    by_hand = (_overlapped(gather_s, plain(proj.backward()[0]), 1, sms, 0.0)
               + _overlapped(gather_s, plain(fc2.backward()[0]), 1, sms, 0.0)
               + _overlapped(scatter_s, fused(qkv.backward()[1]), PIPELINE_SMS, sms, 0.0)
               + _overlapped(scatter_s, fused(fc1.backward()[1]), PIPELINE_SMS, sms, 0.0))
    assert backward == pytest.approx(by_hand, rel=1e-12)
    # Without the fusion (a separate add per micro-batch) the window is the plain GEMM.
    hook = dataclasses.replace(compute, kernels=dataclasses.replace(kernels, grad_accumulation="hook"))
    _, backward_hook = tp_overlap_exposed(model, hook, tokens, tp, gather_s, scatter_s)
    assert backward_hook >= backward


def _one_f_one_b(forward, backward, m):
    """Makespan of Megatron's 1F1B schedule (forward_backward_pipelining_without_interleaving:
    stage i runs min(p-i-1, m) warm-up forwards, then one forward and one backward alternately,
    then the remaining backwards), each operation starting when its stage is free and its input
    has arrived (free transfers)."""
    p = len(forward)
    order = []
    for i in range(p):
        warm = min(p - i - 1, m)
        ops = [("F", j) for j in range(warm)]
        for j in range(m - warm):
            ops += [("F", warm + j), ("B", j)]
        ops += [("B", j) for j in range(m - warm, m)]
        order.append(ops)
    done, position, free = {}, [0] * p, [0.0] * p
    while any(position[i] < len(order[i]) for i in range(p)):
        progressed = False
        for i in range(p):
            if position[i] == len(order[i]):
                continue
            kind, j = order[i][position[i]]
            need = ((("F", i - 1, j) if i > 0 else None) if kind == "F"
                    else (("B", i + 1, j) if i < p - 1 else ("F", i, j)))
            if need is not None and need not in done:
                continue
            start = max(free[i], done[need] if need is not None else 0.0)
            free[i] = done[(kind, i, j)] = start + (forward[i] if kind == "F" else backward[i])
            position[i] += 1
            progressed = True
        assert progressed
    return max(free)


@pytest.mark.parametrize("stage_seconds", [(3.0, 3.0, 3.0, 3.0), (3.0, 3.0, 3.0, 4.5), (4.5, 3.0, 3.0),
                                           (2.0, 6.0, 3.0), (3.0, 6.0), (6.0, 3.0)])
def test_uneven_bubble_is_the_other_stages_time(stage_seconds):
    """1F1B with uneven stages, simulated operation by operation: the step is m times the slowest
    stage plus the sum of the other stages' times (not p-1 times the slowest)."""
    m = 8
    forward = [t / 3 for t in stage_seconds]
    backward = [2 * t / 3 for t in stage_seconds]
    simulated = _one_f_one_b(forward, backward, m)
    assert simulated == pytest.approx(m * max(stage_seconds) + pipeline_bubble(stage_seconds, m))
    # by hand for (3, 3, 3, 4.5): 8 x 4.5 + 3 + 3 + 3 = 45, where (p-1) x slowest would give 49.5
    if stage_seconds == (3.0, 3.0, 3.0, 4.5):
        assert simulated == pytest.approx(45.0)
    # (4.5, 3, 3): the slow first stage's own last backwards hide the last micro-batch's pass
    # through the other two: 8 x 4.5 + max(0, 6 - 2 x 1.5) = 39
    if stage_seconds == (4.5, 3.0, 3.0):
        assert simulated == pytest.approx(39.0)


def test_interleaved_bubble_and_its_transfer_chain():
    """(p-1)/v t with even stages (Narayanan et al.), plus 2 (p v - 1) transfers when they are
    overlapped in the steady state: p = 4, v = 3, t = 6 s, transfer 0.01 s:
    3 x 6 / 3 + 2 x 11 x 0.01 = 6.22 s."""
    assert pipeline_bubble([6.0] * 4, 8, 3, 0.01) == pytest.approx(6.22)
    assert pipeline_bubble([6.0] * 4, 8) == pytest.approx(18.0)
    assert pipeline_bubble([6.0], 8, 1, 0.01) == 0.0


def test_deeper_interleaving_pays_its_chunk_boundaries():
    """Past some depth more chunks cost more than they save: the bubble's compute falls as 1/v
    while the warm-up and cool-down chain of transfers grows as p v."""
    bubbles = [pipeline_bubble([1.0] * 2, 16, v, 0.002) for v in (1, 2, 4, 8, 16, 32)]
    assert bubbles.index(min(bubbles)) not in (0, len(bubbles) - 1)


def test_even_stages_with_the_output_layer_on_the_last_bubble_the_idle_stages():
    """Even stages whose last one also runs the output layer (the 1T run's layout): the bubble is
    (p-1) of the other stages' time, without the output layer, less than (p-1) x the last stage."""
    topology = load_topology("selene")
    model = dataclasses.replace(PRESETS["llama2-7b"], layers=32, global_batch=64)
    degrees = Degrees(2, 8, 4)
    costs = CommunicationCosts(topology)
    placement = published_placement(degrees, topology)
    prediction = predict(model, compute_of(topology.device, model.precision), costs, degrees, placement, Settings(1))
    b, m = prediction.breakdown, prediction.microbatches
    last = (b.compute + b.tensor_parallel + b.pipeline_p2p) / m  # the slowest (last) stage per micro-batch
    assert 0 < b.pipeline_bubble < 3 * last


def test_megatron_r08_reduces_bf16_gradients_in_fp32():
    """Megatron-LM r0.8's arguments.py sets accumulate_allreduce_grads_in_fp32 whenever --bf16 is
    given (training.py passes it as DDP's grad_reduce_in_fp32): the H100 rows' reduce-scatter moves
    4 bytes per gradient, twice bf16's, and exposes more behind the same last backward."""
    from benchmarks.plan import H100_TABLE, h100_model

    model = h100_model(H100_TABLE[3])  # the 32B row: t 8, d 48
    assert model.grad_bytes_per_value == 4
    topology = load_topology("dgx-h100-2x8x8")
    degrees = Degrees(16, 8, 1)
    placement = published_placement(degrees, topology)
    compute = compute_of(topology.device, model.precision)
    costs = CommunicationCosts(topology)
    settings = Settings(1, 1, True, "none", True, tp_overlap=True, overlap_param_gather=True)
    model = dataclasses.replace(model, global_batch=64)
    fp32 = predict(model, compute, costs, degrees, placement, settings)
    bf16 = predict(dataclasses.replace(model, grad_precision="bf16"), compute, costs, degrees, placement, settings)
    reduced = lambda p: sum(r.bytes * r.calls for r in p.routes if r.name == "data" and r.calls > 1)  # noqa: E731
    assert reduced(fp32) == pytest.approx(2 * reduced(bf16), rel=0.01)
    assert fp32.breakdown.data_parallel >= bf16.breakdown.data_parallel


@pytest.mark.parametrize("pp, virtual", [(2, 1), (4, 1), (2, 21), (4, 3), (8, 12)])
def test_interleaved_in_flight_activations_follow_megatrons_warm_up(pp, virtual):
    """The first stage holds its warm-up chunks plus the one in its first steady forward:
    Megatron's warm-up for rank 0 (pipeline_parallel/schedules.py, interleaved) is (p-1) 2 + (v-1) p chunks
    interleaved (p-1 without interleaving), each of L/(p v) layers; the memory term's
    L/p min(p, m) (1 + (p-1)/(p v)) is that count (m >= p)."""
    from synth.plan.formulas import in_flight_layers

    layers = pp * virtual * 2
    model = dataclasses.replace(PRESETS["llama2-7b"], layers=layers)
    warm_up = (pp - 1) * 2 + (virtual - 1) * pp if virtual > 1 else pp - 1
    by_hand = (warm_up + 1) * layers / (pp * virtual)
    assert in_flight_layers(model, pp, virtual, 4 * pp) == pytest.approx(by_hand)
