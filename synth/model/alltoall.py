"""The flat all-to-all as NCCL runs it: a grouped send/recv from every member to every peer.

NCCL has no all-to-all kernel of its own: `ncclAllToAll` (and torch's `all_to_all_single`)
is a `ncclGroupStart` ... `ncclSend`/`ncclRecv` to each peer ... `ncclGroupEnd`, all peers'
transfers in flight together (NCCL's docs, "Point-to-point communication", all-to-all example;
nccl-tests `alltoall.cu`). With S bytes per member and n members, member i sends S/n bytes to
each of its n - 1 peers (its own block stays local). So its time is

    launch + sum over peers of the latency of the level that reaches the peer
           + makespan of every member's n - 1 flows of S/n bytes, all groups at once

where the makespan is the network's fluid model (synth/model/network.py: the busiest link's
load over its capacity, each link at its own rate, with the contention of every group's
flows on shared uplinks). A group inside one NVLink domain is bound by the devices' NVLink
ports; a group across nodes by the network ports of the slowest level it spans, which carry
the bytes bound for the other nodes ((n - n_inner)/n of S), each device's through its own NIC
(an all-to-all does not aggregate several NICs: NCCL's maintainers, NVIDIA/nccl-tests#267). The per-peer latency is the
serial part of posting one send and one receive per peer; it dominates small messages on
large groups. This is the flat call only: hierarchical all-to-all programs are not priced here.
"""

from __future__ import annotations

import numpy as np

from synth.model.network import Network
from synth.topology import Topology


def flat_all_to_all(network: Network, topology: Topology, launch_s: float, groups, size: float) -> tuple[float, str]:
    """(seconds, busiest link) of one all-to-all of `size` bytes per member (S/n to each member,
    as `all_to_all_single` with equal splits) run by every group of `groups` (rank lists of equal
    length) at once (module docstring)."""
    groups = np.asarray(groups, dtype=np.int64)
    n = groups.shape[1]
    if n == 1 or size <= 0:
        return 0.0, ""
    src = np.repeat(groups, n, axis=1).reshape(-1)
    dst = np.tile(groups, (1, n)).reshape(-1)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    seconds, link = network.makespan(src, dst, np.full(len(src), size / n))
    latencies = np.array([level.latency.value for level in topology.levels])
    first = groups[0]
    peers = network.first_difference(np.repeat(first[:1], n - 1), first[1:])  # member 0's peers, by level
    return launch_s + float(latencies[peers].sum()) + seconds, network.link_name(link)
