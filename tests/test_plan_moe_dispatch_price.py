"""The expert term prices dispatch and combine as the launch runs them (synth/plan/dispatcher.py:
one decision read by both): the flat all-to-all under Megatron's `alltoall`, the fastest
two-stage dispatch and combine programs of the model's routing under `flex` (DeepEP, HybridEP);
the price is memoized on the groups' shape, the routing and the host level."""

from __future__ import annotations

from dataclasses import replace

import pytest

from synth.errors import UsageError
from synth.goals import COMBINE, DISPATCH
from synth.plan import moe
from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import Degrees
from synth.plan.dispatcher import FLAT, HIERARCHICAL, megatron_dispatcher
from synth.plan.launch import megatron_arguments, published_placement
from synth.plan.model import PRESETS
from synth.plan.step import Settings
from synth.plan.terms.expert import expert_parallel, expert_routing
from synth.topology_file import load_topology

MOE = sorted(name for name, model in PRESETS.items() if model.is_moe)
SYSTEMS = ("dgx-h100-2x8x8", "gb200-nvl72")
_COSTS: dict[str, CommunicationCosts] = {}


def _costs(system: str) -> CommunicationCosts:
    if system not in _COSTS:
        _COSTS[system] = CommunicationCosts(load_topology(system))
    return _COSTS[system]


def _layouts(model, devices: int):
    """Degrees with expert parallelism that the model's experts allow on `devices`, inside a
    node and across nodes (tensor parallelism 1, 2 or 4 widens the expert groups' span)."""
    for tp in (1, 2, 4):
        for ep in (4, 8, 16, 32):
            degrees = Degrees(devices // tp, tp, 1, 1, ep)
            if moe.expert_problem(model, degrees) is None and model.heads % tp == 0:
                yield degrees


def _priced(model, system, degrees, settings=None):
    costs = _costs(system)
    placement = published_placement(degrees, costs.topology)
    settings = settings or Settings(1)
    tokens = model.seq_len
    term = expert_parallel(model, costs, placement, settings, degrees.tp, degrees.ep, tokens,
                           tokens * model.hidden * model.bytes_per_value)
    return term, megatron_dispatcher(model, placement, costs.topology), placement


@pytest.mark.parametrize("system", SYSTEMS)
@pytest.mark.parametrize("name", MOE)
def test_the_price_and_the_launch_agree_for_every_builtin_moe_model(name, system):
    model = PRESETS[name]
    devices = _costs(system).topology.device_count
    forms = set()
    for degrees in _layouts(model, devices):
        try:
            published_placement(degrees, _costs(system).topology)
        except ValueError:  # Megatron's rank order cannot lay these degrees on the system
            continue
        term, dispatcher, placement = _priced(model, system, degrees)
        assert term.form == dispatcher.form, (name, degrees)
        forms.add(term.form)
        arguments = " ".join(megatron_arguments(model, _Candidate(degrees, placement), _costs(system).topology))
        assert ("flex" in arguments) == (term.form == HIERARCHICAL)
        if term.form == HIERARCHICAL:
            assert "; then " in term.program and term.program.startswith("AllToAll(Parallel(")
        else:
            assert "; then " not in term.program
    assert forms, f"{name}: no layout with expert parallelism on {system}"
    if model.top_k > 1 and system == "dgx-h100-2x8x8":
        assert HIERARCHICAL in forms, name  # some layout spans nodes
    if model.top_k == 1:
        assert forms == {FLAT}


class _Candidate:
    def __init__(self, degrees, placement):
        self.degrees, self.placement, self.settings = degrees, placement, Settings(1)


def test_deepseek_v3_across_nodes_is_priced_by_its_two_stage_programs_below_the_flat_call():
    model = PRESETS["deepseek-v3"]
    degrees = Degrees(128, 1, 1, 1, 64)
    costs = _costs("dgx-h100-2x8x8")
    placement = published_placement(degrees, costs.topology)
    term, dispatcher, _ = _priced(model, "dgx-h100-2x8x8", degrees)
    assert dispatcher.arguments[-1] == "deepep" and term.form == HIERARCHICAL
    routing = expert_routing(model, model.seq_len, costs.factors(placement, ("ep",)))
    assert routing.node_limit == 4 and routing.topk == 8 and routing.tokens == model.seq_len
    dispatch = costs.two_stage(DISPATCH, placement, ("ep",), routing, dispatcher.host)
    combine = costs.two_stage(COMBINE, placement, ("ep",), routing, dispatcher.host)
    assert dispatch.program == "AllToAll(Parallel(node)); AllToAll(InsideGroup(gpu))"
    assert combine.program == "AllToAll(InsideGroup(gpu)); AllToAll(Parallel(node))"
    assert term.call_s == pytest.approx((dispatch.time_s + combine.time_s) / 2)
    assert term.layer == pytest.approx(term.calls * term.call_s) and term.calls == 4
    assert dispatch.time_s < dispatch.default_time_s  # the two-stage form beats the flat call of the routing
    flat = costs.all_to_all(placement, ("ep",), moe.dispatch_bytes(model, model.seq_len))
    assert term.call_s < flat.time_s
    # the node limit sends fewer copies across nodes than unlimited routing
    free = replace(routing, node_limit=None)
    assert costs.two_stage(DISPATCH, placement, ("ep",), free, dispatcher.host).time_s > dispatch.time_s


def test_the_two_stage_price_is_memoized_and_a_pure_function_of_its_key():
    model = PRESETS["deepseek-v3"]
    degrees = Degrees(128, 1, 1, 1, 64)
    costs = CommunicationCosts(load_topology("dgx-h100-2x8x8"))
    placement = published_placement(degrees, costs.topology)
    first = expert_parallel(model, costs, placement, Settings(1), 1, 64, 4096, 1)
    entries = len(costs._routed)
    again = expert_parallel(model, costs, placement, Settings(1), 1, 64, 4096, 1)
    assert again == first and len(costs._routed) == entries == 2
    fresh = CommunicationCosts(load_topology("dgx-h100-2x8x8"))
    assert expert_parallel(model, fresh, placement, Settings(1), 1, 64, 4096, 1) == first


def test_a_padded_capacity_keeps_the_flat_price_where_deepep_refuses_it():
    model = replace(PRESETS["deepseek-v3"], capacity_factor=1.25)
    term, dispatcher, _ = _priced(model, "dgx-h100-2x8x8", Degrees(128, 1, 1, 1, 64))
    assert dispatcher.arguments[-1] == "alltoall" and term.form == FLAT
    assert "AllToAll(InsideGroup(" in term.program and "; then " not in term.program


def test_group_limited_routing_as_a_node_limit():
    model = PRESETS["deepseek-v3"]  # 8 groups of 32 experts, 4 kept
    assert moe.node_limit(model, 8) == 4
    assert moe.node_limit(model, 16) == 8  # a group over two nodes
    assert moe.node_limit(model, 4) is None  # 2 groups per node: 4 groups may reach every node
    assert moe.node_limit(model, 1) is None and moe.node_limit(PRESETS["mixtral-8x7b"], 8) is None
    assert moe.node_limit(model, 3) is None  # groups cut nodes unevenly: not modelled
    for changes, word in (({"router_group_topk": 0}, "give both"), ({"router_groups": 7}, "does not divide"),
                          ({"router_group_topk": 9}, "more than"), ({"router_groups": 256, "router_group_topk": 2},
                                                                       "fewer than top_k")):
        with pytest.raises(UsageError, match=word):
            replace(model, **changes)
    with pytest.raises(UsageError, match="without experts"):
        replace(PRESETS["llama3-8b"], router_groups=8, router_group_topk=4)


def test_the_plan_json_names_the_dispatcher_each_candidate_was_priced_with(capsys):
    from synth.cli import main

    assert main(["plan", "-t", "dgx-h100-2x8x8", "-m", "qwen3-30b-a3b", "--tp", "1", "--pp", "2", "--ep", "16",
                 "--top", "3", "--json"]) == 0
    import json

    ranked = json.loads(capsys.readouterr().out)["ranked"]
    for candidate in ranked:
        dispatcher = candidate["moe_dispatcher"]
        expert = [route for route in candidate["communication"] if route["name"] == "expert"]
        assert expert and ("; then " in expert[0]["program"]) == (dispatcher["form"] == HIERARCHICAL)
        assert "priced so" in dispatcher["statement"]
    assert any(c["moe_dispatcher"]["arguments"][-1] == "deepep" for c in ranked)


def test_group_limited_routing_on_the_launch_line_passes_megatron_cores_config():
    """DeepSeek-V3's line carries its group-limited routing, which megatron-core's
    TransformerConfig takes with the DeepEP dispatcher the same line names."""
    from tests.test_moe_dispatcher_launch import dispatcher_parser, moe_transformer_config

    config, parser = dispatcher_parser()
    model, degrees = PRESETS["deepseek-v3"], Degrees(128, 1, 1, 1, 64)
    topology = _costs("dgx-h100-2x8x8").topology
    candidate = _Candidate(degrees, published_placement(degrees, topology))
    args, rest = parser.parse_known_args(megatron_arguments(model, candidate, topology))
    assert "--multi-latent-attention" in rest and not [flag for flag in rest if flag.startswith("--moe")]
    built = moe_transformer_config(config, args, moe_flex_dispatcher_backend=args.moe_flex_dispatcher_backend,
                                   moe_router_num_groups=args.moe_router_num_groups,
                                   moe_router_group_topk=args.moe_router_group_topk)
    assert (built.moe_router_num_groups, built.moe_router_group_topk) == (8, 4)
    assert built.moe_token_dispatcher_type == "flex" and built.moe_flex_dispatcher_backend == "deepep"


def test_the_steps_shared_by_dispatch_and_combine_price_as_each_goal_alone():
    """A combine's steps priced by its dispatch first (RoutedPrograms' step times shared per
    group shape) cost what the combine costs alone, to the bit, at several token counts and
    group shapes (three-step forms included: the groups span rack and node)."""
    model = PRESETS["deepseek-v3"]
    topology = load_topology("dgx-h100-2x8x8")
    shared = CommunicationCosts(topology)
    for degrees in (Degrees(128, 1, 1, 1, 64), Degrees(128, 1, 1, 1, 128), Degrees(64, 2, 1, 1, 32)):
        placement = published_placement(degrees, topology)
        factors = shared.factors(placement, ("ep",))
        for tokens in (32, 512, 4096):
            routing = expert_routing(model, tokens, factors)
            for goal in (DISPATCH, COMBINE):
                alone = CommunicationCosts(topology).two_stage(goal, placement, ("ep",), routing, 1)
                assert shared.two_stage(goal, placement, ("ep",), routing, 1) == alone
    assert any(len(prices) for prices in shared._routed_seconds.values())
