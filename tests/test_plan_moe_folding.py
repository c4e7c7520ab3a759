"""MoE parallel folding (synth/plan/folding.py): the expert layers' own mesh etp x ep x edp per
pipeline stage, as megatron-core's initialize_model_parallel builds it. The expert groups are
checked against megatron-core's own expert RankGenerator, their spans against the ranks they
hold, the degrees against Megatron's rules, and the memory and the launch against what the
plan priced."""

from __future__ import annotations

import dataclasses
import math
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from synth.cli import main
from synth.placement import enumerate_placements, make_placement, parse_axes
from synth.plan.degrees import DegreeLimits, Degrees, enumerate_degrees
from synth.plan.folding import DigitGroup, UnalignedGroupError
from synth.plan.launch import launch_document, launch_order, megatron_arguments, megatron_launchable, published_placement
from synth.plan.model import PRESETS
from synth.plan.step import Settings
from synth.topology import topology_from_levels
from synth.topology_file import load_topology

FOLDED = [  # (topology, degrees dp, tp, pp, cp, ep, etp)
    ("dgx-h100-2x8x8", Degrees(8, 2, 8, 1, 16, 1)),  # EP16 over tp 2 x dp 8, expert TP 1 (GPT-OSS's recipe, 128 GPUs)
    ("dgx-h100-2x8x8", Degrees(8, 2, 4, 2, 8)),  # EP8 with CP2, expert TP 2 (Mixtral 8x22B's recipe)
    ("dgx-h100-2x8x8", Degrees(4, 4, 4, 2, 8, 1)),  # TP4 CP2 EP8 expert TP 1 (Qwen3 235B's kind)
    ("dgx-a100-x4", Degrees(2, 4, 4, 1, 4, 1)),  # TP4 EP4 expert TP 1, ep beyond dp (Qwen3 30B's 8-GPU kind)
    ("dgx-a100-x4", Degrees(4, 2, 2, 2, 4, 2)),  # expert TP = tp with ep over cp and dp
]


def _groups(lists) -> list[list[int]]:
    return sorted(sorted(group) for group in lists)


def _parallel_state():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip("megatron.core.parallel_state",
                                   reason="megatron-core is not installed (pip install megatron-core==0.16.1)")


def _expert_generator(degrees: Degrees, order: str = "tp-cp-ep-dp-pp"):
    """megatron-core's expert rank generator, as initialize_model_parallel builds it."""
    return _parallel_state().RankGenerator(tp=degrees.expert_tp, ep=degrees.ep, dp=degrees.expert_dp,
                                           pp=degrees.pp, cp=1, order=order)


@pytest.mark.parametrize("topology, degrees", FOLDED)
def test_folded_groups_are_megatrons(topology, degrees):
    """On every placement Megatron's default order numbers (and on the published one), the
    expert, expert tensor and expert data-parallel groups are the expert RankGenerator's."""
    assert degrees.folded and degrees.ep * degrees.expert_tp * degrees.expert_dp == degrees.tp * degrees.cp * degrees.dp
    system = load_topology(topology)
    generator = _expert_generator(degrees)
    checked = 0
    placements = [published_placement(degrees, system)] + enumerate_placements(system, degrees.axes())
    for placement in placements:
        prediction = SimpleNamespace(degrees=degrees, placement=placement)
        if launch_order(prediction).order != "tp-cp-ep-dp-pp":
            continue
        for group, token in ((degrees.expert_group(), "ep"), (degrees.expert_tp_group(), "tp"),
                             (degrees.expert_data_axes(), "dp")):
            if group:
                assert _groups(group.groups(placement)) == _groups(generator.get_ranks(token)), (placement, token)
        checked += 1
    assert checked >= 1


@pytest.mark.parametrize("topology, degrees", FOLDED)
def test_spans_are_the_groups_own(topology, degrees):
    """A group's span per level is what its ranks spread over: at each level, the distinct
    units they occupy inside the unit above; every group alike."""
    system = load_topology(topology)
    for placement in enumerate_placements(system, degrees.axes())[:40]:
        for group in (degrees.expert_group(), degrees.expert_tp_group(), degrees.expert_data_axes()):
            if not group or not group.aligned(placement):
                continue
            span = group.span(placement)
            assert math.prod(span) == group.size
            for members in group.groups(placement):
                coordinates = np.stack(np.unravel_index(members, placement.level_sizes), axis=1)
                for level in range(len(span)):
                    inside = {tuple(row[:level + 1]) for row in coordinates}
                    above = {tuple(row[:level]) for row in coordinates}
                    assert len(inside) == len(above) * span[level]


def test_a_digit_cut_unevenly_has_no_span():
    """tp 2 and dp 3 inside a node of 6: an expert group of 3 (ep 3, etp 1) holds tp's 2 and half
    of dp's first digit, not a product of level factors: refused, and the search skips it."""
    placement = make_placement(topology_from_levels("node=2,gpu=6"), parse_axes("dp=6,tp=2"), ((2, 3), (1, 2)))
    degrees = Degrees(6, 2, 1, 1, 3, 1)
    with pytest.raises(UnalignedGroupError, match="unevenly"):
        degrees.expert_group().span(placement)
    assert not degrees.expert_aligned(placement)
    assert DigitGroup("ep", 2, 12).span(placement) == (2, 3)  # the dp digits whole


def test_unfolded_layouts_keep_their_axes_and_names():
    """Expert TP = tp, no cp, ep dividing dp: the ep axis inside dp, as before folding; giving
    etp = tp spells the same degrees."""
    classic = Degrees(16, 2, 2, 1, 8)
    assert not classic.folded and Degrees(16, 2, 2, 1, 8, 2) == classic and classic.text == "dp=16,tp=2,pp=2,ep=8"
    assert [axis.name for axis in classic.axes()] == ["pp", "dp", "ep", "tp"]
    assert classic.expert_group() == ("ep",) and classic.expert_dp == 2 and "etp" not in classic.to_json()
    folded = Degrees(8, 2, 2, 1, 16, 1)
    assert folded.folded and [axis.name for axis in folded.axes()] == ["pp", "dp", "tp"]
    assert folded.text == "dp=8,tp=2,pp=2,ep=16,etp=1"
    assert folded.to_json() == {"dp": 8, "tp": 2, "pp": 2, "cp": 1, "ep": 16, "edp": 1, "etp": 1, "folded": True}
    assert folded.exported_names(("pp", "dp", "tp")) == ("pp", "dp", "tp")
    assert Degrees(4, 1, 1, 2, 4).folded and Degrees(4, 1, 1, 2, 4).expert_dp == 2  # ep over cp and dp


def test_the_search_adds_folded_choices_after_the_unfolded_ones():
    """Every unfolded choice is still enumerated (first, in its order); the folded ones add
    etp = tp and etp = 1 with every ep > 1 dividing the experts and tp cp dp / etp whose expert
    block ep x etp covers tp x cp; a fixed ep is tried as given."""
    mixtral = PRESETS["mixtral-8x7b"]
    found = list(enumerate_degrees(64, mixtral, DegreeLimits(tp=4, pp=1)))
    unfolded = [d for d in found if not d.folded]
    assert [d.ep for d in unfolded] == [1, 2, 4, 8]
    assert found[:len(unfolded)] == unfolded
    folded = {(d.ep, d.expert_tp) for d in found if d.folded}
    assert folded == {(4, 1), (8, 1)}  # etp = 4 with ep | 16 and 8 experts: all unfolded already; ep 2 < tp 4
    assert {(d.ep, d.expert_tp) for d in enumerate_degrees(64, mixtral, DegreeLimits(tp=4, pp=1, ep=2))} == {(2, 4), (2, 1)}
    for degrees in found:
        assert (degrees.tp * degrees.cp * degrees.dp) % (degrees.ep * degrees.expert_tp) == 0
    wide = list(enumerate_degrees(64, mixtral, DegreeLimits(tp=8, pp=4, ep=8)))
    assert [(d.dp, d.ep, d.expert_tp) for d in wide] == [(2, 8, 1)]  # ep 8 over dp 2 x tp 8 needs etp 1
    with_cp = list(enumerate_degrees(64, mixtral, DegreeLimits(tp=2, pp=2, cp=2, etp=2)))
    assert {d.ep for d in with_cp} == {1, 2, 4, 8} and all(d.folded for d in with_cp if d.ep > 1)


def test_megatrons_rules_refuse_with_their_reason():
    from collections import Counter

    refused = Counter()
    gpt_oss = PRESETS["gpt-oss-120b"]
    assert not list(enumerate_degrees(64, gpt_oss, DegreeLimits(dp=8, tp=2, pp=4, ep=16, etp=2), refused))
    assert refused["ep x etp does not divide tp x cp x dp"] == 1
    refused.clear()
    assert not list(enumerate_degrees(64, PRESETS["llama2-7b"], DegreeLimits(dp=64, tp=1, pp=1, etp=2), refused))
    assert refused["etp for a model without experts"] == 1


def test_expert_weights_are_sharded_by_ep_times_etp():
    """Folded to etp = 1 a device holds E/ep whole experts (not split by tp), their optimizer
    states sharded over edp = tp cp dp / ep."""
    from synth.plan import formulas, moe
    from synth.plan.costs import CommunicationCosts
    from synth.plan.step import Compute, predict

    topology = load_topology("dgx-h100-2x8x8")
    costs = CommunicationCosts(topology)
    compute = Compute(989e12, 0.5, 80 * 2 ** 30, 3.35e12)
    model = PRESETS["mixtral-8x7b"]
    settings = Settings(1, 1, True, "none", True)
    states = {}
    for degrees in (Degrees(16, 4, 2, 1, 8), Degrees(16, 4, 2, 1, 8, 1)):
        placement = published_placement(degrees, topology)
        states[degrees.expert_tp] = predict(model, compute, costs, degrees, placement, settings).memory.states_first
    experts = moe.expert_parameters_per_device(model, 1, 8, 0, model.layers // 2)
    folded_bytes = experts * formulas.state_bytes_per_parameter(model, 8, True)  # edp = 4 x 16 / 8
    tp_bytes = experts / 4 * formulas.state_bytes_per_parameter(model, 2, True)  # edp = 16 / 8
    assert states[1] - states[4] == pytest.approx(folded_bytes - tp_bytes)


def test_permuted_tokens_are_the_expert_tensor_groups():
    """Folded to etp < tp a device's expert layer sees the routed copies of its expert tensor-
    parallel group's tokens only (k c s b etp / tp, megatron-core's all-gather over expt_tp after
    the all-to-all), so the permuted inputs it keeps shrink by etp / tp; the inner activations
    (those rows at f_e / etp wide) and every unfolded figure stay as they were."""
    from synth.plan import formulas, moe

    model = PRESETS["mixtral-8x7b"]
    tokens, tp = model.seq_len * 2, 4
    classic = moe.mean_activation_delta(model, tokens, tp)
    assert moe.mean_activation_delta(model, tokens, tp, 0) == classic  # the default spelling, bit for bit
    permuted = 2 * moe.routed_tokens(model, tokens) * model.hidden * moe.moe_layer_count(model) / model.layers
    for etp in (1, 2):
        assert classic - moe.mean_activation_delta(model, tokens, tp, etp) == pytest.approx(permuted * (1 - etp / tp))
    assert moe.mean_activation_delta(model, tokens, tp, tp) == pytest.approx(classic)
    one = formulas.layer_activation_bytes(model, 2, tp, 1, True, "none", 1)
    assert formulas.layer_activation_bytes(model, 2, tp, 1, True, "none") - one == pytest.approx(permuted * 3 / 4)
    assert formulas.layer_activation_bytes(model, 2, tp, 1, True, "full", 1) == \
        formulas.layer_activation_bytes(model, 2, tp, 1, True, "full")  # the layer input only


def test_launch_names_the_expert_mesh():
    """The launch writes Megatron's two expert flags and the expert groups as rank lists."""
    degrees = Degrees(16, 2, 4, 1, 16, 1)  # 128 GPUs: edp 2
    topology = load_topology("dgx-h100-2x8x8")
    model = PRESETS["gpt-oss-120b"]
    candidate = SimpleNamespace(degrees=degrees, placement=published_placement(degrees, topology),
                                settings=Settings(1, 1, True, "none", True))
    arguments = megatron_arguments(model, candidate)
    at = arguments.index("--expert-model-parallel-size")
    assert arguments[at:at + 4] == ["--expert-model-parallel-size", "16", "--expert-tensor-parallel-size", "1"]
    document = launch_document(model, candidate, topology)
    assert document["megatron"]["launchable"] and document["expert_parallel"]["groups"] == ["edp", "ep"]
    generator = _expert_generator(degrees)
    assert _groups(document["rank_groups"]["ep"]) == _groups(generator.get_ranks("ep"))
    assert _groups(document["rank_groups"]["edp"]) == _groups(generator.get_ranks("dp"))
    assert "data_parallel" not in document and document["degrees"]["folded"]


def test_tp_pp_dp_order_is_refused_where_megatron_asserts():
    """initialize_model_parallel asserts the attention and MoE data-parallel sizes agree without
    a pp-last order: folded with pp > 1 and edp != dp is not launchable with that flag."""
    degrees = Degrees(4, 2, 2, 1, 8, 1)
    topology = topology_from_levels("node=4,gpu=4")  # tp and pp inside a node, dp across: numbered tp-pp-dp
    placement = published_placement(degrees, topology, flag="--use-tp-pp-dp-mapping")
    prediction = SimpleNamespace(degrees=degrees, placement=placement)
    order = launch_order(prediction)
    assert order.order is None and "refuses" in order.reason
    assert "--use-tp-pp-dp-mapping" not in megatron_arguments(PRESETS["mixtral-8x7b"], SimpleNamespace(
        degrees=degrees, placement=placement, settings=Settings(1, 1, True, "none", True)))


def test_launchable_filter_applies_the_launch_orders_rule():
    """`--launchable`'s filter (megatron_launchable with the degrees) refuses what the printed
    launch refuses: a folded tp-pp-dp placement with pp > 1 and edp != dp, which the placement's
    order alone would accept."""
    from synth.export.mesh import megatron_order

    degrees = Degrees(2, 2, 2, 1, 4, 1)  # edp 1 != dp 2, pp 2
    refused = 0
    for placement in enumerate_placements(load_topology("emu-2x4"), degrees.axes()):
        if not degrees.expert_aligned(placement):
            continue
        launchable = megatron_launchable(placement, degrees)
        assert launchable == (launch_order(SimpleNamespace(degrees=degrees, placement=placement)).order is not None)
        if megatron_launchable(placement) and not launchable:
            assert megatron_order(placement).flag == "--use-tp-pp-dp-mapping"
            refused += 1
    assert refused >= 1


def test_megatron_flags_pass_transformer_config():
    """The folded flags build megatron-core's TransformerConfig (its expert checks included)."""
    from tests.test_plan_moe import _moe_parser, moe_transformer_config

    for name, degrees, topology in (("mixtral-8x7b", Degrees(1, 8, 4, 1, 8, 1), "dgx-a100-x4"),
                                    ("mixtral-8x7b", Degrees(2, 4, 4, 1, 4, 1), "dgx-a100-x4"),
                                    ("mixtral-8x7b", Degrees(2, 2, 4, 2, 4), "dgx-a100-x4")):
        model = PRESETS[name]
        candidate = SimpleNamespace(degrees=degrees, settings=Settings(1, 1, True, "none", True),
                                    placement=published_placement(degrees, load_topology(topology)))
        config = moe_transformer_config(_moe_parser().parse_args(megatron_arguments(model, candidate)))
        assert (config.expert_model_parallel_size, config.expert_tensor_parallel_size) == (degrees.ep, degrees.expert_tp)
        assert config.context_parallel_size == degrees.cp


def test_cli_etp(capsys):
    """--etp fixes the expert tensor-parallel degree; a bad one is a usage error naming it."""
    import json

    code = main(["plan", "-t", "dgx-h100-2x8x8", "--resize", "rack=1", "-m", "gpt-oss-120b", "--micro-batch", "1",
                 "--tp", "2", "--pp", "4", "--ep", "16", "--etp", "1", "--sequence-parallel", "on",
                 "--recompute", "none", "--virtual-stages", "1", "--top", "1", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    best = json.loads(out)["ranked"][0]
    assert best["degrees"]["etp"] == 1 and best["degrees"]["ep"] == 16 and best["breakdown"]["expert_parallel_s"] > 0
    assert any(route["name"] == "expert" for route in best["communication"])
    assert main(["plan", "-t", "dgx-h100-2x8x8", "-m", "gpt-oss-120b", "--etp", "0"]) == 2
    assert "--etp" in capsys.readouterr().err


def test_dataclass_replace_keeps_the_spelling():
    degrees = dataclasses.replace(Degrees(8, 2, 4, 1, 16, 1), etp=2)
    assert degrees.etp == 0 and degrees.expert_tp == 2


def test_domain_note_reads_the_folded_expert_groups():
    """On a multi-host NVLink domain the winner's note names where its expert groups are, the
    folded ones too (their span, not an ep axis)."""
    from synth.plan.domains import domain_note

    topology = load_topology("gb200-nvl72")
    degrees = Degrees(18, 2, 4, 1, 4, 1)  # 144 GPUs: EP4 over tp 2 x dp 2 (EP8 would cut the 9 trays unevenly)
    placement = published_placement(degrees, topology)
    prediction = SimpleNamespace(degrees=degrees, placement=placement, step_s=1.0,
                                 breakdown=SimpleNamespace(tensor_parallel=0.1, expert_parallel=0.2))
    note = domain_note(topology, prediction)
    assert "expert-parallel groups stay inside one NVLink domain" in note
