"""Synthesized reductions in JAX: a program as the body of a `shard_map` over a mesh whose axes
are the reduced axis split per level (docs/training.md).

    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("node", "gpu"))   # data=8 as node x gpu
    body = program_body("ReduceScatter(InsideGroup(gpu)); AllReduce(Parallel(node)); "
                        "AllGather(InsideGroup(gpu))", hierarchy)
    reduce = shard_map(body, mesh=mesh, in_specs=P(("node", "gpu")), out_specs=P(("node", "gpu")))

Each device's block is its buffer, of a length divisible by N (the group size). A step over
the members that vary at levels L (InsideGroup(l): l and every level inside it; Parallel(l):
l alone) is one collective over the mesh axes of L, outermost first, which is also the order
in which the program numbers the members: AllReduce is `psum`, ReduceScatter
`psum_scatter(..., tiled=True)` (member i keeps block i, as the program's ReduceScatter does)
and AllGather `all_gather(..., tiled=True)` (blocks joined in member order). So the body's
buffer is always the chunk range the program's semantics gives that member, and after the
last step every device holds the sum over its group, as one `psum` over all the axes would.

What cannot be expressed: Reduce and Broadcast (JAX's collectives have no root: every device
of the named axes takes part and gets the same result) and Master steps (a collective over an
axis cannot leave devices of it out). `expressible(program)` says whether a program can run;
for the others, choose the best program made of ReduceScatter, AllReduce and AllGather over
InsideGroup/Parallel (`best_expressible`, the ranking restricted to those), or run the
reduction as one `psum`, which XLA lowers to the backend's own all-reduce.
"""

from __future__ import annotations

from synth.errors import UsageError
from synth.language import Program, parse_program

PRIMITIVES = {"AllReduce": "psum", "ReduceScatter": "psum_scatter", "AllGather": "all_gather"}
FORMS = ("InsideGroup", "Parallel")


def why_not_expressible(program: Program) -> str | None:
    """None when every step maps to psum/psum_scatter/all_gather, else the reason."""
    for index, step in enumerate(program.steps):
        if step.collective not in PRIMITIVES:
            return (f"step {index + 1} ({step}) is a {step.collective}: JAX's collectives have no root, every device "
                    "of the named axes takes part and gets the result")
        if step.form not in FORMS:
            return (f"step {index + 1} ({step}) is a {step.form} step: a JAX collective over a mesh axis cannot "
                    "leave some of its devices out")
    return None


def expressible(program: Program | str) -> bool:
    return why_not_expressible(parse_program(program) if isinstance(program, str) else program) is None


def step_axes(step, level_names: tuple[str, ...], axis_names: dict) -> tuple[str, ...]:
    """The mesh axes a step's groups vary over, outermost first."""
    level = level_names.index(step.level)
    levels = level_names[level:] if step.form == "InsideGroup" else (step.level,)
    axes: list[str] = []
    for name in levels:
        mapped = axis_names.get(name, name)
        axes += [mapped] if isinstance(mapped, str) else list(mapped)
    return tuple(axes)


def program_body(program: Program | str, hierarchy, axis_names: dict | None = None):
    """The function to give shard_map: x (this device's buffer, 1-D or with its first dimension
    divisible by N) to x reduced over the group by `program`. `axis_names` maps a hierarchy
    level to its mesh axis name (or tuple of names), by default the level's own name.
    Raises InvalidProgramError for a program that is not valid on `hierarchy`, UsageError
    for one JAX cannot express."""
    import jax

    from synth.lowering import lower

    program = parse_program(program) if isinstance(program, str) else program
    lower(program, hierarchy)  # InvalidProgramError unless valid
    reason = why_not_expressible(program)
    if reason:
        raise UsageError(f"{program} cannot run in shard_map: {reason}; choose a program of ReduceScatter, "
                         "AllReduce and AllGather over InsideGroup/Parallel (synth.jax.best_expressible)")
    names = tuple(hierarchy.level_names)
    axis_names = dict(axis_names or {})
    plan = [(step.collective, step_axes(step, names, axis_names)) for step in program.steps]
    group_size = hierarchy.group_size

    def body(x):
        if x.shape[0] % group_size:
            raise ValueError(f"the buffer's first dimension ({x.shape[0]}) must be divisible by the group size "
                             f"{group_size}: pad it, or reduce the tail with one psum")
        for collective, axes in plan:
            if collective == "AllReduce":
                x = jax.lax.psum(x, axes)
            elif collective == "ReduceScatter":
                x = jax.lax.psum_scatter(x, axes, scatter_dimension=0, tiled=True)
            else:
                x = jax.lax.all_gather(x, axes, axis=0, tiled=True)
        return x

    return body


def best_expressible(hierarchy, topology, nbytes: int, backend: str = "nccl", max_len: int = 5) -> str:
    """The fastest program JAX can express at `nbytes` per device, by the simulator's ranking."""
    from synth.analysis.rank import rank_programs
    from synth.model.context import cost_context

    for row in rank_programs(cost_context(hierarchy, topology, backend), nbytes, max_len=max_len):
        if expressible(str(row.program)):
            return str(row.program)
    raise UsageError("no program of ReduceScatter, AllReduce and AllGather is valid here")  # the default always is


def shard_map_function(mesh, body, axes: tuple[str, ...]):
    """`body` under shard_map on `mesh`, the input's first dimension sharded over `axes`."""
    import jax
    from jax.sharding import PartitionSpec

    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:  # jax < 0.6
        from jax.experimental.shard_map import shard_map
    spec = PartitionSpec(tuple(axes))
    return shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec)
