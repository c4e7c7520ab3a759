"""The memory the planner keeps free of every device: the fragmentation headroom and the
reserve for the CUDA context and NCCL's buffers (synth/plan/reserve.py), their defaults, the
flags that change them and the output that shows them."""

from __future__ import annotations

import dataclasses
import json

import pytest

from synth.cli import main
from synth.plan.degrees import Degrees
from synth.plan.model import PRESETS
from synth.plan.reserve import (CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES, DEFAULT_RESERVE, FIGURES, FRAGMENTATION,
                                NCCL_COMMUNICATOR_BYTES, NCCL_PROTOCOL_BUFFER_BYTES, fixed_reserve)
from synth.plan.search import PlanRequest, SearchSpace, plan
from synth.plan.step import compute_of
from synth.topology_file import load_topology

GIB = 1 << 30


def test_nccl_buffers_are_nccls_default_sizes():
    # Simple NCCL_BUFFSIZE 4 MiB; LL128 NCCL_LL128_ELEMS_PER_THREAD x MAX_NTHREADS x NCCL_STEPS x 8;
    # LL NCCL_LL_LINES_PER_THREAD x MAX_NTHREADS x NCCL_STEPS x sizeof(ncclLLFifoLine)
    assert NCCL_PROTOCOL_BUFFER_BYTES == 4_194_304 + 4_915_200 + 524_288
    assert NCCL_COMMUNICATOR_BYTES == 32 * NCCL_PROTOCOL_BUFFER_BYTES
    assert CUDA_CONTEXT_BYTES == 666_632_192 and CUBLAS_WORKSPACE_BYTES == 32 << 20 and FRAGMENTATION == 0.15
    for name, figure in FIGURES.items():  # each a named figure with its source
        assert figure.source and figure.value > 0, name


@pytest.mark.parametrize("degrees, communicators", [(Degrees(64, 1, 1), 1), (Degrees(8, 8, 1), 2), (Degrees(1, 8, 8), 1),
                                                    (Degrees(2, 4, 4, 2), 3), (Degrees(1, 1, 64), 0)])
def test_reserve_counts_the_communicators_a_rank_runs_collectives_on(degrees, communicators):
    assert DEFAULT_RESERVE.communicators(degrees) == communicators
    assert DEFAULT_RESERVE.bytes_for(degrees) == CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES + \
        communicators * NCCL_COMMUNICATOR_BYTES
    assert fixed_reserve(2 * GIB).bytes_for(degrees) == 2 * GIB


@pytest.mark.parametrize("degrees, communicators", [
    (Degrees(8, 2, 8, 1, 16, 1), 3),  # tp, ep, dp; etp 1 and edp 1 hold no communicator
    (Degrees(8, 2, 4, 2, 8), 6),  # tp, cp, ep, dp and the folded etp (2, its own group) and edp (2)
    (Degrees(4, 4, 4, 2, 8, 1), 5),  # tp, cp, ep, dp and edp 4
    (Degrees(2, 4, 4, 1, 4, 1), 4),  # tp, ep, dp and edp 2
    (Degrees(8, 2, 1, 1, 4), 3),  # not folded: tp, ep, dp as before (edp is dp / ep, not counted)
])
def test_folded_layouts_count_the_expert_groups_communicators(degrees, communicators):
    """A folded layout's expert tensor and expert data-parallel groups are communicators of their
    own (one per group a rank belongs to); unfolded layouts keep their count."""
    assert DEFAULT_RESERVE.communicators(degrees) == communicators
    assert DEFAULT_RESERVE.bytes_for(degrees) == CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES + \
        communicators * NCCL_COMMUNICATOR_BYTES


def _request(reserve, headroom, **overrides):
    topology = load_topology("dgx-a100-x4")  # 40 GB devices: memory binds for a 7B model on 32 of them
    model = PRESETS["llama2-7b"]
    return PlanRequest(model, topology, compute_of(topology.device, model.precision),
                       space=SearchSpace(recompute=("none", "selective")), memory_headroom=headroom,
                       memory_reserve=reserve, top=50, **overrides)


def test_the_search_keeps_each_candidate_within_its_limit():
    bare = plan(_request(None, 0.0))
    kept = plan(_request(DEFAULT_RESERVE, FRAGMENTATION))
    for row in kept.ranked + kept.pareto:
        assert row.memory.peak <= kept.request.memory_limit_for(row.degrees)
    assert kept.request.memory_limit_for(Degrees(32, 1, 1)) == pytest.approx(
        kept.request.compute.memory_bytes - CUDA_CONTEXT_BYTES - CUBLAS_WORKSPACE_BYTES - NCCL_COMMUNICATOR_BYTES)
    assert kept.dropped_memory > bare.dropped_memory  # the reserve changes what fits
    for row in kept.ranked:  # tight: inside the limit, but with less margin than the fragmentation headroom
        assert kept.request.tight(row) == (kept.request.margin(row) < FRAGMENTATION * kept.request.compute.memory_bytes)


def test_plan_shows_the_reserve_and_its_flags(capsys):
    args = ["plan", "-t", "dgx-a100", "-m", "gpt3-1.3b", "--top", "1"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "Memory: 40 GiB per device, " in out and "less than 15% of the device (6 GiB) for allocator fragmentation is " \
        "tight (--memory-headroom)" in out
    assert "for the CUDA context and cuBLAS's workspace" in out
    assert "NCCL buffers per TP/CP/EP/DP communicator (--memory-reserve)" in out
    assert main(args + ["--memory-headroom", "0", "--memory-reserve", "0"]) == 0
    out = capsys.readouterr().out
    assert "Memory: 40 GiB per device: 40 GiB left" in out
    assert main(args + ["--memory-reserve", "2GiB", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["memory_headroom"] == FRAGMENTATION
    assert document["memory_reserve"]["fixed_bytes"] == 2 * GIB
    row = document["ranked"][0]
    assert row["memory_limit_bytes"] == pytest.approx(document["memory_bytes"] - 2 * GIB)
    assert row["memory_margin_bytes"] == pytest.approx(row["memory_limit_bytes"] - row["memory"]["peak_bytes"])
    assert row["memory"]["peak_bytes"] <= row["memory_limit_bytes"]


@pytest.mark.parametrize("flag, value", [("--memory-reserve", "lots"), ("--memory-reserve", "-1GiB"),
                                         ("--memory-reserve", "40GiB"), ("--memory-headroom", "100%"),
                                         ("--memory-headroom", "x")])
def test_bad_reserve_flags_are_usage_errors(flag, value, capsys):
    assert main(["plan", "-t", "dgx-a100", "-m", "gpt3-1.3b", flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert flag in err and "Traceback" not in err


def test_a_request_without_a_reserve_is_unchanged():
    request = _request(None, 0.0)
    assert request.memory_limit == request.compute.memory_bytes
    assert request.memory_limit_for(Degrees(32, 1, 1)) == request.memory_limit
    assert dataclasses.replace(request, memory_reserve=fixed_reserve(GIB)).memory_limit == request.memory_limit - GIB


def test_a_layout_inside_the_fragmentation_headroom_is_tight_not_dropped():
    """Llama 3.1 405B under ZeRO-1 on 8,192 H100s (tp 8, pp 16, dp 64, as Meta trained it) needs
    about 73 of 80 GiB: inside what the CUDA context, cuBLAS and NCCL leave, but not beside the
    allocator's measured average fragmentation as well, so it is kept and marked tight."""
    topology = load_topology("dgx-h100-2x8x8")
    topology = dataclasses.replace(topology, levels=(dataclasses.replace(topology.levels[0], size=128),)
                                   + topology.levels[1:])
    model = PRESETS["llama3.1-405b"]
    from synth.plan.degrees import DegreeLimits

    request = PlanRequest(model, topology, compute_of(topology.device, model.precision),
                          limits=DegreeLimits(dp=64, tp=8, pp=16),
                          space=SearchSpace(micro_batches=(1,), virtual=(1,), recompute=("none",), zero_stages=(1,),
                                            sequence_parallel=(True,)),
                          memory_headroom=FRAGMENTATION, memory_reserve=DEFAULT_RESERVE, top=1)
    best = plan(request).ranked[0]
    assert 72 * GIB < best.memory.peak < 74 * GIB
    margin = request.margin(best)
    assert 0 < margin < FRAGMENTATION * 80 * GIB and request.tight(best)
    assert margin == pytest.approx(80 * GIB - DEFAULT_RESERVE.bytes_for(best.degrees) - best.memory.peak)
    from synth.commands.plan import memory_cell

    assert memory_cell(request, best).endswith(f"tight: {margin / GIB:.4g} GiB margin")
    assert not dataclasses.replace(request, memory_headroom=0.0).tight(best)


def test_a_topology_gives_its_own_reserve_figures(tmp_path, capsys):
    source = load_topology("dgx-a100")
    from synth.topology_file import _builtin_dir

    text = (_builtin_dir() / "dgx-a100.toml").read_text() + (
        '\n[device.reserve]\ncuda_context = { value = "1 GiB", source = "measured here" }\n'
        'fragmentation = { value = "5%", source = "expandable segments" }\n')
    path = tmp_path / "own.toml"
    path.write_text(text)
    device = load_topology(str(path)).device
    assert dict(device.reserve)["cuda_context"].value == GIB and source.device.reserve == ()
    assert main(["plan", "-t", str(path), "-m", "gpt3-1.3b", "--top", "1", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["memory_headroom"] == 0.05
    assert document["memory_reserve"]["fixed_bytes"] == GIB + CUBLAS_WORKSPACE_BYTES
    assert "measured here" in document["memory_reserve"]["source"]
    path.write_text(text.replace('fragmentation = { value = "5%"', 'fragmentation = { value = "5 apples"'))
    assert main(["plan", "-t", str(path), "-m", "gpt3-1.3b"]) == 2
    assert "device.reserve.fragmentation" in capsys.readouterr().err
