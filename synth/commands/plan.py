"""`synth plan`: parallelism degrees, placement and programs chosen together for a training step."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from synth.commands.common import (add_constraint_options, add_json_option, add_model_options, add_plot_option,
                                   flagged, positive_int, positive_seconds, print_json, search_memory_bytes)
from synth.errors import UsageError
from synth.names import echo

DEFAULT_TOP = 10


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan", help="degrees, placement and programs of a whole training step, ranked by predicted step time",
        description="Every factorization of the devices into data, tensor and pipeline parallel degrees, every "
                    "placement of those axes on the system, every setting (micro-batch, interleaving, sequence "
                    "parallelism, recomputation, sharded optimizer), each reduction by its fastest synthesized "
                    "program: one training step predicted per candidate (compute, exposed tensor-parallel "
                    "collectives, pipeline bubble and transfers, exposed gradient reduction, optimizer), candidates "
                    "that do not fit in memory dropped, the rest ranked, with the Pareto set of time against memory. "
                    "Axes are named pp, dp, ep, cp, tp for --inside/--factor (ep: the expert-parallel part of dp, "
                    "MoE models). docs/plan.md has the model.")
    parser.add_argument("--topology", "-t", metavar="T", help="built-in topology with a [device] table, or a TOML file")
    parser.add_argument("--model", "-m", metavar="M", help="a preset (see --list-models) or a .toml/.json model file")
    parser.add_argument("--list-models", action="store_true", help="list the built-in models with their sources and exit")
    parser.add_argument("--resize", metavar="LEVEL=N", help="change one level's size, e.g. node=48 (a bigger cluster of the same kind)")
    for role, what in (("dp", "data"), ("tp", "tensor"), ("pp", "pipeline"), ("cp", "context")):
        parser.add_argument(f"--{role}", type=positive_int, metavar="N",
                            help=f"fix the {what}-parallel degree" + (" (default 1; searched when attention dominates the FLOPs)" if role == "cp" else ""))
    parser.add_argument("--ep", type=positive_int, metavar="N",
                        help="fix the expert-parallel degree (MoE models; ep x etp divides tp x cp x dp, an ep "
                             "beyond dp or with cp folds the experts over tensor and context ranks; default: searched)")
    parser.add_argument("--etp", type=positive_int, metavar="N",
                        help="fix the expert tensor-parallel degree (MoE models; Megatron's "
                             "--expert-tensor-parallel-size; default: tp and 1 tried)")
    parser.add_argument("--max-tp", type=positive_int, metavar="N", help="largest tensor-parallel degree to try")
    add_constraint_options(parser)
    parser.add_argument("--micro-batch", metavar="B,B,...", help="micro-batch sizes to try (default: the model's)")
    parser.add_argument("--global-batch", type=positive_int, metavar="N",
                        help="sequences per step (default: the model's; micro-batch 1 unless --micro-batch)")
    parser.add_argument("--virtual-stages", metavar="V,V,...",
                        help="model chunks per pipeline device to try (1: 1F1B; default 1 and every divisor of L/p up to 8)")
    parser.add_argument("--recompute", metavar="R,R,...", default="none,selective,full",
                        help="activation recomputation to try: none, selective, full (default all)")
    parser.add_argument("--sequence-parallel", choices=("on", "off", "both"), default="both",
                        help="sequence parallelism with tensor parallelism (default both)")
    parser.add_argument("--zero1", choices=("on", "off", "both"), default="both",
                        help="sharded optimizer states (ZeRO-1, Megatron's distributed optimizer; default both)")
    parser.add_argument("--zero-stage", metavar="S", default="1",
                        help="ZeRO stages tried with the sharded optimizer: 1, 2 (+ gradients), 3 (+ weights: FSDP), "
                             "comma-separated (default 1)")
    parser.add_argument("--hsdp", choices=("on", "off", "both"), default="off",
                        help="with ZeRO-3: shard inside a node and replicate across nodes (HSDP; default off)")
    parser.add_argument("--offload", choices=("on", "off", "both"), default="both",
                        help="activation offload of all layers but one to host memory (pp 1, no recomputation; "
                             "default both: chosen where it pays)")
    parser.add_argument("--ep-overlap", choices=("on", "off", "both"), default="both",
                        help="MoE: dispatch and combine behind another micro-batch's compute (Megatron's "
                             "--overlap-moe-expert-parallel-comm; needs ep > 1, no full recomputation, interleaving "
                             "with pp > 1; default both: chosen where it pays)")
    parser.add_argument("--no-overlap", action="store_true",
                        help="reduce gradients after backward instead of in buckets behind it")
    parser.add_argument("--no-tp-overlap", action="store_true",
                        help="tensor-parallel collectives on the critical path (default: inside the GEMMs with "
                             "sequence parallelism, Megatron's --tp-comm-overlap)")
    parser.add_argument("--no-param-overlap", action="store_true",
                        help="the sharded optimizer's weight all-gather after the step (default: behind the next "
                             "forward, Megatron's --overlap-param-gather)")
    parser.add_argument("--fp8", action="store_true",
                        help="matmuls in FP8 (Transformer Engine) at the device's FP8 rate; needs a built-in device")
    parser.add_argument("--attention-kernel", choices=("fa2", "fa3"),
                        help="attention kernel's rate (FlashAttention-2 or -3); default: the device's newest")
    parser.add_argument("--efficiency", metavar="F",
                        help="one matmul efficiency (achieved/peak) for every kernel, e.g. 45%%, instead of the kernel "
                             "model; default: kernels by shape on a built-in device, else the topology's figure")
    parser.add_argument("--memory-headroom", metavar="F", default="auto",
                        help="fraction of device memory the allocator may lose to fragmentation: a layout with less "
                             "margin is shown tight, not dropped (default auto: the topology's [device.reserve] "
                             "fragmentation, else the 15%% PyTorch's allocator averaged, docs/plan.md; 0: none)")
    parser.add_argument("--memory-reserve", metavar="SIZE", default="auto",
                        help="bytes per device kept free: auto (default: the CUDA context, cuBLAS's workspace and "
                             "NCCL's buffers per communicator, or the topology's [device.reserve] figures, "
                             "docs/plan.md), a size such as 2GiB, or 0")
    parser.add_argument("--top", "-k", type=positive_int, default=DEFAULT_TOP, metavar="K",
                        help=f"rows to show (default {DEFAULT_TOP})")
    parser.add_argument("--budget", metavar="S",
                        help="refuse searches estimated to take more CPU time (seconds, default 300)")
    parser.add_argument("--launchable", action="store_true",
                        help="keep only layouts Megatron-LM can launch (its rank orders tp-cp-ep-dp-pp, tp-cp-ep-pp-dp)")
    parser.add_argument("--search-memory", metavar="SIZE",
                        help="refuse searches estimated to need more memory, e.g. 4GiB "
                             "(default: 80%% of what this machine has available)")
    parser.add_argument("--export", metavar="FILE", help="write the winner's launch settings (Megatron, DeviceMesh, JAX) as JSON")
    add_model_options(parser)
    add_json_option(parser)
    add_plot_option(parser, "the candidates' step time against memory with the Pareto set, and where the winner's "
                            "step time goes")
    parser.set_defaults(handler=run_plan)


def _choices(text: str, allowed: tuple[str, ...], flag: str) -> tuple[str, ...]:
    values = tuple(part.strip() for part in text.split(",") if part.strip())
    for value in values:
        if value not in allowed:
            raise UsageError(f"{flag} {value!r}: choose from {', '.join(allowed)}")
    if not values:
        raise UsageError(f"{flag} is empty: give one or more of {', '.join(allowed)}")
    return values


def _integers(text: str | None, flag: str) -> tuple[int, ...]:
    """Positive whole numbers in ASCII digits, comma-separated (`²` or 5000 digits are refused)."""
    if text is None:
        return ()
    values = []
    for part in text.split(","):
        try:
            values.append(positive_int(part))
        except argparse.ArgumentTypeError as error:
            raise UsageError(f"{flag}: {error}; give positive integers separated by commas, e.g. 1,2,4") from None
    return tuple(values)


# The device figures a plan accepts: outside these a figure is a typo (a peak of 1e-300 FLOP/s
# gave steps of 1e294 s), refused with the field's name rather than planned with.
DEVICE_RANGES = {
    "peak": (1e9, 1e18, "FLOP/s", "1 GFLOP/s to 1 EFLOP/s, e.g. \"312 TFLOP/s\""),
    "matmul_efficiency": (0.01, 1.0, "", "1% to 100%, e.g. \"46%\""),
    "memory": (float(1 << 26), float(1 << 50), "bytes", "64 MiB to 1 PiB, e.g. \"80 GiB\""),
    "memory_bandwidth": (1e9, 1e15, "bytes/s", "1 GB/s to 1 PB/s, e.g. \"2039 GB/s\""),
}


def check_device_figures(compute, topology_name: str, efficiency_flag: bool, precision: str) -> None:
    """Refuse device figures no accelerator has, naming the field (or --efficiency) and the range."""
    figures = {f"peak.{precision}": compute.peak_flops, "matmul_efficiency": compute.efficiency, "memory": compute.memory_bytes,
               "memory_bandwidth": compute.memory_bandwidth}
    for field, value in figures.items():
        if value is None:
            continue
        low, high, unit, wanted = DEVICE_RANGES[field.split(".")[0]]
        if not low <= value <= high:
            where = "--efficiency" if field == "matmul_efficiency" and efficiency_flag else \
                f"topology {topology_name}: [device] {field}"
            shown = f"{value:.3g}{' ' + unit if unit else ''}"
            raise UsageError(f"{where} = {shown} is outside what a device has: give {wanted}")


def _switch(value: str) -> tuple[bool, ...]:
    return {"on": (True,), "off": (False,), "both": (False, True)}[value]


def resize(topology, text: str):
    """The topology with one level's size changed (`node=48`)."""
    from synth.names import parse_sized_list
    from synth.topology import check_levels

    sized = parse_sized_list(text, "level", "l")
    levels = list(topology.levels)
    for item in sized:
        index = topology.level_index(item.name)
        levels[index] = dataclasses.replace(levels[index], size=item.size)
    check_levels(tuple(levels), f"--resize {text}")
    return dataclasses.replace(topology, levels=tuple(levels),
                               description=f"{topology.description} (resized: {text})")


def _list_models(as_json: bool = False) -> int:
    from synth.plan.formulas import active_parameter_count, parameter_count
    from synth.plan.model import PRESETS, describe_architecture

    if as_json:
        print_json([{"name": name, "parameters": parameter_count(model),
                     "active_parameters": active_parameter_count(model),
                     "architecture": describe_architecture(model), "model": model.to_json()}
                    for name, model in PRESETS.items()])
        return 0
    for name, model in PRESETS.items():
        print(f"{name:16} {parameter_count(model) / 1e9:8.2f}B  L={model.layers} h={model.hidden} a={model.heads} "
              f"g={model.query_groups} f={model.ffn} s={model.seq_len} V={model.vocab} "
              f"batch={model.global_batch}x{model.micro_batch} {model.precision}\n"
              f"{'':16} {describe_architecture(model)}\n{'':16} source: {model.source}")
    return 0


def model_line(model) -> str:
    """The model as priced: parameter count and architecture."""
    from synth.plan.formulas import parameter_count
    from synth.plan.model import describe_architecture

    from synth.plan.formulas import active_parameter_count

    active = f", {active_parameter_count(model) / 1e9:.2f} B active" if model.is_moe else ""
    return (f"{model.name}: {parameter_count(model):,} parameters ({parameter_count(model) / 1e9:.2f} B{active}); "
            f"L={model.layers} h={model.hidden} s={model.seq_len} V={model.vocab}; {describe_architecture(model)}")


def _warn_defaults(spec: str, source) -> None:
    """One short line on stderr naming the architecture keys a model file left to GPT-3's
    defaults (the file name echoed as a literal, cut if long: no markup or escape codes reach the terminal)."""
    print(f"warning: model file {echo(spec)} does not state {', '.join(source.defaulted)}: taking GPT-3's "
          f"{source.defaults_text()}; state them to silence this (docs/plan.md lists the keys)", file=sys.stderr)


def _note_taken(topology) -> None:
    """One line on stderr naming the device figures a topology left to the built-in description."""
    device = topology.device
    print(f"note: topology {echo(topology.name)}: device {echo(device.name)} is the built-in {device.described}; "
          f"took {', '.join(device.taken)} from its description (state them in [device] to override)", file=sys.stderr)


def _zero_stages(text: str) -> tuple[int, ...]:
    stages = tuple(sorted({item.strip() for item in text.split(",")}))
    if not stages or any(stage not in ("1", "2", "3") for stage in stages):
        raise UsageError(f"--zero-stage {text!r}: give ZeRO stages 1, 2 or 3, comma-separated (e.g. 1,3)")
    return tuple(int(stage) for stage in stages)


def build_request(args):
    from synth.placement import parse_factor, parse_inside
    from synth.plan.degrees import DegreeLimits
    from synth.plan.model import read_model
    from synth.plan.search import DEFAULT_BUDGET_S, PlanRequest, SearchSpace
    from synth.plan.step import compute_of
    from synth.topology_file import load_topology, parse_fraction

    if not args.topology:
        raise UsageError("give the system with --topology, e.g. --topology selene (built-ins: synth topologies)")
    if not args.model:
        raise UsageError("give the model with --model, e.g. --model gpt3-2.7b (synth plan --list-models)")
    if args.max_len < 1:
        raise UsageError(f"--max-len {args.max_len}: give a positive number of steps")
    if args.top < 1:
        raise UsageError(f"--top {args.top}: give a positive number of rows")
    if args.export is not None and not args.export.strip():
        raise UsageError("--export '': give the file to write the launch settings to, e.g. --export launch.json")
    topology = load_topology(args.topology)
    if topology.device is not None and topology.device.taken:
        _note_taken(topology)
    if args.resize is not None:
        with flagged("--resize"):
            topology = resize(topology, args.resize)
    source = read_model(args.model, "--model")
    if source.defaulted:
        _warn_defaults(args.model, source)
    model = source.model
    if args.global_batch is not None:
        if args.global_batch < 1:
            raise UsageError(f"--global-batch {args.global_batch}: give a positive number of sequences")
        model = dataclasses.replace(model, global_batch=args.global_batch, micro_batch=1)
    efficiency = parse_fraction(args.efficiency, where="--efficiency") if args.efficiency else None
    from synth.plan.reserve import device_figures

    figures = device_figures(topology.device.reserve if topology.device is not None else ())
    headroom = 0.0
    if args.memory_headroom.strip() == "auto":
        headroom = figures["fragmentation"].value
    elif args.memory_headroom.strip() not in ("0", "0%"):
        headroom = parse_fraction(args.memory_headroom, where="--memory-headroom")
        if headroom >= 1:
            raise UsageError(f"--memory-headroom {args.memory_headroom}: give a fraction below 1, e.g. 15%")
    reserve = _memory_reserve(args.memory_reserve, figures)
    compute = compute_of(topology.device, model.precision, efficiency, topology.name,
                         matmul_precision="fp8" if args.fp8 else None, attention_kernel=args.attention_kernel)
    check_device_figures(compute, topology.name, efficiency is not None, model.precision)
    if reserve is not None and reserve.fixed_bytes >= compute.memory_bytes:
        from synth.units import format_bytes

        raise UsageError(f"--memory-reserve {args.memory_reserve}: the device has {format_bytes(int(compute.memory_bytes))}; "
                         f"reserve less")
    from synth.model.network import check_costable

    check_costable(topology)
    from synth.plan.formulas import attention_dominant

    # Context parallelism is searched by default once attention dominates the layer's FLOPs.
    cp = args.cp if args.cp is not None else (None if attention_dominant(model) else 1)
    limits = DegreeLimits(args.dp, args.tp, args.pp, cp, args.max_tp, args.ep, args.etp)
    constraints = tuple(parse_inside(text) for text in args.inside) + tuple(parse_factor(text) for text in args.factor)
    for constraint in constraints:
        if constraint.axis not in ("pp", "dp", "ep", "cp", "tp"):
            raise UsageError(f"placement constraint on {constraint.axis!r}: the axes are pp, dp, ep, cp and tp")
        topology.level_index(constraint.level)
    micro = _integers(args.micro_batch, "--micro-batch")
    space = SearchSpace(micro_batches=micro, virtual=_integers(args.virtual_stages, "--virtual-stages"),
                        sequence_parallel=_switch(args.sequence_parallel),
                        recompute=_choices(args.recompute, ("none", "selective", "full"), "--recompute"),
                        sharded_optimizer=_switch(args.zero1), overlap_gradients=not args.no_overlap,
                        zero_stages=_zero_stages(args.zero_stage), hsdp=_switch(args.hsdp),
                        tp_overlap=not args.no_tp_overlap,
                        overlap_param_gather=not args.no_param_overlap,
                        activation_offload=_switch(args.offload), ep_overlap=_switch(args.ep_overlap))
    budget = positive_seconds(args.budget, "--budget") if args.budget is not None else DEFAULT_BUDGET_S
    memory = None if args.search_memory is None else search_memory_bytes(args.search_memory)
    from synth.plan.launch import megatron_launchable

    return PlanRequest(model, topology, compute, limits, constraints, space, args.backend, args.max_len, headroom,
                       args.top, budget, memory,
                       placement_filter=megatron_launchable if args.launchable else None, memory_reserve=reserve)


def _memory_reserve(text: str, figures):
    """--memory-reserve: auto (reserve.py's figures, the device's own where its topology gives them), 0 (none) or a size."""
    from synth.plan.reserve import fixed_reserve, reserve_from
    from synth.units import parse_bytes

    if text.strip() == "auto":
        return reserve_from(figures)
    if text.strip() == "0":
        return None
    return fixed_reserve(parse_bytes(text, where="--memory-reserve"), "given with --memory-reserve")


def _flags_for(error):
    """The planner's errors (typed, values only) with the options that change them."""
    from synth.plan.errors import LimitValueError, MissingFigureError, SearchBudgetError

    if isinstance(error, LimitValueError):
        return UsageError(f"--{error.limit.replace('_', '-')} {echo(error.value)}: give a positive integer")
    if isinstance(error, MissingFigureError):
        return UsageError(f"{error} (--efficiency)" if error.figure == "matmul_efficiency" else str(error))
    if not isinstance(error, SearchBudgetError):
        return error
    fixes = {"placements": "fix a degree (--tp, --pp, --dp) or keep axes inside levels (--inside tp=gpu, --factor)",
             "time": "fix a degree (--tp, --pp, --dp), keep axes inside levels (--inside tp=gpu), try fewer settings "
                     "(--micro-batch, --recompute, --virtual-stages), or raise --budget (seconds)",
             "memory": "fix a degree (--tp, --pp, --dp), keep axes inside levels (--inside tp=gpu), or raise "
                       "--search-memory where the machine has more"}[error.over]
    return UsageError(f"{error.facts}: {fixes}")


def run_plan(args) -> int:
    if args.list_models:
        return _list_models(args.json)
    from synth.commands.progress_bar import working
    from synth.plan.search import check_size, estimate, plan

    try:
        request = build_request(args)
        size = estimate(request)
        check_size(size, request)
    except UsageError as error:
        raise _flags_for(error) from None
    from synth.commands.plotting import check_plot

    check_plot(args)
    progress = _progress(size)
    try:
        result = plan(request, progress=progress, size=size)
    finally:
        if progress is not None:
            progress.stop()  # the bar goes before the tables (also when Ctrl-C cut the search short)
    if not result.ranked:
        raise _nothing_fits(result)
    with working("searching a layout Megatron-LM can launch"):  # a second search when no ranked row is one
        launchable = best_launchable(result)
    if args.export:
        _export(args.export, request, result, launchable)
    if args.json:
        print_json(plan_json(result, launchable))
    else:
        _print_tables(result, launchable)
    if args.plot:
        from synth.commands.plotting import plot_plan

        sys.stdout.flush()
        plot_plan(args.plot, result, where_time_goes)
    if result.interrupted_after is not None:
        raise KeyboardInterrupt(f"interrupted after {result.interrupted_after} of {result.size.placements} placement(s): "
                                f"the rows rank the candidates found on those")
    return 0


def best_launchable(result):
    """The fastest candidate Megatron-LM can launch: the winner when it can; else the first such
    row of the ranking; else a second search over launchable layouts only (None if none fits)."""
    from synth.plan.launch import launch_order, megatron_launchable
    from synth.plan.search import plan

    for prediction in result.ranked:
        if launch_order(prediction).order is not None:
            return prediction
    if result.request.placement_filter is not None:
        return None
    # the first search's priced collectives reused: the same topology, so the same figures, not priced twice;
    # and its estimate (a search over fewer placements costs no more: not counted again)
    again = plan(dataclasses.replace(result.request, placement_filter=megatron_launchable, top=1), costs=result.costs,
                 size=result.size)
    return again.ranked[0] if again.ranked else None


def _progress(size):
    """A progress bar on a terminal whenever the search may run over two seconds (progress_bar.py)."""
    from synth.commands.progress_bar import progress_bar

    return progress_bar(f"{size.candidates} candidates", size.placements, size.estimated_s)


def _nothing_fits(result):
    from synth.errors import NoSolutionError
    from synth.units import format_bytes

    smallest = result.smallest_dropped
    if smallest is None:
        return NoSolutionError(f"no candidate for {result.request.model.name} on {result.request.topology.name}: "
                               f"{result.no_placement} degree choice(s) have no placement under the constraints; relax them")
    limit = result.request.memory_limit_for(smallest.degrees)
    return NoSolutionError(
        f"no candidate fits in the memory left per device: {result.dropped_memory} dropped, the smallest needs "
        f"{format_bytes(int(smallest.memory.peak))} where {format_bytes(int(limit))} is left ({smallest.degrees.text}, "
        f"{smallest.settings.text}; {memory_text(result.request, smallest.degrees)}); allow recomputation or the "
        f"sharded optimizer, use more devices, or lower --memory-reserve")


def memory_text(request, degrees=None) -> str:
    """The device's memory and what is kept free of it, with the flags that change it."""
    from synth.units import format_bytes

    total = request.compute.memory_bytes
    parts = [f"{format_bytes(int(total))} per device"]
    reserve = request.memory_reserve
    if reserve is not None:
        if reserve.per_communicator_bytes:
            parts.append(f"{format_bytes(int(reserve.fixed_bytes))} for the CUDA context and cuBLAS's workspace and "
                         f"{format_bytes(int(reserve.per_communicator_bytes))} of NCCL buffers per TP/CP/EP/DP "
                         f"communicator (--memory-reserve)")
        else:
            parts.append(f"{format_bytes(int(reserve.fixed_bytes))} reserved (--memory-reserve)")
    text = ", ".join(parts)
    if degrees is not None:
        text += f": {format_bytes(int(request.memory_limit_for(degrees)))} left for {degrees.text}"
    if request.memory_headroom:
        text += (f"; a layout leaving less than {100 * request.memory_headroom:.3g}% of the device "
                 f"({format_bytes(int(request.memory_headroom * total))}) for allocator fragmentation is tight "
                 f"(--memory-headroom)")
    return text


def _export(path: str, request, result, launchable) -> None:
    from synth.plan.launch import launch_document

    winner = result.ranked[0]
    document = launch_document(request.model, winner, request.topology)
    document = {"format": "synth-launch", "version": 1, "topology": request.topology.name,
                "model": request.model.name, **document}
    if launchable is not winner:
        # The winner's layout is not one Megatron-LM can number; the best one it can, in full.
        document["best_launchable"] = None if launchable is None else {
            "step_s": launchable.step_s, "slower_than_winner": launchable.step_s / winner.step_s - 1,
            **launch_document(request.model, launchable, request.topology)}
    from synth.output_files import write_text

    write_text(path, json.dumps(document, indent=1) + "\n", f"--export {path}")


# --- output ----------------------------------------------------------------------------------------


def _console(stderr: bool = False):
    from synth.commands.terminal import console

    return console(stderr=stderr, piped_width=200)


def _share(part: float, total: float) -> str:
    return f"{100 * part / total:.1f}%"


def where_time_goes(prediction, costs=None) -> list[tuple[str, float, str]]:
    """(what, seconds, where) for every non-zero term of the step, largest first; `where` names
    the groups' levels, the program and (given the search's costs) its busiest link."""
    b = prediction.breakdown

    def at(name: str) -> str:
        return "; then ".join(_route_text(route, prediction, costs) for route in prediction.routes if route.name == name)
    terms = [("compute", b.compute, ""), ("exposed TP", b.tensor_parallel, at("tensor")),
             ("exposed CP", b.context_parallel, at("context")), ("PP bubble", b.pipeline_bubble, ""),
             ("PP p2p", b.pipeline_p2p, at("pipeline")),
             ("exposed DP", b.data_parallel, "; then ".join(part for part in (at("data"), at("expert-data")) if part)),
             ("EP all-to-all", b.expert_parallel, at("expert")),
             ("embedding sync", b.embedding_sync, at("embedding")), ("optimizer", b.optimizer, "")]
    return sorted([term for term in terms if term[1] > 0], key=lambda term: -term[1])


ROLE_OF_ROUTE = {"tensor": ("tp",), "data": ("dp",), "context": ("cp",)}


def _route_text(route, prediction, costs) -> str:
    if not route.levels:
        return route.program
    text = f"{route.levels}: {route.program}"
    axes = route.axes or ROLE_OF_ROUTE.get(route.name)
    if costs is not None and axes:
        link = costs.bottleneck(prediction.placement, axes, route.program.split("; then ")[0], route.bytes)
        if link:
            text += f", busiest link {link}"
    return text


ROUTE_AXES = {**ROLE_OF_ROUTE, "expert": ("ep",), "data-shard": ("dp",)}  # the groups a route's collectives run over


def synthesized_collectives(prediction, costs) -> list[dict]:
    """The step's collectives that run a synthesized program (one that beats the goal's flat
    call in the model), with the gain: route, collective, program, seconds and the flat call's."""
    if costs is None:
        return []
    rows = []
    for route in prediction.routes:
        axes = route.axes or ROUTE_AXES.get(route.name)
        if not axes or not route.levels or (route.name == "data-shard" and prediction.settings.hsdp):
            continue  # HSDP's shard groups are on another placement (not looked up)
        for call in costs.synthesized(prediction.placement, axes, route.program, route.bytes, route.time_s,
                                      route.schedule):
            rows.append({"route": route.name, "collective": call.collective, "program": call.program,
                         "levels": call.levels, "time_s": call.time_s, "flat_time_s": call.default_time_s,
                         "gain": call.gain})
    return rows


def synthesized_text(prediction, costs) -> str:
    from synth.units import format_time

    rows = synthesized_collectives(prediction, costs)
    if not rows:
        return "Synthesized collectives of the winner: none (every collective runs its flat call)"
    lines = ["Synthesized collectives of the winner (beating one flat call of the same collective, in the model):"]
    for row in rows:
        lines.append(f"  {row['route']} {row['collective']}: {row['levels']}: {row['program']}: {row['gain']:.2f}x "
                     f"({format_time(row['time_s'])} against {format_time(row['flat_time_s'])})")
    return "\n".join(lines)


def programs_text(prediction, costs=None) -> str:
    """The program each reduction of the step runs, hidden or not."""
    names = {"tensor": "TP", "data": "DP", "data-shard": "DP shard", "data-replica": "DP replica", "context": "CP",
             "pipeline": "PP", "embedding": "emb", "expert": "EP", "expert-data": "expert DP"}
    return "\n".join(f"{names[route.name]}: {_route_text(route, prediction, costs)}" for route in prediction.routes)


def _print_tables(result, launchable=None) -> None:
    from rich.table import Table

    from synth.units import format_bytes, format_time

    request = result.request
    peak = request.compute.peak_flops
    console = _console()
    title = (f"{request.model.name} on {request.topology.name} ({request.topology.device_count} devices, "
             f"{request.topology.device.name}): {result.evaluated} candidates, {len(result.ranked)} shown")
    caption = (f"{result.size.degrees} degree choices, {result.size.placements} placements; {result.dropped_memory} "
               f"candidates dropped (do not fit in the memory left); "
               f"{result.bounded} stopped by the step-time bound; {request.compute.text}; "
               f"backend {request.backend}; {result.elapsed_s:.1f} s")
    tight = sum(request.tight(prediction) for prediction in result.ranked)
    if tight:
        caption += (f"; {tight} of the {len(result.ranked)} rows tight (less margin than the allocator's "
                    f"fragmentation headroom, --memory-headroom)")
    if result.filtered:
        caption += f"; {result.filtered} placements Megatron-LM cannot launch left out (--launchable)"
    console.print(f"Model {(model_line(request.model))}", highlight=False, soft_wrap=True)
    console.print(f"Memory: {memory_text(request, result.ranked[0].degrees)} (the winner)", highlight=False,
                  soft_wrap=True)
    table = Table(title=(title), caption=(caption))
    for name in ("#", "step", "tokens/s", "MFU", "memory"):
        table.add_column(name, justify="right", no_wrap=True)
    for name in ("degrees", "placement", "settings"):
        table.add_column(name, no_wrap=True)
    table.add_column("where the time goes", overflow="fold")
    table.add_column("programs", overflow="fold")
    for index, prediction in enumerate(result.ranked, 1):
        terms = where_time_goes(prediction)
        split = "\n".join(f"{what} {_share(seconds, prediction.step_s)}" for what, seconds, _ in terms)
        table.add_row(str(index), format_time(prediction.step_s), f"{prediction.tokens_per_s(request.model):,.0f}",
                      f"{100 * prediction.mfu(peak):.1f}%", memory_cell(request, prediction),
                      prediction.degrees.text, prediction.placement.to_text(), prediction.settings.text, split,
                      programs_text(prediction, result.costs))
    console.print(table)
    sure = interval_text(request.topology, result.ranked[0])
    if sure:
        console.print(sure, highlight=False, soft_wrap=True)
    console.print(synthesized_text(result.ranked[0], result.costs), highlight=False, soft_wrap=True)
    from synth.plan.domains import domain_note

    note = domain_note(request.topology, result.ranked[0])
    if note:
        console.print(f"The winner's {note}", highlight=False, soft_wrap=True)
    registration = registration_text(request)
    if registration:
        console.print(registration, highlight=False, soft_wrap=True)
    from synth.plan.gain import gain_text

    gain = gain_text(result.ranked)
    if gain:
        console.print(gain, highlight=False, soft_wrap=True)
    pareto = Table(title="Pareto set: no other candidate is both faster and smaller")
    for name in ("step", "memory", "MFU"):
        pareto.add_column(name, justify="right", no_wrap=True)
    for name in ("degrees", "placement", "settings"):
        pareto.add_column(name, no_wrap=True)
    for prediction in result.pareto:
        pareto.add_row(format_time(prediction.step_s), memory_cell(request, prediction),
                       f"{100 * prediction.mfu(peak):.1f}%", prediction.degrees.text, prediction.placement.to_text(),
                       prediction.settings.text)
    console.print(pareto)
    _print_megatron(console, result, launchable)


def memory_cell(request, prediction) -> str:
    """A row's peak memory; a tight one (reserve.py) with its margin below the device's limit."""
    from synth.units import format_bytes

    text = format_bytes(int(prediction.memory.peak))
    if request.tight(prediction):
        text += f"\ntight: {format_bytes(int(request.margin(prediction)))} margin"
    return text


def _print_megatron(console, result, launchable) -> None:
    """The Megatron-LM launch line of the winner, or, when Megatron cannot number its layout,
    why not and the best layout it can launch."""
    from synth.plan.launch import launch_order, megatron_command
    from synth.units import format_time

    model, winner, topology = result.request.model, result.ranked[0], result.request.topology
    order = launch_order(winner)
    if launchable is winner:
        console.print(f"Megatron-LM: {(megatron_command(model, winner, topology))}\n  rank order: {(order.reason)}"
                      + _dispatcher_line(model, winner, topology), highlight=False, soft_wrap=True)
        return
    console.print(f"Megatron-LM cannot launch the winner: {(order.reason)}", highlight=False, soft_wrap=True)
    if launchable is None:
        console.print("  no layout Megatron-LM can launch fits", highlight=False)
        return
    where = next((f"row {index}" for index, row in enumerate(result.ranked, 1) if row is launchable), "not in the table")
    console.print(
        f"Best launchable ({where}): {format_time(launchable.step_s)}, {100 * (launchable.step_s / winner.step_s - 1):.1f}% "
        f"slower, {launchable.degrees.text} {(launchable.placement.to_text())} {launchable.settings.text}\n"
        f"Megatron-LM: {(megatron_command(model, launchable, topology))}\n"
        f"  rank order: {(launch_order(launchable).reason)}" + _dispatcher_line(model, launchable, topology),
        highlight=False, soft_wrap=True)


def _dispatcher_line(model, prediction, topology) -> str:
    """The MoE dispatcher Megatron-LM runs and what of the plan has no equivalent there."""
    from synth.plan.launch import megatron_dispatcher

    dispatcher = megatron_dispatcher(model, prediction.placement, topology, prediction.degrees.expert_group())
    return f"\n  MoE dispatcher: {dispatcher.statement}" if dispatcher is not None else ""


def interval_text(topology, prediction) -> str | None:
    """The winner's step with a 90% interval of its communication terms where the topology is
    calibrated with fitted spreads (synth/calibrate/plan_interval.py), else None."""
    from synth.calibrate.plan_interval import communication_interval
    from synth.units import format_time

    sure = communication_interval(topology, prediction)
    if sure is None:
        return None
    rest = prediction.step_s - sure.seconds
    return (f"How sure: the winner's step {format_time(prediction.step_s)}, of which communication "
            f"{format_time(sure.seconds)}, 90% interval {format_time(sure.low)}-{format_time(sure.high)} "
            f"(step {format_time(rest + sure.low)}-{format_time(rest + sure.high)}; compute not calibrated) from "
            f"the calibration records nearest each collective, sigma up to {max((s for _, s in sure.sigmas), default=0.0):.3f}")


def _interval_json(topology, prediction) -> dict:
    from synth.calibrate.plan_interval import communication_interval

    sure = communication_interval(topology, prediction)
    if sure is None:
        return {}
    return {"communication_interval_s": {"seconds": sure.seconds, "low": sure.low, "high": sure.high,
                                         "coverage": 0.9, "sigmas": dict(sure.sigmas)}}


def prediction_json(prediction, request, costs=None) -> dict:
    from synth.plan.launch import launch_order, megatron_environment

    order = launch_order(prediction)
    return {**_interval_json(request.topology, prediction),
        "step_s": prediction.step_s, "tokens_per_s": prediction.tokens_per_s(request.model),
        "mfu": prediction.mfu(request.compute.peak_flops), "flops_per_device": prediction.flops_per_device(),
        "degrees": prediction.degrees.to_json(), "placement": prediction.placement.to_text(),
        "axes": list(prediction.degrees.exported_names(prediction.placement.axis_names)),
        "settings": prediction.settings.to_json(),
        "microbatches": prediction.microbatches, "memory": prediction.memory.to_json(),
        "memory_limit_bytes": request.memory_limit_for(prediction.degrees),
        "memory_margin_bytes": request.margin(prediction), "memory_tight": request.tight(prediction),
        "breakdown": prediction.breakdown.to_json(),
        "where": [{"what": what, "seconds": seconds, "where": where}
                  for what, seconds, where in where_time_goes(prediction, costs)],
        "communication": [route.to_json() for route in prediction.routes],
        "synthesized": synthesized_collectives(prediction, costs),
        "megatron_order": order.order, "megatron_launchable": order.order is not None,
        "megatron_environment": megatron_environment(prediction),
        **_dispatcher_json(request, prediction),
    }


def _dispatcher_json(request, prediction) -> dict:
    """For a MoE model: the dispatcher the launch names, whose form the expert term priced."""
    from synth.plan.launch import megatron_dispatcher

    dispatcher = megatron_dispatcher(request.model, prediction.placement, request.topology,
                                     prediction.degrees.expert_group())
    if dispatcher is None:
        return {}
    return {"moe_dispatcher": {"arguments": list(dispatcher.arguments), "form": dispatcher.form,
                               "statement": dispatcher.statement}}


def registration_text(request) -> str | None:
    """Which NCCL release the plan priced and whether its buffers are registered as symmetric
    windows (what 2.27+ runs on its symmetric kernels inside a node); None for another backend."""
    system = request.topology.nccl
    if request.backend != "nccl" or system is None:
        return None
    from synth.model.nccl.names import DEFAULT_VERSION

    version = system.version or DEFAULT_VERSION
    if system.symmetric:
        return (f"NCCL {version}: buffers registered as symmetric windows (ncclCommWindowRegister with "
                f"NCCL_WIN_COLL_SYMMETRIC); calls inside one node run on the symmetric kernels from 2.27, "
                f"reduce-scatters and all-gathers across InfiniBand nodes on the hierarchical ones from 2.29")
    return (f"NCCL {version}: buffers not registered as symmetric windows ([nccl] symmetric = true prices "
            f"registering them)")


def plan_json(result, launchable=None) -> dict:
    request = result.request
    from synth.plan.formulas import active_parameter_count, parameter_count
    from synth.plan.gain import gain_json
    from synth.plan.model import describe_architecture

    return {
        "model": request.model.to_json(), "parameters": parameter_count(request.model),
        "active_parameters": active_parameter_count(request.model),
        "architecture": describe_architecture(request.model),
        "topology": request.topology.name, "devices": request.topology.device_count,
        "device": request.topology.device.name, "peak_flops": request.compute.peak_flops,
        "efficiency": request.compute.efficiency, "compute_model": request.compute.text,
        "memory_limit_bytes": request.memory_limit,
        "memory_bytes": request.compute.memory_bytes, "memory_headroom": request.memory_headroom,
        "memory_reserve": request.memory_reserve.to_json() if request.memory_reserve else None,
        "backend": request.backend, "nccl_registration": registration_text(request),
        "search": result.size.to_json(), "evaluated": result.evaluated,
        "dropped_memory": result.dropped_memory, "bounded": result.bounded, "no_placement": result.no_placement,
        "elapsed_s": result.elapsed_s, "cpu_s": result.cpu_s,
        "ranked": [prediction_json(prediction, request, result.costs) for prediction in result.ranked],
        "pareto": [prediction_json(prediction, request, result.costs) for prediction in result.pareto],
        "best_launchable": None if launchable is None else prediction_json(launchable, request, result.costs),
        "winner_gain": gain_json(result.ranked),
    }
