"""The seam between the costing engine and a collective library's model (a backend).

Like astra-sim, which keeps its system layer (collective algorithms, scheduling) apart from
interchangeable network back ends behind one network API, the engine (synth/model/engine.py)
owns what every backend shares: the network and its contention (synth/model/network.py),
the steps of a program, how all reduction groups' calls of a step share links, and the
estimates (synth/model/estimate.py). A backend answers questions about one call, alone:

* `plans(call)`: the candidate algorithms the library may run for it, each a `Plan`: phases
  of flows between members as fractions of the call's bytes B, a latency per phase, scratch
  memory, and the efficiency of its transfers (its flows occupy links 1/efficiency as long as
  their bytes alone would). This is the call's traffic: the engine maps it onto every
  reduction group's devices and lets all flows of a step share the links.
* `alone_s(call, plans, call_bytes, flow_s)`: its own estimate of each candidate's time when
  the call runs alone, launch excluded, per size (`flow_s[z, c]` is the flow model's estimate:
  the hop latencies plus the drain time of the candidate's flows on an idle network). The
  engine picks, per call and size, the candidate this estimate says is fastest (first on a
  tie), as NCCL's tuner does.
* optionally `headroom_s(call, plans, call_bytes, flow_s)`: of each candidate's time alone,
  the part during which its links could carry more than the call sends, because something of
  the call's own holds it back (NCCL's TCP streams, a protocol's ceiling, fewer channels for
  a small call). Other calls' traffic fills that headroom before it delays this call. It may
  be negative: the flows then need longer than the backend's own time (links the backend's
  own model does not see, such as a fabric or a rack's uplinks), and they bind even alone.
  0 when the backend has no such method.
* optionally `least_alone_s(call, call_bytes)`: the least `alone_s` gives any candidate at the
  one size in `call_bytes`, when the backend knows it without building the plans (None when
  it does not): the search's bounds ask it of every call site, and most are never costed.

A step then costs, per size, with a_i, f_i and h_i the chosen candidate's own time, flow
time and headroom for each call i, and F the flows of all reduction groups' calls of the
step at once (slowest phase latencies plus the busiest link's drain time):

    launch + max over calls of ( a_i + max(0, F - f_i - h_i) )
  = max( launch + max_i a_i,  launch + F + max_i (a_i - f_i - h_i) )

so a call alone costs `launch + alone_s` (exactly, unless its headroom is negative), sharing
links never makes it faster, and what sharing adds is the drain time the other calls' traffic
adds beyond the headroom. A backend whose `alone_s` returns `flow_s` itself (the built-in flow
backends of synth/model/algorithms.py) has a_i = f_i and no headroom: its steps cost
`launch + F`.

`launch_s` is charged once per step (once per call on each device). `alone_s` must be a time
(>= 0) and never decrease with the call's bytes: the search's lower bounds rely on both.
NCCL as measured (synth/model/nccl/backend.py: per-call algorithm and protocol choice,
channels, size ramp, transports) is the `nccl` backend built on this seam.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from synth.topology import Level, NcclSystem


# --- the vocabulary of a call's algorithms (the seam's: backends and algorithms speak it) -------

Flow = tuple[int, int, float]  # (from member index, to member index, fraction of B)


@dataclass(frozen=True, eq=False)
class Layout:
    """What an algorithm needs to know about the members of one call. Hop latencies come from
    the members' coordinates and the levels' latencies on demand (`hops`, vectorized), never as
    a member x member table: a call's cost must not grow with its members squared."""

    size: int
    nodes: tuple[tuple[int, ...], ...]  # member indices of each node, in member order
    outer_latency: float  # s, latency of the outermost level the group spans
    inner_latency: float  # s, latency of the innermost level (hops inside a node)
    coords: np.ndarray = field(repr=False)  # [member, level]
    level_latency: np.ndarray = field(repr=False)  # s, [level]

    @cached_property
    def _node_index(self) -> dict[int, int]:
        return {member: index for index, node in enumerate(self.nodes) for member in node}

    def node_of(self, member: int) -> int:
        return self._node_index[member]

    def hops(self, src, dst) -> np.ndarray:
        """Latency of a message from each src member to the dst member beside it: that of the
        outermost level at which the two differ (0 from a member to itself)."""
        differs = self.coords[np.asarray(src, dtype=np.int64)] != self.coords[np.asarray(dst, dtype=np.int64)]
        return np.where(differs.any(axis=-1), self.level_latency[differs.argmax(axis=-1)], 0.0)

    def hop(self, a: int, b: int) -> float:
        return float(self.hops([a], [b])[0])

    def largest_hop(self) -> float:
        """The largest latency of a message between two members (0.0 for one member): the
        largest latency of a level at which two members of one parent unit differ."""
        found = [float(self.level_latency[level]) for level in range(self.coords.shape[1])
                 if _distinct_rows(self.coords[:, :level + 1]) > _distinct_rows(self.coords[:, :level])]
        return max(found, default=0.0)

    @cached_property
    def hop_latency(self) -> tuple[tuple[float, ...], ...]:
        """[a][b] latency of a message from a to b: the whole table (k x k; for checks and small
        calls only, the algorithms use `hops`)."""
        k = self.size
        return tuple(map(tuple, self.hops(np.repeat(np.arange(k), k), np.tile(np.arange(k), k)).reshape(k, k).tolist()))


def _distinct_rows(rows: np.ndarray) -> int:
    if rows.shape[1] == 0:
        return 1 if len(rows) else 0
    return len(set(map(tuple, rows.tolist())))  # (np.unique would import numpy.ma)


class FlowArrays(Sequence):
    """A phase's flows as three arrays (from member, to member, fraction of B) instead of a
    tuple of tuples: what an all-to-all's k x (k - 1) flows need to stay numpy work. Reads as
    the same sequence of `Flow` tuples."""

    __slots__ = ("src", "dst", "fraction", "_hash")

    def __init__(self, src, dst, fraction):
        self.src = np.asarray(src, dtype=np.int64)
        self.dst = np.asarray(dst, dtype=np.int64)
        self.fraction = np.asarray(fraction, dtype=float)
        self._hash = None

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self)[index]
        return int(self.src[index]), int(self.dst[index]), float(self.fraction[index])

    def __iter__(self):
        return zip(self.src.tolist(), self.dst.tolist(), self.fraction.tolist())

    def __eq__(self, other) -> bool:
        if isinstance(other, FlowArrays):
            return (np.array_equal(self.src, other.src) and np.array_equal(self.dst, other.dst)
                    and np.array_equal(self.fraction, other.fraction))
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((len(self), self.src.tobytes(), self.dst.tobytes(), self.fraction.tobytes()))
        return self._hash


class PairwiseFlows(FlowArrays):
    """Every ordered pair of k members, a -> b for a != b (source-major, the same order as
    FlowArrays of `np.repeat`/`np.tile`), each carrying `share` divided by `intra`, or by
    `inter` where the two members' `node` differs (no `node`: every pair `intra`). Held as
    those few numbers, so that link loads can be priced per class of equal flows
    (Network.pair_loads) instead of over k x (k - 1) arrays; the arrays are built only when
    something reads them, with the same floats."""

    __slots__ = ("k", "share", "node", "inter", "intra", "_arrays")

    def __init__(self, k: int, share: float, node: tuple[int, ...] | None = None, inter: float = 1.0,
                 intra: float = 1.0):
        self.k, self.share, self.node, self.inter, self.intra = int(k), float(share), node, float(inter), float(intra)
        self._arrays = None
        self._hash = None

    def divided(self, node: tuple[int, ...] | None, inter: float, intra: float) -> PairwiseFlows:
        """These flows with each share divided by the link's efficiency (the `node` rule above)."""
        if self.inter != 1.0 or self.intra != 1.0:
            raise ValueError("pairwise flows divided by link efficiency twice")
        return PairwiseFlows(self.k, self.share, node, inter, intra)

    def weight(self, same_node: bool, efficiency: float = 1.0) -> float:
        """The bytes of one flow per byte of B within a node or across nodes, over `efficiency`,
        as the arrays' elementwise division gives it."""
        divisor = self.intra if self.node is None or same_node else self.inter
        return float(np.float64(self.share) / np.float64(divisor) / np.float64(efficiency))

    def _build(self):
        if self._arrays is None:
            k = self.k
            src, dst = np.repeat(np.arange(k), k), np.tile(np.arange(k), k)
            pairs = src != dst
            src, dst = src[pairs], dst[pairs]
            fraction = np.full(k * (k - 1), self.share)
            if self.inter != 1.0 or self.intra != 1.0:
                node = None if self.node is None else np.array(self.node, dtype=np.int64)
                divisor = (np.full(len(src), self.intra, dtype=float) if node is None
                           else np.where(node[src] != node[dst], self.inter, self.intra))
                fraction = fraction / divisor
            self._arrays = (src, dst, fraction)
        return self._arrays

    src = property(lambda self: self._build()[0])
    dst = property(lambda self: self._build()[1])
    fraction = property(lambda self: self._build()[2])

    def __len__(self) -> int:
        return self.k * (self.k - 1)

    def __eq__(self, other) -> bool:
        if isinstance(other, PairwiseFlows):
            return (self.k, self.share, self.node, self.inter, self.intra) == (
                other.k, other.share, other.node, other.inter, other.intra)
        return super().__eq__(other)

    def __hash__(self) -> int:
        return hash((self.k, self.share, self.node, self.inter, self.intra))

    def __reduce__(self):  # its few numbers, not the arrays (which have no setter)
        return PairwiseFlows, (self.k, self.share, self.node, self.inter, self.intra)


@dataclass(frozen=True)
class Phase:
    latency_s: float
    flows: tuple[Flow, ...] | FlowArrays


@dataclass(frozen=True)
class Plan:
    """One algorithm for one call: phases in order, scratch memory per member, and the
    fraction of the links' rate its transfers reach (its flows occupy links 1/efficiency as
    long as their bytes alone would: protocol overheads, achieved bandwidth)."""

    algorithm: str
    phases: tuple[Phase, ...]
    extra_memory: float = 0.0  # scratch bytes per member, as a fraction of B
    efficiency: float = 1.0


def call_layout(coords: np.ndarray, level_latencies) -> Layout:
    """The shape of one call whose members sit at `coords` ([member, level]), with the given
    latency per level: nodes, hop latencies, and the outermost and innermost latencies."""
    coords = np.asarray(coords)
    latency_of_level = np.asarray(level_latencies, dtype=float)
    # a level is spanned when its coordinate varies (np.unique's count would import numpy.ma)
    spanned = [l for l in range(coords.shape[1]) if len(coords) and coords[:, l].min() != coords[:, l].max()]
    outer = float(latency_of_level[spanned[0]]) if spanned else 0.0
    return Layout(len(coords), _nodes(coords), outer, float(latency_of_level[-1]), coords, latency_of_level)


def _nodes(coords: np.ndarray) -> tuple[tuple[int, ...], ...]:
    """The member indices of each node (members alike in every coordinate but the last), nodes
    in order of first appearance, members in order: by sorts, not a dictionary per member (a
    call may have thousands)."""
    count = len(coords)
    if count == 0:
        return ()
    prefix = coords[:, :-1]
    if prefix.shape[1] == 0:
        return (tuple(range(count)),)
    keys = np.ravel_multi_index(tuple(prefix.T), tuple(int(size) for size in prefix.max(axis=0) + 1))
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    appearance = np.empty(len(first), dtype=np.int64)
    appearance[np.argsort(first, kind="stable")] = np.arange(len(first))
    node = appearance[inverse.reshape(-1)]
    members = np.argsort(node, kind="stable")
    bounds = np.cumsum(np.bincount(node, minlength=len(first)))[:-1]
    return tuple(tuple(part.tolist()) for part in np.split(members, bounds.tolist()))


@dataclass(frozen=True)
class CallSite:
    """One call as a backend sees it: the collective, where its members sit, the figures of
    the system's levels as that collective sees them (calibrated per-collective figures
    included) and the system's NCCL facts (GPU generation, NVLS: its `[nccl]` table).
    Coordinates are relabelled in order of first appearance per parent unit, so every call of
    the same shape is the same site (the system's units of a level are alike)."""

    collective: str
    coords: tuple[tuple[int, ...], ...]  # [member][system level], members in group order
    levels: tuple[Level, ...]  # the system's levels, outermost first, as `collective` sees them
    nccl: NcclSystem | None = None  # the topology's [nccl] table

    @cached_property
    def layout(self) -> Layout:
        """Nodes, hop latencies, outermost and innermost latencies (what algorithms need)."""
        return call_layout(np.array(self.coords, dtype=np.int64).reshape(len(self.coords), -1),
                           [level.latency.value for level in self.levels])

    def __hash__(self) -> int:
        """Hashed once (sites key the plan caches; their levels make a deep hash)."""
        found = self.__dict__.get("_hash")
        if found is None:
            found = self.__dict__["_hash"] = hash((self.collective, self.coords, self.levels, self.nccl))
        return found

    def __getstate__(self) -> dict:
        """Pickled without the kept hash (a string's hash differs from process to process) or the
        cached layout (rebuilt when asked)."""
        return {key: value for key, value in self.__dict__.items() if key not in ("_hash", "layout")}

    @property
    def size(self) -> int:
        return len(self.coords)

    @cached_property
    def spanned(self) -> tuple[int, ...]:
        """The system levels at which members differ, outermost first."""
        return tuple(l for l in range(len(self.levels)) if len({row[l] for row in self.coords}) > 1)


def canonical_coords(coords: np.ndarray) -> tuple[tuple[int, ...], ...]:
    """Member coordinates with each level's unit indices renumbered, inside each parent, in
    order of first appearance: equal for calls that differ only by which units they use."""
    seen: dict[tuple, dict[int, int]] = {}
    result = []
    for row in coords.tolist():
        prefix: tuple = ()
        for value in row:
            labels = seen.setdefault(prefix, {})
            prefix += (labels.setdefault(value, len(labels)),)
        result.append(prefix)
    return tuple(result)


def canonical_labels(coords: np.ndarray) -> np.ndarray:
    """`canonical_coords` of many calls of equal size at once, coords [call, member, level],
    as an array of the same shape: one pass of sorts per level instead of a dictionary per
    member and level (and no Python integer per coordinate)."""
    calls, size, levels = coords.shape
    if calls == 0:
        return np.zeros((0, size, levels), dtype=np.int64)
    labels = np.empty((calls, size, levels), dtype=np.int64)
    parent = np.repeat(np.arange(calls, dtype=np.int64), size)  # the group each member sits in so far
    for level in range(levels):
        value = coords[:, :, level].ravel().astype(np.int64)
        span = int(value.max()) + 1
        groups, first, inverse = np.unique(parent * span + value, return_index=True, return_inverse=True)
        inverse = inverse.ravel()
        owner = groups // span
        order = np.lexsort((first, owner))  # each parent's units in order of first appearance
        owners = owner[order]
        starts = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])
        run_start = np.repeat(starts, np.diff(np.r_[starts, len(order)]))
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order)) - run_start
        labels[:, :, level] = rank[inverse].reshape(calls, size)
        parent = inverse
    return labels


@runtime_checkable
class CallModel(Protocol):
    """What the costing engine asks of a backend (see the module docstring)."""

    name: str
    launch_s: float

    def plans(self, call: CallSite) -> tuple[Plan, ...]:
        ...

    def alone_s(self, call: CallSite, plans: tuple[Plan, ...], call_bytes: np.ndarray,
                flow_s: np.ndarray) -> np.ndarray:
        ...
