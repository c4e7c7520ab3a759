"""`synth export` (programs and placements as files a cluster runs) and `synth bench` (run
them here with torchrun, or on an emulated cluster, and write the measurements to -o DIR)."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from synth.commands.common import (resolve_goal, DEFAULT_BACKEND, Job, check_search, add_backend_option, add_bytes_option, add_job_options, add_max_len_option,
                                   add_output_option, add_size_options, add_top_option, echo, flagged, hierarchy_for,
                                   iter_placements, natural_int, one_placement, output_directory, positive_int,
                                   read_program_text, resolve_axes, resolve_job, resolve_reduce, resolve_sizes, seconds)
from synth.errors import InvalidProgramError, NoSolutionError, UsageError
from synth.output_files import write_text

if TYPE_CHECKING:
    from synth.execute import report as benchmod
    from synth.export.plan import PlanEntry
    from synth.goals import Goal
    from synth.hierarchy import SynthesisHierarchy
    from synth.language import Program

FORMATS = ("torch", "nccl", "json", "mesh")
EXTENSIONS = {"torch": ".py", "nccl": ".c", "json": ".json", "mesh": ".json"}
DEFAULT_EXPORT_BYTES = 32 * 2**20
DEFAULT_BENCH_BYTES = {"gloo": 2**20, "nccl": 32 * 2**20}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export", help="write programs as a torch script, NCCL C file or JSON plan, or a placement as meshes",
        description="Write programs (or, with --format mesh, the placement) as files a cluster runs. "
                    "Several programs: -o is a directory with one file each, or one torch script with --batch. "
                    "The placement is --placement, or the one placement --inside/--factor leave.")
    add_job_options(parser, reduce_required=False)
    _add_program_options(parser)
    parser.add_argument("--format", "-F", required=True, choices=FORMATS, help="what to write")
    parser.add_argument("--output", "-o", required=True, metavar="PATH", help="file to write (a directory for several files)")
    parser.add_argument("--batch", action="store_true", help="torch: all programs in one script, run in one launch")
    add_bytes_option(parser, "buffer size per device: the one JSON offsets are for, and the one --top ranks at "
                             "(default 32MiB)")
    add_backend_option(parser, "the backend the programs will run on, which --top's ranking models")
    parser.set_defaults(handler=run_export)

    parser = subparsers.add_parser(
        "bench", help="run programs and the default all-reduce with torchrun here and time them",
        description="Export the programs and the default all-reduce into one torch script, run it with torchrun "
                    "(one process per device), check every result and write time, algbw and busbw to a CSV "
                    "in -o DIR, with the script and the log beside it.")
    add_job_options(parser, placement=True, system_required=False)  # --emulate T may stand for -t T
    _add_program_options(parser)
    add_backend_option(parser, "torch.distributed backend: nccl needs a GPU per process, gloo runs on CPU processes",
                       default=None, default_text="nccl; gloo with --emulate, whose ranks are CPU processes")
    add_size_options(parser, "buffer size per device, e.g. 1MiB (default 1MiB on gloo, 32MiB on nccl)")
    parser.add_argument("--nproc", type=positive_int, metavar="N", help="processes; must equal the device count (the default)")
    parser.add_argument("-n", "--iters", type=positive_int, default=20, metavar="I",
                        help="timed runs per size (nccl-tests -n, default 20)")
    parser.add_argument("-w", "--warmup", type=natural_int, default=5, metavar="W",
                        help="untimed runs first (nccl-tests -w, default 5)")
    add_output_option(parser, "directory for the CSV, the script and the log (default: a new directory under the "
                              "system's temporary directory, printed at the end)")
    parser.add_argument("--timeout", type=seconds, default=1800.0, metavar="SECONDS",
                        help="stop the run after this long (default 1800)")
    from synth.commands.emulated_bench import add_emulate_options

    add_emulate_options(parser)
    from synth.commands.bench_loop import add_loop_options

    add_loop_options(parser)
    parser.set_defaults(handler=run_bench)


def _add_program_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--program", action="append", default=[], metavar="TEXT",
                        help="program text, '-' for standard input or @FILE; repeatable")
    add_top_option(parser, "the K programs the simulator ranks first (needs a topology with link figures)")
    add_max_len_option(parser, "--top: longest program, in steps")


# --- shared ------------------------------------------------------------------------------------


def _given_programs(args) -> list[Program]:
    """The --program texts parsed, each once (empty with --top)."""
    if args.top is not None:
        if args.program:
            raise UsageError("give either --program or --top, not both")
        return []
    if not args.program:
        raise UsageError("give the programs to run with --program TEXT (repeatable) or --top K")
    from synth.language import parse_program

    programs = []
    for text in args.program:
        with flagged("--program"):
            program = parse_program(read_program_text(text))
        if not program.steps:
            raise UsageError(f"--program {echo(text)} has no step")
        if program not in programs:
            programs.append(program)
    return programs


def _top_programs(args, hierarchy: SynthesisHierarchy, topology, sizes, backend: str, goal: Goal) -> list[Program]:
    """The simulator's K best programs of the goal at each size (their union, best first), for
    one placement."""
    from synth.search.rank import Ranker
    from synth.model.context import cost_context
    from synth.model.network import check_costable

    check_search([hierarchy], args.max_len, goal=goal)
    check_costable(topology)
    ranker = Ranker(cost_context(hierarchy, topology, backend), args.max_len, goal=goal)
    programs: list[Program] = []
    for nbytes in sizes:
        for row in ranker.top(nbytes, args.top)[:args.top]:
            if row.program not in programs:
                programs.append(row.program)
    return programs


def _note_flat_call(programs: list[Program], hierarchy: SynthesisHierarchy, goal) -> None:
    """Say so when all the ranking wrote is the framework's own flat call (`--top 1`, or a top K
    of one program): the file then runs the one call NCCL (or gloo) would have made anyway."""
    flat = goal.flat_call(hierarchy.level_names[0])
    if programs == [flat]:
        print(f"note: nothing beats the flat call here: the fastest program is {flat}, the one "
              f"{goal.collective} call over the whole group that the framework makes itself", file=sys.stderr)


def _check_valid(program: Program, hierarchy: SynthesisHierarchy, goal="allreduce") -> None:
    from synth.lowering import lower

    try:
        lower(program, hierarchy, goal)
    except InvalidProgramError as error:
        raise InvalidProgramError(f"{program}: {error}", error.step_index) from None


def _system_arguments(args) -> list[str]:
    if args.topology:
        return ["--topology", args.topology]
    return ["--levels", args.levels] if args.levels else []


# --- export ------------------------------------------------------------------------------------


def run_export(args) -> int:
    from synth.export import json_plan, mesh, nccl_c, torch_script
    from synth.export.plan import PlanEntry, build_plan, check_export_size
    from synth.export.provenance import Provenance, hierarchy_metadata, placement_metadata

    job = resolve_job(args)
    if args.format != "torch" and args.batch:
        raise UsageError("--batch is for --format torch")
    if args.format == "mesh" and (args.program or args.top is not None):
        raise UsageError("--format mesh exports the placement, not programs: drop --program/--top")
    if args.reduce is None and args.format != "mesh":
        raise UsageError(f"--format {args.format} exports reduction programs: give the axes they reduce with --reduce")
    if args.bytes is not None and args.format != "json" and args.top is None:
        raise UsageError("--bytes is for --format json or --top (scripts take --bytes when they run)")
    placement = one_placement(args, job, "export")
    reduce_axes = resolve_reduce(args, job) if args.reduce is not None else None
    # Every format takes every goal: programs given or ranked by --top; the mesh says where the goal's blocks go.
    goal = resolve_goal(args, routed=True)
    if args.format == "mesh" and not goal.is_all_reduce and reduce_axes is None:
        raise UsageError(f"--collective {goal.name} with --format mesh says where its blocks go in each reduction "
                         "group: give the axes it runs over with --reduce")
    hierarchy = hierarchy_for(placement, reduce_axes, args.hierarchy) if reduce_axes else None
    if goal.routed:
        return _export_routed(args, job, placement, hierarchy, goal)
    nbytes = resolve_sizes(args, default=DEFAULT_EXPORT_BYTES)[0] if args.format == "json" or args.top else None
    programs = []
    if args.format != "mesh":
        if args.format in ("torch", "nccl") and not args.program:  # before a ranking, itself per device
            check_export_size(placement.device_count, None, f"--format {args.format}")
        programs = _given_programs(args) or _top_programs(args, hierarchy, job.topology, [nbytes], args.backend, goal)
        if args.format in ("torch", "nccl"):
            check_export_size(placement.device_count, programs, f"--format {args.format}")
        for program in programs:
            _check_valid(program, hierarchy, goal)
        if args.top is not None:
            _note_flat_call(programs, hierarchy, goal)

    argv = ["synth", "export", *_system_arguments(args), "--axes", args.axes]
    if reduce_axes:
        argv += ["--reduce", ",".join(reduce_axes)]
    argv += ["--placement", placement.to_text(), "--hierarchy", args.hierarchy]
    if not goal.is_all_reduce:  # the default goal is not spelled
        argv += ["--collective", goal.name]
    if args.top is not None:
        argv += ["--top", str(args.top), "--max-len", str(args.max_len), "--backend", args.backend]
    for program in [] if args.top is not None else programs:
        argv += ["--program", str(program)]
    argv += ["--format", args.format] + (["--batch"] if args.batch else [])
    if nbytes is not None:
        argv += ["--bytes", str(nbytes)]
    argv += ["-o", args.output]
    provenance = Provenance(tuple(argv))
    metadata = placement_metadata(job.topology, placement)

    # Render everything before writing anything (an error in one file leaves none written);
    # Ctrl-C writes the files rendered before it, each whole.
    several = args.format in ("torch", "nccl") and not args.batch and len(programs) > 1
    total, files, interrupted = len(programs) if several else 1, [], False
    try:
        if args.format == "mesh":
            if hierarchy is not None:
                metadata.update(hierarchy_metadata(hierarchy))
                if not goal.is_all_reduce:
                    metadata["collective"] = mesh.collective_layout(hierarchy, goal)
            files.append(mesh.render(placement, provenance, metadata))
        elif args.format == "json":
            _check_json_size(hierarchy, programs, goal.name)
            metadata.update(hierarchy_metadata(hierarchy))
            plan = build_plan(PlanEntry(hierarchy, program, goal=goal) for program in programs)
            files.append(json_plan.render(plan, provenance, metadata, nbytes))
        else:
            module = torch_script if args.format == "torch" else nccl_c
            if args.batch:
                files.append(module.render(build_plan(PlanEntry(hierarchy, p, goal=goal) for p in programs),
                                           provenance))
            else:
                for program in programs:
                    files.append(module.render(build_plan([PlanEntry(hierarchy, program, goal=goal)]), provenance))
    except KeyboardInterrupt:
        if not files:
            raise KeyboardInterrupt("interrupted before a file was complete: nothing written") from None
        interrupted = True
    written = 0
    try:
        for path in _write(args.output, files, EXTENSIONS[args.format], several):
            written += 1
            print(f"wrote {path}")
    except KeyboardInterrupt:
        interrupted = True
    if interrupted:
        raise KeyboardInterrupt(f"interrupted after writing {written} of {total} file(s) (each whole, through the "
                                f"usual atomic writer); the rest were not written")
    return 0


def _export_routed(args, job, placement, hierarchy, goal) -> int:
    """Dispatch or combine programs (given, or the --top K for the --routing) as a JSON plan of
    their calls (synth/export/routed_plan.py)."""
    from synth.commands.common import resolve_routing
    from synth.export.routed_plan import render, routed_plan

    if args.format != "json":
        raise UsageError(f"--collective {goal.name} exports --format json for now (its runtime reads the plan)")
    routing = resolve_routing(args, goal, required=args.top is not None)
    programs = _given_programs(args)
    if not programs:
        from synth.model.context import cost_context
        from synth.model.network import check_costable
        from synth.search.rank import Ranker

        check_costable(job.topology)
        size = resolve_sizes(args, routing.buffer_bytes)[0]
        ranker = Ranker(cost_context(hierarchy, job.topology, args.backend), args.max_len, goal=goal, routing=routing)
        programs = [row.program for row in ranker.top(size, args.top)[:args.top]]
    argv = ["synth", "export", *_system_arguments(args), "--axes", args.axes, "--reduce", ",".join(hierarchy.reduce_axes),
            "--placement", placement.to_text(), "--hierarchy", args.hierarchy, "--collective", goal.name]
    if args.routing:
        argv += ["--routing", args.routing]
    argv += (["--top", str(args.top)] if args.top is not None else
             [part for program in programs for part in ("--program", str(program))]) + ["--format", "json", "-o", args.output]
    try:
        text = render(routed_plan(hierarchy, goal, programs, routing, argv))
    except InvalidProgramError as error:
        raise InvalidProgramError(f"{error}", error.step_index) from None
    for path in _write(args.output, [text], ".json", False):
        print(f"wrote {path}")
    return 0


MAX_JSON_PLAN_BYTES = 256 << 20  # about 15 s and 1.5 GB to build; 54 MB took 2.7 s and 330 MB


def _check_json_size(hierarchy, programs, goal="allreduce") -> None:
    """Refuse a JSON plan too large to write, before any per-rank work (2^20 ranks ran for
    more than ten minutes without a word)."""
    from synth.export.json_plan import estimated_bytes
    from synth.units import format_bytes

    size = estimated_bytes(hierarchy, programs, goal)
    if size > MAX_JSON_PLAN_BYTES:
        raise UsageError(f"the JSON plan would be about {format_bytes(size)} ({hierarchy.placement.device_count:,} ranks, "
                         f"each listing its group's members at every step; at most {format_bytes(MAX_JSON_PLAN_BYTES)}): "
                         f"use --format torch or nccl, which build the groups at run time, or fewer devices")


def _write(option: str, files: list[str], extension: str, several: bool) -> Iterator[Path]:
    """One file at -o PATH, or (`several`) PATH/program_1.py, program_2.py, ... (numbered from
    1, as every table numbers programs and placements); yields each path once it is written."""
    output = Path(option)
    try:
        if not several:
            paths = [output]
            if output.is_dir():
                raise UsageError(f"-o {echo(option)} is a directory; give a file name, e.g. "
                                 f"{output / ('program' + extension)}")
        else:
            if output.exists() and not output.is_dir():
                raise UsageError(f"{len(files)} files to write but -o {echo(option)} is a file: give a directory "
                                 "(or --batch for one torch script)")
            paths = [output / f"program_{index}{extension}" for index in range(1, len(files) + 1)]
        paths[0].parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"-o {echo(option)}: cannot write it ({error.strerror or error})") from None
    for path, text in zip(paths, files):
        try:
            write_text(path, text, f"-o {path}")
        except OSError as error:
            raise UsageError(f"-o {echo(option)}: cannot write it ({error.strerror or error})") from None
        yield path


# --- bench -------------------------------------------------------------------------------------


def _bench_entries(args, job, reduce_axes, programs, sizes) -> tuple[list[PlanEntry], list[benchmod.EntryInfo]]:
    """Each program (given, or the simulator's top K for the placement) on each placement
    where it is valid, and each placement's default all-reduce (for another --collective, the
    goal's own flat call)."""
    from synth.execute import report as benchmod
    from synth.export.plan import PlanEntry
    from synth.lowering import lower

    goal = resolve_goal(args)
    role = goal.role
    placements = list(iter_placements(args, job))
    entries, infos = [], []
    for placement in placements:
        hierarchy = hierarchy_for(placement, reduce_axes, args.hierarchy)
        if hierarchy.group_size < 2:
            continue
        default, valid = goal.flat_call(hierarchy.level_names[0]), 0
        candidates = programs or _top_programs(args, hierarchy, job.topology, sizes, args.backend, goal)
        for program in candidates:
            try:
                lower(program, hierarchy, goal)
            except (InvalidProgramError, UsageError) as error:
                if len(placements) == 1:
                    raise type(error)(f"{program}: {error}") from None
                continue
            valid += 1
            if program != default:
                entries.append(PlanEntry(hierarchy, program, goal=goal))
                infos.append(benchmod.EntryInfo(placement.to_text(), ",".join(hierarchy.level_names), "synthesized", str(program)))
        if valid:
            entries.append(PlanEntry(hierarchy, default, goal=goal))
            infos.append(benchmod.EntryInfo(placement.to_text(), ",".join(hierarchy.level_names), role, str(default)))
    if not entries:
        raise NoSolutionError("no given program is valid on any placement of this request")
    return entries, infos


def run_bench(args) -> int:
    from synth.commands.emulated_bench import check_emulate_options, run_emulated
    from synth.execute.launch import torchrun

    emulated = check_emulate_options(args)
    if args.backend is None:  # the one default, nccl; an emulated cluster has no GPUs to run it
        args.backend = "gloo" if emulated else DEFAULT_BACKEND
    if emulated:
        return run_emulated(args, bench)
    return bench(args, torchrun)


def bench(args, launch, topology=None, notes=(), label="torchrun") -> int:
    """The bench, with `launch` in torchrun()'s place and, when given, `topology` for the job's
    (what `synth bench --emulate` runs with its own launcher)."""
    from synth.execute import report as benchmod
    from synth.execute.launch import LaunchError, MAX_LOCAL_PROCESSES
    from synth.export import torch_script
    from synth.export.plan import build_plan
    from synth.export.provenance import Provenance
    from synth.placement import check_axes_fit

    if topology is None:
        job = resolve_job(args)
    else:
        job = Job(topology, resolve_axes(args.axes))
        with flagged("--axes"):
            check_axes_fit(job.topology, job.axes)
    if args.reduce is None:
        raise UsageError("give the axes to reduce with --reduce, e.g. --reduce data")
    reduce_axes = resolve_reduce(args, job)
    goal = resolve_goal(args)
    devices = job.topology.device_count
    if args.nproc is not None and args.nproc != devices:
        raise UsageError(f"--nproc {args.nproc} but the placement has {devices} devices: a program runs on exactly "
                         f"one process per device, so give --nproc {devices} (or leave it out)")
    if devices > MAX_LOCAL_PROCESSES:
        raise UsageError(f"{devices} devices is more than {MAX_LOCAL_PROCESSES} local processes: export the programs "
                         f"with 'synth export --format torch --batch' and launch them with torchrun across nodes")
    sizes = resolve_sizes(args, default=DEFAULT_BENCH_BYTES[args.backend])
    from synth.commands.bench_loop import check_loop_options, close_loop

    check_loop_options(args, sizes)
    programs = _given_programs(args)
    entries, infos = _bench_entries(args, job, reduce_axes, programs, sizes)
    _require_torch()
    if args.backend == "nccl":
        _require_gpus(devices)
    directory = output_directory(args.output, "bench")
    plan = build_plan(entries)
    provenance = Provenance(tuple(_bench_argv(args, reduce_axes, programs, sizes)))
    script_args = ["--backend", args.backend, "--check", "--iters", str(args.iters), "--warmup", str(args.warmup)]
    for nbytes in sizes:
        script_args += ["--bytes", str(nbytes)]
    try:
        csv_path = benchmod.results_path(directory)
        log_path = csv_path.with_suffix(".log")
        script_path = csv_path.with_suffix(".py")
        write_text(script_path, torch_script.render(plan, provenance))
    except OSError as error:
        raise UsageError(f"-o {echo(str(directory))}: cannot write there ({error.strerror or error})") from None
    started = datetime.now().astimezone()
    print(f"running {len(plan.programs)} program(s) on {devices} processes ({args.backend}), "
          f"sizes {', '.join(map(str, sizes))} B: {label} {script_path}", file=sys.stderr)
    # Absolute: `-o -x` made the script `-x/...`, which torchrun and python read as an option.
    result = launch(script_path.absolute(), devices, script_args, timeout=args.timeout)
    write_text(log_path, result.log)
    if result.report is None:
        raise LaunchError(f"{label.rstrip(':')} exited with code {result.returncode} before the script reported; "
                          f"its output is in {log_path}")
    predicted = None
    placeholders = placeholder_figures(job.topology)
    if job.topology.has_link_figures:
        predicted = benchmod.predictions(entries, job.topology, args.backend, sizes)
        prediction_note = f"predicted: the simulator on {job.topology.name} with the {args.backend} model"
        if placeholders:
            prediction_note += (f"; CAUTION: {job.topology.name} has placeholder figures ({', '.join(placeholders)}), "
                                f"not calibrated on this machine, so predicted times show the model's ranking, not "
                                f"this machine's speed; calibrate with `synth calibrate` and pass the result with -t")
    else:
        prediction_note = f"predicted: none ({job.topology.name} has no link figures to simulate)"
    rows = benchmod.rows_from_report(result.report, infos, predicted)
    apply_notes = []  # predictions that do not apply to this run, said beside them
    if predicted is not None:
        apply_notes = benchmod.setup_notes(job.topology, args.backend, getattr(args, "emulate", None) is not None,
                                           getattr(args, "scale", None))
        if result.report.get("shared_gpus"):
            apply_notes.append(benchmod.SHARED_GPUS_NOTE.format(topology=job.topology.name))
        far = benchmod.far_off_note(rows, job.topology)
        apply_notes += [far] if far else []
    header = [f"command: {provenance.command}", f"version: {provenance.version}; torch {result.report.get('torch', '?')}",
              f"date: {started.isoformat(timespec='seconds')}", *benchmod.machine_lines(),
              f"backend: {args.backend}; {devices} processes; {args.iters} iteration(s) after {args.warmup} warm-up run(s); "
              f"float32 sum; times are the slowest rank's mean per run",
              prediction_note, *(f"note: {note}" for note in apply_notes), *notes,
              f"script: {script_path.name}; log: {log_path.name}"]
    benchmod.write_csv(csv_path, rows, header)
    _print_rows(rows)
    if predicted is not None and placeholders:
        print(f"note: predicted from placeholder figures of {job.topology.name} ({', '.join(placeholders)}): the "
              f"predicted columns rank the programs but are not this machine's speed; calibrate it "
              f"(`synth calibrate`, docs/calibrate.md) and pass the calibrated file with -t"
              f"{calibrated_hint(job.topology.name)}")
    for note in apply_notes:
        print(f"note: {note}")
    _print_nccl_tests(rows)
    print(f"wrote {csv_path}")
    if args.calibrate is not None and not any(row.check == "FAILED" for row in rows):
        close_loop(args, job, entries, result.report, infos, rows, csv_path, sizes)
    failed = sorted({row.program for row in rows if row.check == "FAILED"})
    if failed or result.returncode != 0:
        raise NoSolutionError(f"check failed for {', '.join(failed) or 'a program'} (exit code {result.returncode}); "
                              f"see {csv_path} and {log_path}")
    return 0


def calibrated_hint(name: str) -> str:
    """Where a calibration of this topology ships (`emu-2x4` -> `emu-2x4-gloo`), if one does."""
    from synth.topology_file import builtin_topology_names, load_topology

    import re

    calibrated = f"{name}-gloo"
    if calibrated not in builtin_topology_names():
        return ""
    scale = re.search(r"at scale ([0-9./]+[0-9])", load_topology(calibrated).description)
    where = f" at scale {scale[1]}" if scale else ""
    return (f"; {calibrated} has figures calibrated on the emulated cluster{where}: --emulate {name}"
            f"{' --scale ' + scale[1] if scale else ''} -t {calibrated}")


def placeholder_figures(topology) -> list[str]:
    """Which figures of `topology` say they are placeholders (level.figure), for the bench's note."""
    found = []
    for level in topology.levels:
        figures = {"bandwidth": level.bandwidth, "latency": level.latency,
                   "uplinks": level.uplinks.bandwidth if level.uplinks else None}
        found += [f"{level.name}.{name}" for name, figure in figures.items()
                  if figure is not None and "placeholder" in figure.source.lower()]
    return found


def _bench_argv(args, reduce_axes, programs, sizes) -> list[str]:
    """The command, rebuilt from validated values (programs in canonical form)."""
    argv = ["synth", "bench", *_system_arguments(args), "--axes", args.axes, "--reduce", ",".join(reduce_axes),
            "--hierarchy", args.hierarchy]
    if getattr(args, "collective", "allreduce") not in (None, "allreduce"):
        argv += ["--collective", resolve_goal(args).name]
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
    if len(sizes) > 1:
        argv += ["-b", str(sizes[0]), "-e", str(sizes[-1]), "-f", str(args.stepfactor or 2)]
    else:
        argv += ["--bytes", str(sizes[0])]
    return argv


def _require_torch() -> None:
    import importlib.util

    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # torch set to None in sys.modules: as good as absent
        found = False
    if not found:
        raise UsageError("synth bench runs programs with torch, which is not installed: pip install "
                         "'hierarchical-collectives-synth[run]' (see the README for the CPU and GPU builds)")


def _require_gpus(devices: int) -> None:
    """NCCL needs a GPU; with fewer GPUs than ranks the ranks share them (the script gives each
    its own NCCL_HOSTID, so NCCL connects them over sockets): correct, but not the GPUs' speed."""
    import torch
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if available < 1:
        raise UsageError("--backend nccl (the default) needs a GPU on this machine and torch sees none: use --backend gloo, "
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
    from rich.table import Table

    from synth.commands.terminal import console

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
    console(width=200).print(table)
