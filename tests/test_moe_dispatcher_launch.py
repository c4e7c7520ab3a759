"""The Megatron-LM dispatcher a plan names (synth.plan.launch.megatron_dispatcher): alltoall while
the expert-parallel groups stay inside a host, flex with HybridEP across the hosts of a multi-host
NVLink domain, flex with DeepEP across a network (alltoall when the plan pads to a capacity,
which megatron-core refuses with DeepEP). The flags are megatron-core's own: parsed with its
choices and built into its TransformerConfig."""

from __future__ import annotations

import json
import typing
import warnings
from dataclasses import replace
from types import SimpleNamespace

import pytest

from synth.cli import main
from synth.plan.degrees import Degrees
from synth.plan.launch import launch_document, megatron_arguments, megatron_dispatcher, published_placement
from synth.plan.model import PRESETS
from synth.plan.search import Settings
from synth.topology_file import load_topology

CASES = [  # (model, degrees, topology, capacity, dispatcher arguments)
    ("mixtral-8x7b", Degrees(8, 2, 2, 1, 4), "dgx-a100-x4", 0.0, ["alltoall"]),  # ep inside a node
    ("mixtral-8x7b", Degrees(16, 1, 8, 1, 8), "dgx-h100-2x8x8", 0.0, ["alltoall"]),  # ep = the node's 8 GPUs
    ("deepseek-moe-16b", Degrees(64, 1, 2, 1, 16), "dgx-h100-2x8x8", 0.0, ["flex", "deepep"]),  # two nodes
    ("deepseek-moe-16b", Degrees(64, 1, 2, 1, 16), "dgx-h100-2x8x8", 1.25, ["alltoall"]),  # padded: no DeepEP
    ("mixtral-8x7b", Degrees(72, 1, 2, 1, 8), "gb200-nvl72", 0.0, ["flex", "hybridep"]),  # two trays, one rack
    ("mixtral-8x7b", Degrees(36, 1, 4, 1, 4), "gb200-nvl72", 0.0, ["alltoall"]),  # one tray
]


def _candidate(name, degrees, topology, capacity):
    model = replace(PRESETS[name], capacity_factor=capacity)
    settings = Settings(1, 1, False, "none", True)
    return model, SimpleNamespace(degrees=degrees, settings=settings, placement=published_placement(degrees, topology))


def _config_field(name: str):
    """A TransformerConfig field's choices, from megatron-core's own annotation."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = pytest.importorskip("megatron.core.transformer.transformer_config",
                                     reason="megatron-core is not installed (pip install megatron-core==0.16.1)")
    return config, typing.get_args(typing.get_type_hints(config.TransformerConfig)[name])


def moe_transformer_config(config, args, **extra):
    """megatron-core's TransformerConfig built from parsed Megatron-LM MoE flags (its checks run)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return config.TransformerConfig(
            num_layers=args.num_layers, hidden_size=args.hidden_size, num_attention_heads=args.num_attention_heads,
            ffn_hidden_size=args.ffn_hidden_size, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
            bf16=args.bf16, add_bias_linear=not args.disable_bias_linear, gated_linear_unit=args.swiglu,
            tensor_model_parallel_size=args.tensor_model_parallel_size,
            pipeline_model_parallel_size=args.pipeline_model_parallel_size,
            num_moe_experts=args.num_experts, moe_router_topk=args.moe_router_topk,
            moe_ffn_hidden_size=args.moe_ffn_hidden_size, expert_model_parallel_size=args.expert_model_parallel_size,
            expert_tensor_parallel_size=args.expert_tensor_parallel_size,
            moe_token_dispatcher_type=args.moe_token_dispatcher_type, **extra)


@pytest.mark.parametrize("name, degrees, system, capacity, expected", CASES)
def test_the_dispatcher_follows_where_the_expert_groups_run(name, degrees, system, capacity, expected):
    topology = load_topology(system)
    model, candidate = _candidate(name, degrees, topology, capacity)
    dispatcher = megatron_dispatcher(model, candidate.placement, topology)
    values = [value for value in dispatcher.arguments if not value.startswith("--")]
    assert values == expected
    assert dispatcher.form == ("hierarchical" if "flex" in expected else "flat")
    arguments = megatron_arguments(model, candidate, topology)
    assert arguments.count("--moe-token-dispatcher-type") == 1
    assert " ".join(dispatcher.arguments) in " ".join(arguments)
    if capacity:
        assert "refuses with DeepEP" in dispatcher.statement
    document = launch_document(model, candidate, topology)
    assert document["megatron"]["moe_dispatcher"]["arguments"] == list(dispatcher.arguments)
    assert "no equivalent among Megatron's dispatchers" in document["megatron"]["moe_dispatcher"]["statement"]


def test_without_a_topology_levels_above_the_innermost_are_a_network():
    model, candidate = _candidate("deepseek-moe-16b", Degrees(64, 1, 2, 1, 16), load_topology("dgx-h100-2x8x8"), 0.0)
    assert megatron_dispatcher(model, candidate.placement).arguments[-1] == "deepep"
    assert megatron_dispatcher(PRESETS["llama3-8b"], candidate.placement) is None


def dispatcher_parser():
    """megatron-core's config module and a Megatron-LM MoE flag parser with its dispatcher choices."""
    from tests.test_plan_moe import _moe_parser

    config, types = _config_field("moe_token_dispatcher_type")
    _, backends = _config_field("moe_flex_dispatcher_backend")
    parser = _moe_parser()
    parser.add_argument("--moe-flex-dispatcher-backend", choices=backends, default="deepep")
    for action in parser._actions:
        if action.dest == "moe_token_dispatcher_type":
            action.choices = types
    return config, parser


@pytest.mark.parametrize("name, degrees, system, capacity, expected", CASES)
def test_the_dispatcher_flags_pass_megatron_cores_config(name, degrees, system, capacity, expected):
    """Parsed with the choices megatron-core's TransformerConfig declares and built into it,
    with the parallel degrees and capacity the plan priced."""
    config, parser = dispatcher_parser()
    model, candidate = _candidate(name, degrees, load_topology(system), capacity)
    args = parser.parse_args(megatron_arguments(model, candidate, load_topology(system)))
    built = moe_transformer_config(config, args, moe_flex_dispatcher_backend=args.moe_flex_dispatcher_backend,
                                   moe_expert_capacity_factor=args.moe_expert_capacity_factor,
                                   moe_pad_expert_input_to_capacity=args.moe_pad_expert_input_to_capacity)
    assert built.moe_token_dispatcher_type == expected[0]
    if expected[0] == "flex":
        assert built.moe_flex_dispatcher_backend == expected[1]


def test_megatron_core_refuses_deepep_with_padded_capacity():
    """Why a padded plan keeps alltoall: the check the fallback avoids is live."""
    import torch

    config, _ = _config_field("moe_token_dispatcher_type")
    with pytest.raises(ValueError, match="does not support moe_pad_expert_input_to_capacity"), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config.TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, params_dtype=torch.float32,
                                 num_moe_experts=8, moe_router_topk=2, moe_token_dispatcher_type="flex",
                                 moe_flex_dispatcher_backend="deepep", moe_expert_capacity_factor=1.0,
                                 moe_pad_expert_input_to_capacity=True)


def test_plan_prints_and_exports_the_dispatcher(tmp_path, capsys):
    out = tmp_path / "launch.json"
    assert main(["plan", "-t", "dgx-a100-x4", "-m", "mixtral-8x7b", "--ep", "8", "--factor", "ep.node=2", "--top", "1",
                 "--export", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep" in printed
    assert "MoE dispatcher: the expert-parallel groups span nodes" in printed
    document = json.loads(out.read_text())
    launch = document.get("best_launchable") or document
    assert launch["megatron"]["moe_dispatcher"]["form"] == "hierarchical"
