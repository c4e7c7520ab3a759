"""Mixture-of-experts models: parameters (total and active), FLOPs and memory by a worked
example, the published totals of the built-in MoE models, and the MoE keys' checks."""

from __future__ import annotations

import dataclasses

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
    # Memory traffic per token (tp = 1, bf16): the dense FFN's activation 3 x 16 x 2 = 96 bytes;
    # a MoE layer's routed 3 (k c) x 3 x 4 x 2 = 72, shared 3 x 6 x 2 = 36, permutations
    # 4 x 3 x 8 x 2 = 192: 300, on 3 of 4 layers.
    assert moe.mean_traffic_delta(TINY, 1, 1) == pytest.approx(3 * (300 - 96) / 4)
    # The dispatch of 32 tokens: 32 x h x k x c = 768 values of 2 bytes.
    assert moe.dispatch_bytes(TINY, 32) == 1536


# Published totals (model cards and papers) and active parameters; within 1% (active 2%: published
# to one decimal, 3.3B for Qwen3-30B-A3B). GPT-OSS's 5.13B active leaves the unembedding
# (2880 x 201088) out, as its model card counts it.
PUBLISHED = {"mixtral-8x7b": (46.7e9, 12.9e9), "mixtral-8x22b": (141e9, 39e9), "deepseek-moe-16b": (16.4e9, 2.8e9),
             "qwen1.5-moe-a2.7b": (14.3e9, 2.7e9), "deepseek-v3": (671e9, 37e9), "qwen3-235b-a22b": (235e9, 22e9),
             "qwen3-30b-a3b": (30.5e9, 3.3e9), "gpt-oss-120b": (116.8e9, 5.13e9 + 2880 * 201088),
             "dbrx": (132e9, 36e9), "llama4-maverick": (400e9, 17e9)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_moe_presets_match_the_published_totals(name):
    model = PRESETS[name]
    total, active = PUBLISHED[name]
    assert formulas.parameter_count(model) == pytest.approx(total, rel=0.01)
    assert formulas.active_parameter_count(model) == pytest.approx(active, rel=0.02)
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


# --- expert parallelism: degrees, groups as Megatron forms them, all-to-all cost, search --------

import warnings  # noqa: E402

import numpy as np  # noqa: E402

from synth.plan.costs import CommunicationCosts  # noqa: E402
from synth.plan.degrees import DegreeLimits, Degrees, enumerate_degrees  # noqa: E402
from synth.plan.launch import megatron_arguments, moe_layer_pattern, published_placement  # noqa: E402
from synth.plan.step import Settings, settings_problem  # noqa: E402
from synth.topology_file import load_topology  # noqa: E402


def test_expert_parallel_axes_split_the_data_parallel_ranks():
    degrees = Degrees(8, 2, 2, 1, 4)
    assert [(axis.name, axis.size) for axis in degrees.axes()] == [("pp", 2), ("dp", 2), ("ep", 4), ("tp", 2)]
    assert degrees.data_axes() == ("dp", "ep") and degrees.expert_data_axes() == ("dp",) and degrees.expert_dp == 2
    whole = Degrees(4, 1, 1, 1, 4)
    assert whole.data_axes() == ("ep",) and whole.expert_data_axes() == ()
    mixtral = PRESETS["mixtral-8x7b"]
    eps = {d.ep for d in enumerate_degrees(64, mixtral, DegreeLimits(tp=1, pp=1))}
    assert eps == {1, 2, 4, 8}  # divisors of dp = 64 that divide the 8 experts
    assert {d.ep for d in enumerate_degrees(64, PRESETS["llama3-8b"], DegreeLimits(tp=1, pp=1))} == {1}


@pytest.mark.parametrize("degrees", [Degrees(8, 2, 2, 1, 4), Degrees(16, 1, 2, 1, 8), Degrees(4, 8, 1, 1, 2)])
def test_expert_groups_are_megatrons(degrees):
    """megatron-core's RankGenerator forms the expert-parallel, expert data-parallel and dense
    data-parallel groups of the default order as the placement's ep, dp and (dp, ep) axes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_state = pytest.importorskip("megatron.core.parallel_state",
                                             reason="megatron-core is not installed (pip install megatron-core==0.16.1)")
    placement = published_placement(degrees, load_topology("dgx-a100-x4"))

    def ours(axes):
        return sorted(sorted(group) for group in placement.groups_over(axes))

    def theirs(generator, role):
        return sorted(sorted(group) for group in generator.get_ranks(role))
    dense = parallel_state.RankGenerator(tp=degrees.tp, ep=1, dp=degrees.dp, pp=degrees.pp, cp=1, order="tp-cp-ep-dp-pp")
    expert = parallel_state.RankGenerator(tp=degrees.tp, ep=degrees.ep, dp=degrees.expert_dp, pp=degrees.pp, cp=1,
                                          order="tp-cp-ep-dp-pp")
    assert theirs(expert, "ep") == ours(("ep",))
    assert theirs(dense, "dp") == ours(degrees.data_axes())
    if degrees.expert_dp > 1:
        assert theirs(expert, "dp") == ours(("dp",))


def test_the_all_to_all_is_one_call_through_the_estimate_and_bound_by_the_uplinks():
    """emu-2x4: 2 nodes of 4, every port 1 GB/s, one 1 GB/s uplink per node. An all-to-all of S
    bytes over all 8 sends S/8 to each peer: a node's uplink carries 4 devices x 4 remote peers
    x S/8 = 2 S, the busiest link, so the call takes at least 2 S at 1 GB/s; inside one node (4
    members, two groups at once, sharing no link) each device's port carries 3 x S/4. The time
    is the cost model's estimate of one AllToAll call (NCCL's grouped send/recv)."""
    from synth.placement import make_placement

    topology = load_topology("emu-2x4")
    costs = CommunicationCosts(topology)
    size = 8 * 10**6
    across = make_placement(topology, Degrees(8, 1, 1, 1, 8).axes(), ((2, 4),))
    found = costs.all_to_all(across, ("ep",), size)
    assert found.program == "AllToAll(InsideGroup(node))" and found.time_s >= 2 * size / 1e9
    assert "uplink" in costs.bottleneck(across, ("ep",), found.program, size)
    inside = make_placement(topology, Degrees(8, 1, 1, 1, 4).axes(), ((2, 1), (1, 4)))
    local = costs.all_to_all(inside, ("ep",), size)
    assert 0.75 * size / 1e9 <= local.time_s < found.time_s / 4
    assert local.levels == "gpu=4"


def test_all_to_all_inside_nvlink_is_cheaper_and_the_search_keeps_it_there():
    topology = load_topology("selene")
    costs = CommunicationCosts(topology)
    degrees = Degrees(64, 1, 1, 1, 8)
    from synth.placement import make_placement

    inside = make_placement(topology, degrees.axes(), ((8, 1), (1, 8)))  # dp across nodes, ep inside
    across = make_placement(topology, degrees.axes(), ((1, 8), (8, 1)))
    size = 64 << 20
    assert costs.all_to_all(inside, ("ep",), size).time_s * 3 < costs.all_to_all(across, ("ep",), size).time_s
    assert costs.all_to_all(inside, ("ep",), size).levels == "gpu=8"
    assert costs.all_to_all(across, ("ep",), size).levels.startswith("node=8")


def test_moe_settings_follow_megatron():
    mixtral = PRESETS["mixtral-8x7b"]
    assert settings_problem(mixtral, Degrees(8, 2, 1, 1, 2), Settings(1)) == \
        "MoE with tensor parallelism needs sequence parallelism"
    assert settings_problem(mixtral, Degrees(8, 2, 1, 1, 2), Settings(1, sequence_parallel=True)) is None
    from synth.plan.degrees import model_problem

    assert model_problem(mixtral, Degrees(16, 1, 1, 1, 16)) == "ep does not divide the experts"
    assert model_problem(mixtral, Degrees(8, 1, 1, 2, 2)) is None  # folded over cp (tests/test_plan_moe_folding.py)
    assert model_problem(mixtral, Degrees(2, 1, 1, 2, 8)) == "ep x etp does not divide tp x cp x dp"


def test_plan_mixtral_places_experts_inside_a_node(capsys):
    from synth.cli import main

    assert main(["plan", "-t", "selene", "-m", "mixtral-8x7b", "--tp", "1", "--pp", "2", "--ep", "8",
                 "--micro-batch", "1", "--recompute", "none", "--zero1", "on", "--virtual-stages", "1",
                 "--top", "1", "--json"]) == 0
    import json

    document = json.loads(capsys.readouterr().out)
    best = document["ranked"][0]
    assert best["degrees"]["ep"] == 8
    expert = [route for route in best["communication"] if route["name"] == "expert"]
    assert expert and expert[0]["levels"] == "gpu=8" and best["breakdown"]["expert_parallel_s"] > 0


def test_ep_shrinks_the_expert_memory():
    from synth.plan.costs import CommunicationCosts
    from synth.plan.step import Compute, predict
    from synth.placement import enumerate_placements

    topology = load_topology("selene")
    costs = CommunicationCosts(topology)
    compute = Compute(312e12, 0.5, 80 * 2 ** 30, 2e12)
    mixtral = PRESETS["mixtral-8x7b"]
    settings = Settings(1, sequence_parallel=True, sharded_optimizer=True)
    memory = {}
    for ep in (1, 8):
        degrees = Degrees(8, 8, 1, 1, ep)
        placement = enumerate_placements(topology, degrees.axes())[0]
        memory[ep] = predict(mixtral, compute, costs, degrees, placement, settings).memory.states_first
    # Each device holds 1 of 8 experts instead of 8 (split by tp = 8 either way): 7/8 of the
    # routed experts' weights and gradients gone, their optimizer states sharded over dp/ep = 1.
    experts = moe.routed_expert_parameters(mixtral) * 32 / 8
    per_parameter = formulas.state_bytes_per_parameter(mixtral, 8, True)
    whole = formulas.state_bytes_per_parameter(mixtral, 1, True)
    assert memory[1] - memory[8] == pytest.approx(experts * per_parameter - experts / 8 * whole)


def _moe_parser():
    from tests.test_plan_launch import _megatron_parser

    parser = _megatron_parser()
    for flag in ("--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size",
                 "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--moe-router-num-groups",
                 "--moe-router-group-topk"):
        parser.add_argument(flag, type=int)
    parser.add_argument("--moe-token-dispatcher-type", choices=("allgather", "alltoall", "flex"), default="allgather")
    parser.add_argument("--moe-expert-capacity-factor", type=float)
    parser.add_argument("--moe-pad-expert-input-to-capacity", action="store_true")
    # Megatron-LM's moe_freq_type: an integer, or a list expression such as "([0]*1+[1]*27)"
    parser.add_argument("--moe-layer-freq", type=lambda x: eval(x, {}) if "[" in x else int(x), default=1)
    return parser


def moe_transformer_config(args):
    """megatron-core's TransformerConfig (its checks run) from the parsed MoE launch flags."""
    import torch

    config_module = pytest.importorskip("megatron.core.transformer.transformer_config",
                                        reason="megatron-core is not installed (pip install megatron-core==0.16.1)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return config_module.TransformerConfig(
            num_layers=args.num_layers, hidden_size=args.hidden_size, ffn_hidden_size=args.ffn_hidden_size,
            num_attention_heads=args.num_attention_heads,
            num_query_groups=args.num_query_groups if args.group_query_attention else None,
            tensor_model_parallel_size=args.tensor_model_parallel_size,
            pipeline_model_parallel_size=args.pipeline_model_parallel_size,
            context_parallel_size=args.context_parallel_size or 1, sequence_parallel=args.sequence_parallel,
            gated_linear_unit=args.swiglu, add_bias_linear=not args.disable_bias_linear, bf16=args.bf16,
            params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
            num_moe_experts=args.num_experts, moe_router_topk=args.moe_router_topk,
            moe_ffn_hidden_size=args.moe_ffn_hidden_size,
            moe_shared_expert_intermediate_size=args.moe_shared_expert_intermediate_size,
            moe_layer_freq=args.moe_layer_freq, moe_token_dispatcher_type=args.moe_token_dispatcher_type,
            moe_expert_capacity_factor=args.moe_expert_capacity_factor,
            moe_pad_expert_input_to_capacity=args.moe_pad_expert_input_to_capacity,
            expert_model_parallel_size=args.expert_model_parallel_size,
            expert_tensor_parallel_size=args.expert_tensor_parallel_size)


@pytest.mark.parametrize("name, degrees, capacity", [
    ("mixtral-8x7b", Degrees(8, 2, 2, 1, 4), 0.0),
    ("deepseek-moe-16b", Degrees(16, 1, 2, 1, 8), 1.25),
    ("qwen1.5-moe-a2.7b", Degrees(4, 2, 4, 1, 2), 0.0),
])
def test_megatron_moe_arguments_pass_transformer_config(name, degrees, capacity):
    """The MoE flags build, through megatron-core 0.16.1's TransformerConfig checks, the experts,
    routing, sizes, layer pattern and parallel degrees the plan priced."""
    from dataclasses import replace
    from types import SimpleNamespace

    model = replace(PRESETS[name], capacity_factor=capacity)
    settings = Settings(1, 1, degrees.tp > 1, "none", True)
    candidate = SimpleNamespace(degrees=degrees, settings=settings,
                                placement=published_placement(degrees, load_topology("dgx-a100-x4")))
    args = _moe_parser().parse_args(megatron_arguments(model, candidate))
    config = moe_transformer_config(args)
    assert (config.num_moe_experts, config.moe_router_topk, config.moe_ffn_hidden_size) == (
        model.experts, model.top_k, moe.expert_ffn(model))
    assert (config.moe_shared_expert_intermediate_size or 0) == model.shared_ffn
    pattern = config.moe_layer_freq if isinstance(config.moe_layer_freq, list) else \
        [1 if index % config.moe_layer_freq == 0 else 0 for index in range(model.layers)]
    assert pattern == [int(moe.is_moe_layer(model, index)) for index in range(model.layers)]
    assert (config.moe_expert_capacity_factor or 0.0) == capacity and config.moe_pad_expert_input_to_capacity == (capacity > 0)
    assert (config.expert_model_parallel_size, config.expert_tensor_parallel_size) == (degrees.ep, degrees.tp)
    assert config.moe_token_dispatcher_type == "alltoall"


def test_moe_layer_pattern_text():
    assert moe_layer_pattern([0, 1, 1, 1]) == "([0]*1+[1]*3)"
    assert eval(moe_layer_pattern([1, 0] * 3), {}) == [1, 0] * 3
    assert megatron_arguments(PRESETS["llama3-8b"], type("C", (), {
        "degrees": Degrees(8, 1, 1), "settings": Settings(1), "placement": published_placement(
            Degrees(8, 1, 1), load_topology("dgx-a100"))})()).count("--num-experts") == 0


def _small_moe():
    """A small Mixtral-like model that fits 32 A100s many ways (8 experts, top-2)."""
    from dataclasses import replace

    return replace(PRESETS["mixtral-8x7b"], name="mixtral-small", layers=8, hidden=1024, heads=8, kv_heads=8,
                   ffn=2048, seq_len=2048, global_batch=64)


def test_moe_step_terms_add_up():
    from synth.plan.launch import published_placement as placed
    from synth.plan.step import compute_of, predict

    topology = load_topology("dgx-a100-x4")
    model = _small_moe()
    costs = CommunicationCosts(topology)
    compute = compute_of(topology.device, model.precision)
    degrees = Degrees(8, 2, 2, 1, 4)
    prediction = predict(model, compute, costs, degrees, placed(degrees, topology), Settings(1, 2, True, "full", True))
    assert prediction.step_s == pytest.approx(prediction.breakdown.total)
    expert = [route for route in prediction.routes if route.name == "expert"][0]
    # 4 per MoE layer plus 2 in the recomputed forward, for the last stage's 4 MoE layers, per micro-batch
    assert expert.calls == prediction.microbatches * 4 * 6
    assert expert.bytes == moe.dispatch_bytes(model, 2048 // 2)  # sequence parallelism: s b / t tokens
    # + the routed tokens' all-gather and reduce-scatter over tp beyond the dense FFN's pair,
    # forward, backward and the recomputed forward, for the 4 MoE layers
    def pair(size):
        return costs.reduce_scatter(prediction.placement, ("tp",), size).time_s + \
            costs.all_gather(prediction.placement, ("tp",), size).time_s
    activation = 2048 * model.hidden * model.bytes_per_value
    extra = pair(moe.dispatch_bytes(model, 2048)) - pair(activation)
    assert extra > 0
    assert prediction.breakdown.expert_parallel == pytest.approx(
        prediction.microbatches * (24 * expert.time_s + 4 * 3 * extra))
    assert {route.name for route in prediction.routes} >= {"expert", "expert-data", "data"}


def test_moe_search_ranks_exactly_what_predicting_everything_ranks():
    from tests.test_plan import _everything, _request

    from synth.plan.search import plan

    topology = load_topology("dgx-a100-x4")
    request = _request(topology, model=_small_moe(), top=10)
    result = plan(request)
    rows = _everything(request)
    fitting = sorted((row for row in rows if row.memory.peak <= request.memory_limit),
                     key=lambda r: (r.step_s, r.memory.peak, r.degrees.text, r.placement.to_text(), r.settings.text))
    assert [(r.step_s, r.degrees, r.placement.to_text(), r.settings) for r in result.ranked] == \
           [(r.step_s, r.degrees, r.placement.to_text(), r.settings) for r in fitting[:10]]
    assert result.evaluated == len(rows) == result.size.candidates
    assert any(row.degrees.ep > 1 for row in rows)


def test_moe_model_file_through_the_command(tmp_path, capsys):
    import json

    from synth.cli import main

    path = tmp_path / "moe.toml"
    path.write_text('name = "tiny-moe"\nlayers = 4\nhidden = 256\nheads = 4\nffn = 512\nseq_len = 512\nvocab = 1000\n'
                    'micro_batch = 1\nglobal_batch = 32\ngated_mlp = true\nbiases = false\ndropout = false\n'
                    'learned_positions = false\ntied_embeddings = false\nflash_attention = true\nkv_heads = 0\n'
                    'experts = 4\ntop_k = 2\nexpert_ffn = 256\ncapacity_factor = 1.25\nmoe_every = 2\n')
    assert main(["plan", "-t", "dgx-a100", "-m", str(path), "--top", "1", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    model = Transformer(**document["model"])
    assert model.capacity_factor == 1.25 and moe.moe_layer_count(model) == 2
    assert document["parameters"] == formulas.parameter_count(model) > document["active_parameters"]
    assert "MoE on 2 of 4 layers" in document["architecture"]
    path.write_text(path.read_text().replace("capacity_factor = 1.25", 'capacity_factor = "high"'))
    assert main(["plan", "-t", "dgx-a100", "-m", str(path)]) == 2
    assert "capacity_factor = 'high' is not a number" in capsys.readouterr().err


def test_megatron_command_quotes_the_layer_pattern():
    import shlex
    from types import SimpleNamespace

    from synth.plan.launch import megatron_command

    model = PRESETS["deepseek-moe-16b"]
    degrees = Degrees(16, 1, 2, 1, 8)
    candidate = SimpleNamespace(degrees=degrees, settings=Settings(1),
                                placement=published_placement(degrees, load_topology("dgx-a100-x4")))
    line = megatron_command(model, candidate)
    assert "--moe-layer-freq '([0]*1+[1]*27)'" in line
    assert shlex.split(line)[1:] == megatron_arguments(model, candidate)


# --- the MoE layers in the kernel step model and with uneven pipeline stages -----------------------


def test_expert_gemms_carry_the_routed_flops_and_are_timed_by_shape():
    """The local experts' grouped GEMMs plus the router and the shared experts do the MoE FFN's
    forward FLOPs per tensor-parallel rank (whatever ep: each device's share of the routed work
    is the same), and the kernel model times them by shape: fewer rows per expert (more
    experts for the same routed work) cannot be faster at the same FLOPs."""
    from synth.devices import device_named
    from synth.plan.kernels import expert_gemms, gemms_seconds, layer_times, rates_for

    mixtral = PRESETS["mixtral-8x7b"]
    tokens = 4096
    for tp, ep in ((1, 1), (1, 8), (2, 4)):
        gemms, dense = expert_gemms(mixtral, tokens, tp, ep, sequence_parallel=tp > 1)
        routed_and_shared = sum(g.flops for g in gemms[1:])
        assert routed_and_shared == pytest.approx(
            (moe.moe_ffn_forward_flops(mixtral, tokens) - 2.0 * tokens * mixtral.hidden * mixtral.experts) / tp)
        assert sum(g.flops for g in dense) == pytest.approx(2.0 * tokens * 3 * mixtral.hidden * mixtral.ffn / tp)
    rates = rates_for(device_named("a100-sxm4-80gb"), "bf16")
    routed = gemms[1:3]  # the last (tp=2, ep=4): 2 local experts of 4096 x 4 x 2 / 8 rows each
    assert routed[0].batch == 2 and routed[0].m == 4096 * 4 * 2 // 8
    floor = sum(g.flops for g in routed) / (rates.matmul_flops * rates.sustained)
    assert gemms_seconds(rates, routed, 2)[0] >= floor  # by tiles and waves, never above the rate
    dense_mixtral = dataclasses.replace(mixtral, name="dense", experts=0, top_k=0, expert_ffn=0)
    moe_layer = layer_times(mixtral, rates, 1, 1, 1, False, 8)
    dense_layer = layer_times(dense_mixtral, rates, 1, 1, 1, False)
    assert moe_layer.forward > dense_layer.forward and moe_layer.backward > dense_layer.backward


def test_moe_layers_per_stage_with_uneven_stages():
    """Each stage's MoE layers are its own: with uneven stages (and every other layer MoE) the
    first and last stages' layer ranges are formulas.stage_layers' split."""
    model = dataclasses.replace(_small_moe(), name="uneven", layers=10, moe_every=2)
    stages = formulas.stage_layers(model.layers, 4)
    ranges = moe.stage_ranges(model, stages)
    assert ranges[0] == (0, stages.first) and ranges[-1] == (model.layers - stages.last, model.layers)
    assert len(ranges) == 4 and all(b - a == stages.middle for a, b in ranges[1:-1])
    assert sum(moe.moe_layers_in(model, a, b) for a, b in ranges) == moe.moe_layer_count(model)
    assert moe.stage_ranges(model, formulas.stage_layers(model.layers, 1)) == ((0, model.layers),)


def test_moe_with_zero3_is_runnable_but_not_with_hsdp():
    mixtral = PRESETS["mixtral-8x7b"]
    settings = Settings(1, sharded_optimizer=True, zero=3)
    assert settings_problem(mixtral, Degrees(8, 1, 1, 1, 8), settings) is None  # tests/test_plan_moe_zero3.py
    assert settings_problem(mixtral, Degrees(8, 1, 1, 1, 8), Settings(1, sharded_optimizer=True, zero=3, hsdp=True))
    assert settings_problem(mixtral, Degrees(8, 1, 1, 1, 8), Settings(1, sharded_optimizer=True, zero=2)) is None


@pytest.mark.parametrize("degrees", [Degrees(8, 2, 2, 1, 4), Degrees(16, 1, 2, 1, 8), Degrees(8, 4, 1, 1, 8)])
def test_moe_exports_name_the_expert_and_the_dense_data_parallel_groups(degrees):
    """In every form of the launch export, `edp` is the expert data-parallel group (dp / ep ranks)
    and `dp` the dense one (edp and ep together), as megatron-core's RankGenerator forms them."""
    from types import SimpleNamespace

    import numpy as np

    from synth.plan.launch import launch_document

    placement = published_placement(degrees, load_topology("dgx-a100-x4"))
    candidate = SimpleNamespace(degrees=degrees, placement=placement,
                                settings=Settings(1, 1, degrees.tp > 1, "none", True))
    document = launch_document(PRESETS["mixtral-8x7b"], candidate)
    names = document["torch_device_mesh"]["mesh_dim_names"]
    assert "dp" not in names and names == document["jax"]["axis_names"] == list(document["axes"])
    assert document["degrees"]["dp"] == degrees.dp and document["degrees"]["edp"] == degrees.dp // degrees.ep
    assert ("edp" in names) == (degrees.expert_dp > 1) and document["axes"].get("edp", 1) == degrees.expert_dp
    dense = document["data_parallel"]["axes"]
    assert document["data_parallel"]["size"] == degrees.dp and dense == [name for name in ("edp", "ep") if name in names]

    def groups(lists):
        return sorted(sorted(group) for group in lists)
    mesh = np.array(document["torch_device_mesh"]["mesh"])  # the dense group as mesh[dense]._flatten("dp") takes it
    inside = [names.index(name) for name in dense]
    outside = [index for index in range(len(names)) if index not in inside]
    flattened = mesh.transpose(outside + inside).reshape(-1, degrees.dp)
    assert groups(flattened.tolist()) == groups(document["rank_groups"]["dp"])
    assert document["data_parallel"]["jax"] == (f"psum(x, {tuple(dense)!r})" if len(dense) > 1 else "psum(x, 'ep')")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_state = pytest.importorskip("megatron.core.parallel_state",
                                             reason="megatron-core is not installed (pip install megatron-core==0.16.1)")
    order = document["megatron"]["order"]
    dense_generator = parallel_state.RankGenerator(tp=degrees.tp, ep=1, dp=degrees.dp, pp=degrees.pp, cp=1, order=order)
    expert = parallel_state.RankGenerator(tp=degrees.tp, ep=degrees.ep, dp=degrees.expert_dp, pp=degrees.pp, cp=1,
                                          order=order)
    assert groups(dense_generator.get_ranks("dp")) == groups(document["rank_groups"]["dp"])
    assert groups(expert.get_ranks("ep")) == groups(document["rank_groups"]["ep"])
    if degrees.expert_dp > 1:
        assert groups(expert.get_ranks("dp")) == groups(document["rank_groups"]["edp"])
