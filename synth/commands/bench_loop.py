"""`synth bench --calibrate OUT.toml`: close the loop. After the run, the measured winner at
every size; the run's flat calls (and any probe files given) calibrate the job's topology
(synth/calibrate), written to OUT.toml; and the programs are ranked again on it, saying at how
many sizes the calibrated model's first choice is the measured winner."""

from __future__ import annotations

from synth.commands.common import flagged
from synth.errors import UsageError


def add_loop_options(parser) -> None:
    group = parser.add_argument_group("close the loop")
    group.add_argument("--calibrate", metavar="OUT.toml",
                       help="after the run, calibrate the topology from its flat calls (two sizes or more) and "
                            "--measurements, write it here, and rank the programs again on it")
    group.add_argument("--measurements", action="append", default=[], metavar="FILE",
                       help="--calibrate: more measurements to fit with the run's, e.g. synth probe's CSV; repeatable")


def check_loop_options(args, sizes) -> None:
    if args.calibrate is None:
        if args.measurements:
            raise UsageError("--measurements is for --calibrate")
        return
    if len(sizes) < 2 and not args.measurements:
        raise UsageError("--calibrate fits a latency and a bandwidth: give two sizes or more (e.g. -b 64KiB -e 64MiB) "
                         "or --measurements FILE")


def measured_winners(rows) -> dict[tuple[str, int], object]:
    """Per (placement, bytes), the fastest checked program row."""
    best: dict[tuple[str, int], object] = {}
    for row in rows:
        if row.check != "ok":
            continue
        key = (row.placement, row.nbytes)
        if key not in best or row.seconds < best[key].seconds:
            best[key] = row
    return best


def close_loop(args, job, entries, report, infos, rows, csv_path, sizes) -> None:
    """Print the winners, write the calibrated topology, print the re-ranking."""
    from synth.calibrate import read_measurements
    from synth.execute import report as benchmod
    from synth.output_files import write_text
    from synth.topology_file import render_topology

    winners = measured_winners(rows)
    for (placement, nbytes), row in sorted(winners.items(), key=lambda item: (item[0][0], item[0][1])):
        print(f"measured winner at {nbytes} B ({placement}): {row.program} ({row.role}), {row.seconds * 1e6:.1f} us")
    measurements = []
    spec = args.topology or getattr(args, "emulate", None)
    _, found = read_measurements(str(csv_path), None, spec)
    measurements += found
    for path in args.measurements:
        with flagged("--measurements"):
            measurements += read_measurements(path, None, spec)[1]
    if not measurements:
        raise UsageError(f"--calibrate: {csv_path} has no flat call to fit (its programs are not single calls); "
                         f"give --measurements FILE (e.g. synth probe's CSV)")
    calibrated = calibrate_for(args.backend, measurements, job.topology)
    write_text(args.calibrate, render_topology(calibrated, f"Written by synth bench --calibrate from {csv_path}"
                                                           f"{''.join(', ' + p for p in args.measurements)}"),
               f"--calibrate {args.calibrate}")
    predicted = benchmod.predictions(entries, calibrated, args.backend, sizes)
    again = benchmod.rows_from_report(report, infos, predicted)
    agree = total = 0
    for key, winner in winners.items():
        first = [row for row in again if (row.placement, row.nbytes) == key and row.prediction is not None
                 and row.prediction.rank == 1]
        if first:
            total += 1
            agree += first[0].program == winner.program
    print(f"wrote {args.calibrate}; ranked again on it: its first choice is the measured winner at {agree} of "
          f"{total} size(s)")


def calibrate_for(backend: str, measurements, base):
    """The topology calibrated as `synth calibrate` would for this backend."""
    if backend == "nccl":
        from synth.calibrate.all_to_all import calibrate_with_all_to_all

        return calibrate_with_all_to_all(measurements, base).topology
    from synth.calibrate import calibrate
    from synth.model.backends import resolve_backend

    return calibrate(measurements, base, resolve_backend(backend)).topology
