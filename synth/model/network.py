"""The physical network of a topology: devices, switches and links, and the load flows put on them.

The graph (networkx, directed) follows the topology file's meaning (synth/topology_file.py):

* one switch per unit of each level's parent, ``("sw", prefix)``: the interconnect joining
  the units of level ``len(prefix)`` inside the unit ``prefix`` (``()`` is the whole system);
* every unit of every level (a prefix of level coordinates; a device is a unit of the
  innermost level) has an exit node ``("out", prefix)`` and an entry node ``("in", prefix)``;
  the edges that leave or enter it carry the unit's uplinks when its level has them
  (capacity ``count * bandwidth``, each direction), and are free otherwise;
* a level with a ``fabric`` figure has one more link per switch of that level, the shared
  interconnect itself: every flow turning at the switch crosses it once (one queue for both
  directions, like a node's loopback), so it bounds the level's whole traffic in one parent;
* each device has, for each level ``l``, an injection link into the level-``l`` interconnect
  and an ejection link out of it, each of the level's per-device bandwidth, through port
  nodes ``("port-out", rank, l)`` and ``("port-in", rank, l)``.

A flow between devices whose coordinates first differ at level ``d`` takes the source's
level-``d`` injection link, leaves every unit of the source at levels ``d..L-1`` (their
uplinks, where present), turns at the switch of their common level-``d`` parent, enters the
destination's units and takes its level-``d`` ejection link. That is the unique shortest
path between the two level-``d`` ports (``route``). The costing tables number the same links
per (device, level) as arrays, built without walking the graph (which is built from them only
when a route is asked for), so that the load of a batch of flows is a few numpy gathers and one
``bincount``.

Time of a batch of flows that all start together: with max-min fair sharing every link
drains its load at its capacity and the last flow ends when the busiest link is empty, so
the makespan is ``max over links of load / capacity`` (the standard fluid model; e.g.
Bertsekas & Gallager, Data Networks, 2nd ed., section 6.5.2 on max-min fairness).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property, lru_cache
from itertools import product as cartesian
from typing import TYPE_CHECKING

import numpy as np

from synth.errors import UsageError
from synth.topology import Topology

if TYPE_CHECKING:
    import networkx as nx

NO_LINK = -1


@dataclass(frozen=True)
class Link:
    """One shared resource: a direction of a device's level link or of a unit's uplinks."""

    name: str
    capacity: float  # bytes/s


def check_costable(topology: Topology) -> None:
    """Costs need bandwidth and latency on every level; say so in one line otherwise."""
    if not topology.has_link_figures:
        missing = [level.name for level in topology.levels if level.bandwidth is None or level.latency is None]
        raise UsageError(
            f"topology {topology.name} has no link figures for level(s) {', '.join(missing)}: costs need a "
            f"topology with bandwidth and latency per level; use a built-in (dgx-a100-x4) or a TOML file",
            inputs=("topology",))


_JOINED_FLOWS = 1 << 16  # link ids up to which Network.loads joins its parts (a copy of each)


class Network:
    """A topology as a graph of devices, switches and links, with fast per-batch link loads."""

    def __init__(self, topology: Topology):
        check_costable(topology)
        self.topology = topology
        self.sizes = topology.sizes
        self.depth = len(self.sizes)
        self.device_count = topology.device_count
        ranks = np.arange(self.device_count)
        self.coords = np.stack(np.unravel_index(ranks, self.sizes), axis=1).astype(np.int64)
        self._build_tables()
        self._pack_codes()

    # --- the links and the graph -----------------------------------------------------------------

    def _unit_name(self, prefix: tuple[int, ...]) -> str:
        if not prefix:
            return "system"
        return ".".join(f"{self.topology.levels[i].name}{c}" for i, c in enumerate(prefix))

    def _prefix(self, rank: int, length: int) -> tuple[int, ...]:
        return tuple(int(c) for c in self.coords[rank, :length])

    def _units(self, length: int):
        """The units whose prefixes have `length` coordinates, in order (their index = rank // stride)."""
        return cartesian(*(range(n) for n in self.sizes[:length]))

    def _build_tables(self) -> None:
        """Every link, numbered in a fixed order (each fabric, then each unit's uplinks out and
        in, then each device's injection and ejection link per level), and per (device, level)
        the links a flow of that level takes at its ends: arrays, without walking the graph
        (`graph` is built from them; tests/test_pair_loads.py checks they agree)."""
        levels = self.topology.levels
        ranks = np.arange(self.device_count, dtype=np.int64)
        strides = [int(np.prod(self.sizes[p:], dtype=np.int64)) for p in range(self.depth + 1)]
        shape = (self.device_count, self.depth)
        self.inject = np.full(shape, NO_LINK, dtype=np.int64)
        self.eject = np.full(shape, NO_LINK, dtype=np.int64)
        self.up_out = np.full(shape, NO_LINK, dtype=np.int64)
        self.up_in = np.full(shape, NO_LINK, dtype=np.int64)
        self.fabric = np.full(shape, NO_LINK, dtype=np.int64)
        # the links' capacities in blocks, their names built when first asked for (`link_names`)
        capacities: list[np.ndarray] = []
        self._name_blocks: list[tuple[str, int]] = []
        first = 0
        for length, level in enumerate(levels):  # one shared medium per switch of the level
            if level.fabric is not None:
                units = int(np.prod(self.sizes[:length], dtype=np.int64))
                capacities.append(np.full(units, level.fabric.value, dtype=float))
                self._name_blocks.append(("fabric", length))
                self.fabric[:, length] = first + ranks // strides[length]
                first += units
        for length in range(1, self.depth + 1):
            level = levels[length - 1]
            if level.uplinks is not None:
                units = int(np.prod(self.sizes[:length], dtype=np.int64))
                capacities.append(np.full(2 * units, level.uplinks.count * level.uplinks.bandwidth.value, dtype=float))
                self._name_blocks.append(("uplinks", length))
                self.up_out[:, length - 1] = first + 2 * (ranks // strides[length])
                self.up_in[:, length - 1] = self.up_out[:, length - 1] + 1
                first += 2 * units
        self.shared_links = first  # the fabrics and uplinks: every link before the devices' own
        per_device = np.array([level.bandwidth.value for level in levels for _ in ("out", "in")], dtype=float)
        capacities.append(np.tile(per_device, self.device_count))
        self._name_blocks.append(("devices", self.depth))
        self.capacity = np.concatenate(capacities)
        self.inject[:] = first + 2 * (ranks[:, None] * self.depth + np.arange(self.depth)[None, :])
        self.eject[:] = self.inject + 1
        self.uplink_levels = tuple(l for l, level in enumerate(levels) if level.uplinks is not None)
        self.fabric_levels = tuple(l for l, level in enumerate(levels) if level.fabric is not None)

    @cached_property
    def link_names(self) -> tuple[str, ...]:
        """Every link's name, in link order (built when first asked for: costing needs only
        the capacities, and a system of thousands of devices has tens of thousands of links)."""
        levels = self.topology.levels
        names: list[str] = []
        for kind, length in self._name_blocks:
            if kind == "fabric":
                level = levels[length]
                names += [f"{self._unit_name(prefix)} {level.name}-fabric" for prefix in self._units(length)]
            elif kind == "uplinks":
                for prefix in self._units(length):
                    name = self._unit_name(prefix)
                    names += [f"{name} uplinks out", f"{name} uplinks in"]
            else:
                for prefix in self._units(length):
                    name = self._unit_name(prefix)
                    for level in levels:
                        names += [f"{name} {level.name}-link out", f"{name} {level.name}-link in"]
        return tuple(names)

    @cached_property
    def links(self) -> tuple[Link, ...]:
        """Every link (name and capacity), in link order."""
        return tuple(Link(name, float(capacity)) for name, capacity in zip(self.link_names, self.capacity.tolist()))

    @cached_property
    def graph(self) -> nx.DiGraph:
        """The network as a graph whose edges carry the link numbers of the tables (for `route`,
        checks and explanations; built, and networkx imported, when first asked for)."""
        import networkx as nx

        graph = nx.DiGraph()
        strides = [int(np.prod(self.sizes[p:], dtype=np.int64)) for p in range(self.depth + 1)]

        def first_rank(prefix: tuple[int, ...]) -> int:
            return sum(c * strides[i + 1] for i, c in enumerate(prefix))

        def link(table: np.ndarray, rank: int, level: int) -> int | None:
            found = int(table[rank, level])
            return None if found == NO_LINK else found

        for length in range(self.depth):
            for prefix in self._units(length):
                graph.add_node(("sw", prefix), kind="switch", name=self._unit_name(prefix))
        for length in range(1, self.depth + 1):
            for prefix in self._units(length):
                name, rank = self._unit_name(prefix), first_rank(prefix)
                graph.add_node(("out", prefix), kind="exit", name=name)
                graph.add_node(("in", prefix), kind="entry", name=name)
                up, down = link(self.up_out, rank, length - 1), link(self.up_in, rank, length - 1)
                parent = prefix[:-1]
                # Leaving the unit: to the parent's switch (traffic that stays in the parent)
                # or on to the parent's own exit; either way through the unit's uplinks.
                graph.add_edge(("out", prefix), ("sw", parent), link=up)
                graph.add_edge(("sw", parent), ("in", prefix), link=down)
                if parent:
                    graph.add_edge(("out", prefix), ("out", parent), link=up)
                    graph.add_edge(("in", parent), ("in", prefix), link=down)
        for rank in range(self.device_count):
            device = self._prefix(rank, self.depth)
            graph.add_node(("dev", rank), kind="device", name=self._unit_name(device))
            for index in range(self.depth):
                graph.add_edge(("dev", rank), ("port-out", rank, index), link=int(self.inject[rank, index]))
                graph.add_edge(("port-out", rank, index), ("out", device), link=None)
                graph.add_edge(("in", device), ("port-in", rank, index), link=None)
                graph.add_edge(("port-in", rank, index), ("dev", rank), link=int(self.eject[rank, index]))
        return graph

    # --- routing and loads -----------------------------------------------------------------------

    def first_difference(self, src, dst) -> np.ndarray:
        """The outermost level at which each pair of devices differs (the level of their traffic)."""
        if self._codes is not None:  # one integer per device: the highest bit two codes differ at
            differs = self._codes[np.asarray(src)] ^ self._codes[np.asarray(dst)]
            if not differs.all():
                raise ValueError("a flow from a device to itself carries no traffic")
            return self._level_of_bit[np.frexp(differs.astype(float))[1]]
        differs = self.coords[np.asarray(src)] != self.coords[np.asarray(dst)]
        if not differs.any(axis=-1).all():
            raise ValueError("a flow from a device to itself carries no traffic")
        return differs.argmax(axis=-1)

    def _pack_codes(self) -> None:
        """Each device's coordinates packed into one integer, outermost level in the high bits,
        and the level each bit belongs to: two devices first differ at the level of the highest
        bit their codes differ at (None past 52 bits, where floats stop being exact)."""
        widths = [max(1, (size - 1).bit_length()) for size in self.sizes]
        self._codes = self._level_of_bit = None
        if sum(widths) > 52:
            return
        codes = np.zeros(self.device_count, dtype=np.int64)
        level_of_bit = []
        for level, width in enumerate(widths):
            codes = (codes << width) | self.coords[:, level]
            level_of_bit = [level] * width + level_of_bit
        # frexp's exponent of a code difference is its bit length: bit e - 1 is the highest set
        self._codes = codes
        self._level_of_bit = np.array([0] + level_of_bit, dtype=np.int64)

    def route(self, src: int, dst: int) -> tuple[str, ...]:
        """The names of the links one flow crosses, by shortest path on the graph (for checks
        and explanations; costing uses the tables built from the same graph)."""
        import networkx as nx

        level = int(self.first_difference(src, dst))
        path = nx.shortest_path(self.graph, ("port-out", src, level), ("port-in", dst, level))
        nodes = [("dev", src), *path, ("dev", dst)]
        links = [self.graph.edges[a, b]["link"] for a, b in zip(nodes, nodes[1:])]
        if self.fabric[src, level] != NO_LINK:  # the switch's own shared medium, at the turn
            turn = nodes.index(("sw", self._prefix(src, level)))
            links.insert(turn, int(self.fabric[src, level]))
        return tuple(self.link_names[link] for link in links if link is not None)

    def loads(self, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, level: np.ndarray | None = None) -> np.ndarray:
        """Bytes each link carries for a batch of flows (src device, dst device, bytes);
        `level`: their `first_difference` where the caller knows it."""
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        nbytes = np.asarray(nbytes, dtype=float)
        if src.size == 0:
            return np.zeros(len(self.capacity))
        level = self.first_difference(src, dst) if level is None else level
        shared_ids, shared_weights = self._shared_parts(src, dst, nbytes, level)
        ids = [self.inject[src, level], self.eject[dst, level], *shared_ids]
        weights = [nbytes, nbytes, *shared_weights]
        # Each link is in one of these parts only (its kind and level fix the part), so summing the
        # parts' loads adds its bytes in the same order as one bincount over them all would,
        # without a copy of every part (the copy was most of the time for millions of flows).
        # Flows no more than the links (a step's calls at one site, or every call of a large
        # system's step) take one bincount over the parts joined: the same sums, and a copy of
        # the flows costs less than an array of every link per part.
        if sum(len(part) for part in ids) <= max(_JOINED_FLOWS, len(self.capacity)):
            return np.bincount(np.concatenate(ids), weights=np.concatenate(weights), minlength=len(self.capacity))
        return _summed_parts(ids, weights, len(self.capacity))

    def _shared_parts(self, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, level: np.ndarray
                      ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The link ids and bytes of the flows on the shared links (uplinks, fabrics), one part per
        kind and level of link."""
        ids, weights = [], []
        for uplink_level in self.uplink_levels:
            crossing = level <= uplink_level  # the flow leaves its units at this level and below
            ids += [self.up_out[src[crossing], uplink_level], self.up_in[dst[crossing], uplink_level]]
            weights += [nbytes[crossing], nbytes[crossing]]
        for fabric_level in self.fabric_levels:
            turning = level == fabric_level  # the flow turns at this level's switch
            ids.append(self.fabric[src[turning], fabric_level])
            weights.append(nbytes[turning])
        return ids, weights

    def shared_loads(self, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray,
                     level: np.ndarray | None = None) -> np.ndarray:
        """`loads(src, dst, nbytes)[:shared_links]`, bit for bit, without the devices' own links:
        the loads of the fabrics and uplinks, the links that flows of several devices share
        (CostEngine prices the devices' links of translated groups from one group's flows)."""
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        nbytes = np.asarray(nbytes, dtype=float)
        if src.size == 0 or not self.shared_links:
            return np.zeros(self.shared_links)
        level = self.first_difference(src, dst) if level is None else level
        # each link is in one part: its bytes are added in flow order, as `loads` adds them
        return _summed_parts(*self._shared_parts(src, dst, nbytes, level), self.shared_links)

    def pair_loads(self, sets: np.ndarray, node: np.ndarray | None, inter: np.ndarray, intra: np.ndarray,
                   shared_only: bool = False) -> np.ndarray | None:
        """`loads` of every ordered pair of distinct members within each row of `sets` ([set,
        member] devices), a flow weighing `intra[set]` between members of one `node` (None: all
        one node) and `inter[set]` otherwise, priced per class of equal flows, not one by one.

        The flows from a device to the others group by the level at which they first differ;
        every flow of a class crosses the same links (route), so a link's load is a count of
        flows of one weight. Counting needs only each device's number of members sharing its
        prefix at each level, O(members x levels). The result is bit for bit `loads` over the
        pairs in any order: every link's bytes are then `count` equal addends, summed here one
        after the other as `np.bincount` does. None (price the flows one by one) where that does
        not hold: a node that is not a unit of the hierarchy, a link whose flows weigh differently
        (mixed classes), or a device twice in a set. `shared_only`: the loads of the shared
        links alone (`shared_loads`), None only where one of those mixes classes."""
        sets = np.asarray(sets, dtype=np.int64)
        count, k = sets.shape
        length = self.shared_links if shared_only else len(self.capacity)
        if k < 2:
            return np.zeros(length)
        strides = [int(np.prod(self.sizes[p:], dtype=np.int64)) for p in range(self.depth + 1)]
        row = np.arange(count, dtype=np.int64)[:, None] * (self.device_count + 1)
        same = []  # [p][set, member]: members of the set sharing the member's prefix of length p
        for stride in strides:
            _, inverse, counts = np.unique(row + sets // stride, return_inverse=True, return_counts=True)
            same.append(counts[inverse.reshape(sets.shape)])
        if not (same[-1] == 1).all():
            return None
        weight = self._class_weights(sets, row, strides, node, np.asarray(inter, dtype=float),
                                     np.asarray(intra, dtype=float))
        if weight is None:
            return None
        flows = [same[level] - same[level + 1] for level in range(self.depth)]  # [level][set, member]
        ids, counts, weights = [], [], []

        def add(links: np.ndarray, level: int) -> None:
            ids.append(links.ravel())
            counts.append(flows[level].ravel())
            weights.append(np.broadcast_to(weight[:, level:level + 1], sets.shape).ravel())

        for level in range(0 if shared_only else self.depth):
            add(self.inject[sets, level], level)
            add(self.eject[sets, level], level)
        for uplink_level in self.uplink_levels:
            for level in range(uplink_level + 1):
                add(self.up_out[sets, uplink_level], level)
                add(self.up_in[sets, uplink_level], level)
        for fabric_level in self.fabric_levels:
            add(self.fabric[sets, fabric_level], fabric_level)
        if not ids:
            return np.zeros(length)
        return self._summed(np.concatenate(ids), np.concatenate(counts), np.concatenate(weights), length)

    def _class_weights(self, sets, row, strides, node, inter, intra) -> np.ndarray | None:
        """[set, level] the weight of a flow first differing at the level: `inter` above the
        level whose units are the nodes, `intra` from it down; None when no level's units are
        the nodes in some set."""
        levels = np.arange(self.depth)[None, :]
        if node is None:
            return np.broadcast_to(intra[:, None], (len(sets), self.depth))
        node = np.asarray(node, dtype=np.int64)
        nodes = row + node[None, :]
        node_count = len(np.unique(nodes))
        for split, stride in enumerate(strides):
            units = row + sets // stride
            if len(np.unique(units)) == node_count and len(np.unique(units * (len(node) + 1) + node)) == node_count:
                return np.where(levels < split, inter[:, None], intra[:, None])
        return None

    def _summed(self, ids: np.ndarray, counts: np.ndarray, weights: np.ndarray, length: int) -> np.ndarray | None:
        """Per link of the first `length`, `counts` addends of `weights` summed in sequence
        (None if a link gets two weights)."""
        used = counts > 0
        ids, counts, weights = ids[used], counts[used], weights[used]
        total = np.bincount(ids, weights=counts, minlength=length).astype(np.int64)
        low = np.full(length, np.inf)
        high = np.full(length, -np.inf)
        np.minimum.at(low, ids, weights)
        np.maximum.at(high, ids, weights)
        loaded = np.flatnonzero(total)
        if (low[loaded] != high[loaded]).any():
            return None
        result = np.zeros(length)
        for value in np.unique(low[loaded]):
            links = loaded[low[loaded] == value]
            result[links] = sequential_sums(float(value), total[links])
        return result

    def makespan(self, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray) -> tuple[float, int]:
        """(seconds, busiest link) for flows that start together: max over links of load/capacity."""
        if np.asarray(src).size == 0:
            return 0.0, NO_LINK
        times = self.loads(src, dst, nbytes) / self.capacity
        busiest = int(np.argmax(times))  # the first of equals: deterministic
        return float(times[busiest]), busiest

    def link_name(self, link: int) -> str:
        """One link's name, as `link_names` has it, found from its number (a row's explanation
        names a few links of a system whose every name costs a second to build)."""
        if link == NO_LINK:
            return ""
        if "link_names" in self.__dict__:
            return self.link_names[link]
        levels, index = self.topology.levels, int(link)
        for kind, length in self._name_blocks:
            units = int(np.prod(self.sizes[:length], dtype=np.int64))
            per_unit = 1 if kind == "fabric" else 2 if kind == "uplinks" else 2 * self.depth
            if index >= units * per_unit:
                index -= units * per_unit
                continue
            unit, within = divmod(index, per_unit)
            name = self._unit_name(tuple(int(c) for c in np.unravel_index(unit, self.sizes[:length])) if length else ())
            if kind == "fabric":
                return f"{name} {levels[length].name}-fabric"
            if kind == "uplinks":
                return f"{name} uplinks {('out', 'in')[within]}"
            return f"{name} {levels[within // 2].name}-link {('out', 'in')[within % 2]}"
        raise IndexError(f"link {link} is not one of the {len(self.capacity)} links")


def sequential_sums(value: float, counts: np.ndarray) -> np.ndarray:
    """For each count n, the float that adding `value` (> 0) to 0.0 n times one after the other
    gives (as `np.bincount` or `np.cumsum` add), in O(log n) steps: within one binade of the
    running sum every addition rounds to the same multiple of its ulp, unless `value` is halfway
    between two (then those additions are done one by one, as cumsum does them)."""
    counts = np.asarray(counts, dtype=np.int64)
    wanted = sorted(set(counts.tolist()))
    found: dict[int, float] = {}
    total, done, exact = 0.0, 0, Fraction(value)
    for target in wanted:
        while done < target:
            if total == 0.0:
                total, done = total + value, done + 1
                continue
            exponent = math.frexp(total)[1]  # total in [2^(e-1), 2^e): ulp 2^(e-53)
            ulp = Fraction(2) ** (exponent - 53)
            whole, rest = divmod(exact, ulp)
            if 2 * rest == ulp:  # a tie: round-half-even alternates, so add one by one
                total = float(np.cumsum(np.concatenate(([total], np.full(target - done, value))))[-1])
                done = target
                continue
            step = (whole + (1 if 2 * rest > ulp else 0)) * ulp
            room = (Fraction(2) ** exponent - exact - Fraction(total)) / step  # additions j < room stay inside
            steps = min(math.ceil(room), target - done) if room > 0 else 0
            if steps <= 0:
                total, done = total + value, done + 1
                continue
            total, done = float(Fraction(total) + steps * step), done + steps
        found[target] = total
    return np.array([found[n] for n in counts.tolist()], dtype=float)


@lru_cache(maxsize=16)
def network_for(topology: Topology) -> Network:
    """One Network per topology (building the graph is the slow part; topologies are frozen)."""
    return Network(topology)


def _summed_parts(ids: list[np.ndarray], weights: list[np.ndarray], length: int) -> np.ndarray:
    """Bytes per link of `length` links from parts of (link ids, bytes), each link in one part.
    Each part's bincount spans only its own links' ids (an uplink level's are a few thousand of
    a large system's): adding zeros elsewhere changes no sum."""
    total = np.zeros(length)
    for part, weight in zip(ids, weights):
        if len(part):
            low, high = int(part.min()), int(part.max()) + 1
            total[low:high] += np.bincount(part - low, weights=weight, minlength=high - low)
    return total
