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
from synth.plan.reserve import (CUDA_CONTEXT_BYTES, DEFAULT_RESERVE, FRAGMENTATION, NCCL_COMMUNICATOR_BYTES,
                                NCCL_PROTOCOL_BUFFER_BYTES, fixed_reserve)
from synth.plan.search import PlanRequest, SearchSpace, plan
from synth.plan.step import compute_of
from synth.topology_file import load_topology

GIB = 1 << 30


def test_nccl_buffers_are_nccls_default_sizes():
    # Simple NCCL_BUFFSIZE 4 MiB; LL128 NCCL_LL128_ELEMS_PER_THREAD x MAX_NTHREADS x NCCL_STEPS x 8;
    # LL NCCL_LL_LINES_PER_THREAD x MAX_NTHREADS x NCCL_STEPS x sizeof(ncclLLFifoLine)
    assert NCCL_PROTOCOL_BUFFER_BYTES == 4_194_304 + 4_915_200 + 524_288
    assert NCCL_COMMUNICATOR_BYTES == 32 * NCCL_PROTOCOL_BUFFER_BYTES
    assert CUDA_CONTEXT_BYTES == 666_632_192 and FRAGMENTATION == 0.10


@pytest.mark.parametrize("degrees, communicators", [(Degrees(64, 1, 1), 1), (Degrees(8, 8, 1), 2), (Degrees(1, 8, 8), 1),
                                                    (Degrees(2, 4, 4, 2), 3), (Degrees(1, 1, 64), 0)])
def test_reserve_counts_the_communicators_a_rank_runs_collectives_on(degrees, communicators):
    assert DEFAULT_RESERVE.communicators(degrees) == communicators
    assert DEFAULT_RESERVE.bytes_for(degrees) == CUDA_CONTEXT_BYTES + communicators * NCCL_COMMUNICATOR_BYTES
    assert fixed_reserve(2 * GIB).bytes_for(degrees) == 2 * GIB


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
        kept.request.compute.memory_bytes * 0.9 - CUDA_CONTEXT_BYTES - NCCL_COMMUNICATOR_BYTES)
    assert kept.dropped_memory > bare.dropped_memory  # the reserve changes what fits
    assert bare.ranked[0].memory.peak > kept.request.memory_limit_for(bare.ranked[0].degrees)  # as the issue saw


def test_plan_shows_the_reserve_and_its_flags(capsys):
    args = ["plan", "-t", "dgx-a100", "-m", "gpt3-1.3b", "--top", "1"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "Memory: 40 GiB per device, 10% kept free for allocator fragmentation (--memory-headroom)" in out
    assert "for the CUDA context" in out and "NCCL buffers per TP/CP/EP/DP communicator (--memory-reserve)" in out
    assert main(args + ["--memory-headroom", "0", "--memory-reserve", "0"]) == 0
    out = capsys.readouterr().out
    assert "Memory: 40 GiB per device: 40 GiB left" in out
    assert main(args + ["--memory-reserve", "2GiB", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["memory_headroom"] == FRAGMENTATION
    assert document["memory_reserve"]["fixed_bytes"] == 2 * GIB
    row = document["ranked"][0]
    assert row["memory_limit_bytes"] == pytest.approx(document["memory_bytes"] * 0.9 - 2 * GIB)
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
