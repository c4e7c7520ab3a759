"""The `nccl` backend (synth/model/nccl/backend.py): the NCCL model of synth/model/nccl/
behind the costing engine. A call alone costs exactly what the NCCL model says; sharing links
with other groups' calls only ever adds time, and adds none while a call's own streams or
protocol hold it back; the time of a call alone never decreases with its bytes."""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from synth.hierarchy import build_hierarchy
from synth.language import parse_program
from synth.lowering import lower
from synth.model import ESTIMATES, LOCKSTEP, CostEngine, cost_context, program_cost, steps_of
from synth.model.backend import CallSite, canonical_coords
from synth.search.rank import rank_programs
from synth.model.bound import bound_line
from synth.model.cost import baseline_program
from synth.model.nccl import PAYLOAD
from synth.model.nccl.backend import NCCL_MEASURED, envelope, shape_of
from synth.model.nccl.hardware import estimate_group
from synth.model.network import network_for
from synth.placement import enumerate_placements, make_placement, parse_axes
from synth.search import enumerate_programs
from synth.topology import Figure
from synth.topology_file import load_topology

SYSTEMS = ("gcp-n1-v100-4x8", "gcp-a2-2x16", "dgx-a100-x4", "hgx-h100-ib-4x8", "dgx-h100-2x8x8", "dgx-h100",
           "gcp-a3-mega-2x8", "paper-fig3")
SIZES = [2**k for k in range(0, 35, 2)] + [3 * 2**20 + 5, 1000, 123456789]


def whole_system(name: str):
    topology = load_topology(name)
    placement = enumerate_placements(topology, parse_axes(f"data={topology.device_count}"))[0]
    return topology, build_hierarchy(placement, ("data",))


def site_of(context, collective: str, devices) -> CallSite:
    coords = context.network.coords[np.asarray(devices)]
    return CallSite(collective, canonical_coords(coords), context.levels_of(collective), context.topology.nccl)


@pytest.mark.parametrize("name", SYSTEMS)
def test_a_flat_all_reduce_over_the_whole_system_costs_what_the_nccl_model_says_alone(name):
    topology, hierarchy = whole_system(name)
    context = cost_context(hierarchy, topology)
    lowered = lower(baseline_program(hierarchy), hierarchy)
    devices = range(topology.device_count)
    curve = envelope(shape_of(site_of(context, "AllReduce", devices)))
    compared = 0
    for size in SIZES:
        alone = estimate_group(topology, devices, "AllReduce", size)
        expected = alone.time_s
        if curve.least_above(size) < alone.time_s:  # a larger call is faster: the least time of any call as large
            expected = curve.least_above(size)
        else:
            compared += 1
        for estimate in ESTIMATES:
            cost = program_cost(context, lowered, size, estimate)
            assert cost.steps[0].algorithm == f"{alone.choice.algorithm}/{alone.choice.protocol}"
            if name == "paper-fig3":
                # its server uplinks (12.5 GB/s) lie outside the network NCCL's view has (the cpu
                # level, 15.75 GB/s): the call's flows on them bind, even alone
                assert cost.time_s >= expected * (1 - 1e-12)
                if size >= 2**26:
                    assert cost.time_s > 1.05 * expected and cost.busiest_link.startswith("server")
                continue
            if estimate == "pipelined":  # back to back, a run takes at least its busiest link's load
                assert cost.link_bound_s <= expected * (1 + 1e-12)
            assert cost.time_s == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert compared >= len(SIZES) - 2


@pytest.mark.parametrize("name", ("gcp-n1-v100-4x8", "dgx-a100-x4", "dgx-h100-2x8x8", "emu-2x4"))
def test_the_time_of_a_call_alone_never_decreases_with_its_bytes_and_is_the_least_of_any_larger_call(name):
    topology = load_topology(name)
    context = cost_context(build_hierarchy(enumerate_placements(
        topology, parse_axes(f"data={topology.device_count}"))[0], ("data",)), topology)
    n, per = topology.device_count, topology.sizes[-1]
    for collective in ("AllReduce", "ReduceScatter", "AllGather", "Broadcast", "Reduce"):
        for devices in (range(n), range(0, n, per), range(per)):
            site = site_of(context, collective, devices)
            curve = envelope(shape_of(site))
            near = [b + d for b in curve.points if b < 2**36 for d in (-1.0, -0.5, 0.0, 0.5, 1.0)]
            grid = np.array(sorted(set(near) | set(np.geomspace(0.25, 2**36, 4000).tolist())))
            grid = grid[grid > 0]
            plans = NCCL_MEASURED.plans(site)
            own = NCCL_MEASURED.alone_s(site, plans, grid, np.zeros((len(grid), len(plans))))
            alone = own.min(axis=1)
            assert np.all(alone >= 0) and np.all(np.diff(alone) >= 0), (collective, list(devices)[:3])
            raw = np.array([curve.timed(b).time_s for b in grid])
            assert np.all(alone <= raw)
            suffix = np.minimum.accumulate(raw[::-1])[::-1]  # the least over the grid at or above
            assert np.all(alone <= suffix + 1e-18)
            assert np.all(np.isin(alone, raw) | (alone < raw))  # attained: NCCL's time of some call


def test_sharing_links_only_ever_adds_time():
    """Every step of every program: all reduction groups at once cost at least one group alone,
    which costs at least NCCL's time of each of its calls alone."""
    cases = [("gcp-n1-v100-4x8", "data=8,model=4", [[4, 2], [1, 4]]), ("gcp-a2-2x16", "data=16,model=2", [[2, 8], [1, 2]]),
             ("dgx-h100-2x8x8", "data=16,model=8", [[2, 2, 4], [1, 4, 2]]), ("dgx-a100-x4", "data=8,model=4", [[4, 2], [1, 4]])]
    for name, axes, matrix in cases:
        topology = load_topology(name)
        hierarchy = build_hierarchy(make_placement(topology, parse_axes(axes), matrix), ("data",))
        context = cost_context(hierarchy, topology)
        together, alone = CostEngine(context), CostEngine(context, context.devices[:1])
        for program in list(enumerate_programs(hierarchy, max_len=3)):
            steps = steps_of(lower(program, hierarchy))
            for size in (2**10, 2**16, 2**22, 2**28):
                all_groups, one_group = together.figures(steps, [size]), alone.figures(steps, [size])
                assert np.all(all_groups.time_s >= one_group.time_s)
                assert np.all(all_groups.chain_s == one_group.chain_s)
                for d, step in enumerate(steps):
                    for members, chunks in zip(step.calls, step.chunks):
                        site = site_of(context, step.collective, context.devices[0, list(members)])
                        nbytes = np.array([chunks * size / hierarchy.group_size])
                        plans = NCCL_MEASURED.plans(site)
                        own = NCCL_MEASURED.alone_s(site, plans, nbytes, np.zeros((1, len(plans))))
                        assert one_group.time_s[d, 0] >= own.min() * (1 - 1e-12)
            for estimate in ESTIMATES.values():
                lowered = lower(program, hierarchy)
                assert (program_cost(context, lowered, 2**26, estimate).time_s
                        >= program_cost(context, lowered, 2**26, estimate, alone).time_s * (1 - 1e-12))


def with_stream(topology, gbps: float):
    """The topology with NCCL's TCP streams at `gbps` each (the VM level's transport)."""
    level = topology.levels[0]
    transport = dataclasses.replace(level.transport, stream=Figure(gbps * 1e9 / 8, "test"))
    return dataclasses.replace(topology, levels=(dataclasses.replace(level, transport=transport),) + topology.levels[1:])


def test_other_groups_traffic_fills_a_calls_headroom_before_it_adds_time():
    """16 groups of 2 GPUs across the two VMs, through one 100 Gb/s NIC per VM. With fast TCP
    streams each call is held by the NIC, and the other 15 calls' bytes add their whole drain
    time; with slow streams each call is held by its own streams, and the NIC carries the 16
    calls together in less than one call's stream time: nothing is added."""
    base = load_topology("gcp-a2-2x16")
    placement = make_placement(base, parse_axes("data=2,model=16"), [[2, 1], [1, 16]])
    hierarchy = build_hierarchy(placement, ("data",))
    lowered = lower(baseline_program(hierarchy), hierarchy)
    size = 2**28

    def costs(topology):
        context = cost_context(hierarchy, topology)
        one = program_cost(context, lowered, size, LOCKSTEP, CostEngine(context, context.devices[:1])).time_s
        every = program_cost(context, lowered, size, LOCKSTEP, CostEngine(context)).time_s
        alone = estimate_group(topology, context.devices[0], "AllReduce", size)
        return one, every, alone

    one, every, alone = costs(base)
    assert one == pytest.approx(alone.time_s, rel=1e-12) and alone.bottleneck == "net"
    net = next(load for load in alone.loads if load.resource == "net")
    assert every == pytest.approx(one + 15 * net.seconds, rel=0.02)  # the NIC drains 16 calls' bytes
    one, every, alone = costs(with_stream(base, 0.25))  # 2 streams x 0.25 Gb/s: 16 calls need < 1/6 of the NIC
    assert alone.bottleneck == "streams" and one == pytest.approx(alone.time_s, rel=1e-12)
    assert every == pytest.approx(one, rel=1e-12)
    one, every, alone = costs(with_stream(base, 2.0))  # 16 calls at 2 x 2 Gb/s need more than the NIC's 100
    streams = next(load for load in alone.loads if load.resource == "streams")
    assert alone.bottleneck == "streams" and one < every < one + 15 * net.seconds
    assert every == pytest.approx(alone.time_s - streams.seconds + 16 * net.seconds, rel=0.02)


def test_plans_are_ncclS_pairs_with_flows_held_as_long_as_nccl_holds_the_links():
    topology, hierarchy = whole_system("dgx-a100-x4")
    context = cost_context(hierarchy, topology)
    site = site_of(context, "AllReduce", range(32))
    plans = NCCL_MEASURED.plans(site)
    assert [plan.algorithm for plan in plans] == [f"{a}/{p}" for a, p in envelope(shape_of(site)).pairs]
    assert {plan.algorithm for plan in plans} >= {"ring/LL", "ring/LL128", "ring/Simple", "tree/LL", "tree/Simple"}
    net = topology.levels[0].efficiency.value if topology.levels[0].efficiency else None
    ring = next(plan for plan in plans if plan.algorithm == "ring/LL")
    assert ring.efficiency == PAYLOAD["LL"]
    weights = {round(f, 12) for _, _, f in ring.phases[0].flows}
    inside, across = 2 * 31 / 32, 2 * 31 / 32 / 8  # a hop between nodes is spread over the node's 8 GPUs
    intra = topology.levels[1].efficiency.value
    assert weights == {round(inside / intra, 12), round(across / (net or shape_of(site).hardware.network.link.efficiency), 12)}


def test_a_program_through_the_nccl_backend_uses_nvls_inside_an_h100_node():
    topology, hierarchy = whole_system("dgx-h100")
    cost = program_cost(cost_context(hierarchy, topology), lower(parse_program("AllReduce(InsideGroup(gpu))"), hierarchy),
                        2**30, LOCKSTEP)
    assert cost.steps[0].algorithm == "nvls/Simple"
    assert cost.time_s == pytest.approx(estimate_group(topology, range(8), "AllReduce", 2**30).time_s, rel=1e-12)


def test_the_lower_bound_holds_for_nvls_whose_switch_reduces():
    """NVLS moves S + S/k through each GPU's port, less than the 2(k-1)/k * S any all-reduce
    without in-network reduction must: where the switch reduces, the bound is S per device."""
    topology, hierarchy = whole_system("dgx-h100")
    context = cost_context(hierarchy, topology)
    for estimate in ESTIMATES:
        rows = rank_programs(context, 2**30, max_len=3, estimate=estimate)
        assert rows[0].bound_ratio >= 1 and all(row.bound_ratio >= 1 for row in rows)
    line = bound_line(context)
    assert line.seconds_per_byte == pytest.approx(1 / topology.levels[0].bandwidth.value, rel=1e-12)


def test_a_pickled_call_site_hashes_as_one_built_in_the_process_that_reads_it():
    """Sites key the plan caches and keep their hash; a string's hash differs from process to
    process (PYTHONHASHSEED), so a site sent to a worker (ray, dask) must not carry its old one."""
    topology = load_topology("dgx-h100-2x8x8")
    site = CallSite("AllReduce", canonical_coords(network_for(topology).coords[:16]), topology.levels, topology.nccl)
    hash(site)  # kept on the object
    script = ("import pickle, sys\n"
              "from synth.model.backend import CallSite\n"
              "site = pickle.loads(sys.stdin.buffer.read())\n"
              "fresh = CallSite(site.collective, site.coords, site.levels, site.nccl)\n"
              "print(hash(site) == hash(fresh) and site == fresh and {site: 1}.get(fresh) == 1)\n")
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", script], input=pickle.dumps(site), capture_output=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}, check=True)
        assert out.stdout.decode().strip() == "True"
