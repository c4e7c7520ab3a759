"""A call's cost depends on its shape, not on walking its members pair by pair: the layouts,
network crossings and all-to-all plans are computed from the level structure (vectorized), and
every predicted time stays bit for bit what the member-by-member code gave.

REFERENCE holds, per case, a SHA-256 of the predicted times (float64 bytes, programs x sizes)
of every valid program of a goal, recorded with the member-by-member code (the commit before
this change) by running `digest(case_times(case))` for each case. The three NCCL all-to-all
digests were re-recorded when the all-to-all's time alone became NCCL's point-to-point schedule
(synth/model/nccl/p2p.py: per-peer protocol, batches, kernels, proxy posts); its flows are the
same, and its per-class schedule is checked against a per-pair one in tests/test_nccl_p2p.py.
The five NCCL all-reduce and reduce digests that take a classic tree were re-recorded when the
tree took NCCL's mid-size correction and LL128 fill (synth/model/nccl/tables.py tree_correction,
chunking.py ll128_tree_stages): the commit adding them alone gives these digests, and every
speed change since leaves them bit for bit."""

from __future__ import annotations

import dataclasses
import hashlib
from functools import lru_cache

import numpy as np
import pytest

from synth.analysis.goal_rank import goal_program_times
from synth.hierarchy import build_hierarchy
from synth.model import cost_context
from synth.model.algorithms import GLOO, NCCL_FLOWS
from synth.model.backend import call_layout
from synth.placement import enumerate_placements, parse_axes
from synth.search import Enumerator, SearchOptions, semantics_for
from synth.topology_file import load_topology

SIZES = (4096, 3 * 2**20 + 5, 2**28)


@lru_cache(maxsize=None)
def topology(name: str):
    """A built-in topology, or `dgx-h100-2x8x8` with its node level resized (`h100-rack2-nodeN`)."""
    if name.startswith("h100-rack2-node"):
        base = load_topology("dgx-h100-2x8x8")
        rack, node, gpu = base.levels
        nodes = int(name.removeprefix("h100-rack2-node"))
        return dataclasses.replace(base, name=name, levels=(rack, dataclasses.replace(node, size=nodes), gpu))
    return load_topology(name)


BACKENDS = {"nccl": "nccl", "gloo": GLOO, "nccl-flows": NCCL_FLOWS}

# (id, topology, axes, reduction, hierarchy kind, placement index, backend, goal, max length, estimate)
CASES = (
    ("emu-2x2x2 allreduce nccl", "emu-2x2x2", "data=8", ("data",), "merged", 0, "nccl", "allreduce", 4, "lockstep"),
    ("dgx-a100-x4 allreduce nccl", "dgx-a100-x4", "data=8,model=4", ("data",), "merged", 1, "nccl", "allreduce", 4,
     "pipelined"),
    ("dgx-a100-x4 split alltoall nccl", "dgx-a100-x4", "data=8,model=4", ("data", "model"), "split", 0, "nccl",
     "alltoall", 3, "lockstep"),
    ("paper-fig3 reducescatter gloo", "paper-fig3", "data=4,model=4", ("data", "model"), "merged", 2, "gloo",
     "reducescatter", 3, "pipelined"),
    ("paper-fig3 broadcast gloo", "paper-fig3", "data=4,model=4", ("data", "model"), "merged", 2, "gloo",
     "broadcast", 3, "lockstep"),
    ("paper-fig3 reduce gloo", "paper-fig3", "data=4,model=4", ("data", "model"), "merged", 0, "gloo",
     "reduce", 3, "lockstep"),
    ("dgx-h100-2x8x8 allreduce nccl", "dgx-h100-2x8x8", "data=128", ("data",), "merged", 0, "nccl", "allreduce", 3,
     "pipelined"),
    ("dgx-h100-2x8x8 allreduce nccl-flows", "dgx-h100-2x8x8", "data=128", ("data",), "merged", 0, "nccl-flows",
     "allreduce", 3, "lockstep"),
    ("dgx-h100-2x8x8 allgather nccl", "dgx-h100-2x8x8", "data=128", ("data",), "merged", 0, "nccl", "allgather", 3,
     "lockstep"),
    ("dgx-h100-2x8x8 broadcast nccl", "dgx-h100-2x8x8", "data=128", ("data",), "merged", 0, "nccl", "broadcast", 3,
     "pipelined"),
    ("dgx-h100-2x8x8 reduce nccl", "dgx-h100-2x8x8", "data=128", ("data",), "merged", 0, "nccl", "reduce", 3,
     "lockstep"),
    ("dgx-h100-2x8x8 alltoall nccl", "dgx-h100-2x8x8", "data=128", ("data",), "merged", 0, "nccl", "alltoall", 3,
     "pipelined"),
    ("h100 256 members reducescatter nccl", "h100-rack2-node16", "data=256", ("data",), "merged", 0, "nccl",
     "reducescatter", 3, "pipelined"),
    ("h100 256 members alltoall gloo", "h100-rack2-node16", "data=256", ("data",), "merged", 0, "gloo", "alltoall", 3,
     "lockstep"),
    ("h100 512 members allreduce nccl", "h100-rack2-node32", "data=512", ("data",), "merged", 0, "nccl", "allreduce",
     3, "lockstep"),
    ("h100 512 members alltoall nccl", "h100-rack2-node32", "data=512", ("data",), "merged", 0, "nccl", "alltoall",
     3, "pipelined"),
)

REFERENCE = {
    'emu-2x2x2 allreduce nccl': '(229, 3):737441b098c597083da8d06f90b31b9252e325475a58443376303610f893a2a6',
    'dgx-a100-x4 allreduce nccl': '(75, 3):ddcf4a6c22ce36c766bc30d5fdb311afd86863fa9e369bc4f17f8f38c01852b0',
    'dgx-a100-x4 split alltoall nccl': '(4, 3):a87dbc1e5d08c5294f51bb2105e170c7644466efcedaf71a799c14a1601bd8ca',
    'paper-fig3 reducescatter gloo': '(4, 3):b9b37d2d2383f79bb491e0c1d359cc9284b33ef5c26644778a4ae56813045dd8',
    'paper-fig3 broadcast gloo': '(6, 3):4d4a50afc671dc0520467e3d457ca39a30680bbadb20cce810c1dc28f0bbbc43',
    'paper-fig3 reduce gloo': '(73, 3):29c5699499f9d263a9906e9f9ccd34d91d4297118719cb49d9c0fff96e2a54fe',
    'dgx-h100-2x8x8 allreduce nccl': '(33, 3):be50158816b1498b3ddf6b73b842a6b46ecdd0a61cd5cfb4553a94ac0f50695b',
    'dgx-h100-2x8x8 allreduce nccl-flows': '(33, 3):2fffc0ac0ea41c295dd33ac797f5f32fb4206b43e72b6b48834a39a815597588',
    'dgx-h100-2x8x8 allgather nccl': '(5, 3):dbd25b11f043d3e570afdb46ef13b66b2feb14c3ff044df416c8170a5a0b992f',
    'dgx-h100-2x8x8 broadcast nccl': '(6, 3):7511ed45f6e549819039f2b228d7f574f9deec8b0ed14f98b82d5ebedc81a735',
    'dgx-h100-2x8x8 reduce nccl': '(73, 3):ffbd6ce48f2fe7de3103cce75b347d4cda7fafb9a1f857478dd0383c9e3f85e0',
    'dgx-h100-2x8x8 alltoall nccl': '(4, 3):9e6a5725d8b92f22282474c94238f9fb66b806dd9357e923161121168d9d8edd',
    'h100 256 members reducescatter nccl': '(4, 3):4749f783df9ad733592f14250bb9c67db39d738ba777183f0215b69440f1dc30',
    'h100 256 members alltoall gloo': '(4, 3):c9afdd1fb8b299a3d49f2c6769ef6406ef1e53a2af30f3788b5cdf2928e311b3',
    'h100 512 members allreduce nccl': '(33, 3):eef6121269fcd64e76c446be1906c256b0efd2e40b5f4e0674397c8e8a83e42f',
    'h100 512 members alltoall nccl': '(4, 3):c636adb0a545371cccc637c9e09149f57c3ba11fa88827ba59061785c9c579d2',
}


def case_times(case) -> np.ndarray:
    _, name, axes, reduction, kind, which, backend, goal, max_len, estimate = case
    system = topology(name)
    placements = enumerate_placements(system, parse_axes(axes))
    hierarchy = build_hierarchy(placements[which % len(placements)], reduction, kind)
    context = cost_context(hierarchy, system, BACKENDS[backend])
    programs = list(Enumerator(semantics_for(hierarchy, goal=goal), SearchOptions(max_len=max_len)).programs())
    return np.ascontiguousarray(goal_program_times(context, goal, programs, SIZES, estimate), dtype=np.float64)


def digest(times: np.ndarray) -> str:
    return f"{times.shape}:" + hashlib.sha256(times.tobytes()).hexdigest()


@pytest.mark.parametrize("case", CASES, ids=lambda case: case[0])
def test_predicted_times_are_bit_identical_to_the_member_by_member_code(case):
    assert digest(case_times(case)) == REFERENCE[case[0]]


def _reference_hops(coords: np.ndarray, latencies) -> list[list[float]]:
    """[a][b] latency of a message from a to b, pair by pair (the definition)."""
    rows = coords.tolist()
    result = []
    for x in rows:
        line = []
        for y in rows:
            level = next((l for l, (p, q) in enumerate(zip(x, y)) if p != q), None)
            line.append(0.0 if level is None else float(latencies[level]))
        result.append(line)
    return result


@pytest.mark.parametrize("coords", [
    [[0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1], [1, 0, 0], [1, 0, 1]],
    [[0, 0], [1, 1], [2, 0]],  # not canonical: no two members share a parent at the inner level
    [[0, 3, 1], [0, 3, 0], [1, 0, 1], [0, 2, 1]],
    [[0, 0]],
])
def test_a_layouts_hops_and_largest_hop_are_the_pairwise_definitions(coords):
    coords = np.array(coords, dtype=np.int64)
    latencies = [15e-6, 2e-6, 9e-6]
    layout = call_layout(coords, latencies[:coords.shape[1]])
    expected = _reference_hops(coords, latencies[:coords.shape[1]])
    assert [list(row) for row in layout.hop_latency] == expected
    k = len(coords)
    src, dst = np.repeat(np.arange(k), k), np.tile(np.arange(k), k)
    assert layout.hops(src, dst).tolist() == [value for row in expected for value in row]
    pairs = [expected[a][b] for a in range(k) for b in range(k) if a != b]
    assert layout.largest_hop() == max(pairs, default=0.0)


@pytest.mark.parametrize("name", ["emu-2x2x2", "dgx-a100-x4", "dgx-h100-2x8x8", "paper-fig3"])
def test_the_networks_first_difference_is_the_coordinates_outermost_differing_level(name):
    from synth.model.network import network_for

    network = network_for(topology(name))
    k = network.device_count
    src, dst = np.repeat(np.arange(k), k), np.tile(np.arange(k), k)
    apart = src != dst
    src, dst = src[apart], dst[apart]
    expected = (network.coords[src] != network.coords[dst]).argmax(axis=-1)
    assert network.first_difference(src, dst).tolist() == expected.tolist()
    with pytest.raises(ValueError, match="itself"):
        network.first_difference([0], [0])
