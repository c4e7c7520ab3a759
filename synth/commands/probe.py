"""`synth probe`: write the script that measures the calls which fix a cluster's unknowns
(synth/calibrate/probe.py), and say how to launch it and calibrate from what it writes."""

from __future__ import annotations

import sys

from synth.commands.common import BACKEND_NAMES, DEFAULT_BACKEND, flagged
from synth.errors import UsageError


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "probe", help="write a short script that measures what calibration needs on a cluster",
        description="Write one script that times, with torch.distributed, an all-reduce across every level (its "
                    "floor and bandwidth at four sizes) and the flat call of every collective, and writes them as "
                    "CSV for `synth calibrate FILE --topology T`. Prints its torchrun and srun launch lines and "
                    "the same calls as nccl-tests command lines.")
    parser.add_argument("--topology", "-t", required=True, metavar="T",
                        help="the cluster (built-in name or TOML file); rank r of the launch is its device r")
    parser.add_argument("--output", "-o", metavar="probe.py", help="write the script here (default: print it)")
    parser.add_argument("--backend", choices=BACKEND_NAMES, default=DEFAULT_BACKEND,
                        help=f"the script's default backend: nccl on GPUs, gloo to try it on CPUs (default "
                             f"{DEFAULT_BACKEND})")
    parser.add_argument("--sizes", metavar="B,B,...",
                        help="sizes to time, e.g. 8KiB,512KiB,32MiB,2GiB (the default; at least two)")
    parser.set_defaults(handler=run_probe)


def run_probe(args) -> int:
    from synth.calibrate.probe import PROBE_SIZES
    from synth.commands.probe_script import launch_lines, nccl_tests_lines, probe_script
    from synth.topology_file import load_topology
    from synth.units import parse_bytes

    with flagged("--topology"):
        topology = load_topology(args.topology)
    sizes = PROBE_SIZES
    if args.sizes is not None:
        with flagged("--sizes"):
            try:
                sizes = tuple(sorted({parse_bytes(part.strip()) for part in args.sizes.split(",") if part.strip()}))
            except (ValueError, UsageError) as error:
                raise UsageError(f"{args.sizes!r} is not a list of sizes ({error}); write e.g. 8KiB,512KiB,32MiB,2GiB"
                                 ) from None
    script_name = args.output or "probe.py"
    with flagged("--sizes"):
        text = probe_script(topology, args.backend, sizes, script_name, "probe.csv")
    if args.output:
        from synth.output_files import write_text

        write_text(args.output, text, f"-o {args.output}")
    else:
        sys.stdout.write(text)
    stream = sys.stdout if args.output else sys.stderr
    print(f"launch ({topology.name}, rank r = device r):", file=stream)
    for line in launch_lines(topology, script_name, "probe.csv"):
        print(f"  {line}", file=stream)
    print("or, with nccl-tests built:", file=stream)
    for line in nccl_tests_lines(topology, sizes):
        print(f"  {line}", file=stream)
    print(f"then: synth calibrate probe.csv --topology {args.topology} -o calibrated.toml", file=stream)
    return 0
