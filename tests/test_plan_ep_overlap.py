"""Dispatch and combine behind another micro-batch's compute (Megatron's
--overlap-moe-expert-parallel-comm, `Settings.ep_overlap`): runnable only where megatron-core
allows it, priced in the expert term as never slower, searched, and exported only when chosen."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from types import SimpleNamespace

import pytest

from synth.commands.plan import resize
from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import Degrees
from synth.plan.launch import megatron_arguments, published_placement
from synth.plan.model import PRESETS
from synth.plan.search import SearchSpace, Settings
from synth.plan.step import compute_of, ep_overlap_problem, predict
from synth.plan.terms.expert import ep_overlap_steady
from synth.topology_file import load_topology

FLAG = "--overlap-moe-expert-parallel-comm"
CASES = [  # (model, degrees): expert groups inside a node, across nodes, with a pipeline
    ("mixtral-8x7b", Degrees(32, 1, 4, 1, 8)),
    ("deepseek-moe-16b", Degrees(64, 1, 2, 1, 16)),
    ("qwen3-30b-a3b", Degrees(64, 1, 2, 1, 16)),
    ("gpt-oss-120b", Degrees(64, 2, 1, 1, 16)),
]


@pytest.fixture(scope="module")
def system():
    topology = load_topology("dgx-h100-2x8x8")
    return topology, CommunicationCosts(topology)


@pytest.mark.parametrize("name, degrees", CASES)
def test_the_overlap_is_never_slower(system, name, degrees):
    """Every runnable setting the search tries with the overlap is at most as slow as the same
    setting without it, and hides some all-to-all where there is a steady state."""
    topology, costs = system
    model = PRESETS[name]
    compute = compute_of(topology.device, model.precision)
    placement = published_placement(degrees, topology)
    overlapped = [s for s in SearchSpace(micro_batches=(1,)).settings(model, degrees) if s.ep_overlap]
    assert overlapped
    for settings in overlapped:
        on = predict(model, compute, costs, degrees, placement, settings)
        off = predict(model, compute, costs, degrees, placement, replace(settings, ep_overlap=False))
        assert on.step_s <= off.step_s * (1 + 1e-12), settings.text
        assert on.breakdown.expert_parallel < off.breakdown.expert_parallel, settings.text
        assert on.memory.peak >= off.memory.peak  # one more micro-batch in flight


def test_megatron_cores_conditions_are_enforced():
    model = PRESETS["mixtral-8x7b"]
    base = Settings(1, 2, ep_overlap=True)
    assert ep_overlap_problem(model, Degrees(16, 1, 4, 1, 8), base) is None
    assert "without expert parallelism" in ep_overlap_problem(model, Degrees(16, 1, 4, 1, 1), base)
    assert "full recomputation" in ep_overlap_problem(model, Degrees(16, 1, 4, 1, 8), replace(base, recompute="full"))
    assert "interleaved" in ep_overlap_problem(model, Degrees(16, 1, 4, 1, 8), replace(base, virtual=1))
    assert ep_overlap_problem(model, Degrees(64, 1, 1, 1, 8), replace(base, virtual=1)) is None  # no pipeline
    fp32 = replace(model, precision="fp32")
    assert "bf16 or fp16" in ep_overlap_problem(fp32, Degrees(16, 1, 4, 1, 8), base)
    dense = SearchSpace(micro_batches=(1,)).settings(model, Degrees(16, 1, 4, 1, 1))
    assert dense and not any(s.ep_overlap for s in dense)


def test_the_steady_share_follows_megatrons_warm_up():
    assert ep_overlap_steady(8, 1, 1) == 7 / 8  # no pipeline: the first forward and last backward unpaired
    assert ep_overlap_steady(8, 4, 2) == (16 - (6 + 4 + 1)) / 16
    assert ep_overlap_steady(2, 8, 2) == 0.0  # all warm-up: nothing hidden


def _candidate(system, ep_overlap: bool):
    topology, _ = system
    degrees = Degrees(32, 1, 4, 1, 8)
    settings = Settings(1, 2, False, "none", True, overlap_p2p=True, ep_overlap=ep_overlap)
    return PRESETS["mixtral-8x7b"], SimpleNamespace(degrees=degrees, settings=settings,
                                                    placement=published_placement(degrees, topology))


@pytest.mark.parametrize("ep_overlap", [False, True])
def test_the_launch_line_has_the_flag_only_when_chosen(system, ep_overlap):
    model, candidate = _candidate(system, ep_overlap)
    assert (FLAG in megatron_arguments(model, candidate, system[0])) is ep_overlap


def test_megatron_core_accepts_the_flag_set(system):
    """The exported flags, parsed, build megatron-core's TransformerConfig with the overlap on
    (its checks: expert parallelism, an alltoall or flex dispatcher, no full recomputation,
    bf16, virtual stages with a pipeline, no shared-expert overlap)."""
    import torch

    config = pytest.importorskip("megatron.core.transformer.transformer_config",
                                 reason="megatron-core is not installed (pip install megatron-core==0.16.1)")
    from tests.test_plan_moe import _moe_parser

    model, candidate = _candidate(system, True)
    parser = _moe_parser()
    parser.add_argument("--moe-flex-dispatcher-backend")
    parser.add_argument(FLAG, action="store_true")
    args = parser.parse_args(megatron_arguments(model, candidate, system[0]))
    assert args.overlap_moe_expert_parallel_comm  # the flag's dest is the config field's name
    virtual = args.num_layers // (args.pipeline_model_parallel_size * args.num_layers_per_virtual_pipeline_stage)
    from tests.test_moe_dispatcher_launch import moe_transformer_config

    built = moe_transformer_config(config, args, virtual_pipeline_model_parallel_size=virtual,
                                   overlap_moe_expert_parallel_comm=args.overlap_moe_expert_parallel_comm)
    assert built.overlap_moe_expert_parallel_comm
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(AssertionError, match="full recomputation"):  # what ep_overlap_problem refuses
            config.TransformerConfig(
                num_layers=args.num_layers, hidden_size=args.hidden_size, num_attention_heads=args.num_attention_heads,
                bf16=True, pipeline_dtype=torch.bfloat16, pipeline_model_parallel_size=4,
                virtual_pipeline_model_parallel_size=virtual, num_moe_experts=8, moe_router_topk=2,
                expert_model_parallel_size=8, moe_token_dispatcher_type="alltoall", recompute_granularity="full",
                recompute_method="uniform", recompute_num_layers=1, overlap_moe_expert_parallel_comm=True)


def test_the_search_chooses_it_and_the_plan_says_so(capsys):
    from synth.cli import main

    assert main(["plan", "-t", "dgx-h100-2x8x8", "--resize", "rack=1", "-m", "mixtral-8x7b", "--dp", "16", "--tp", "1",
                 "--pp", "4", "--ep", "8", "--virtual-stages", "8", "--micro-batch", "1", "--recompute", "none",
                 "--sequence-parallel", "off", "--top", "2", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["ranked"][0]
    assert best["settings"]["ep_overlap"] is True
    assert main(["plan", "-t", "dgx-h100-2x8x8", "--resize", "rack=1", "-m", "mixtral-8x7b", "--dp", "16", "--tp", "1",
                 "--pp", "4", "--ep", "8", "--virtual-stages", "8", "--micro-batch", "1", "--recompute", "none",
                 "--sequence-parallel", "off", "--ep-overlap", "off", "--top", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ranked"][0]["settings"]["ep_overlap"] is False
