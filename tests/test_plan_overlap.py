"""Overlap settings of the step (tensor-parallel collectives inside GEMMs, the sharded optimizer's
weight gather behind the next forward) and context parallelism searched by default."""

from __future__ import annotations

import dataclasses

from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import Degrees
from synth.plan.formulas import attention_dominant
from synth.plan.launch import megatron_arguments
from synth.plan.model import PRESETS
from synth.plan.step import Settings, compute_of, predict, settings_problem
from synth.topology_file import load_topology

from plan_cases import h100_step


def test_overlapped_collectives_never_cost_more_and_still_cost_something():
    model, compute, costs, degrees, placement = h100_step()
    plain = predict(model, compute, costs, degrees, placement, Settings(1, 1, True, "none", True))
    tp = predict(model, compute, costs, degrees, placement, Settings(1, 1, True, "none", True, tp_overlap=True))
    both = predict(model, compute, costs, degrees, placement,
                   Settings(1, 1, True, "none", True, tp_overlap=True, overlap_param_gather=True))
    assert 0 < tp.breakdown.tensor_parallel < plain.breakdown.tensor_parallel
    assert both.breakdown.data_parallel <= tp.breakdown.data_parallel
    assert both.step_s <= tp.step_s <= plain.step_s
    args = megatron_arguments(model, both)
    assert "--tp-comm-overlap" in args and "--overlap-param-gather" in args


def test_overlap_settings_need_what_they_overlap():
    model = PRESETS["llama2-7b"]
    assert settings_problem(model, Degrees(8, 8, 1), Settings(1, 1, False, tp_overlap=True)) is not None
    assert settings_problem(model, Degrees(8, 8, 1), Settings(1, 1, True, overlap_param_gather=True)) is not None


def test_context_parallelism_is_searched_once_attention_dominates():
    model = PRESETS["llama2-70b"]  # h = 8192: attention dominates from s = 6h = 49152 on (GQA: a bit later)
    assert not attention_dominant(model)
    assert attention_dominant(dataclasses.replace(model, seq_len=131072))
    assert not attention_dominant(dataclasses.replace(model, seq_len=32768))


def test_single_calls_and_all_reduces_are_priced_alike():
    """A reduce-scatter and an all-gather each move half an all-reduce's bytes: on the same groups
    and the same estimate, neither is slower than the all-reduce of the same buffer."""
    model, compute, costs, degrees, placement = h100_step()
    size = 1 << 28
    all_reduce = costs.all_reduce(placement, ("dp",), size).time_s
    assert costs.reduce_scatter(placement, ("dp",), size).time_s < all_reduce
    assert costs.all_gather(placement, ("dp",), size).time_s < all_reduce


def test_no_tensor_parallel_overlap_across_nodes():
    """Userbuffers overlap runs inside a node: tensor-parallel groups spanning two nodes pay their
    collectives in full, and the prediction says the overlap is off."""
    from synth.placement import Axis, make_placement

    topology = load_topology("dgx-h100-2x8x8")  # rack=2, node=8, gpu=8
    model = dataclasses.replace(PRESETS["llama2-7b"], global_batch=64)
    compute = compute_of(topology.device, model.precision)
    costs = CommunicationCosts(topology)
    degrees = Degrees(8, 16, 1)
    across = make_placement(topology, (Axis("dp", 8), Axis("tp", 16)), ((2, 4, 1), (1, 2, 8)))
    settings = Settings(1, 1, True, "none", True, tp_overlap=True)
    prediction = predict(model, compute, costs, degrees, across, settings)
    assert not prediction.settings.tp_overlap
    plain = predict(model, compute, costs, degrees, across, dataclasses.replace(settings, tp_overlap=False))
    assert prediction.step_s == plain.step_s


def test_pipeline_transfers_hide_behind_the_next_chunk_when_interleaved():
    """Megatron overlaps the interleaved schedule's sends and receives with compute by default:
    the exposed point-to-point time can only shrink, and without interleaving there is no overlap."""
    model, compute, costs, degrees, placement = h100_step("llama2-7b", Degrees(16, 2, 4))
    plain = predict(model, compute, costs, degrees, placement, Settings(1, 2, True, "none", True))
    hidden = predict(model, compute, costs, degrees, placement, Settings(1, 2, True, "none", True, overlap_p2p=True))
    assert hidden.breakdown.pipeline_p2p <= plain.breakdown.pipeline_p2p
    assert hidden.step_s <= plain.step_s
    assert settings_problem(model, degrees, Settings(1, 1, overlap_p2p=True)) is not None
    assert "--no-overlap-p2p-communication" in megatron_arguments(model, plain)
    assert "--no-overlap-p2p-communication" not in megatron_arguments(model, hidden)


def test_tensor_parallel_overlap_across_the_trays_of_an_nvlink_domain():
    """Transformer Engine (2.2+) maps userbuffers by CUDA fabric handles across multi-node NVLink
    (NVIDIA/TransformerEngine#1470): on a GB200 NVL72 rack a tensor-parallel group over two
    trays keeps its overlap; one across racks (the network) does not."""
    from synth.placement import Axis, make_placement

    topology = load_topology("gb200-nvl72")  # rack=2, tray=18 (NVLink domain), gpu=4
    model = dataclasses.replace(PRESETS["llama2-7b"], global_batch=72)
    compute = compute_of(topology.device, model.precision)
    costs = CommunicationCosts(topology)
    assert costs.userbuffers_level == 1 and CommunicationCosts(load_topology("dgx-h100-2x8x8")).userbuffers_level == 2
    settings = Settings(1, 1, True, "none", True, tp_overlap=True)
    trays = make_placement(topology, (Axis("dp", 18), Axis("tp", 8)), ((2, 9, 1), (1, 2, 4)))
    inside = predict(model, compute, costs, Degrees(18, 8, 1), trays, settings)
    plain = predict(model, compute, costs, Degrees(18, 8, 1), trays, dataclasses.replace(settings, tp_overlap=False))
    assert inside.settings.tp_overlap and inside.breakdown.tensor_parallel < plain.breakdown.tensor_parallel
    racks = make_placement(topology, (Axis("dp", 36), Axis("tp", 4)), ((1, 18, 2), (2, 1, 2)))
    across = predict(model, compute, costs, Degrees(36, 4, 1), racks, settings)
    assert not across.settings.tp_overlap
