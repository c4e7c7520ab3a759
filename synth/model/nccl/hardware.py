"""A topology and a group as the NCCL model (this package) sees them.

The node level is the innermost level whose `link` is a network (infiniband, roce, ethernet,
loopback); the levels inside it are the node's GPUs. A group's call then spans `nodes` units
of that level with `ranks_per_node` GPUs each. Figures a topology does not give are assumed,
each assumption said in words (`NcclView.assumptions`), so a command can print them:

* no link kinds: the second-innermost level is the network (InfiniBand), the innermost NVLink;
* no `[nccl]` table: Ampere, no NVLS;
* no `uplinks` on the node level: one NIC per GPU at the level's per-device bandwidth;
* no `efficiency`: what NCCL itself takes the link to carry (`default_efficiency`);
* no transport: ib over InfiniBand/RoCE, socket over Ethernet and loopback; for sockets NCCL's
  default streams for the NIC vendor and 25 Gb/s per stream (the NCCL user guide advises four
  helper threads for a generic 100 Gb/s network: NCCL_SOCKET_NTHREADS).

A level marked `nvlink_domain` (compute trays joined by NVLink switches, GB200 NVL72) lies
inside the node as NCCL sees it: with multi-node NVLink (MNNVL, on by default when a
communicator spans hosts: NCCL_MNNVL_ENABLE=2, src/init.cc:649,731 in 2.26.2) NCCL fuses the
topologies of the domain's hosts into one (src/graph/topo.cc:1346-1350) and counts nodes by the
rings' first ranks over that fused system (src/init.cc:917-930), so a domain is one node: its
rings, trees and NVLS run over NVLink across trays, and only the network level outside it is
crossed between domains. NVLS runs across the trays alike: src/transport/nvls.cc gates nothing
on MNNVL in 2.26.2-2.28.3 but buffer registration (nvls.cc:462-463 in 2.26.2). A call that spans
hosts of one domain is marked `Hardware.mnnvl` (what NCCL's MNNVL changes, e.g. no NVLS buffer
registration: src/init.cc:766-767).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

import numpy as np

from synth.errors import UsageError
from synth.model.nccl import names as N
from synth.model.nccl import graph as S
from synth.model.nccl import system as nccl
from synth.model.nccl import timing
from synth.model.nccl.protocols import BUFFER
from synth.model.nccl.transports import socket_streams
from synth.model.nccl.tables import NVLS_EFFICIENCY
from synth.topology import Figure, Level, NcclSystem, Topology

NETWORK_KINDS = nccl.NET_KINDS
DEFAULT_STREAM = Figure(25e9 / 8, "NCCL user guide, NCCL_SOCKET_NTHREADS: 'for generic 100G networks, this value can be "
                                  "manually set to 4', i.e. about 25 Gb/s per helper thread and its socket")


@dataclass(frozen=True)
class NcclView:
    """The hardware as NCCL sees it, where the network starts, and what was assumed."""

    hardware: nccl.Hardware
    node_level: int | None  # index of the network level; None when the whole system is one node
    overheads: tuple[float, ...]  # seconds per call, by the outermost level the call spans
    assumptions: tuple[str, ...]
    protocols: tuple[tuple[nccl.ProtocolFigures, ...], ...] = ()  # per-protocol factors, by the outermost level
    domain_level: int | None = None  # the innermost level marked nvlink_domain (its units are hosts), if any


def default_efficiency(kind: str, generation: str, line_rate: float) -> Figure:
    """What NCCL takes a link of this kind to carry, over its line rate, with the source."""
    if kind in ("nvswitch", "nvlink"):
        ratio = S.nccl_link_ratio(kind, generation)
        return Figure(ratio, f"NCCL {N.NCCL_VERSION} src/graph/topo.h: {S.NVLINK_BW_PER_LINK[generation]:g} GB/s per "
                             f"NVLink ({generation}) of its {S.NVLINK_LINE_PER_LINK[generation]:g} GB/s line rate")
    if kind == "pcie":
        ratio = S.nccl_link_ratio(kind, generation)
        return Figure(ratio, f"NCCL {N.NCCL_VERSION} src/graph/topo.h PCI_BW: {S.PCI_GEN3_X16_BW:g} GB/s per PCIe Gen3 "
                             f"x16 of its {S.PCI_GEN3_X16_LINE:g} GB/s (width x GT/s / 80, topo.cc:476)")
    if kind in ("infiniband", "roce"):
        nic = line_rate / 1e9
        path = min(nic, S.PCI_VIEW[generation])
        ladder = S.speeds("inter", generation)
        speed = next((s for s in ladder if s <= path + 1e-9), ladder[-1])
        return Figure(speed / nic, f"NCCL {N.NCCL_VERSION} src/graph/search.cc:913-924: the topology search gives each "
                                   f"channel the fastest speed on its ladder not above the GPU-NIC path "
                                   f"(min of the NIC's {nic:g} GB/s and PCIe's {S.PCI_VIEW[generation]:g} GB/s): "
                                   f"{speed:g} GB/s")
    return Figure(1.0, "estimate: the line rate; sockets are bounded by their streams instead")


def nccl_view(topology: Topology) -> NcclView:
    """NCCL's view of a topology with link figures (see the module docstring)."""
    assumptions: list[str] = []
    levels = topology.levels
    if topology.nccl is not None:
        generation, nvls, cpu = topology.nccl.generation, topology.nccl.nvls, topology.nccl.cpu
        algorithms, protocols = topology.nccl.algorithms, topology.nccl.protocols
    else:
        generation, nvls, cpu, algorithms, protocols = "ampere", False, "intel", (), ()
        assumptions.append("GPU generation Ampere, no NVLS (no [nccl] table)")
    node_level = _node_level(topology, assumptions)
    inner = levels[node_level + 1:] if node_level is not None else levels
    gpus_per_node = prod(level.size for level in inner) if inner else 1
    intra = _intra_link(inner, generation, assumptions)
    network = None
    if node_level is not None:
        network = _network(levels[node_level], gpus_per_node, generation, assumptions)
    buffsize = topology.nccl.buffsize if topology.nccl is not None and topology.nccl.buffsize else BUFFER["Simple"]
    launch = topology.nccl
    hardware = nccl.Hardware(generation, gpus_per_node, intra, network, nvls, cpu, 0.0, algorithms, protocols, buffsize,
                             gpus_per_thread=launch.gpus_per_thread if launch is not None else 1,
                             cuda_graphs=launch.cuda_graphs if launch is not None else False,
                             min_ctas=launch.min_ctas if launch is not None else None,
                             max_ctas=launch.max_ctas if launch is not None else None,
                             version=(launch.version if launch is not None and launch.version else N.DEFAULT_VERSION),
                             symmetric=launch.symmetric if launch is not None else False,
                             ib_qps=launch.ib_qps if launch is not None else 1,
                             cpu_cores=launch.cpu_cores if launch is not None else None,
                             launch_s_per_gpu=(launch.launch_per_gpu.value
                                               if launch is not None and launch.launch_per_gpu is not None else None))
    overheads = tuple(level.overhead.value if level.overhead is not None else 0.0 for level in levels)
    protocols = tuple(tuple(nccl.ProtocolFigures(name, factors.bandwidth.value if factors.bandwidth else 1.0,
                                                 factors.latency.value if factors.latency else 1.0)
                            for name, factors in level.protocols) for level in levels)
    domains = [index for index, level in enumerate(levels) if level.nvlink_domain]
    domain_level = domains[-1] if domains else None
    if domain_level is not None:
        assumptions.append(f"levels {', '.join(level.name for level in inner)} form one NVLink domain of "
                           f"{gpus_per_node} GPUs across hosts ({levels[domain_level].name}): NCCL's multi-node NVLink "
                           f"treats it as one node")
    return NcclView(hardware, node_level, overheads, tuple(assumptions), protocols, domain_level)


def level_efficiencies(topology: Topology) -> tuple[float, ...]:
    """Per level, the share of its line rate NCCL moves data at, as the NCCL model charges it
    (the one reading of a topology's NCCL figures: `nccl_view`'s): the network level its
    network link's efficiency, the levels inside a node their link's (the level's `efficiency`
    or NCCL's own per-link figure, `default_efficiency`), times NVLS's efficiency where the
    innermost switch reduces (tables.NVLS_EFFICIENCY); 1 where the topology has no link
    figures (nothing NCCL-specific to charge)."""
    levels = topology.levels
    if not topology.has_link_figures or (topology.nccl is None and all(level.link is None for level in levels)):
        return (1.0,) * len(levels)  # no NCCL system described (an emulated or generic one): line rates
    try:
        view = nccl_view(topology)
    except UsageError:
        return (1.0,) * len(levels)
    generation = view.hardware.generation
    rates = []
    for index, level in enumerate(levels):
        if level.bandwidth is None:
            rates.append(1.0)
        elif view.node_level is not None and index == view.node_level:
            rates.append(view.hardware.network.link.efficiency)
        elif view.node_level is not None and index < view.node_level:
            # a level above the nodes (racks): its uplinks are network links too
            kind = level.link.kind if level.link is not None else "infiniband"
            rates.append((level.efficiency or default_efficiency(kind, generation, level.bandwidth.value)).value)
        else:
            kind = level.link.kind if level.link is not None else "nvlink"
            rates.append((level.efficiency or default_efficiency(kind, generation, level.bandwidth.value)).value)
    innermost = levels[-1]
    if view.hardware.nvls and innermost.link is not None and innermost.link.kind == "nvswitch":
        rates[-1] *= NVLS_EFFICIENCY.get(generation, 1.0)
    return tuple(rates)


def with_launch(topology: Topology, gpus_per_thread: int, cuda_graphs: bool = False,
                cpu_cores: int | None = None) -> Topology:
    """The topology as a run launched it: `gpus_per_thread` GPUs driven by each host thread (a
    measured nccl-tests -g N run), CUDA graphs or not (launch.launch_floor_s), and the CPU cores
    the launcher bound each process to (proxy.cpu_share; None: not bound)."""
    system = topology.nccl
    if system is None:
        system = NcclSystem("ampere", "assumed: Ampere, no NVLS (no [nccl] table)")
    if (system.gpus_per_thread, system.cuda_graphs, system.cpu_cores) == (gpus_per_thread, cuda_graphs, cpu_cores):
        return topology
    return replace(topology, nccl=replace(system, gpus_per_thread=gpus_per_thread, cuda_graphs=cuda_graphs,
                                          cpu_cores=cpu_cores))


def _node_level(topology: Topology, assumptions: list[str]) -> int | None:
    kinds = [level.link.kind if level.link is not None else None for level in topology.levels]
    networks = [i for i, kind in enumerate(kinds) if kind in NETWORK_KINDS]
    if networks:
        return networks[-1]
    if any(kind is not None for kind in kinds) or len(kinds) < 2:
        return None  # link kinds given and none is a network: one node
    assumptions.append(f"level {topology.levels[-2].name} is the network between nodes (no link kinds given)")
    return len(kinds) - 2


def _intra_link(inner: tuple[Level, ...], generation: str, assumptions: list[str]) -> nccl.Link:
    if not inner:
        return nccl.Link("none", 0.0, 1.0, "one GPU per node: no intra-node link")
    candidates = []
    for level in inner:
        if level.bandwidth is None:
            continue
        kind = level.link.kind if level.link is not None else None
        if kind is None:
            kind = "nvlink"
            assumptions.append(f"level {level.name} is NVLink (no link kind given)")
        efficiency = level.efficiency or default_efficiency(kind, generation, level.bandwidth.value)
        candidates.append(nccl.Link(kind, level.bandwidth.value, efficiency.value, efficiency.source))
    if not candidates:
        names = ", ".join(level.name for level in inner)
        raise UsageError(f"level(s) {names} have no bandwidth and latency: the NCCL model needs the links inside a node; "
                         f"add them to the topology (or measure a single-node run on a base that has them)")
    return min(candidates, key=lambda link: link.achieved)


def _network(level: Level, gpus_per_node: int, generation: str, assumptions: list[str]) -> nccl.Network:
    if level.bandwidth is None:
        raise UsageError(f"level {level.name} has no bandwidth and latency: the NCCL model needs the network's line rate; "
                         f"add them to the topology")
    kind = level.link.kind if level.link is not None else "infiniband"
    if level.link is None:
        assumptions.append(f"level {level.name} is InfiniBand (no link kind given)")
    if level.uplinks is not None:
        nics, line = level.uplinks.count, level.uplinks.bandwidth.value
        per_device = level.bandwidth.value
        # one reading: the flow model and the bounds take what one GPU moves across nodes from the
        # level's per-device bandwidth, NCCL from the NIC it reaches (one uplink: a GPU alone
        # uses its rail's NIC). Where the two differ, the paths give different rates: say so.
        if abs(per_device - line) > 0.01 * line:
            assumptions.append(
                f"level {level.name}: per-device bandwidth {per_device * 8 / 1e9:g} Gb/s differs from one uplink's "
                f"{line * 8 / 1e9:g} Gb/s: NCCL's model reads the uplinks (its NICs), the flow model and the bounds "
                f"the per-device figure too; a GPU alone reaches one NIC, so give the per-device bandwidth as one "
                f"uplink's rate")
    else:
        nics, line = gpus_per_node, level.bandwidth.value
        assumptions.append(f"level {level.name}: one NIC per GPU at {line * 8 / 1e9:g} Gb/s (no uplinks given)")
    efficiency = level.efficiency or default_efficiency(kind, generation, line)
    link = nccl.Link(kind, line, efficiency.value, efficiency.source)
    transport = level.transport
    if transport is None:
        transport_kind = "ib" if kind in ("infiniband", "roce") else "socket"
        assumptions.append(f"level {level.name}: NCCL transport {transport_kind} (none given)")
        return nccl.Network(link, nics, transport_kind, transport_kind == "ib", 0.0,
                            socket_streams("other"), DEFAULT_STREAM.value, DEFAULT_STREAM.source)
    sockets = transport.sockets if transport.sockets is not None else socket_streams(transport.vendor)
    stream = transport.stream if transport.stream is not None else DEFAULT_STREAM
    if transport.kind == "socket" and transport.stream is None:
        assumptions.append(f"level {level.name}: {DEFAULT_STREAM.value * 8 / 1e9:g} Gb/s per TCP stream (none given)")
    latency = transport.latency.value if transport.latency is not None else 0.0
    stages = transport.stages.value if transport.stages is not None else None
    floor = transport.floor.value if transport.floor is not None else None
    rate = transport.message_rate
    return nccl.Network(link, nics, transport.kind, transport.gdr, latency, sockets, stream.value, stream.source,
                        transport.unpack, stages, floor, rate.value if rate is not None else None,
                        rate.source if rate is not None else "",
                        transport.fabric_share.value if transport.fabric_share is not None else None)


def group_layout(topology: Topology, view: NcclView, devices) -> tuple[int, int, int]:
    """(nodes, ranks per node, outermost level spanned) of a group of device ranks; -1 for a
    group of one device."""
    devices = np.asarray(devices, dtype=np.int64)
    coords = np.stack(np.unravel_index(devices, topology.sizes), axis=1)
    spanned = [l for l in range(coords.shape[1]) if len(set(coords[:, l].tolist())) > 1]
    outer = spanned[0] if spanned else -1
    if view.node_level is None:
        return 1, len(devices), outer
    nodes: dict[tuple, int] = {}
    for row in coords:
        key = tuple(row[:view.node_level + 1].tolist())
        nodes[key] = nodes.get(key, 0) + 1
    return len(nodes), max(nodes.values()), outer


def call_for(topology: Topology, view: NcclView, devices, collective: str, nbytes: float
             ) -> tuple[nccl.Hardware, nccl.Call]:
    """The hardware (with the per-call overhead and per-protocol factors of the outermost level
    the group spans) and the call NCCL makes for a group of device ranks."""
    nodes, per_node, outer = group_layout(topology, view, devices)
    hardware = view.hardware
    if view.domain_level is not None and _spans_hosts(topology, view, devices):
        hardware = replace(hardware, mnnvl=True)
    if outer >= 0 and view.overheads[outer]:
        hardware = replace(hardware, overhead_s=view.overheads[outer])
    if outer >= 0 and view.protocols and view.protocols[outer]:
        hardware = replace(hardware, protocol_figures=view.protocols[outer])
    return hardware, nccl.Call(collective, nodes, per_node, nbytes)


def _spans_hosts(topology: Topology, view: NcclView, devices) -> bool:
    """Whether some node of the group holds members on two hosts of its NVLink domain."""
    coords = np.stack(np.unravel_index(np.asarray(devices, dtype=np.int64), topology.sizes), axis=1)
    first = 0 if view.node_level is None else view.node_level + 1
    hosts: dict[tuple, set] = {}
    for row in coords:
        hosts.setdefault(tuple(row[:first].tolist()), set()).add(tuple(row[first:view.domain_level + 1].tolist()))
    return any(len(found) > 1 for found in hosts.values())


def estimate_group(topology: Topology, devices, collective: str, nbytes: float,
                   view: NcclView | None = None) -> timing.Estimate:
    """NCCL's choice and time for one call over the group, alone on the system."""
    view = view or nccl_view(topology)
    hardware, call = call_for(topology, view, devices, collective, nbytes)
    return timing.estimate(hardware, call)
