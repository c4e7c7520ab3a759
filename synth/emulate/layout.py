"""What an emulated cluster is made of, computed without touching the machine.

A node (a unit of the second-innermost level) is one network namespace; its ranks talk over
the namespace's loopback. Nodes hang off bridges in one "switch" namespace: one bridge per
unit of every level above the node level, plus a root bridge, joined by veth pairs, so a
3-level topology gets a bridge per rack under a spine bridge. Every link is shaped with a
token-bucket filter (tbf) on the egress of both veth ends, at the topology's bandwidth times
`scale`. Everything lives inside namespaces this layout names, so deleting them removes every
link, bridge and qdisc: that is the whole cleanup story.

Keeping this pure (argv tuples, not actions) lets the tests check the plan without root.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from synth.errors import UsageError
from synth.names import echo, product
from synth.topology import Figure, Level, Topology, Uplinks
from synth.units import format_bandwidth

DEFAULT_NAME = "synth"
SUBNET = "10.213.0.0/16"  # private, and only ever assigned inside namespaces we create
NODE_INTERFACE = "eth0"  # the node namespace's end of its link to the switch
MAX_NODES = 250
# `--scale auto` puts a node's busiest queue (its loopback or its uplink) at this rate:
# 2 cores push several Gbit/s through gloo over loopback, so the shaper, not the CPU, binds.
AUTO_BUDGET = 500e6 / 8  # bytes/s
# tbf: a burst of 1 ms of traffic, never below what one packet needs (veth segments GSO
# packets to its 1500-byte MTU; loopback sends 64 KiB packets), and a queue of 100 ms.
BURST_TIME = 1e-3
MIN_BURST = {"veth": 16 * 1024, "lo": 128 * 1024}
QUEUE_TIME = 0.1

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,23}\Z")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")  # ASCII, no nan/inf
# What tc's token bucket shapes here: slower is not a link, faster than a core can push.
RATE_RANGE = (1e3, 12.5e9)  # bytes/s: 8 kbit/s to 100 Gbit/s


@dataclass(frozen=True)
class Node:
    """One node namespace and the ranks that run in it."""

    index: int
    namespace: str
    interface: str  # what gloo binds to (GLOO_SOCKET_IFNAME)
    address: str  # the interface's IPv4 address, reachable from every node
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Link:
    """One tbf qdisc: the egress of `device` in `namespace`, at `rate` bytes/s."""

    namespace: str
    device: str
    rate: float
    what: str  # which link and direction, for people


@dataclass(frozen=True)
class Cluster:
    """An emulated cluster as recorded in its state file."""

    name: str
    topology: str  # the topology's name
    spec: str  # what load_topology was given (a built-in name or a path)
    level_names: tuple[str, ...]
    sizes: tuple[int, ...]
    scale: float
    namespaces: tuple[str, ...]  # creation order
    nodes: tuple[Node, ...]
    links: tuple[Link, ...]
    complete: bool = True  # False while `up` runs, or after it was killed before finishing

    @property
    def device_count(self) -> int:
        return product(self.sizes)

    def node_of(self, rank: int) -> Node:
        return self.nodes[rank // self.sizes[-1]]

    def to_json(self) -> dict:
        return {"name": self.name, "topology": self.topology, "spec": self.spec, "level_names": list(self.level_names),
                "sizes": list(self.sizes), "scale": self.scale, "namespaces": list(self.namespaces),
                "nodes": [{"index": n.index, "namespace": n.namespace, "interface": n.interface, "address": n.address,
                           "ranks": list(n.ranks)} for n in self.nodes],
                "links": [{"namespace": k.namespace, "device": k.device, "rate": k.rate, "what": k.what}
                          for k in self.links], "complete": self.complete}

    @staticmethod
    def from_json(data: dict) -> "Cluster":
        nodes = tuple(Node(n["index"], n["namespace"], n["interface"], n["address"], tuple(n["ranks"]))
                      for n in data["nodes"])
        links = tuple(Link(k["namespace"], k["device"], float(k["rate"]), k["what"]) for k in data["links"])
        return Cluster(data["name"], data["topology"], data["spec"], tuple(data["level_names"]), tuple(data["sizes"]),
                       float(data["scale"]), tuple(data["namespaces"]), nodes, links, bool(data.get("complete", True)))


@dataclass(frozen=True)
class Blueprint:
    cluster: Cluster
    commands: tuple[tuple[str, ...], ...]  # ip/tc argv, in order; `ip netns add` creates a namespace


# --- scale -------------------------------------------------------------------------------------


def parse_scale(text: str | float | None) -> float | None:
    """'1/2000', '0.0005', '5e-4' into a float; None or 'auto' into None (see auto_scale)."""
    if text is None or (isinstance(text, str) and text.strip().lower() == "auto"):
        return None
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        parts = text.split("/")
        try:
            numbers = [float(part) for part in parts if _DECIMAL.match(part.strip())]
        except ValueError:
            numbers = []
        if len(numbers) not in (1, 2) or (len(numbers) == 2 and numbers[1] == 0) or len(text) > 64:
            raise UsageError(f"{echo(text)} is not a scale: give a factor such as 1/2000, 0.0005 or auto")
        value = numbers[0] / numbers[1] if len(numbers) == 2 else numbers[0]
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"{echo(text)} is not a positive scale: give a factor such as 1/2000")
    return value


def format_scale(scale: float) -> str:
    inverse = 1 / scale
    if 1e-9 < scale < 1 and abs(inverse - round(inverse)) < 1e-9 * inverse:
        return f"1/{round(inverse)}"
    return f"{scale:g}"


def format_rate(bytes_per_second: float) -> str:
    """Links are sold in bits: '250 Mbit/s (31.25 MB/s)'."""
    bits = bytes_per_second * 8
    for step, unit in ((1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s"), (1, "bit/s")):
        if bits >= step or step == 1:
            return f"{bits / step:.4g} {unit} ({format_bandwidth(bytes_per_second)})"
    raise AssertionError("unreachable")


# --- rates -------------------------------------------------------------------------------------


def check_emulable(topology: Topology) -> None:
    if not topology.has_link_figures:
        raise UsageError(f"{topology.name} has no link figures to shape the emulated links with: give a topology "
                         "with bandwidth and latency on every level (e.g. emu-2x4)")
    nodes = product(topology.sizes[:-1])
    if nodes > MAX_NODES:
        raise UsageError(f"{topology.name} has {nodes} nodes; an emulated cluster has at most {MAX_NODES}")


def loopback_rate(topology: Topology) -> float | None:
    """A node's loopback carries every byte its devices send each other once, so it gets the
    devices' aggregate: devices per node x the innermost level's per-device bandwidth."""
    devices = topology.sizes[-1]
    return devices * topology.levels[-1].bandwidth.value if devices > 1 else None


def unit_rate(topology: Topology, level: int) -> float:
    """What one unit of `level` sends to (and receives from) its parent: its uplinks when the
    topology gives them, else each of its devices at the level's per-device bandwidth."""
    spec = topology.levels[level]
    if spec.uplinks is not None:
        return spec.uplinks.count * spec.uplinks.bandwidth.value
    return product(topology.sizes[level + 1:]) * spec.bandwidth.value


def auto_scale(topology: Topology) -> float:
    """1/N, the largest such factor that keeps a node's loopback and uplink within AUTO_BUDGET
    (1 when they already are): ratios are kept, absolute rates fit 2 cores."""
    rates = [rate for rate in (loopback_rate(topology),) if rate]
    if len(topology.levels) > 1:
        rates.append(unit_rate(topology, len(topology.levels) - 2))
    fastest = max(rates, default=0.0)
    return 1.0 if fastest <= AUTO_BUDGET else 1 / math.ceil(fastest / AUTO_BUDGET)


def shaped_topology(topology: Topology, scale: float) -> Topology:
    """The topology as the emulated cluster runs it: every bandwidth times `scale`, latencies
    as given (tbf shapes rates only), so the simulator can predict the emulated runs."""
    note = f" (x{format_scale(scale)} in the emulated cluster)"

    def scaled(figure: Figure | None) -> Figure | None:
        return None if figure is None else Figure(figure.value * scale, figure.source + note)

    levels = []
    for level in topology.levels:
        uplinks = level.uplinks and Uplinks(level.uplinks.count, scaled(level.uplinks.bandwidth))
        levels.append(Level(level.name, level.size, scaled(level.bandwidth), level.latency, uplinks))
    return replace(topology, description=f"{topology.description} Emulated at scale {format_scale(scale)}.",
                   levels=tuple(levels))


def emulated_figures(topology: Topology, scale: float) -> Topology:
    """The topology as the emulated links really behave, for the simulator: tbf shapes each
    unit's uplink (its rate, `unit_rate`) and each node's loopback, never a single device. So
    every level above the devices gets uplinks of one link at the unit's rate and a per-device
    bandwidth of that rate (a device alone may use it all), and the innermost level a fabric
    of the loopback rate, the one queue every intra-node byte crosses once, with that rate per
    device as well. Latencies are kept (tbf shapes rates only)."""
    shaped = shaped_topology(topology, scale)
    note = f" (x{format_scale(scale)} in the emulated cluster)"
    levels = []
    for index, level in enumerate(shaped.levels):
        if index == len(shaped.levels) - 1:
            rate = loopback_rate(shaped)
            if rate is None:
                levels.append(level)
                continue
            figure = Figure(rate, f"emulated node loopback: {topology.sizes[-1]} devices x the level's bandwidth"
                                  f" {format_rate(topology.levels[-1].bandwidth.value)}{note}, one shared queue")
            levels.append(replace(level, bandwidth=figure, fabric=figure))
        else:
            figure = Figure(unit_rate(shaped, index), f"emulated uplink of each {level.name}: the tbf rate of "
                                                      f"its veth{note}, shared by its devices")
            levels.append(replace(level, bandwidth=figure, uplinks=Uplinks(1, figure)))
    return replace(shaped, levels=tuple(levels))


# --- the plan ----------------------------------------------------------------------------------


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise UsageError(f"cluster name {echo(name)}: use up to 24 letters, digits, '-' and '_', starting with a "
                         f"letter or digit")
    return name


def check_rates(topology: Topology, scale: float) -> None:
    """Every link's shaped rate inside RATE_RANGE, or one line with the scales that fit."""
    rates = [rate for rate in (loopback_rate(topology),) if rate]
    rates += [unit_rate(topology, level) for level in range(len(topology.levels) - 1)]
    if not rates:
        return
    low, high = RATE_RANGE
    slowest, fastest = min(rates) * scale, max(rates) * scale
    if slowest < low or fastest > high:
        fits = f"a scale from {format_scale(low / min(rates))} to {format_scale(high / max(rates))}"
        if low / min(rates) > high / max(rates):
            fits = "no single scale (its links differ too much)"
        raise UsageError(f"at scale {format_scale(scale)} {topology.name}'s links would be shaped from "
                         f"{format_rate(slowest)} to {format_rate(fastest)}, outside what tc shapes "
                         f"({format_rate(low)} to {format_rate(high)}): choose {fits}")


def tbf(namespace: str, device: str, rate: float, kind: str) -> tuple[str, ...]:
    burst = max(math.ceil(rate * BURST_TIME), MIN_BURST[kind])
    limit = max(math.ceil(rate * QUEUE_TIME), 4 * burst)
    return ("tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf", "rate", f"{round(rate * 8)}bit",
            "burst", str(burst), "limit", str(limit))


def node_address(index: int) -> str:
    return f"10.213.{index // 250}.{index % 250 + 1}"


def blueprint(topology: Topology, spec: str, scale: float, name: str = DEFAULT_NAME) -> Blueprint:
    """The namespaces, bridges, veth pairs, addresses and tbf qdiscs of `topology` at `scale`."""
    check_name(name)
    check_emulable(topology)
    check_rates(topology, scale)
    sizes, depth = topology.sizes, len(topology.levels)
    devices_per_node = sizes[-1]
    node_count = product(sizes[:-1])
    switch = f"{name}-sw"
    node_namespaces = [f"{name}-n{index}" for index in range(node_count)]
    namespaces = ([switch] if depth > 1 else []) + node_namespaces
    commands: list[tuple[str, ...]] = []
    links: list[Link] = []

    def shape(namespace: str, device: str, rate: float, kind: str, what: str) -> None:
        commands.append(tbf(namespace, device, rate, kind))
        links.append(Link(namespace, device, rate, what))

    for namespace in namespaces:
        commands.append(("ip", "netns", "add", namespace))
        commands.append(("ip", "-n", namespace, "link", "set", "dev", "lo", "up"))
    if depth > 1:
        node_level = depth - 2

        def bridge(level: int, unit: int) -> str:
            """The bridge of unit `unit` of `level` (level -1: the root)."""
            return "br" if level < 0 else f"br{level}-{unit}"

        commands.append(("ip", "-n", switch, "link", "add", "name", "br", "type", "bridge"))
        commands.append(("ip", "-n", switch, "link", "set", "dev", "br", "up"))
        for level in range(node_level):
            rate = unit_rate(topology, level) * scale
            for unit in range(product(sizes[:level + 1])):
                own, parent = bridge(level, unit), bridge(level - 1, unit // sizes[level])
                up, down = f"up{level}-{unit}", f"dn{level}-{unit}"
                unit_name = f"{topology.levels[level].name} {unit}"
                commands += [("ip", "-n", switch, "link", "add", "name", own, "type", "bridge"),
                             ("ip", "-n", switch, "link", "set", "dev", own, "up"),
                             ("ip", "-n", switch, "link", "add", "name", up, "type", "veth", "peer", "name", down),
                             ("ip", "-n", switch, "link", "set", "dev", up, "master", own),
                             ("ip", "-n", switch, "link", "set", "dev", down, "master", parent),
                             ("ip", "-n", switch, "link", "set", "dev", up, "up"),
                             ("ip", "-n", switch, "link", "set", "dev", down, "up")]
                shape(switch, up, rate, "veth", f"{unit_name} uplink, outbound")
                shape(switch, down, rate, "veth", f"{unit_name} uplink, inbound")
        rate = unit_rate(topology, node_level) * scale
        for index, namespace in enumerate(node_namespaces):
            port = f"node{index}"
            parent = bridge(node_level - 1, index // sizes[node_level])
            commands += [("ip", "-n", switch, "link", "add", "name", port, "type", "veth", "peer", "name", NODE_INTERFACE,
                          "netns", namespace),
                         ("ip", "-n", switch, "link", "set", "dev", port, "master", parent),
                         ("ip", "-n", switch, "link", "set", "dev", port, "up"),
                         ("ip", "-n", namespace, "addr", "add", f"{node_address(index)}/16", "dev", NODE_INTERFACE),
                         ("ip", "-n", namespace, "link", "set", "dev", NODE_INTERFACE, "up")]
            shape(namespace, NODE_INTERFACE, rate, "veth", f"node {index} uplink, outbound")
            shape(switch, port, rate, "veth", f"node {index} uplink, inbound")
    loopback = loopback_rate(topology)
    for index, namespace in enumerate(node_namespaces):
        if loopback is not None:
            shape(namespace, "lo", loopback * scale, "lo", f"node {index} loopback (its {devices_per_node} devices)")
    interface, address = (NODE_INTERFACE, node_address) if depth > 1 else ("lo", lambda index: "127.0.0.1")
    nodes = tuple(Node(index, namespace, interface, address(index),
                       tuple(range(index * devices_per_node, (index + 1) * devices_per_node)))
                  for index, namespace in enumerate(node_namespaces))
    cluster = Cluster(name, topology.name, spec, topology.level_names, sizes, scale, tuple(namespaces), nodes,
                      tuple(links))
    return Blueprint(cluster, tuple(commands))
