"""Point-to-point as NCCL schedules it (NCCL 2.26.2; these rules are unchanged in 2.27 and 2.28):
the channels each peer gets, the protocol by the bytes per peer, how peers are batched onto
channels and kernels, and what the proxy thread and the NIC do per message. An all-to-all (`ncclSend`/`ncclRecv` to every peer in one
group) is priced from these, per class of equivalent peers, never per pair.

At init (src/graph/paths.cc ncclTopoComputeP2pChannels, ncclTopoGetNchannels):

* `p2pnChannels` = pow2Up(min(nChannels, NCCL_MAX_P2P_NCHANNELS)), at least
  NCCL_MIN_P2P_NCHANNELS;
* channels per peer: 2 x the NVLinks of the path to a peer over NVLink, 2 over PCIe, and over
  the network NCCL_NCHANNELS_PER_NET_PEER, by default 2 halved while 2 x nRanks > 4 x
  p2pnChannels, at least the NICs the GPU needs for its bandwidth (paths.cc:780-792);
  `p2pnChannelsPerPeer` = pow2Up of the least over every peer, at most p2pnChannels;
* the chunk (one step of the Simple protocol) is NCCL_P2P_NET_CHUNKSIZE (128 KiB) when the
  communicator spans nodes, NCCL_P2P_NVL_CHUNKSIZE (512 KiB) on one all-NVLink node,
  NCCL_P2P_PCI_CHUNKSIZE (128 KiB) otherwise, at most the Simple buffer / NCCL_STEPS
  (src/init.cc computeBuffSizes).

Per call (src/enqueue.cc scheduleP2pTasksToPlan, addP2pToPlan):

* the peers are taken round by round (src/init.cc's p2pSchedule: every peer once, nodes by a
  quadratic walk), each round one send and one receive, its parts on channels from a base that
  rotates with the round, so all channels carry the rounds alike;
* nChannelsMax = p2pnChannelsPerPeer; nChannelsMin halves while nChannelsMin x nRanks >
  p2pnChannels; an operation of `bytes` runs on min(nChannelsMin, ceil(bytes / minPart))
  channels, doubled while its part exceeds maxPart and the count stays <= nChannelsMax (minPart,
  maxPart = step / 2, step across nodes; step / 8, 32 x step on one node);
* protocol LL when bytes <= nChannelsMax x NCCL_P2P_LL_THRESHOLD (16 KiB), Simple otherwise
  (LL's step is its buffer / NCCL_STEPS); over the network a Simple chunk is a quarter of the
  step below one step of bytes and half of it below eight, an LL chunk half below eight;
* each channel runs its work batches one after another, a batch holding at most
  NCCL_MAX_DEV_WORK_P2P_PER_BATCH (8) operations of distinct rounds; a kernel (one plan)
  holds the batches its 4 KiB of arguments fit (16 bytes each after the 32-byte header,
  ncclMaxKernelArgsSize in 2.26), so a large group is launched as several kernels;
* the proxy thread of each GPU posts every network step of its sends and receives, one
  message per step and part (src/transport/net.cc sendProxyProgress / recvProxyProgress),
  at NCCL's per-step overhead (getNetOverhead, tuning.cc: 1 us Intel, 2 us AMD, x3 Simple);
  each post is a message its NIC processes, at the NIC's message rate (a topology figure,
  `[levels.transport] message_rate`, defaulting per NIC kind: `DEFAULT_MESSAGE_RATE`).

The time of a call alone is then the per-call overhead of the level it spans, plus the longer
of the host's launches (one per kernel, launch.launch_floor_s) and the device's: the kernels'
base latency, and the longest of (the flows' drain with one hop latency per batch a channel
runs), (the proxy's posts), (the NIC's messages), each after one hop.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from synth.model.nccl.graph import NVLINK_LINE_PER_LINK, nics_used
from synth.model.nccl.launch import launch_floor_s
from synth.model.nccl.protocols import BUFFER, NCCL_STEPS
from synth.model.nccl.system import Hardware
from synth.model.nccl.tables import NET_OVERHEAD

# src/enqueue.cc:740 and src/init.cc:818-820 (2.26.2): the p2p parameters' defaults.
PROTOCOLS = ("LL", "Simple")  # what p2p runs (no LL128: addP2pToPlan picks LL or Simple)
LL_THRESHOLD = 16384  # NCCL_P2P_LL_THRESHOLD, bytes per channel of nChannelsMax
NET_CHUNK = 1 << 17  # NCCL_P2P_NET_CHUNKSIZE
PCI_CHUNK = 1 << 17  # NCCL_P2P_PCI_CHUNKSIZE
NVL_CHUNK = 1 << 19  # NCCL_P2P_NVL_CHUNKSIZE
MAX_CHANNELS = 64  # src/include/device.h MAXCHANNELS, NCCL_MAX_P2P_NCHANNELS' default
NET_PEER_CHANNELS = 2  # paths.cc:783: "start from 2 channels per NIC and reduce with scale"
P2P_PER_BATCH = 8  # src/include/device.h NCCL_MAX_DEV_WORK_P2P_PER_BATCH
# src/include/device.h (2.26.2): 4 KiB of kernel arguments, a 32-byte ncclDevKernelArgs header,
# 16 bytes per ncclDevWorkBatch (the work itself fits the work FIFO, 512 KiB per plan).
BATCHES_PER_PLAN = ((4 << 10) - 32) // 16

# Messages per second one NIC processes, by link kind, with the source. A topology's transport
# table may give its own (`message_rate`): it differs per NIC and cluster.
DEFAULT_MESSAGE_RATE = {
    "infiniband": (215e6, "NVIDIA ConnectX-6 VPI product brief: up to 215 million messages per second "
                          "(ConnectX-7's brief claims more; the lower figure is kept)"),
    "roce": (215e6, "NVIDIA ConnectX-6 Dx/VPI product brief: up to 215 million messages per second"),
}


@dataclass(frozen=True)
class P2pComm:
    """What NCCL fixes for point-to-point when the communicator is made."""

    ranks: int
    nodes: int
    channels: int  # p2pnChannels
    per_peer: int  # p2pnChannelsPerPeer (nChannelsMax)
    least: int  # nChannelsMin of scheduleP2pTasksToPlan
    step: int  # p2pChunkSize: the Simple protocol's step


@dataclass(frozen=True)
class Op:
    """One send (or receive) to one peer as addP2pToPlan lays it out."""

    protocol: str  # "LL" or "Simple"
    channels: int
    chunk: int  # data bytes per step
    posts: int  # network steps over all its parts (0 inside a node)


@dataclass(frozen=True)
class PeerClass:
    """Peers alike from a member's side: how many, and whether over the network."""

    count: int
    network: bool


@dataclass(frozen=True)
class Schedule:
    """An all-to-all of `nbytes` per peer on its busiest GPU, as NCCL schedules it."""

    protocol: str
    channels: int  # per operation
    posts: int  # network posts (sends and receives) of the busiest GPU's proxy
    batches: int  # work batches of the busiest channel
    plans: int  # kernels launched

    def proxy_s(self, hardware: Hardware) -> float:
        """The proxy thread's time posting every network step (getNetOverhead per step)."""
        return self.posts * step_overhead_s(hardware, self.protocol)

    def nic_s(self, hardware: Hardware, ranks_per_node: int, message_rate: float) -> float:
        """The busiest NIC's time processing the posts of the GPUs that share it."""
        if not self.posts or hardware.network is None or not math.isfinite(message_rate):
            return 0.0
        share = ranks_per_node / max(1, nics_used(hardware, ranks_per_node))
        return self.posts * share / message_rate


def step_overhead_s(hardware: Hardware, protocol: str) -> float:
    """NCCL's per-step cost of driving a network connection (tuning.cc getNetOverhead, x3 for Simple)."""
    return NET_OVERHEAD[hardware.cpu] * (3 if protocol == "Simple" else 1) * 1e-6


def pow2_up(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def nvlinks(hardware: Hardware) -> int:
    """NVLinks between a GPU and its peers (path bw / per-link bw, paths.cc:772-774)."""
    per_link = NVLINK_LINE_PER_LINK[hardware.generation] * 1e9
    return max(1, int(hardware.intra.bandwidth / per_link + 1e-9))


def net_peer_channels(ranks: int, p2p_channels: int, nics_per_gpu: int = 1, given: int | None = None) -> int:
    """Channels to one peer across the network (paths.cc:780-792): NCCL_NCHANNELS_PER_NET_PEER
    when given, else 2 halved while 2 x ranks > 4 x p2pnChannels, at least the GPU's NICs."""
    if given is not None:
        return given
    channels = NET_PEER_CHANNELS
    while channels * ranks > p2p_channels * 4 and channels > 1:
        channels //= 2
    return max(nics_per_gpu, channels)


def local_peer_channels(hardware: Hardware) -> int:
    """Channels to one peer inside the node: 2 per NVLink of the path, 2 over PCIe."""
    if hardware.intra.kind in ("nvlink", "nvswitch"):
        return 2 * nvlinks(hardware)
    return 2


def p2p_comm(hardware: Hardware, nodes: int, ranks_per_node: int, comm_channels: int,
             net_channels: int | None = None) -> P2pComm:
    """The communicator's p2p figures (module docstring, init)."""
    ranks = nodes * ranks_per_node
    given = max(1, min(comm_channels, MAX_CHANNELS))  # p2pnChannels before it is made a power of two
    channels = pow2_up(given)
    least = channels
    if nodes > 1:  # ncclTopoGetNchannels runs on the value before pow2Up (paths.cc:803-826)
        least = min(least, net_peer_channels(ranks, given, 1, net_channels))
    if ranks_per_node > 1:
        least = min(least, local_peer_channels(hardware))
    per_peer = min(pow2_up(least), channels)
    smallest = per_peer
    while smallest * ranks > channels and smallest > 1:
        smallest //= 2
    if nodes > 1:
        step = NET_CHUNK
    elif hardware.intra.kind in ("nvlink", "nvswitch"):
        step = NVL_CHUNK
    else:
        step = PCI_CHUNK
    step = min(step, hardware.buffsize // NCCL_STEPS)
    return P2pComm(ranks, nodes, channels, per_peer, smallest, step)


def protocol_for(comm: P2pComm, nbytes: int) -> str:
    """LL up to nChannelsMax x NCCL_P2P_LL_THRESHOLD bytes per peer, Simple above."""
    return "LL" if nbytes <= comm.per_peer * LL_THRESHOLD else "Simple"


def operation(comm: P2pComm, nbytes: int, network: bool, itself: bool = False) -> Op:
    """One send of `nbytes` to one peer (addP2pToPlan): protocol, channels, chunk, posts. A
    member's send to `itself` is a local copy, always Simple (protoLL starts false for it)."""
    nbytes = int(nbytes)
    protocol = "Simple" if itself else protocol_for(comm, nbytes)
    step = BUFFER["LL"] // NCCL_STEPS if protocol == "LL" else comm.step
    chunk = step
    if network:
        if protocol == "Simple" and nbytes < step:
            chunk //= 4
        elif nbytes < 8 * step:
            chunk //= 2
    data = chunk // 2 if protocol == "LL" else chunk  # LL carries 4 data bytes in 8
    if nbytes <= 0:
        return Op(protocol, 1, data, 1 if network else 0)
    low, high = (step // 2, step) if comm.nodes > 1 else (step // 8, step * 32)
    channels = min(comm.least, -(-nbytes // low))
    part = max(low, -(-nbytes // channels))
    while part > high and channels <= comm.per_peer // 2:
        channels *= 2
        part = -(-nbytes // channels)
    posts = 0
    if network:  # ncclP2pPartBounds: parts of ceil(bytes / channels), the last the rest
        size = -(-nbytes // channels)
        full, rest = divmod(nbytes, size)
        posts = full * -(-size // data) + (-(-rest // data) if rest else 0)
    return Op(protocol, channels, data, posts)


@lru_cache(maxsize=65536)
def schedule(comm: P2pComm, classes: tuple[PeerClass, ...], nbytes: int) -> Schedule:
    """The all-to-all's schedule on its busiest GPU, from its classes of peers (every peer one
    round of one send and one receive of `nbytes`; itself one more round, a local copy). Kept:
    every all-to-all's time alone asks it again at each of its schedule's breakpoints."""
    ops = {network: operation(comm, nbytes, network) for network in (False, True)}
    parts = sum(c.count * ops[c.network].channels for c in classes) + operation(comm, nbytes, False, True).channels
    posts = sum(2 * c.count * ops[True].posts for c in classes if c.network)
    per_channel = -(-parts // comm.channels)  # the rotating base spreads the parts evenly
    batches = -(-per_channel // P2P_PER_BATCH)
    total = batches * min(comm.channels, parts)
    plans = max(1, -(-total // max(1, BATCHES_PER_PLAN - comm.per_peer)))
    widest = ops[any(c.network for c in classes)]
    return Schedule(widest.protocol, widest.channels, posts, batches, plans)


def breakpoints(comm: P2pComm) -> tuple[int, ...]:
    """Bytes per peer at which something in the schedule changes (protocol, chunk, channels):
    between two of them the posts and parts only grow with the bytes."""
    points = {comm.per_peer * LL_THRESHOLD + 1}
    for step in (comm.step, BUFFER["LL"] // NCCL_STEPS):
        points.update((step, 8 * step))
        low, high = (step // 2, step) if comm.nodes > 1 else (step // 8, step * 32)
        channels = 1
        while channels <= 2 * MAX_CHANNELS:
            points.update((low * channels + 1, high * channels + 1))
            channels *= 2
    return tuple(sorted(points))


@dataclass(frozen=True)
class AllToAllCost:
    """What an all-to-all call adds to its flows' time, per size: NCCL's schedule on the busiest GPU."""

    comm: P2pComm
    classes: tuple[PeerClass, ...]
    ranks_per_node: int
    message_rate: float

    def time_s(self, hardware: Hardware, nbytes: int, drain_s: float, hop_s: float, base_s: float) -> float:
        """The call alone: overhead + max(host launches, kernels' base + the longest of the
        flows' drain with a hop per batch, the proxy's posts, the NIC's messages)."""
        return self.parts(hardware, nbytes, drain_s, hop_s, base_s)[0]

    def parts(self, hardware: Hardware, nbytes: int, drain_s: float, hop_s: float, base_s: float
              ) -> tuple[float, float]:
        """(the call alone, its part no other traffic can overlap: overhead, the kernels' base
        and a hop per batch). The rest beyond the drain is time the proxy, the NIC or the host
        holds the call back while its links could carry more."""
        found = schedule(self.comm, self.classes, nbytes)
        fixed = found.plans * base_s + found.batches * hop_s
        device = found.plans * base_s + max(drain_s + found.batches * hop_s,
                                            hop_s + found.proxy_s(hardware),
                                            hop_s + found.nic_s(hardware, self.ranks_per_node, self.message_rate))
        overhead = hardware.overhead_s
        return overhead + max(found.plans * launch_floor_s(hardware), device), overhead + fixed


def peer_classes(coords: np.ndarray, node_level: int | None) -> tuple[PeerClass, ...]:
    """The busiest member's peers by class, from member coordinates ([member, level]): the peers
    in other nodes (network) and in its node, counted per prefix (O(members x levels)), the
    member with the most network peers taken."""
    coords = np.asarray(coords, dtype=np.int64)
    k = len(coords)
    if node_level is None:
        return (PeerClass(k - 1, False),) if k > 1 else ()
    _, inverse, counts = np.unique(coords[:, :node_level + 1], axis=0, return_inverse=True, return_counts=True)
    same = counts[inverse.reshape(-1)]
    busiest = int(np.argmin(same))
    local, remote = int(same[busiest]) - 1, k - int(same[busiest])
    return tuple(c for c in (PeerClass(remote, True), PeerClass(local, False)) if c.count)


def message_rate_of(hardware: Hardware) -> tuple[float, str]:
    """The NIC's message rate (messages/s) and its source: the topology's, else the default for
    its link kind, else none (inf: no bound from it)."""
    network = hardware.network
    if network is None:
        return math.inf, "no network"
    if getattr(network, "message_rate", None):
        return network.message_rate, network.message_rate_source
    if network.transport == "socket":
        return math.inf, "sockets: bounded by their streams, not by a NIC's message rate"
    rate, source = DEFAULT_MESSAGE_RATE.get(network.link.kind, (math.inf, "no default for this NIC kind"))
    return rate, source


@lru_cache(maxsize=1024)
def cached_cost(hardware: Hardware, nodes: int, ranks_per_node: int, comm_channels: int,
                classes: tuple[PeerClass, ...]) -> AllToAllCost:
    comm = p2p_comm(hardware, nodes, ranks_per_node, comm_channels)
    return AllToAllCost(comm, classes, ranks_per_node, message_rate_of(hardware)[0])


# --- pairs of unequal bytes (a skewed routing's all-to-all) --------------------------------------
#
# Each operation is laid out by the rules above from its own bytes, each direction of a round
# on its own protocol and channels (addP2pToPlan: protocol[dir], nChannels[dir]; a round takes
# max(nChannels[recv], nChannels[send]) parts). As a uniform call's time is the least of any
# call at least as large (the breakpoints above), each operation's figures are the least its
# layout reaches at any size at least its own: so a member's time never falls as any of its
# operations grows.


@dataclass(frozen=True)
class OpFigures:
    """Per operation of the given bytes (arrays): channels, network posts, the proxy's seconds
    posting them, and bytes over the protocol's rate share (what its flow weighs on a link)."""

    channels: np.ndarray
    posts: np.ndarray
    proxy_s: np.ndarray
    weighed: np.ndarray


def _raw_op(comm: P2pComm, hardware: Hardware, nbytes: int, network: bool, efficiency) -> tuple[float, ...]:
    op = operation(comm, nbytes, network)
    return (float(op.channels), float(op.posts), op.posts * step_overhead_s(hardware, op.protocol),
            nbytes / efficiency[op.protocol])


@lru_cache(maxsize=256)
def _later_ops(comm: P2pComm, hardware: Hardware, network: bool, efficiency: tuple[tuple[str, float], ...]
               ) -> tuple[tuple[int, ...], np.ndarray]:
    """(the breakpoints, [point, figure] the least of each figure from that point on)."""
    rates = dict(efficiency)
    points = breakpoints(comm)
    figures = np.array([_raw_op(comm, hardware, point, network, rates) for point in points])
    return points, np.minimum.accumulate(figures[::-1], axis=0)[::-1]


def op_figures(comm: P2pComm, hardware: Hardware, nbytes: np.ndarray, network: bool,
               efficiency: dict[str, float]) -> OpFigures:
    """Each operation's figures (module section above): its own, or a larger operation's where less."""
    nbytes = np.asarray(nbytes, dtype=float)
    values, inverse = np.unique(nbytes, return_inverse=True)
    points, later = _later_ops(comm, hardware, network, tuple(sorted(efficiency.items())))
    rows = []
    for value in values.tolist():
        own = np.array(_raw_op(comm, hardware, math.ceil(value), network, efficiency))
        j = bisect.bisect_right(points, math.ceil(value))
        rows.append(np.minimum(own, later[j]) if j < len(points) else own)
    table = np.array(rows).reshape(len(values), 4)[inverse.reshape(-1)]
    return OpFigures(*(table[:, i].reshape(nbytes.shape) for i in range(4)))


@dataclass(frozen=True)
class MemberLoads:
    """Per member of one call: its rounds' parts (self included), network posts and the
    proxy's seconds, summed over its peers."""

    parts: np.ndarray
    posts: np.ndarray
    proxy_s: np.ndarray


def member_loads(comm: P2pComm, hardware: Hardware, values: np.ndarray, node: np.ndarray | None,
                 efficiency: dict[str, float]) -> MemberLoads:
    """Each member's sums when every round it runs with peer j moves `values[j]` one way and
    its own `values[i]` the other (a pair's bytes fixed by one end), per class of peers: a
    histogram of the peers' channels per node, never per pair."""
    values = np.asarray(values, dtype=float)
    k = len(values)
    node = np.zeros(k, dtype=np.int64) if node is None else np.asarray(node, dtype=np.int64)
    own_self = np.array([operation(comm, math.ceil(v), False, True).channels for v in values.tolist()], dtype=float)
    local = op_figures(comm, hardware, values, False, efficiency)
    parts = own_self + _max_sums(local.channels, node, same_node=True)
    posts = np.zeros(k)
    proxy = np.zeros(k)
    if len(np.unique(node)) > 1:
        remote = op_figures(comm, hardware, values, True, efficiency)
        parts = parts + _max_sums(remote.channels, node, same_node=False)
        count = k - np.bincount(node)[node]
        posts = _other_node_sums(remote.posts, node) + count * remote.posts
        proxy = _other_node_sums(remote.proxy_s, node) + count * remote.proxy_s
    return MemberLoads(parts, posts, proxy)


def _other_node_sums(figure: np.ndarray, node: np.ndarray) -> np.ndarray:
    """Per member, the sum of `figure` over the members of other nodes."""
    per_node = np.bincount(node, weights=figure)
    return per_node.sum() - per_node[node]


def _max_sums(channels: np.ndarray, node: np.ndarray, same_node: bool) -> np.ndarray:
    """Per member i, the sum over its peers j (in its node, or in others) of max(channels[j],
    channels[i]): from a histogram of the peers' channel counts (at most MAX_CHANNELS values)."""
    counts = channels.astype(np.int64)
    width = int(counts.max()) + 1
    per_node = np.zeros((int(node.max()) + 1, width))
    np.add.at(per_node, (node, counts), 1.0)
    hist = per_node[node] if same_node else per_node.sum(axis=0)[None, :] - per_node[node]
    if same_node:
        hist[np.arange(len(counts)), counts] -= 1.0  # not itself
    levels = np.arange(width, dtype=float)
    return (hist * np.maximum(levels[None, :], counts[:, None].astype(float))).sum(axis=1)


def member_times_s(cost: AllToAllCost, hardware: Hardware, loads: MemberLoads, drain_s: float, hop_s: float,
                   base_s: float) -> np.ndarray:
    """Each member's time in the call (AllToAllCost.parts' rule, with its own parts, posts and
    proxy seconds): overhead + max(host launches, kernels' base + the longest of the drain with
    a hop per batch, the proxy's posts, the NIC's messages)."""
    comm = cost.comm
    parts = loads.parts
    per_channel = np.ceil(parts / comm.channels)
    batches = np.ceil(per_channel / P2P_PER_BATCH)
    total = batches * np.minimum(comm.channels, parts)
    plans = np.maximum(1.0, np.ceil(total / max(1, BATCHES_PER_PLAN - comm.per_peer)))
    nic = np.zeros(len(parts))
    if hardware.network is not None and math.isfinite(cost.message_rate):
        nic = loads.posts * (cost.ranks_per_node / max(1, nics_used(hardware, cost.ranks_per_node))) / cost.message_rate
    device = plans * base_s + np.maximum(np.maximum(drain_s + batches * hop_s, hop_s + loads.proxy_s), hop_s + nic)
    return hardware.overhead_s + np.maximum(plans * launch_floor_s(hardware), device)


@dataclass(frozen=True, eq=False)
class PairCall:
    """One call's members as NCCL schedules them, waiting for the step's drain
    (synth/model/weighted.py)."""

    weighed: np.ndarray  # [member] bytes over its protocol's rate share of a pair keyed by the member
    hardware: Hardware
    cost: AllToAllCost
    loads: MemberLoads
    hop_s: float
    base_s: float

    def times_s(self, drain_s: float) -> np.ndarray:
        return member_times_s(self.cost, self.hardware, self.loads, drain_s, self.hop_s, self.base_s)


def pair_call(hardware: Hardware, cost: AllToAllCost, node: np.ndarray | None, values: np.ndarray,
              efficiency: dict[str, float], hop_s: float, base_s: float) -> PairCall:
    """A call whose pairs keyed by member i carry `values[i]` bytes, on these NCCL figures."""
    values = np.asarray(values, dtype=float)
    weighed = op_figures(cost.comm, hardware, values, False, efficiency).weighed
    return PairCall(weighed, hardware, cost, member_loads(cost.comm, hardware, values, node, efficiency), hop_s, base_s)
