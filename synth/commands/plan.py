"""`synth plan`: parallelism degrees, placement and programs chosen together for a training step."""

from __future__ import annotations

import dataclasses
import json
import sys

from synth.commands.common import add_constraint_options, add_json_option, add_model_options, positive_int, print_json
from synth.errors import UsageError

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
                    "Axes are named pp, dp, cp, tp for --inside/--factor. docs/plan.md has the model.")
    parser.add_argument("--topology", "-t", metavar="T", help="built-in topology with a [device] table, or a TOML file")
    parser.add_argument("--model", "-m", metavar="M", help="a preset (see --list-models) or a .toml/.json model file")
    parser.add_argument("--list-models", action="store_true", help="list the built-in models with their sources and exit")
    parser.add_argument("--resize", metavar="LEVEL=N", help="change one level's size, e.g. node=48 (a bigger cluster of the same kind)")
    for role, what in (("dp", "data"), ("tp", "tensor"), ("pp", "pipeline"), ("cp", "context")):
        parser.add_argument(f"--{role}", type=positive_int, metavar="N",
                            help=f"fix the {what}-parallel degree" + (" (default 1; searched when attention dominates the FLOPs)" if role == "cp" else ""))
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
    parser.add_argument("--memory-headroom", metavar="F", default="0",
                        help="fraction of device memory to keep free, e.g. 10%% (default 0)")
    parser.add_argument("--top", "-k", type=positive_int, default=DEFAULT_TOP, metavar="K",
                        help=f"rows to show (default {DEFAULT_TOP})")
    parser.add_argument("--budget", type=float, default=None, metavar="S",
                        help="refuse searches estimated to take longer (seconds, default 300)")
    parser.add_argument("--export", metavar="FILE", help="write the winner's launch settings (Megatron, DeviceMesh, JAX) as JSON")
    add_model_options(parser)
    add_json_option(parser)
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
    if text is None:
        return ()
    values = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise UsageError(f"{flag} {text!r}: give positive integers separated by commas, e.g. 1,2,4")
        values.append(int(part))
    return tuple(values)


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


def _list_models() -> int:
    from synth.plan.model import PRESETS

    for name, model in PRESETS.items():
        from synth.plan.formulas import parameter_count

        print(f"{name:16} {parameter_count(model) / 1e9:8.2f}B  L={model.layers} h={model.hidden} a={model.heads} "
              f"f={model.ffn} s={model.seq_len} V={model.vocab} batch={model.global_batch}x{model.micro_batch} "
              f"{model.precision}\n{'':16} source: {model.source}")
    return 0


def _zero_stages(text: str) -> tuple[int, ...]:
    stages = tuple(sorted({item.strip() for item in text.split(",")}))
    if not stages or any(stage not in ("1", "2", "3") for stage in stages):
        raise UsageError(f"--zero-stage {text!r}: give ZeRO stages 1, 2 or 3, comma-separated (e.g. 1,3)")
    return tuple(int(stage) for stage in stages)


def build_request(args):
    from synth.placement import parse_factor, parse_inside
    from synth.plan.degrees import DegreeLimits
    from synth.plan.model import load_model
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
    topology = load_topology(args.topology)
    if args.resize:
        topology = resize(topology, args.resize)
    model = load_model(args.model)
    if args.global_batch is not None:
        if args.global_batch < 1:
            raise UsageError(f"--global-batch {args.global_batch}: give a positive number of sequences")
        model = dataclasses.replace(model, global_batch=args.global_batch, micro_batch=1)
    efficiency = parse_fraction(args.efficiency, where="--efficiency") if args.efficiency else None
    headroom = 0.0
    if args.memory_headroom.strip() not in ("0", "0%"):
        headroom = parse_fraction(args.memory_headroom, where="--memory-headroom")
        if headroom >= 1:
            raise UsageError(f"--memory-headroom {args.memory_headroom}: keep less than all of the memory free")
    compute = compute_of(topology.device, model.precision, efficiency, topology.name,
                         matmul_precision="fp8" if args.fp8 else None, attention_kernel=args.attention_kernel)
    from synth.model.network import check_costable

    check_costable(topology)
    from synth.plan.formulas import attention_dominant

    # Context parallelism is searched by default once attention dominates the layer's FLOPs.
    cp = args.cp if args.cp is not None else (None if attention_dominant(model) else 1)
    limits = DegreeLimits(args.dp, args.tp, args.pp, cp, args.max_tp)
    constraints = tuple(parse_inside(text) for text in args.inside) + tuple(parse_factor(text) for text in args.factor)
    for constraint in constraints:
        if constraint.axis not in ("pp", "dp", "cp", "tp"):
            raise UsageError(f"placement constraint on {constraint.axis!r}: the axes are pp, dp, cp and tp")
        topology.level_index(constraint.level)
    micro = _integers(args.micro_batch, "--micro-batch")
    space = SearchSpace(micro_batches=micro, virtual=_integers(args.virtual_stages, "--virtual-stages"),
                        sequence_parallel=_switch(args.sequence_parallel),
                        recompute=_choices(args.recompute, ("none", "selective", "full"), "--recompute"),
                        sharded_optimizer=_switch(args.zero1), overlap_gradients=not args.no_overlap,
                        zero_stages=_zero_stages(args.zero_stage), hsdp=_switch(args.hsdp),
                        tp_overlap=not args.no_tp_overlap,
                        overlap_param_gather=not args.no_param_overlap)
    if args.budget is not None and args.budget <= 0:
        raise UsageError(f"--budget {args.budget}: give a positive number of seconds")
    return PlanRequest(model, topology, compute, limits, constraints, space, args.backend, args.max_len, headroom,
                       args.top, args.budget or DEFAULT_BUDGET_S)


def run_plan(args) -> int:
    if args.list_models:
        return _list_models()
    from synth.plan.search import check_size, estimate, plan

    request = build_request(args)
    size = estimate(request)
    check_size(size, request)
    result = plan(request, progress=_progress(size))
    if not result.ranked:
        raise _nothing_fits(result)
    if args.export:
        _export(args.export, request, result)
    if args.json:
        print_json(plan_json(result))
        return 0
    _print_tables(result)
    return 0


def _progress(size):
    """A progress bar on a terminal for searches that take a while; nothing otherwise."""
    if not sys.stderr.isatty() or size.estimated_s < 2:
        return None
    from rich.progress import Progress

    progress = Progress(transient=True, console=_console(stderr=True))
    task = progress.add_task(f"{size.candidates} candidates", total=size.placements)
    progress.start()

    def update(done: int, total: int) -> None:
        progress.update(task, completed=done)
        if done >= total:
            progress.stop()
    return update


def _nothing_fits(result):
    from synth.errors import NoSolutionError
    from synth.units import format_bytes

    smallest = result.smallest_dropped
    if smallest is None:
        return NoSolutionError(f"no candidate for {result.request.model.name} on {result.request.topology.name}: "
                               f"{result.no_placement} degree choice(s) have no placement under the constraints; relax them")
    return NoSolutionError(
        f"no candidate fits in {format_bytes(int(result.request.memory_limit))} per device: {result.dropped_memory} "
        f"dropped, the smallest needs {format_bytes(int(smallest.memory.peak))} ({smallest.degrees.text}, "
        f"{smallest.settings.text}); allow recomputation or the sharded optimizer, or use more devices")


def _export(path: str, request, result) -> None:
    from synth.plan.launch import launch_document

    document = launch_document(request.model, result.ranked[0])
    document = {"format": "synth-launch", "version": 1, "topology": request.topology.name,
                "model": request.model.name, **document}
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1)
            handle.write("\n")
    except OSError as error:
        raise UsageError(f"--export {path!r}: cannot write ({error.strerror})") from None


# --- output ----------------------------------------------------------------------------------------


def _console(stderr: bool = False):
    from rich.console import Console

    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(width=200, stderr=stderr)


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
             ("PP p2p", b.pipeline_p2p, at("pipeline")), ("exposed DP", b.data_parallel, at("data")),
             ("embedding sync", b.embedding_sync, at("embedding")), ("optimizer", b.optimizer, "")]
    return sorted([term for term in terms if term[1] > 0], key=lambda term: -term[1])


ROLE_OF_ROUTE = {"tensor": ("tp",), "data": ("dp",), "context": ("cp",)}


def _route_text(route, prediction, costs) -> str:
    if not route.levels:
        return route.program
    text = f"{route.levels}: {route.program}"
    axes = ROLE_OF_ROUTE.get(route.name)
    if costs is not None and axes:
        link = costs.bottleneck(prediction.placement, axes, route.program.split("; then ")[0], route.bytes)
        if link:
            text += f", busiest link {link}"
    return text


def programs_text(prediction, costs=None) -> str:
    """The program each reduction of the step runs, hidden or not."""
    names = {"tensor": "TP", "data": "DP", "data-shard": "DP shard", "data-replica": "DP replica", "context": "CP",
             "pipeline": "PP", "embedding": "emb"}
    return "\n".join(f"{names[route.name]}: {_route_text(route, prediction, costs)}" for route in prediction.routes)


def _print_tables(result) -> None:
    from rich.table import Table

    from synth.units import format_bytes, format_time

    request = result.request
    peak = request.compute.peak_flops
    console = _console()
    title = (f"{request.model.name} on {request.topology.name} ({request.topology.device_count} devices, "
             f"{request.topology.device.name}): {result.evaluated} candidates, {len(result.ranked)} shown")
    caption = (f"{result.size.degrees} degree choices, {result.size.placements} placements; {result.dropped_memory} "
               f"candidates dropped (do not fit in {format_bytes(int(request.memory_limit))}); "
               f"{result.bounded} stopped by the step-time bound; {request.compute.text}; "
               f"backend {request.backend}; {result.elapsed_s:.1f} s")
    table = Table(title=title, caption=caption)
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
                      f"{100 * prediction.mfu(peak):.1f}%", format_bytes(int(prediction.memory.peak)),
                      prediction.degrees.text, prediction.placement.to_text(), prediction.settings.text, split,
                      programs_text(prediction, result.costs))
    console.print(table)
    pareto = Table(title="Pareto set: no other candidate is both faster and smaller")
    for name in ("step", "memory", "MFU"):
        pareto.add_column(name, justify="right", no_wrap=True)
    for name in ("degrees", "placement", "settings"):
        pareto.add_column(name, no_wrap=True)
    for prediction in result.pareto:
        pareto.add_row(format_time(prediction.step_s), format_bytes(int(prediction.memory.peak)),
                       f"{100 * prediction.mfu(peak):.1f}%", prediction.degrees.text, prediction.placement.to_text(),
                       prediction.settings.text)
    console.print(pareto)
    from synth.plan.launch import megatron_arguments, megatron_order

    winner = result.ranked[0]
    order = megatron_order(winner.placement)
    console.print(f"Megatron-LM: {' '.join(megatron_arguments(request.model, winner))}\n  rank order: {order.reason}",
                  highlight=False, soft_wrap=True)


def prediction_json(prediction, request, costs=None) -> dict:
    from synth.plan.launch import megatron_order

    order = megatron_order(prediction.placement)
    return {
        "step_s": prediction.step_s, "tokens_per_s": prediction.tokens_per_s(request.model),
        "mfu": prediction.mfu(request.compute.peak_flops), "flops_per_device": prediction.flops_per_device(),
        "degrees": prediction.degrees.to_json(), "placement": prediction.placement.to_text(),
        "axes": list(prediction.placement.axis_names), "settings": prediction.settings.to_json(),
        "microbatches": prediction.microbatches, "memory": prediction.memory.to_json(),
        "breakdown": prediction.breakdown.to_json(),
        "where": [{"what": what, "seconds": seconds, "where": where}
                  for what, seconds, where in where_time_goes(prediction, costs)],
        "communication": [dataclasses.asdict(route) for route in prediction.routes],
        "megatron_order": order.order,
    }


def plan_json(result) -> dict:
    request = result.request
    return {
        "model": request.model.to_json(), "topology": request.topology.name, "devices": request.topology.device_count,
        "device": request.topology.device.name, "peak_flops": request.compute.peak_flops,
        "efficiency": request.compute.efficiency, "compute_model": request.compute.text,
        "memory_limit_bytes": request.memory_limit,
        "backend": request.backend, "search": result.size.to_json(), "evaluated": result.evaluated,
        "dropped_memory": result.dropped_memory, "bounded": result.bounded, "no_placement": result.no_placement,
        "elapsed_s": result.elapsed_s,
        "ranked": [prediction_json(prediction, request, result.costs) for prediction in result.ranked],
        "pareto": [prediction_json(prediction, request, result.costs) for prediction in result.pareto],
    }
