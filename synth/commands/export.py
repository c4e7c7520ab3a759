"""`synth export` (programs and placements as files a cluster runs) and `synth bench` (run
them here with torchrun and write the measurements to results/)."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from synth.commands.common import (Job, add_job_options, hierarchy_for, read_program_text, resolve_job,
                                   resolve_placements, resolve_reduce)
from synth.emulate.bench import add_emulate_options, emulation_requested, run_emulated
from synth.errors import InvalidProgramError, NoSolutionError, UsageError
from synth.execute import report as benchmod
from synth.export import json_plan, mesh, nccl_c, torch_script
from synth.execute.launch import LaunchError, check_nproc, torchrun
from synth.export.plan import PlanEntry, build_plan
from synth.export.provenance import Provenance, hierarchy_metadata, placement_metadata
from synth.hierarchy import SynthesisHierarchy
from synth.language import Program, Step, parse_program
from synth.lowering import lower
from synth.placement import parse_axes
from synth.model.algorithms import BACKENDS
from synth.model.network import check_costable
from synth.analysis.rank import rank_programs
from synth.units import parse_bytes

FORMATS = ("torch", "nccl", "json", "mesh")
EXTENSIONS = {"torch": ".py", "nccl": ".c", "json": ".json", "mesh": ".json"}
DEFAULT_EXPORT_BYTES = 32 * 2**20
DEFAULT_BENCH_BYTES = {"gloo": 2**20, "nccl": 32 * 2**20}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export", help="write programs as a torch script, NCCL C file or JSON plan, or a placement as meshes",
        description="Write programs (or, with --format mesh, the placement) as files a cluster runs. "
                    "Several programs: -o is a directory with one file each, or one torch script with --batch.")
    add_job_options(parser, placement=False)
    parser.add_argument("--placement", "-p", required=True, metavar="M",
                        help="parallelism matrix as JSON rows, e.g. '[[1,2,2],[2,1,2]]'")
    _add_program_options(parser)
    parser.add_argument("--format", "-F", required=True, choices=FORMATS, help="what to write")
    parser.add_argument("--output", "-o", required=True, metavar="PATH", help="file to write (a directory for several files)")
    parser.add_argument("--batch", action="store_true", help="torch: all programs in one script, run in one launch")
    parser.add_argument("--bytes", metavar="S",
                        help="buffer size per device: the one JSON offsets are for, and the one --top ranks at (default 32MiB)")
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="nccl",
                        help="the backend the programs will run on, which --top's ranking models (default nccl)")
    parser.set_defaults(handler=run_export)

    parser = subparsers.add_parser(
        "bench", help="run programs and the default all-reduce with torchrun here; measurements to results/",
        description="Export the programs and the default all-reduce into one torch script, run it with torchrun "
                    "(one process per device), check every result and write time, algbw and busbw to a CSV.")
    add_job_options(parser, placement=True, system_required=False)  # --emulate T may stand for -t T
    _add_program_options(parser)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="torch.distributed backend (default gloo)")
    parser.add_argument("--bytes", metavar="S", help="buffer size per device, e.g. 1MiB (default 1MiB on gloo, 32MiB on nccl)")
    parser.add_argument("-b", "--minbytes", metavar="S", help="smallest size of a sweep, as nccl-tests -b")
    parser.add_argument("-e", "--maxbytes", metavar="S", help="largest size of a sweep, as nccl-tests -e")
    parser.add_argument("-f", "--stepfactor", type=int, default=2, metavar="F", help="sweep factor (default 2)")
    parser.add_argument("--nproc", type=int, metavar="N", help="processes; must equal the device count (the default)")
    parser.add_argument("-n", "--iters", type=int, default=20, metavar="I",
                        help="timed runs per size (nccl-tests -n, default 20)")
    parser.add_argument("-w", "--warmup", type=int, default=5, metavar="W",
                        help="untimed runs first (nccl-tests -w, default 5)")
    parser.add_argument("--results", default="results", metavar="DIR", help="where the CSV goes (default results/)")
    parser.add_argument("--timeout", type=float, default=1800.0, metavar="SECONDS", help="stop torchrun after this long")
    add_emulate_options(parser)
    parser.set_defaults(handler=run_bench)


def _add_program_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--program", action="append", default=[], metavar="TEXT",
                        help="program text, '-' for standard input or @FILE; repeatable")
    parser.add_argument("--top", type=int, metavar="K",
                        help="the K programs the simulator ranks first (needs a topology with link figures)")
    parser.add_argument("--max-len", "-L", type=int, default=5, help="--top: longest program, in steps (default 5)")


# --- shared ------------------------------------------------------------------------------------


def _given_programs(args) -> list[Program]:
    """The --program texts parsed, each once (empty with --top)."""
    if args.top is not None:
        if args.program:
            raise UsageError("give either --program or --top, not both")
        if args.top < 1:
            raise UsageError(f"--top {args.top}: give a positive number of programs")
        return []
    if not args.program:
        raise UsageError("give the programs to run with --program TEXT (repeatable) or --top K")
    programs = []
    for text in args.program:
        program = parse_program(read_program_text(text))
        if not program.steps:
            raise UsageError(f"--program {text!r} has no step")
        if program not in programs:
            programs.append(program)
    return programs


def _top_programs(args, hierarchy: SynthesisHierarchy, topology, sizes, backend: str) -> list[Program]:
    """The simulator's K best programs at each size (their union, best first), for one placement."""
    check_costable(topology)
    programs: list[Program] = []
    for nbytes in sizes:
        rows = rank_programs(hierarchy, topology, nbytes, max_len=args.max_len, top=args.top, backend=backend)
        for row in rows[:args.top]:
            program = parse_program(row.program)
            if program not in programs:
                programs.append(program)
    return programs


def _check_valid(program: Program, hierarchy: SynthesisHierarchy) -> None:
    try:
        lower(program, hierarchy)
    except InvalidProgramError as error:
        raise InvalidProgramError(f"{program}: {error}", error.step_index) from None


def default_all_reduce(hierarchy: SynthesisHierarchy) -> Program:
    """docs/model.md section 8's baseline: one AllReduce over the whole reduction group."""
    return Program((Step("AllReduce", "InsideGroup", hierarchy.level_names[0]),))


def _system_arguments(args) -> list[str]:
    if args.topology:
        return ["--topology", args.topology]
    return ["--levels", args.levels] if args.levels else []


# --- export ------------------------------------------------------------------------------------


def run_export(args) -> int:
    job = resolve_job(args)
    reduce_axes = resolve_reduce(args, job)
    placement = resolve_placements(args, job)[0]
    hierarchy = hierarchy_for(placement, reduce_axes, args.hierarchy)
    if args.format != "torch" and args.batch:
        raise UsageError("--batch is for --format torch")
    if args.format == "mesh":
        if args.program or args.top is not None:
            raise UsageError("--format mesh exports the placement, not programs: drop --program/--top")
        programs = []
    if args.bytes is not None and args.format != "json" and args.top is None:
        raise UsageError("--bytes is for --format json or --top (scripts take --bytes when they run)")
    nbytes = parse_bytes(args.bytes, "--bytes") if args.bytes is not None else DEFAULT_EXPORT_BYTES
    if args.format != "mesh":
        programs = _given_programs(args) or _top_programs(args, hierarchy, job.topology, [nbytes], args.backend)
        for program in programs:
            _check_valid(program, hierarchy)

    argv = ["synth", "export", *_system_arguments(args), "--axes", args.axes, "--reduce", ",".join(reduce_axes),
            "--placement", placement.to_text(), "--hierarchy", hierarchy.kind]
    if args.top is not None:
        argv += ["--top", str(args.top), "--max-len", str(args.max_len), "--backend", args.backend]
    for program in [] if args.top is not None else programs:
        argv += ["--program", str(program)]
    argv += ["--format", args.format] + (["--batch"] if args.batch else [])
    if args.format == "json" or args.top is not None:
        argv += ["--bytes", str(nbytes)]
    argv += ["-o", args.output]
    provenance = Provenance(tuple(argv))
    metadata = placement_metadata(job.topology, placement)

    # Render everything before writing anything.
    if args.format == "mesh":
        metadata.update(hierarchy_metadata(hierarchy))
        files = [mesh.render(placement, provenance, metadata)]
    elif args.format == "json":
        metadata.update(hierarchy_metadata(hierarchy))
        plan = build_plan(PlanEntry(hierarchy, program) for program in programs)
        files = [json_plan.render(plan, provenance, metadata, nbytes)]
    else:
        module = torch_script if args.format == "torch" else nccl_c
        if args.batch:
            files = [module.render(build_plan(PlanEntry(hierarchy, p) for p in programs), provenance)]
        else:
            files = [module.render(build_plan([PlanEntry(hierarchy, program)]), provenance) for program in programs]
    for path in _write(Path(args.output), files, EXTENSIONS[args.format]):
        print(f"wrote {path}")
    return 0


def _write(output: Path, files: list[str], extension: str) -> list[Path]:
    if len(files) == 1:
        paths = [output]
        if output.is_dir():
            raise UsageError(f"-o {output} is a directory; give a file name, e.g. {output / ('program' + extension)}")
    else:
        if output.exists() and not output.is_dir():
            raise UsageError(f"{len(files)} files to write but -o {output} is a file: give a directory "
                             "(or --batch for one torch script)")
        paths = [output / f"program_{index}{extension}" for index in range(len(files))]
    try:
        paths[0].parent.mkdir(parents=True, exist_ok=True)
        for path, text in zip(paths, files):
            path.write_text(text, encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write {error.filename}: {error.strerror}") from None
    return paths


# --- bench -------------------------------------------------------------------------------------


def _bench_sizes(args) -> list[int]:
    if args.minbytes is not None or args.maxbytes is not None:
        if args.bytes is not None:
            raise UsageError("give either --bytes or -b/-e/-f")
        if args.minbytes is None or args.maxbytes is None:
            raise UsageError("give -b and -e together")
        low, high = parse_bytes(args.minbytes, "-b"), parse_bytes(args.maxbytes, "-e")
        if low > high:
            raise UsageError(f"-b {args.minbytes} is larger than -e {args.maxbytes}")
        if args.stepfactor < 2:
            raise UsageError("-f must be at least 2")
        sizes = [low]
        while sizes[-1] * args.stepfactor <= high:
            sizes.append(sizes[-1] * args.stepfactor)
        return sizes
    if args.bytes is not None:
        return [parse_bytes(args.bytes, "--bytes")]
    return [DEFAULT_BENCH_BYTES[args.backend]]


def _bench_entries(args, job, reduce_axes, programs, sizes) -> tuple[list[PlanEntry], list[benchmod.EntryInfo]]:
    """Each program (given, or the simulator's top K for the placement) on each placement
    where it is valid, and each placement's default all-reduce."""
    placements = resolve_placements(args, job)
    entries, infos = [], []
    for placement in placements:
        hierarchy = hierarchy_for(placement, reduce_axes, args.hierarchy)
        if hierarchy.group_size < 2:
            continue
        default, valid = default_all_reduce(hierarchy), 0
        candidates = programs or _top_programs(args, hierarchy, job.topology, sizes, args.backend)
        for program in candidates:
            try:
                lower(program, hierarchy)
            except (InvalidProgramError, UsageError) as error:
                if len(placements) == 1:
                    raise type(error)(f"{program}: {error}") from None
                continue
            valid += 1
            if program != default:
                entries.append(PlanEntry(hierarchy, program))
                infos.append(benchmod.EntryInfo(placement.to_text(), ",".join(hierarchy.level_names), "synthesized", str(program)))
        if valid:
            entries.append(PlanEntry(hierarchy, default))
            infos.append(benchmod.EntryInfo(placement.to_text(), ",".join(hierarchy.level_names), "default all-reduce", str(default)))
    if not entries:
        raise NoSolutionError("no given program is valid on any placement of this request")
    return entries, infos


def run_bench(args) -> int:
    if emulation_requested(args):
        return run_emulated(args, _bench)
    return _bench(args, torchrun)


def _bench(args, launch, topology=None, notes=(), label="torchrun") -> int:
    """The bench, with `launch` in torchrun()'s place and, when given, `topology` for the job's."""
    job = resolve_job(args) if topology is None else Job(topology, parse_axes(args.axes))
    reduce_axes = resolve_reduce(args, job)
    devices = job.topology.device_count
    check_nproc(args.nproc if args.nproc is not None else devices, devices)
    sizes = _bench_sizes(args)
    if args.iters < 1 or args.warmup < 0:
        raise UsageError("--iters must be at least 1 and --warmup at least 0")
    programs = _given_programs(args)
    entries, infos = _bench_entries(args, job, reduce_axes, programs, sizes)
    if args.backend == "nccl":
        _require_gpus(devices)
    plan = build_plan(entries)
    provenance = Provenance(tuple(_bench_argv(args, reduce_axes, programs, sizes)))
    script_args = ["--backend", args.backend, "--check", "--iters", str(args.iters), "--warmup", str(args.warmup)]
    for nbytes in sizes:
        script_args += ["--bytes", str(nbytes)]
    results_dir = Path(args.results)
    csv_path = benchmod.results_path(results_dir)
    log_path = csv_path.with_suffix(".log")
    script_path = csv_path.with_suffix(".py")
    script_path.write_text(torch_script.render(plan, provenance), encoding="utf-8")
    started = datetime.now().astimezone()
    print(f"running {len(plan.programs)} program(s) on {devices} processes ({args.backend}), "
          f"sizes {', '.join(map(str, sizes))} B: {label} {script_path}", file=sys.stderr)
    result = launch(script_path, devices, script_args, timeout=args.timeout)
    log_path.write_text(result.log, encoding="utf-8")
    if result.report is None:
        raise LaunchError(f"{label.rstrip(':')} exited with code {result.returncode} before the script reported; "
                          f"its output is in {log_path}")
    predicted = None
    if job.topology.has_link_figures:
        predicted = benchmod.predictions(entries, job.topology, args.backend, sizes)
        prediction_note = f"predicted: the simulator on {job.topology.name} with the {args.backend} model"
    else:
        prediction_note = f"predicted: none ({job.topology.name} has no link figures to simulate)"
    rows = benchmod.rows_from_report(result.report, infos, predicted)
    header = [f"command: {provenance.command}", f"version: {provenance.version}; torch {result.report.get('torch', '?')}",
              f"date: {started.isoformat(timespec='seconds')}", *benchmod.machine_lines(),
              f"backend: {args.backend}; {devices} processes; {args.iters} iteration(s) after {args.warmup} warm-up run(s); "
              f"float32 sum; times are the slowest rank's mean per run",
              prediction_note, *notes, f"script: {script_path.name}; log: {log_path.name}"]
    benchmod.write_csv(csv_path, rows, header)
    _print_rows(rows)
    _print_nccl_tests(rows)
    print(f"wrote {csv_path}")
    failed = sorted({row.program for row in rows if row.check == "FAILED"})
    if failed or result.returncode != 0:
        raise NoSolutionError(f"check failed for {', '.join(failed) or 'a program'} (exit code {result.returncode}); "
                              f"see {csv_path} and {log_path}")
    return 0


def _bench_argv(args, reduce_axes, programs, sizes) -> list[str]:
    """The command, rebuilt from validated values (programs in canonical form)."""
    argv = ["synth", "bench", *_system_arguments(args), "--axes", args.axes, "--reduce", ",".join(reduce_axes),
            "--hierarchy", args.hierarchy]
    if args.placement:
        argv += ["--placement", args.placement]
    for option in ("inside", "factor"):
        for value in getattr(args, option, []):
            argv += [f"--{option}", value]
    for program in programs:
        argv += ["--program", str(program)]
    if args.top is not None:
        argv += ["--top", str(args.top), "--max-len", str(args.max_len)]
    argv += ["--backend", args.backend, "--iters", str(args.iters), "--warmup", str(args.warmup)]
    if args.emulate is not None:
        argv += ["--emulate", args.emulate, "--emulate-name", args.emulate_name] + (["--scale", args.scale] if args.scale else [])
    if args.minbytes is not None:
        argv += ["-b", str(sizes[0]), "-e", str(sizes[-1]), "-f", str(args.stepfactor)]
    else:
        argv += ["--bytes", str(sizes[0])]
    return argv


def _require_gpus(devices: int) -> None:
    """NCCL needs a GPU; with fewer GPUs than ranks the ranks share them (the script gives each
    its own NCCL_HOSTID, so NCCL connects them over sockets): correct, but not the GPUs' speed."""
    import torch

    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if available < 1:
        raise UsageError("--backend nccl needs a GPU on this machine and torch sees none: use --backend gloo, "
                         "or export with 'synth export --format torch' and run on the cluster")
    if available < devices:
        print(f"note: {devices} ranks share {available} GPU(s), each with its own NCCL_HOSTID (NCCL's socket "
              "transport): the check is real NCCL, the times are not the GPUs' speed", file=sys.stderr)


def _print_nccl_tests(rows: list[benchmod.BenchRow]) -> None:
    """The measurements as nccl-tests prints them, one table per program with its "Avg bus
    bandwidth" line, to hold beside all_reduce_perf's output (programs and torch's all_reduce
    run in place only: out-of-place reads N/A)."""
    from synth.execute.nccl_tests import HEADER, footer, format_row

    programs: dict[tuple[str, str, str], list[benchmod.BenchRow]] = {}
    for row in rows:
        programs.setdefault((row.placement, row.role, row.program), []).append(row)
    for (placement, role, program), group in programs.items():
        print(f"#\n# {role} on placement {placement}: {program}\n{HEADER}")
        values = [{"bytes": row.nbytes, "count": row.count, "type": "float", "time_us": row.seconds * 1e6,
                   "algbw_gbs": row.algbw / 1e9, "busbw_gbs": row.busbw / 1e9,
                   "wrong": {"ok": 0, "FAILED": "FAILED"}.get(row.check)} for row in group]
        for value in values:
            print(format_row(value))
        print(footer(values))


def _print_rows(rows: list[benchmod.BenchRow]) -> None:
    predicted = any(row.prediction is not None for row in rows)
    columns = ["placement", "role", "program", "bytes", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "check", "rank"]
    table = Table(*columns, *(["predicted (us)", "pred. busbw", "sim. rank"] if predicted else []))
    for row in rows:
        cells = [row.placement, row.role, row.program, str(row.nbytes), f"{row.seconds * 1e6:.1f}",
                 f"{row.algbw / 1e9:.3f}", f"{row.busbw / 1e9:.3f}", row.check,
                 "" if row.measured_rank is None else str(row.measured_rank)]
        if predicted:
            p = row.prediction
            cells += ["", "", ""] if p is None else [f"{p.seconds * 1e6:.1f}", f"{p.busbw / 1e9:.3f}", str(p.rank)]
        table.add_row(*cells)
    Console(width=200).print(table)
