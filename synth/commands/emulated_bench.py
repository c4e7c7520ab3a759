"""`synth bench --emulate T`: the same bench, with the launcher swapped for ranks in the node
namespaces of an emulated cluster of T, brought up and down around the run unless one with
that name is already up (then it is used as it is, and left up).

Predictions need figures for the links the ranks really use: without -t/--levels the job's
topology is T with every bandwidth times the cluster's scale (what tbf enforces); with -t the
figures given are used as they are, e.g. a topology calibrated on the emulated cluster.
This module is the command-line glue; the cluster and its launcher are synth.emulate's.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from synth.commands.common import flagged, resolve_topology
from synth.errors import UsageError

DEFAULT_NAME = "synth"  # synth.emulate.layout.DEFAULT_NAME, without importing it for --help


def add_emulate_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("emulated cluster (needs root; see docs/emulate.md)")
    group.add_argument("--emulate", metavar="T",
                       help="run every rank in its node's namespace of an emulated cluster of topology T (gloo); "
                            "-t then defaults to T with its bandwidths scaled as emulated")
    group.add_argument("--scale", metavar="F", help="--emulate: bandwidth factor, e.g. 1/2000 (default auto: a "
                                                    "node's loopback or uplink, whichever is faster, at 500 Mbit/s)")
    group.add_argument("--emulate-name", default=DEFAULT_NAME, metavar="PREFIX",
                       help=f"--emulate: the cluster's name (default {DEFAULT_NAME}); one already up is reused")


def check_emulate_options(args) -> bool:
    """Whether the bench runs on an emulated cluster; options that need --emulate refused without it."""
    if args.emulate is None and args.scale is not None:
        raise UsageError("--scale is for --emulate")
    return args.emulate is not None


@contextmanager
def cleanup_hints(option: str) -> Iterator[None]:
    """Emulation errors that a removal or another name cures, with the command that does it."""
    from synth.emulate import ClusterInUse, EmulationError

    try:
        yield
    except ClusterInUse as error:
        raise ClusterInUse(f"{error}: run 'synth emulate down --name {error.cluster}' or give another {option}",
                           error.cluster) from None
    except EmulationError as error:
        if error.cluster is None:
            raise
        raise EmulationError(f"{error}; 'synth emulate down --name {error.cluster}' removes it",
                             error.cluster) from None


def run_emulated(args, bench) -> int:
    """Run `bench(args, launch, topology, notes, label)` with ranks in the emulated cluster."""
    from synth.emulate import cluster_launcher, format_scale, parse_scale, require_host, shaped_topology, use_cluster
    from synth.emulate.host import sigterm_interrupts
    from synth.emulate.layout import check_name
    from synth.topology_file import load_topology

    if args.backend != "gloo":
        raise UsageError("--emulate runs CPU processes: add --backend gloo")
    with flagged("--scale"):
        scale = parse_scale(args.scale)
    with flagged("--emulate-name"):
        check_name(args.emulate_name)
    with flagged("--emulate"):
        emulated = load_topology(args.emulate)
    given = resolve_topology(args) if (args.topology or args.levels) else None
    if given is not None and given.sizes != emulated.sizes:
        raise UsageError(f"-t {given.name} has levels {_shape(given)} but --emulate {emulated.name} has "
                         f"{_shape(emulated)}: the job must run on the emulated system (or leave -t out)")
    require_host()
    with cleanup_hints("--emulate-name"), sigterm_interrupts(), use_cluster(emulated, args.emulate, scale, args.emulate_name) as (cluster,
                                                                                                       reused):
        topology = given or shaped_topology(emulated, cluster.scale)
        how = "reused, left up" if reused else "brought up and down around this run"
        notes = [f"emulated: {cluster.topology} as cluster {cluster.name!r} ({how}) at scale "
                 f"{format_scale(cluster.scale)}; {len(cluster.nodes)} node namespace(s), one rank per process in "
                 f"its node's namespace, links shaped with tc tbf",
                 f"predicted on: {'-t ' + given.name + ' as given' if given else topology.name + ' bandwidths x ' + format_scale(cluster.scale)}"]
        return bench(args, cluster_launcher(cluster), topology, notes,
                     f"ranks in the namespaces of emulated cluster {cluster.name!r}:")


def _shape(topology) -> str:
    return ",".join(f"{name}={size}" for name, size in zip(topology.level_names, topology.sizes))
