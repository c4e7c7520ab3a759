"""`synth bench --emulate T`: the same bench, with the launcher swapped for ranks in the node
namespaces of an emulated cluster of T, brought up and down around the run unless one with
that name is already up (then it is used as it is, and left up).

Predictions need figures for the links the ranks really use: without -t/--levels the job's
topology is T with every bandwidth times the cluster's scale (what tbf enforces); with -t the
figures given are used as they are, e.g. a topology calibrated on the emulated cluster.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

from synth.commands.common import resolve_topology
from synth.emulate.host import (EmulationError, bring_up, find_cluster, namespaces, require_host,
                                sigterm_interrupts, tear_down)
from synth.emulate.layout import DEFAULT_NAME, Cluster, format_scale, parse_scale, shaped_topology
from synth.emulate.ranks import run_ranks
from synth.errors import UsageError
from synth.topology import Topology
from synth.topology_file import load_topology


def add_emulate_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("emulated cluster (needs root; see docs/emulate.md)")
    group.add_argument("--emulate", metavar="T",
                       help="run every rank in its node's namespace of an emulated cluster of topology T (gloo); "
                            "-t then defaults to T with its bandwidths scaled as emulated")
    group.add_argument("--scale", metavar="F", help="--emulate: bandwidth factor, e.g. 1/2000 (default auto: a "
                                                    "node's loopback or uplink, whichever is faster, at 500 Mbit/s)")
    group.add_argument("--emulate-name", default=DEFAULT_NAME, metavar="PREFIX",
                       help=f"--emulate: the cluster's name (default {DEFAULT_NAME}); one already up is reused")


Bench = Callable[..., int]


def emulation_requested(args) -> bool:
    if args.emulate is None and args.scale is not None:
        raise UsageError("--scale is for --emulate")
    return args.emulate is not None


def run_emulated(args, bench: Bench) -> int:
    """Run `bench(args, launch, topology, notes, label)` with ranks in the emulated cluster."""
    if args.backend != "gloo":
        raise UsageError("--emulate runs on CPU processes: use --backend gloo")
    scale = parse_scale(args.scale)
    emulated = load_topology(args.emulate)
    given = resolve_topology(args) if (args.topology or args.levels) else None
    if given is not None and given.sizes != emulated.sizes:
        raise UsageError(f"-t {given.name} has levels {_shape(given)} but --emulate {emulated.name} has "
                         f"{_shape(emulated)}: the job must run on the emulated system (or leave -t out)")
    require_host()
    with sigterm_interrupts(), _cluster(emulated, args.emulate, scale, args.emulate_name) as (cluster, reused):
        topology = given or shaped_topology(emulated, cluster.scale)
        how = "reused, left up" if reused else "brought up and down around this run"
        notes = [f"emulated: {cluster.topology} as cluster {cluster.name!r} ({how}) at scale "
                 f"{format_scale(cluster.scale)}; {len(cluster.nodes)} node namespace(s), one rank per process in "
                 f"its node's namespace, links shaped with tc tbf",
                 f"predicted on: {'-t ' + given.name + ' as given' if given else topology.name + ' bandwidths x ' + format_scale(cluster.scale)}"]
        return bench(args, partial(run_ranks, cluster), topology, notes,
                     f"ranks in the namespaces of emulated cluster {cluster.name!r}:")


@contextmanager
def _cluster(topology: Topology, spec: str, scale: float | None, name: str) -> Iterator[tuple[Cluster, bool]]:
    existing = find_cluster(name)
    if existing is not None:
        if (existing.sizes, existing.level_names) != (topology.sizes, topology.level_names):
            raise UsageError(f"emulated cluster {name!r} is up with {existing.topology}, not {topology.name}: "
                             f"run 'synth emulate down --name {name}' or give another --emulate-name")
        if scale is not None and abs(existing.scale - scale) > 1e-12 * scale:
            raise UsageError(f"emulated cluster {name!r} is up at scale {format_scale(existing.scale)}, not "
                             f"{format_scale(scale)}: leave --scale out to use it, or bring it down first")
        if not existing.complete or set(existing.namespaces) - namespaces():
            raise EmulationError(f"emulated cluster {name!r} is only partly there (an 'up' failed or is running): "
                                 f"run 'synth emulate down --name {name}' and try again")
        yield existing, True
        return
    cluster = bring_up(topology, spec, scale, name)
    try:
        yield cluster, False
    finally:
        tear_down(cluster.name)


def _shape(topology: Topology) -> str:
    return ",".join(f"{name}={size}" for name, size in zip(topology.level_names, topology.sizes))
