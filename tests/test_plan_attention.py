"""Attention forms beyond `h / a` heads (a per-head size of its own, multi-head latent attention),
the built-in MoE models that need them, expert imbalance, and fine-grained experts' GEMMs."""

from __future__ import annotations

import dataclasses

import pytest

from synth.errors import UsageError
from synth.plan import attention, formulas, kernels, moe
from synth.devices import device_named
from synth.plan.kernels import Gemm, gemms_seconds, layer_times, rates_for
from synth.plan.launch import megatron_model_arguments
from synth.plan.model import PRESETS, describe_architecture, model_from_mapping

V3 = PRESETS["deepseek-v3"]
H100 = rates_for(device_named("h100-sxm5-80gb"), "bf16")


def test_deepseek_v3_layout():
    assert [moe.is_moe_layer(V3, index) for index in range(5)] == [False, False, False, True, True]
    assert moe.moe_layer_count(V3) == 58 and V3.shared_ffn == moe.expert_ffn(V3) == 2048
    maverick = PRESETS["llama4-maverick"]  # dense and MoE alternate, MoE on the odd layers
    assert [moe.is_moe_layer(maverick, index) for index in range(4)] == [False, True, False, True]
    assert not PRESETS["qwen3-235b-a22b"].shared_ffn and moe.moe_layer_count(PRESETS["qwen3-235b-a22b"]) == 94


def test_mla_layer_parameters_by_hand():
    """DeepSeek-V3's attention: q down 7168 x 1536, q up 1536 x 128 x 192, kv down 7168 x 576,
    kv up 512 x 128 x 256, output 128 x 128 x 7168, two latent norms; the down projections
    (and norms) whole on every tensor-parallel rank, the rest split."""
    split = 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168
    whole = 7168 * 1536 + 7168 * 576
    assert attention.split_weights(V3) == split
    assert attention.replicated_weights(V3) == whole
    shape = formulas.layer_shape(V3)
    ffn = 3 * 7168 * 18432
    assert shape.matmul == split + ffn
    assert shape.replicated == 2 * 7168 + whole + 1536 + 512
    assert shape.per_device(4) == pytest.approx((split + ffn) / 4 + 2 * 7168 + whole + 2048)
    assert attention.kv_cache_values_per_token(V3) == 576  # the latent, not 128 heads of keys and values
    assert attention.kv_values_per_token(V3) == 128 * (192 + 128)


def test_mla_flops_and_activations():
    tokens, context = 10, 4096
    layer, scores = formulas.layer_forward_flops(V3, tokens, context, padded=False)
    assert scores == pytest.approx(2.0 * tokens * context * 128 * (192 + 128))
    dense_part = 2.0 * tokens * (formulas.layer_shape(V3).matmul + attention.replicated_weights(V3))
    assert layer == pytest.approx(dense_part + moe.mean_flops_delta(V3, tokens, padded=False) + scores)
    split, whole = attention.activation_bytes_per_token(V3)
    assert split == 2 * (128 * 192 * 2 + 128 * 128 * 2) and whole == 4 * (1536 + 512 + 64)
    one = formulas.layer_activation_bytes(V3, 1, 1, 1, False, "selective")
    two = formulas.layer_activation_bytes(V3, 1, 2, 1, False, "selective")
    assert one > two > one / 2  # the latents stay whole


def test_a_head_size_equal_to_h_over_a_prices_as_the_plain_formulas():
    """The general path with `head_size = h / a` gives the plain formulas' figures."""
    for name in ("llama3-8b", "gpt3-1.3b", "mixtral-8x7b"):
        plain = PRESETS[name]
        general = dataclasses.replace(plain, head_size=plain.hidden // plain.heads)
        assert not attention.plain(general)
        assert formulas.parameter_count(general) == formulas.parameter_count(plain)
        assert formulas.layer_forward_flops(general, 7, 2048) == pytest.approx(formulas.layer_forward_flops(plain, 7, 2048))
        for tp, sp in ((1, False), (2, True)):
            assert formulas.layer_activation_bytes(general, 1, tp, 1, sp, "none") == pytest.approx(
                formulas.layer_activation_bytes(plain, 1, tp, 1, sp, "none"))
            assert dataclasses.astuple(layer_times(general, H100, 1, tp, 1, sp)) == pytest.approx(
                dataclasses.astuple(layer_times(plain, H100, 1, tp, 1, sp)))


def test_qwen3_heads_are_wider_than_h_over_a():
    qwen = PRESETS["qwen3-235b-a22b"]
    assert qwen.head_dim == 128 and qwen.heads * qwen.head_dim == 2 * qwen.hidden
    assert attention.split_weights(qwen) == 4096 * (64 * 128 + 2 * 4 * 128) + 64 * 128 * 4096
    assert "--kv-channels" in megatron_model_arguments(qwen)


def test_mla_layer_times_and_megatron_flags():
    times = layer_times(V3, H100, 1, 1, 1, False, ep=64)
    assert times.forward > times.matmul_forward > 0 and times.backward > times.forward
    assert len(attention.attention_gemms(V3, 4096, 1)) == 5
    args = megatron_model_arguments(V3)
    for flag, value in (("--kv-lora-rank", "512"), ("--q-lora-rank", "1536"), ("--qk-head-dim", "128"),
                        ("--qk-pos-emb-head-dim", "64"), ("--v-head-dim", "128")):
        assert args[args.index(flag) + 1] == value
    assert "--multi-latent-attention" in args and "--group-query-attention" not in args
    assert "multi-head latent attention (128 heads" in describe_architecture(V3)


@pytest.mark.parametrize("fields, words", [
    ({"qk_nope_head_dim": 128}, "set without kv_lora_rank"),
    ({"kv_lora_rank": 512}, "needs qk_nope_head_dim, qk_rope_head_dim, v_head_dim"),
    ({"kv_lora_rank": 512, "qk_nope_head_dim": 1, "qk_rope_head_dim": 1, "v_head_dim": 1, "kv_heads": 2},
     "do not apply"),
    ({"kv_lora_rank": 512, "qk_nope_head_dim": 1, "qk_rope_head_dim": 1, "v_head_dim": 1, "biases": True},
     "biases = false"),
    ({"head_size": -1}, "head_size = -1"),
    ({"hidden": 100, "heads": 3}, "not a multiple of heads"),
])
def test_bad_attention_keys_are_named(fields, words):
    base = {"name": "m", "layers": 2, "hidden": 64, "heads": 4, "ffn": 128, "seq_len": 16, "vocab": 10,
            "micro_batch": 1, "global_batch": 1, "biases": False}
    with pytest.raises(UsageError, match=words):
        model_from_mapping({**base, **fields}, "test")


def test_expert_imbalance_scales_the_busiest_experts_work():
    qwen = PRESETS["qwen3-30b-a3b"]
    skewed = dataclasses.replace(qwen, expert_imbalance=1.5)
    assert moe.routed_tokens(skewed, 100) == pytest.approx(1.5 * moe.routed_tokens(qwen, 100))
    assert moe.dispatch_bytes(skewed, 100) == int(1.5 * moe.dispatch_bytes(qwen, 100))
    assert formulas.model_flops_per_step(skewed) == formulas.model_flops_per_step(qwen)  # the MFU numerator
    assert layer_times(skewed, H100, 1, 1, 1, False, 8).forward > layer_times(qwen, H100, 1, 1, 1, False, 8).forward
    with pytest.raises(UsageError, match="capacity caps"):
        dataclasses.replace(qwen, expert_imbalance=1.5, capacity_factor=1.25)
    with pytest.raises(UsageError, match="expert_imbalance = 0.5"):
        dataclasses.replace(qwen, expert_imbalance=0.5)


def test_fine_grained_experts_run_below_one_big_gemms_rate():
    """DeepSeek-V3's 4 local experts (ep 64) on 4096 tokens get 4096 x 8 x 64 / 256 = 8192 rows
    each; at a micro-batch of 1/8 of that, 1024 rows. Run as grouped problems, a small M fills
    whole tiles per expert; the same FLOPs as one GEMM of all rows are never slower, and at a
    few rows per expert the grouped form is far slower per FLOP (tile rows padded)."""
    tokens = 4096
    gemms, _ = kernels.expert_gemms(V3, tokens, 1, 64, False)
    up = gemms[1]
    assert (up.m, up.n, up.k, up.batch) == (tokens * 8 * 64 // 256, 2 * 2048, 7168, 4)
    few = Gemm(40, 2 * 2048, 7168, 16)  # 16 experts of 40 rows
    one = Gemm(40 * 16, 2 * 2048, 7168)
    assert few.flops == one.flops
    assert H100.gemm_seconds(few, 2) > 1.5 * H100.gemm_seconds(one, 2)
    grouped = gemms_seconds(H100, gemms[1:3], 2)[0]
    merged = gemms_seconds(H100, [Gemm(up.m * 4, up.n, up.k), Gemm(up.m * 4, 7168, 2048)], 2)[0]
    assert grouped >= merged * 0.999


def test_plan_deepseek_v3_at_its_published_degrees(capsys):
    """2048 GPUs (the report's H800 count, here H100 nodes): pipeline 16, expert parallelism 64,
    no tensor parallelism, ZeRO-1 data parallelism."""
    import json

    from synth.cli import main

    assert main(["plan", "-t", "dgx-h100-2x8x8", "--resize", "rack=32", "-m", "deepseek-v3", "--tp", "1", "--pp", "16",
                 "--ep", "64", "--micro-batch", "1", "--recompute", "full", "--zero1", "on", "--virtual-stages", "1",
                 "--sequence-parallel", "off", "--top", "1", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["ranked"][0]
    assert (best["degrees"]["dp"], best["degrees"]["tp"], best["degrees"]["pp"], best["degrees"]["ep"]) == (128, 1, 16, 64)
    assert best["breakdown"]["expert_parallel_s"] > 0


@pytest.mark.parametrize("name, degrees", [
    ("deepseek-v3", (32, 1, 16, 1, 32)), ("qwen3-235b-a22b", (64, 1, 8, 1, 64)), ("qwen3-30b-a3b", (64, 2, 4, 1, 8)),
    ("gpt-oss-120b", (128, 1, 4, 1, 16)), ("dbrx", (32, 4, 4, 1, 8)), ("llama4-maverick", (64, 1, 8, 1, 64)),
])
def test_every_new_preset_is_priced_by_the_step_model(name, degrees):
    """Each new MoE preset through the whole step model on 512 H100s (a published-style layout:
    experts spread over the data-parallel ranks, pipeline across nodes): its terms add up, its
    expert all-to-alls and compute are priced."""
    from synth.plan.costs import CommunicationCosts
    from synth.plan.degrees import Degrees
    from synth.plan.launch import published_placement
    from synth.plan.search import Settings
    from synth.plan.step import compute_of, predict
    from synth.topology_file import load_topology

    from synth.commands.plan import resize

    topology = resize(load_topology("dgx-h100-2x8x8"), "rack=8")
    model = PRESETS[name]
    chosen = Degrees(*degrees)
    assert chosen.devices == 512
    from synth.plan.degrees import model_problem

    assert model_problem(model, chosen) is None  # Megatron's rules allow the layout
    compute = compute_of(topology.device, model.precision)
    prediction = predict(model, compute, CommunicationCosts(topology), chosen, published_placement(chosen, topology),
                         Settings(1, 1, chosen.tp > 1, "full", True))
    assert prediction.step_s == pytest.approx(prediction.breakdown.total)
    assert prediction.breakdown.expert_parallel > 0 and prediction.step_s > 0
