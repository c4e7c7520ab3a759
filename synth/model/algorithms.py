"""How a backend runs one collective call over a group of k members holding B bytes.

An algorithm is a `Plan`: phases that run one after another, each with a latency and a set
of flows (member index -> member index, as a fraction of B) that run at the same time; a
phase's transfer time comes from the network (synth/model/network.py). B is the call's
range in bytes: the input of ReduceScatter, the output of AllGather, the buffer otherwise.

Members are in group order (member rank order, docs/model.md section 5), which puts the members of
one node next to each other; a "node" is a unit of the second-innermost system level (the
domain of the innermost interconnect), the whole system for a one-level topology.

NCCL (Simple protocol; Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective
Communication Operations in MPICH", for the ring and chain algorithms; NCCL docs and
src/graph/tuning.cc for NCCL's use of them):

* ring AllReduce: 2(k-1) steps, each member sends 2(k-1)/k * B to its ring successor;
* ring ReduceScatter, AllGather: k-1 steps, (k-1)/k * B to the successor;
* Broadcast, Reduce: a pipelined chain from (to) the root, k-1 steps, B per hop;
* tree AllReduce (NCCL 2.4+, double binary tree, src/graph/trees.cc): a chain inside each
  node and two complementary binary trees over the nodes, each tree carrying B/2 up
  (reduce) and down (broadcast); latency 2 * ((ppn-1) * intra + depth * inter), NCCL's own
  formula (src/graph/tuning.cc) with the trees' real depth.

Latency (the alpha-beta model of Thakur et al.): in a pipelined ring or chain, the message a
member forwards at step s+1 is the one it received at step s, so the last piece of data
arrives after the sum of the hop latencies along its path, not after steps x the slowest
hop. A ring of `nsteps` steps pays the largest sum over `nsteps` consecutive hops; for a ring
through n nodes that is NCCL's own (nsteps - nInter) * intraLat + nInter * interLat
(src/graph/tuning.cc). A hop's latency is that of the outermost level its two ends differ at.

Channels: NCCL opens one channel per NIC and rotates each channel's ring inside the node,
so each channel enters and leaves a node through a different GPU (NCCL's topology-aware
ring search, src/graph/search.cc): a hop between nodes is spread over the node's members,
each carrying an equal share through its own link. This is why one NCCL all-reduce over a
multi-node group is already hierarchical in its traffic.

gloo, as torch.distributed's ProcessGroupGloo calls it (gloo/*.cc, torch
ProcessGroupGloo.cpp): rings in rank order without channels (a hop between nodes uses the
one pair of processes), so nothing is spread:

* AllReduce: gloo::allreduce ring (reduce-scatter then all-gather to the ring neighbour);
* ReduceScatter: not bandwidth-optimal: ProcessGroupGloo::reduce_scatter_tensor_coalesced
  clones the input and all-reduces the whole clone, then keeps its block (extra memory B);
* AllGather: gloo::allgather ring, into a flat scratch output of size B (extra memory B);
* Broadcast: gloo::broadcast binomial tree, ceil(log2 k) rounds of B;
* Reduce: gloo::reduce ring reduce-scatter, then every member sends its block to the root.

AllToAll, on either backend: every member sends block j straight to member j, all pairs at
once (NCCL: ncclSend/ncclRecv to every peer in one group; gloo: gloo::alltoall), so the
links between nodes carry every pair's blocks together and contention decides the time.

`Backend` keeps the per-collective algorithm table, the per-call launch cost and a per-
collective bandwidth efficiency (the fraction of link bandwidth the implementation reaches,
1.0 by default), so calibration can replace any of them with measured figures. It is the
flow-level implementation of the engine's backend seam (synth/model/backend.py): its plans
are its traffic, and its estimate of a call alone is the flow model's own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np


from synth.model.backend import CallSite, Flow, FlowArrays, Layout, PairwiseFlows, Phase, Plan, call_layout  # noqa: F401 - the seam's vocabulary

Algorithm = Callable[[Layout], Plan]


# --- building blocks --------------------------------------------------------------------------


def _hop(layout: Layout, a: int, b: int, fraction: float, spread: bool) -> list[Flow]:
    """A hop a -> b carrying `fraction` of B. Between nodes with channels (`spread`), the hop
    is split evenly over the nodes' members: the j-th member of a's node sends to the j-th
    of b's, as NCCL's per-NIC channels do."""
    node_a, node_b = layout.node_of(a), layout.node_of(b)
    if not spread or node_a == node_b:
        return [(a, b, fraction)]
    senders, receivers = layout.nodes[node_a], layout.nodes[node_b]
    width = min(len(senders), len(receivers))
    return [(senders[j], receivers[j], fraction / width) for j in range(width)]


def _ring(layout: Layout, fraction: float, spread: bool, step: int = 1) -> tuple[Flow, ...]:
    k = layout.size
    flows: list[Flow] = []
    for member in range(k):
        flows += _hop(layout, member, (member + step) % k, fraction, spread)
    return tuple(flows)


def _ring_latency(layout: Layout, nsteps: int, step: int = 1) -> float:
    """The slowest path of `nsteps` consecutive ring hops (the critical chunk's path)."""
    k = layout.size
    members = np.arange(k)
    hops = layout.hops(members, (members + step) % k)
    laps = -(-nsteps // k) + 1
    running = np.concatenate(([0.0], np.cumsum(np.tile(hops, laps))))
    return float(np.max(running[nsteps:nsteps + k] - running[:k]))


def _chain_latency(layout: Layout) -> float:
    members = np.arange(layout.size - 1)
    return sum(layout.hops(members, members + 1).tolist())  # in member order, as the chain adds them


def _chain(layout: Layout, toward_root: bool, spread: bool) -> tuple[Flow, ...]:
    flows: list[Flow] = []
    for member in range(layout.size - 1):
        a, b = (member + 1, member) if toward_root else (member, member + 1)
        flows += _hop(layout, a, b, 1.0, spread)
    return tuple(flows)


def btree_parent(n: int, rank: int) -> int:
    """Parent of `rank` in NCCL's binary tree over n ranks rooted at 0 (ncclGetBtree,
    src/graph/trees.cc); -1 for the root."""
    if rank == 0:
        return -1
    bit = 1
    while bit < n and not bit & rank:
        bit <<= 1
    up = (rank ^ bit) | (bit << 1)
    return rank ^ bit if up >= n else up


def dtree_parents(n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """NCCL's double binary tree (ncclGetDtree): the btree, and its mirror (n even) or its
    shift by one rank (n odd), so that a rank is a leaf in at least one of them."""
    first = tuple(btree_parent(n, r) for r in range(n))
    if n % 2:
        second = tuple(-1 if (u := btree_parent(n, (r - 1) % n)) == -1 else (u + 1) % n for r in range(n))
    else:
        second = tuple(-1 if (u := btree_parent(n, n - 1 - r)) == -1 else n - 1 - u for r in range(n))
    return first, second


def tree_depth(parents: tuple[int, ...]) -> int:
    def depth(rank: int) -> int:
        steps = 0
        while parents[rank] != -1:
            rank, steps = parents[rank], steps + 1
        return steps

    return max((depth(r) for r in range(len(parents))), default=0)


# --- NCCL ----------------------------------------------------------------------------------------


def nccl_ring_all_reduce(layout: Layout) -> Plan:
    k = layout.size
    flows = _ring(layout, 2 * (k - 1) / k, spread=True)
    return Plan("ring", (Phase(_ring_latency(layout, 2 * (k - 1)), flows),))


def nccl_tree_all_reduce(layout: Layout) -> Plan:
    """Chain inside each node, double binary tree over nodes, B/2 per tree each way."""
    flows: list[Flow] = []
    for node in layout.nodes:
        for a, b in zip(node, node[1:]):
            flows += [(b, a, 1.0), (a, b, 1.0)]  # both trees share the chain: 2 x B/2 each way
    node_count = len(layout.nodes)
    trees = dtree_parents(node_count) if node_count > 1 else ()
    for parents in trees:
        for child, parent in enumerate(parents):
            if parent == -1:
                continue
            head_child, head_parent = layout.nodes[child][0], layout.nodes[parent][0]
            flows += _hop(layout, head_child, head_parent, 0.5, spread=True)
            flows += _hop(layout, head_parent, head_child, 0.5, spread=True)
    per_node = max(len(node) for node in layout.nodes)
    depth = max((tree_depth(parents) for parents in trees), default=0)
    latency = 2 * ((per_node - 1) * layout.inner_latency + depth * layout.outer_latency)
    return Plan("tree", (Phase(latency, tuple(flows)),))


def nccl_ring_reduce_scatter(layout: Layout) -> Plan:
    k = layout.size
    return Plan("ring", (Phase(_ring_latency(layout, k - 1), _ring(layout, (k - 1) / k, spread=True)),))


def nccl_ring_all_gather(layout: Layout) -> Plan:
    k = layout.size
    return Plan("ring", (Phase(_ring_latency(layout, k - 1), _ring(layout, (k - 1) / k, spread=True)),))


def nccl_chain_broadcast(layout: Layout) -> Plan:
    flows = _chain(layout, toward_root=False, spread=True)
    return Plan("chain", (Phase(_chain_latency(layout), flows),))


def nccl_chain_reduce(layout: Layout) -> Plan:
    flows = _chain(layout, toward_root=True, spread=True)
    return Plan("chain", (Phase(_chain_latency(layout), flows),))


def _switch_flows(node: tuple[int, ...], per_member: float) -> list[Flow]:
    """Traffic through an NVSwitch as flows: every member of the node sends `per_member` of B
    out of its port, spread evenly over the others (and receives as much)."""
    if len(node) < 2:
        return []
    share = per_member / (len(node) - 1)
    return [(a, b, share) for a in node for b in node if a != b]


def nccl_nvls_all_reduce(layout: Layout) -> Plan:
    """NVLS inside one node (NVLink SHARP, NCCL 2.17+): each GPU's reduce-scatter pass reads
    its share through multimem reductions in the switch and its all-gather pass multicasts it
    back, B + B/k through each GPU's NVSwitch port (synth/model/nccl/timing.py `_loads`); as flows,
    that load spread over the other members. Latency: one hop (the switch does the rest)."""
    k = layout.size
    flows = tuple(f for node in layout.nodes for f in _switch_flows(node, 1.0 + 1.0 / k))
    return Plan("nvls", (Phase(layout.inner_latency, flows),))


def nccl_nvls_tree_all_reduce(layout: Layout) -> Plan:
    """NVLS inside each node and NCCL's double binary tree between nodes (NVLS tree, NCCL
    2.18+ across nodes): each GPU moves B + B/ppn through its NVSwitch port, each node B/2 per
    tree up and down through its NICs (spread over its members, one channel per NIC)."""
    flows: list[Flow] = []
    for node in layout.nodes:
        flows += _switch_flows(node, 1.0 + 1.0 / len(node))
    node_count = len(layout.nodes)
    trees = dtree_parents(node_count) if node_count > 1 else ()
    for parents in trees:
        for child, parent in enumerate(parents):
            if parent == -1:
                continue
            head_child, head_parent = layout.nodes[child][0], layout.nodes[parent][0]
            flows += _hop(layout, head_child, head_parent, 0.5, spread=True)
            flows += _hop(layout, head_parent, head_child, 0.5, spread=True)
    depth = max((tree_depth(parents) for parents in trees), default=0)
    return Plan("nvls_tree", (Phase(layout.inner_latency + 2 * depth * layout.outer_latency, tuple(flows)),))


def pairwise_all_to_all(layout: Layout) -> Plan:
    """All-to-all as NCCL runs it (and torch's all_to_all_single on gloo): one grouped round of
    send/recv in which every member sends its block j (B/k) straight to member j, every pair at
    once through the links between them (no channel spreading: each GPU's own NIC); latency the
    slowest pair's. The received blocks land in a scratch buffer of B (NCCL has no in-place
    all-to-all) that is copied back."""
    k = layout.size
    flows = PairwiseFlows(k, 1.0 / k)  # k x (k-1) flows, held as their classes
    return Plan("pairwise", (Phase(layout.largest_hop(), flows),), extra_memory=1.0)


# --- gloo ----------------------------------------------------------------------------------------


def gloo_ring_all_reduce(layout: Layout) -> Plan:
    k = layout.size
    flows = _ring(layout, 2 * (k - 1) / k, spread=False, step=-1)  # gloo sends to rank - 1
    return Plan("ring", (Phase(_ring_latency(layout, 2 * (k - 1), step=-1), flows),))


def gloo_reduce_scatter(layout: Layout) -> Plan:
    """torch's gloo reduce_scatter: a full ring all-reduce of a clone of the input."""
    plan = gloo_ring_all_reduce(layout)
    return Plan("allreduce+copy", plan.phases, extra_memory=1.0)


def gloo_ring_all_gather(layout: Layout) -> Plan:
    k = layout.size
    flows = _ring(layout, (k - 1) / k, spread=False)
    return Plan("ring", (Phase(_ring_latency(layout, k - 1), flows),), extra_memory=1.0)


def gloo_binomial_broadcast(layout: Layout) -> Plan:
    """Round i: members 0..2^i-1 send B to member + 2^i (gloo/broadcast.cc, root 0)."""
    k, phases, span = layout.size, [], 1
    while span < k:
        flows = tuple((sender, sender + span, 1.0) for sender in range(span) if sender + span < k)
        phases.append(Phase(float(layout.hops([a for a, _, _ in flows], [b for _, b, _ in flows]).max()), flows))
        span <<= 1
    return Plan("binomial", tuple(phases))


def gloo_ring_reduce(layout: Layout) -> Plan:
    """Ring reduce-scatter, then every member sends its reduced block to the root (gloo/reduce.cc)."""
    k = layout.size
    scatter = Phase(_ring_latency(layout, k - 1, step=-1), _ring(layout, (k - 1) / k, spread=False, step=-1))
    gather = Phase(float(layout.hops(np.arange(1, k), np.zeros(k - 1, dtype=np.int64)).max()),
                   tuple((m, 0, 1 / k) for m in range(1, k)))
    return Plan("ring+gather", (scatter, gather))


# --- backends --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Backend:
    """A collective library as the cost model sees it; replace fields to calibrate."""

    name: str
    launch_s: float  # per-call overhead before any byte moves
    launch_source: str
    algorithms: tuple[tuple[str, tuple[Algorithm, ...]], ...]  # collective -> candidates
    efficiency: tuple[tuple[str, float], ...] = field(default=())  # collective -> fraction of link bandwidth

    def candidates(self, collective: str) -> tuple[Algorithm, ...]:
        for name, algorithms in self.algorithms:
            if name == collective:
                return algorithms
        raise ValueError(f"backend {self.name} has no algorithm for {collective}")

    def efficiency_of(self, collective: str) -> float:
        return dict(self.efficiency).get(collective, 1.0)

    # --- the engine's backend seam (synth/model/backend.py) ---------------------------------

    def plans(self, call: CallSite) -> tuple[Plan, ...]:
        """Every candidate algorithm for the call, at this backend's efficiency for it."""
        efficiency = self.efficiency_of(call.collective)
        return tuple(replace(algorithm(call.layout), efficiency=efficiency)
                     for algorithm in self.candidates(call.collective))

    def alone_s(self, call: CallSite, plans: tuple[Plan, ...], call_bytes: np.ndarray,
                flow_s: np.ndarray) -> np.ndarray:
        """The time of each candidate alone: the flow model's (the same object, so the engine
        knows it adds nothing to the flows' contention)."""
        return flow_s


# NCCL's own per-call base latency for the Ring/Simple algorithm (NCCL 2.7-2.8
# src/graph/tuning.cc, baseLat[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE] = 8.4 us): the fixed cost of
# a call, mostly the kernel launch and the first chunk's handshake.
NCCL_LAUNCH_S = 8.4e-6
NCCL_LAUNCH_SOURCE = "NCCL 2.7 src/graph/tuning.cc baseLat Ring/Simple = 8.4 us"

# estimate: ProcessGroupGloo queues every call to a worker thread (enqueue/runLoop) and gloo's
# pairs start with a TCP message, tens of microseconds; a placeholder until `synth calibrate`.
GLOO_LAUNCH_S = 20e-6
GLOO_LAUNCH_SOURCE = "estimate: ProcessGroupGloo worker-thread queueing plus a TCP round trip, ~20 us"

NCCL_FLOWS = Backend(
    name="nccl-flows",
    launch_s=NCCL_LAUNCH_S,
    launch_source=NCCL_LAUNCH_SOURCE,
    algorithms=(
        ("AllReduce", (nccl_ring_all_reduce, nccl_tree_all_reduce)),
        ("ReduceScatter", (nccl_ring_reduce_scatter,)),
        ("AllGather", (nccl_ring_all_gather,)),
        ("Reduce", (nccl_chain_reduce,)),
        ("Broadcast", (nccl_chain_broadcast,)),
        ("AllToAll", (pairwise_all_to_all,)),
    ),
)
"""NCCL's algorithms on datasheet links, Simple protocol only, the faster algorithm by the flows
alone: the model before NCCL's own choice and performance (synth/model/nccl/backend.py, the
`nccl` backend) joined the engine; kept to compare with it."""

GLOO = Backend(
    name="gloo",
    launch_s=GLOO_LAUNCH_S,
    launch_source=GLOO_LAUNCH_SOURCE,
    algorithms=(
        ("AllReduce", (gloo_ring_all_reduce,)),
        ("ReduceScatter", (gloo_reduce_scatter,)),
        ("AllGather", (gloo_ring_all_gather,)),
        ("Reduce", (gloo_ring_reduce,)),
        ("Broadcast", (gloo_binomial_broadcast,)),
        ("AllToAll", (pairwise_all_to_all,)),
    ),
)

