"""How much of the NICs' rate a call keeps across a multi-level fabric: routing entropy.

NCCL opens one InfiniBand queue pair per connection by default, and its user guide says why one
would open more: NCCL_IB_QPS_PER_CONNECTION (since 2.10) "can be useful on multi-level fabrics
which need multiple queue pairs to have good routing entropy". A switch routes each queue pair's
packets along one path (static or ECMP-hashed routing; adaptive routing, NCCL_IB_ADAPTIVE_ROUTING,
spreads them where the switches support it), so when a call's connections cross the fabric's
upper tier (leaf to spine), several flows can share one uplink while others idle, and the NICs
drain below their rate. How much is a property of one cluster's fabric and routing, which no
document gives: `Network.fabric_share`, a topology figure (`transport.fabric_share`) that synth
calibrate fits, defaults to none lost (FABRIC_SHARE), the documented rate of a non-blocking fabric.

Which calls cross the upper tier: a call over more than `LEAF_HOSTS` hosts. Two hosts of a job
are taken to share a leaf switch (an estimate, not a figure any document gives: schedulers pack
a job's hosts, and NDR leaf switches have 32 host ports); a call over more spreads its rings and
trees over hosts of several leaves. With `Hardware.ib_qps` queue pairs per connection
(NCCL_IB_QPS_PER_CONNECTION), each connection's bytes are split over that many independently
routed flows (NCCL_IB_SPLIT_DATA_ON_QPS), and the share lost is taken to shrink as 1 / ib_qps
(an estimate: the collisions of more, smaller flows average out).
"""

from __future__ import annotations

from synth.model.nccl.system import Call, Hardware

FABRIC_SHARE = (1.0, "estimate: a non-blocking fabric whose routing keeps every NIC at its rate (InfiniBand's "
                     "adaptive routing, NCCL_IB_ADAPTIVE_ROUTING default on); a cluster's own figure is fitted by "
                     "synth calibrate")
LEAF_HOSTS = 2  # hosts of a job taken to share one leaf switch (see the module docstring)


def crosses_upper_tier(call: Call) -> bool:
    """Whether the call's connections are taken to cross the fabric's upper tier."""
    return call.nodes > LEAF_HOSTS


def fabric_share(hardware: Hardware, call: Call) -> float:
    """The share of the NICs' rate the call keeps (1 for a call inside one leaf or one node)."""
    network = hardware.network
    if network is None or not crosses_upper_tier(call):
        return 1.0
    share = network.fabric_share if network.fabric_share is not None else FABRIC_SHARE[0]
    return 1.0 - (1.0 - share) / max(1, hardware.ib_qps)
