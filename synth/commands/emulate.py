"""`synth emulate up|down|status`: a hierarchical cluster of network namespaces on this machine
(see synth.emulate and docs/emulate.md); `synth bench --emulate` runs programs on it."""

from __future__ import annotations

from synth.commands.common import flagged, print_json
from synth.commands.emulated_bench import DEFAULT_NAME, cleanup_hints
from synth.errors import UsageError


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "emulate", help="bring an emulated cluster (network namespaces, shaped links) up or down; needs root",
        description="An emulated hierarchical cluster on this machine: one network namespace per node, nodes "
                    "joined by veth pairs to bridges (racks by a second tier), every link shaped with tc tbf "
                    "to the topology's bandwidth times --scale. Needs root.")
    parser.set_defaults(handler=_missing_action)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")

    up = actions.add_parser("up", help="create the namespaces, bridges and shaped links of a topology",
                            description="Create the emulated cluster of TOPOLOGY and leave it up.")
    up.add_argument("topology", metavar="TOPOLOGY", help="built-in topology name (e.g. emu-2x4) or path to a TOML file")
    up.add_argument("--scale", metavar="F", help="bandwidth factor, e.g. 1/2000 (default auto: a node's loopback or "
                                                 "uplink, whichever is faster, at 500 Mbit/s)")
    _add_name(up)
    up.set_defaults(handler=run_up)

    down = actions.add_parser("down", help="remove an emulated cluster and everything it made",
                              description="Stop the processes left in the cluster's namespaces and delete them "
                                          "(with every link, bridge and qdisc inside), then its state file.")
    _add_name(down)
    down.set_defaults(handler=run_down)

    status = actions.add_parser("status", help="list emulated clusters, their links, rates and counters")
    status.add_argument("--name", metavar="PREFIX", help="only this cluster")
    status.add_argument("--json", action="store_true", help="print JSON instead of tables")
    status.set_defaults(handler=run_status)


def _add_name(parser) -> None:
    parser.add_argument("--name", default=DEFAULT_NAME, metavar="PREFIX",
                        help=f"the cluster's name, prefix of its namespaces (default {DEFAULT_NAME})")


def _missing_action(args) -> int:
    raise UsageError("give an action: up TOPOLOGY, down or status (see synth emulate --help)")


def _check_name(args) -> None:
    from synth.emulate.layout import check_name

    if args.name is not None:
        with flagged("--name"):
            check_name(args.name)


def run_up(args) -> int:
    from synth.emulate.host import bring_up, require_host
    from synth.emulate.layout import parse_scale
    from synth.topology_file import load_topology

    _check_name(args)
    require_host()
    with flagged("--scale"):
        scale = parse_scale(args.scale)
    topology = load_topology(args.topology)
    with cleanup_hints("--name"):
        cluster = bring_up(topology, args.topology, scale, args.name)
    _print(cluster, {})
    print(f"cluster {cluster.name!r} is up; run ranks in it with 'synth bench --emulate {args.topology}"
          f"{'' if cluster.name == DEFAULT_NAME else ' --emulate-name ' + cluster.name} ...'; remove it with "
          f"'synth emulate down{'' if cluster.name == DEFAULT_NAME else ' --name ' + cluster.name}'")
    return 0


def run_down(args) -> int:
    from synth.emulate.host import UnreadableState, tear_down

    _check_name(args)
    with cleanup_hints("--name"):
        cluster = tear_down(args.name)
    if cluster is None:
        print(f"no emulated cluster named {args.name!r} is up; nothing to remove")
    elif isinstance(cluster, UnreadableState):
        print(f"removed cluster {cluster.name!r} by its names (its state file could not be read: {cluster.reason})")
    else:
        print(f"removed cluster {cluster.name!r}: {len(cluster.namespaces)} namespace(s) with their links and qdiscs")
    return 0


def run_status(args) -> int:
    """Every recorded cluster, each on its own: one that an `up` killed half-way shows as
    incomplete, a state file that cannot be read as such, and neither hides the others."""
    from synth.emulate.host import (Cluster, EmulationError, UnreadableState, find_cluster, link_counters, recorded,
                                    require_host)

    _check_name(args)
    require_host()
    if args.name:
        try:
            found = find_cluster(args.name)
        except EmulationError as error:
            found = UnreadableState(args.name, None, str(error))
        listed = [found] if found else []
    else:
        listed = recorded()
    counters = {entry.name: link_counters(entry) for entry in listed if isinstance(entry, Cluster)}
    if args.json:
        print_json([dict(entry.to_json(), counters=[
            {"namespace": namespace, "device": device, **{key: qdisc.get(key) for key in
                                                          ("bytes", "packets", "drops", "overlimits", "backlog")}}
            for (namespace, device), qdisc in counters[entry.name].items()]) if isinstance(entry, Cluster) else
            {"name": entry.name, "complete": False, "unreadable": entry.reason} for entry in listed])
        return 0
    if not listed:
        print("no emulated cluster is up" if not args.name else f"no emulated cluster named {args.name!r} is up")
        return 0
    for entry in listed:
        if isinstance(entry, Cluster):
            _print(entry, counters[entry.name])
        else:
            print(f"cluster {entry.name!r}: INCOMPLETE, its state file cannot be read ({entry.reason}); "
                  f"'synth emulate down --name {entry.name}' removes what it made")
    return 0


def _print(cluster, counters: dict) -> None:
    from rich.table import Table

    from synth.commands.terminal import console as text_console
    from synth.emulate.layout import format_rate, format_scale

    console = text_console(width=200)
    console.print(f"cluster {cluster.name!r}: {cluster.topology} ("
                  + ", ".join(f"{name}={size}" for name, size in zip(cluster.level_names, cluster.sizes))
                  + f") at scale {format_scale(cluster.scale)}"
                  + ("" if cluster.complete else f"; INCOMPLETE: an 'up' is running or was killed; 'synth emulate down "
                                                 f"--name {cluster.name}' removes it"))
    nodes = Table("node", "namespace", "interface", "address", "ranks")
    for node in cluster.nodes:
        nodes.add_row(str(node.index), node.namespace, node.interface, node.address,
                      f"{node.ranks[0]}-{node.ranks[-1]}" if len(node.ranks) > 1 else str(node.ranks[0]))
    console.print(nodes)
    links = Table("link", "namespace", "device", "tbf rate", *(("sent", "drops") if counters else ()))
    for link in cluster.links:
        cells = [link.what, link.namespace, link.device, format_rate(link.rate)]
        if counters:
            qdisc = counters.get((link.namespace, link.device))
            cells += ["missing", ""] if qdisc is None else [f"{qdisc.get('bytes', 0)} B", str(qdisc.get("drops", 0))]
        links.add_row(*cells)
    console.print(links)
