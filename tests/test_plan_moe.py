"""Mixture-of-experts models: parameters (total and active), FLOPs and memory by a worked
example, the published totals of the built-in MoE models, and the MoE keys' checks."""

from __future__ import annotations

import pytest

from synth.errors import UsageError
from synth.plan import formulas, moe
from synth.plan.model import PRESETS, Transformer, model_from_mapping

# A tiny MoE model whose figures are worked out by hand below: 4 layers, h = 8, 2 heads,
# gated FFNs, no biases, untied embeddings, vocabulary 10; the first layer dense (f = 16), the
# others with E = 4 experts of f_e = 4, top-2, a shared FFN of f_s = 6, capacity factor 1.5.
TINY = Transformer("tiny-moe", 4, 8, 2, 16, 32, 10, 1, 4, gated_mlp=True, biases=False, dropout=False,
                   learned_positions=False, tied_embeddings=False, flash_attention=True, experts=4, top_k=2,
                   expert_ffn=4, shared_ffn=6, capacity_factor=1.5, first_dense=1)


def test_worked_example_parameters():
    # attention 4 h^2 = 256, two RMSNorms 16: 272 per layer.
    # dense layer FFN: 3 h f = 384; MoE layer: 4 experts x 3 h f_e (96) = 384, shared 3 h f_s = 144,
    # router h E = 32: 560; one token uses 2 x 96 + 144 + 32 = 368.
    # embeddings: input and output 2 V h = 160, final norm 8.
    assert moe.moe_layer_count(TINY) == 3 and not moe.is_moe_layer(TINY, 0) and moe.is_moe_layer(TINY, 1)
    assert formulas.parameter_count(TINY) == 4 * 272 + 384 + 3 * 560 + 168 == 3320
    assert formulas.active_parameter_count(TINY) == 4 * 272 + 384 + 3 * 368 + 168 == 2744


def test_worked_example_flops():
    # Forward FLOPs per token of a MoE layer's FFN: routed 2 x k c x 3 h f_e = 2 x 3 x 96 = 576,
    # shared 2 x 144 = 288, router 2 x 32 = 64: 928 (c = 1 for model FLOPs: 2 x 2 x 96 + 288 + 64 = 736).
    assert moe.moe_ffn_forward_flops(TINY, 1) == 928
    assert moe.moe_ffn_forward_flops(TINY, 1, padded=False) == 736
    tokens, context = 32, 32
    attention_matmul = 2 * tokens * 256
    scores = 4 * tokens * context * 8
    dense = 2 * tokens * 384
    executed = (attention_matmul + scores) * 4 + dense + 3 * 928 * tokens
    layer, attention = formulas.layer_forward_flops(TINY, tokens, context)
    assert attention == scores and layer * 4 == pytest.approx(executed)
    unpadded, _ = formulas.layer_forward_flops(TINY, tokens, context, padded=False)
    assert unpadded * 4 == pytest.approx(executed - 3 * (928 - 736) * tokens)


def test_worked_example_memory_with_expert_parallelism():
    # pp = 2: the first stage holds layers 0-1 (one MoE), the last layers 2-3 (two MoE). tp = 2,
    # ep = 2: each device holds 2 of the 4 experts split by tp (4 x 96 / 4 = 96 per MoE layer), the
    # shared FFN split by tp (72) and the whole router (32), in place of the dense FFN / tp (192).
    per_moe = 96 + 72 + 32 - 192
    dense = formulas.stage_parameters(TINY.__class__("dense", 4, 8, 2, 16, 32, 10, 1, 4, gated_mlp=True, biases=False,
                                                     dropout=False, learned_positions=False, tied_embeddings=False),
                                      2, 2)
    stages = formulas.stage_parameters(TINY, 2, 2, ep=2)
    assert stages.first == dense.first + per_moe
    assert stages.last == dense.last + 2 * per_moe
    assert moe.expert_parameters_per_device(TINY, 2, 2, 2, 4) == 2 * 96
    # The dispatch of 32 tokens: 32 x h x k x c = 768 values of 2 bytes.
    assert moe.dispatch_bytes(TINY, 32) == 1536


# Published totals (model cards and papers) and active parameters; within 1%.
PUBLISHED = {"mixtral-8x7b": (46.7e9, 12.9e9), "mixtral-8x22b": (141e9, 39e9), "deepseek-moe-16b": (16.4e9, 2.8e9),
             "qwen1.5-moe-a2.7b": (14.3e9, 2.7e9)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_moe_presets_match_the_published_totals(name):
    model = PRESETS[name]
    total, active = PUBLISHED[name]
    assert formulas.parameter_count(model) == pytest.approx(total, rel=0.01)
    assert formulas.active_parameter_count(model) == pytest.approx(active, rel=0.015)
    assert model.is_moe and model.source


def test_mixtral_is_exactly_its_checkpoint():
    # The sum of the released checkpoint's tensor sizes (46,702,792,704).
    assert formulas.parameter_count(PRESETS["mixtral-8x7b"]) == 46_702_792_704


def test_dense_models_are_unchanged_by_the_moe_terms():
    model = PRESETS["llama3-8b"]
    assert formulas.active_parameter_count(model) == formulas.parameter_count(model) == 8_030_261_248
    assert moe.mean_flops_delta(model, 100) == 0.0


@pytest.mark.parametrize("fields, words", [
    ({"top_k": 2}, "top_k set without experts"),
    ({"experts": 1, "top_k": 1}, "experts = 1"),
    ({"experts": 8, "top_k": 9}, "top_k = 9"),
    ({"experts": 8}, "top_k = 0"),
    ({"experts": 8, "top_k": 2, "capacity_factor": 0.5}, "capacity_factor = 0.5"),
    ({"experts": 8, "top_k": 2, "capacity_factor": "1"}, "is not a number"),
    ({"experts": 8, "top_k": 2, "first_dense": 2}, "first_dense = 2"),
    ({"experts": 8, "top_k": 2, "moe_every": 0}, "moe_every = 0"),
])
def test_bad_moe_keys_are_named(fields, words):
    document = {"name": "m", "layers": 2, "hidden": 64, "heads": 4, "ffn": 256, "seq_len": 128, "vocab": 1000,
                "micro_batch": 1, "global_batch": 8, **fields}
    with pytest.raises(UsageError, match=words):
        model_from_mapping(document, "m.toml")


def test_moe_every_other_layer():
    document = {"name": "m", "layers": 6, "hidden": 64, "heads": 4, "ffn": 256, "seq_len": 128, "vocab": 1000,
                "micro_batch": 1, "global_batch": 8, "experts": 4, "top_k": 1, "moe_every": 2,
                "capacity_factor": 1}
    model = model_from_mapping(document, "m.toml")
    assert [moe.is_moe_layer(model, i) for i in range(6)] == [True, False] * 3
    assert model.capacity_factor == 1.0 and isinstance(model.capacity_factor, float)
