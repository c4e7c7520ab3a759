"""`synth tune`: the fix for stock NCCL, where the model's fastest algorithm and protocol for a
flat call differ from NCCL's own pick: a tuner file for NCCL's example tuner plugin, or the
NCCL_ALGO / NCCL_PROTO settings of the simple case (synth/export/nccl_tuner.py), or per-call
ncclCollConfig_t values for NCCL 2.31+ (synth/export/nccl_coll_config.py)."""

from __future__ import annotations

import sys

from synth.commands.common import flagged, resolve_topology
from synth.errors import UsageError
from synth.output_files import write_text

FORMATS = ("nccl-tuner", "env", "coll-config")
COLLECTIVE_NAMES = {"allreduce": "AllReduce", "allgather": "AllGather", "reducescatter": "ReduceScatter",
                    "broadcast": "Broadcast", "reduce": "Reduce"}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "tune", help="NCCL tuner settings where the model's best algorithm/protocol differs from NCCL's pick",
        description="For each flat communicator of the topology (one per level: the whole system, one of its "
                    "parts, ...) and each collective, compare NCCL's own pick with the fastest pair the model "
                    "predicts at every power-of-two size, and write the overrides as the CSV NCCL's example tuner "
                    "plugin reads (NCCL_TUNER_CONFIG_FILE), or as NCCL_ALGO/NCCL_PROTO when one setting is "
                    "right everywhere.")
    parser.add_argument("--topology", "-t", required=True, metavar="T", help="built-in topology name or path to a TOML file")
    parser.add_argument("--collective", "-c", action="append", default=[], metavar="C",
                        help=f"a collective to tune ({', '.join(COLLECTIVE_NAMES)}); repeatable (default all)")
    parser.add_argument("--format", "-F", choices=FORMATS, default="nccl-tuner",
                        help="nccl-tuner: the example tuner plugin's CSV (default); env: shell exports; "
                             "coll-config: a C function filling ncclCollConfig_t per call (NCCL 2.31+)")
    parser.add_argument("--output", "-o", metavar="PATH", help="file to write (default: standard output)")
    parser.set_defaults(handler=run_tune)


def run_tune(args) -> int:
    from synth.export import nccl_tuner

    topology = resolve_topology(args)
    if not topology.has_link_figures:
        raise UsageError(f"--topology {topology.name}: tuning needs link figures (bandwidth and latency per level)")
    collectives = []
    for name in args.collective:
        with flagged("--collective"):
            key = name.replace("_", "").replace("-", "").lower()
            if key not in COLLECTIVE_NAMES:
                raise UsageError(f"{name!r} is not a collective NCCL's tuner takes: one of {', '.join(COLLECTIVE_NAMES)}")
            collectives.append(COLLECTIVE_NAMES[key])
    if args.format == "coll-config":
        _check_coll_config_version(topology)
    found = nccl_tuner.overrides(topology, tuple(dict.fromkeys(collectives)) or nccl_tuner.COLLECTIVES)
    title = (f"NCCL tuner overrides for {topology.name}, written by synth tune: where the model's fastest "
             f"algorithm/protocol differs from NCCL's own pick ({len(found.rows)} ranges)\n"
             f"format of NVIDIA/nccl plugins/tuner/example: load with NCCL_TUNER_PLUGIN=<its .so> "
             f"NCCL_TUNER_CONFIG_FILE=<this file>")
    if args.format == "coll-config":
        from synth.export import nccl_coll_config

        text = nccl_coll_config.render_c(found.rows, title.split("\n")[0])
    elif args.format == "nccl-tuner":
        settings = nccl_tuner.environment(found)
        if settings:
            title += "\nthe simple case, one setting right everywhere: " + " ".join(f"{k}={v}" for k, v in settings.items())
        text = nccl_tuner.render_csv(found.rows, title)
    else:
        settings = nccl_tuner.environment(found)
        lines = [f"# {line}" for line in title.splitlines()]
        if not found.rows:
            lines.append("# NCCL's pick is the model's fastest everywhere: nothing to set")
        elif not settings:
            lines.append("# no single NCCL_ALGO/NCCL_PROTO is the fastest everywhere: use --format nccl-tuner")
        lines += [f"export {key}={value}" for key, value in settings.items()]
        text = "\n".join(lines) + "\n"
    if args.output:
        write_text(args.output, text, f"-o {args.output}")
        print(f"wrote {args.output}: {len(found.rows)} override(s)")
    else:
        sys.stdout.write(text)
    return 0


def _check_coll_config_version(topology) -> None:
    """ncclCollConfig_t is NCCL 2.31's: a topology pinned to an older release cannot take it."""
    from synth.model.nccl.names import DEFAULT_VERSION
    from synth.model.nccl.versions import COLL_CONFIG_SINCE, at_least

    version = (topology.nccl.version if topology.nccl is not None else None) or DEFAULT_VERSION
    if not at_least(version, COLL_CONFIG_SINCE):
        raise UsageError(f"--format coll-config: ncclCollConfig_t needs NCCL 2.31 or later and --topology "
                         f"{topology.name} sets [nccl] version = {version}; use --format nccl-tuner or env")
