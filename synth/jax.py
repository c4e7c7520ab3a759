"""Synthesized collectives in JAX: a program as the body of a `shard_map` over a mesh whose axes
are the reduced axis split per level (docs/training.md).

    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("node", "gpu"))   # data=8 as node x gpu
    body = program_body("ReduceScatter(InsideGroup(gpu)); AllReduce(Parallel(node)); "
                        "AllGather(InsideGroup(gpu))", hierarchy)
    reduce = shard_map(body, mesh=mesh, in_specs=P(("node", "gpu")), out_specs=P(("node", "gpu")))

Each device's block is its buffer, of a length divisible by N (the group size). A step over
the members that vary at levels L (InsideGroup(l): l and every level inside it; Parallel(l):
l alone) is one collective over the mesh axes of L, outermost first, which is also the order
in which the program numbers the members: AllReduce is `psum`, ReduceScatter
`psum_scatter(..., tiled=True)` (member i keeps block i, as the program's ReduceScatter does),
AllGather `all_gather(..., tiled=True)` (blocks joined in member order) and AllToAll
`all_to_all(..., tiled=True)` (piece j to member j, pieces joined in member order). A
`Permute` reorders the buffer's N chunks by a constant index (a local copy); on one chunk (an
all-gather's input) it changes nothing the device holds. So the body's buffer is always the
chunk range the program's semantics gives that member, and after the last step every device
holds what the goal's one JAX collective over all the axes, outermost first, gives it:

| goal | the JAX call the body equals |
|---|---|
| allreduce | `psum(x, axes)` |
| reducescatter | `psum_scatter(x, axes, scatter_dimension=0, tiled=True)` |
| allgather | `all_gather(x, axes, axis=0, tiled=True)` |
| alltoall | `all_to_all(x, axes, split_axis=0, concat_axis=0, tiled=True)` |

`collective_body(program, hierarchy, collective, axis_name=..., tiled=..., ...)` takes the
arguments of the call it replaces and raises where the program's result would differ from it:
axes in another order (the blocks would be numbered another way), `tiled=False`, another
dimension than 0, a buffer whose first dimension is not a multiple of N.

What cannot be expressed: Reduce and Broadcast (JAX's collectives have no root: every device
of the named axes takes part and gets the same result), so neither the broadcast and reduce
goals nor programs using those steps, and Master steps (a collective over an axis cannot
leave devices of it out). `expressible(program)` says whether a program can run; for the
all-reduce, choose the best program made of ReduceScatter, AllReduce and AllGather over
InsideGroup/Parallel (`best_expressible`, the ranking restricted to those), or run the
reduction as one `psum`, which XLA lowers to the backend's own all-reduce.
"""

from __future__ import annotations

from synth.errors import UsageError
from synth.goals import GOALS, OWN_BLOCK, parse_goal
from synth.language import Program, parse_program

PRIMITIVES = {"AllReduce": "psum", "ReduceScatter": "psum_scatter", "AllGather": "all_gather",
              "AllToAll": "all_to_all"}
FORMS = ("InsideGroup", "Parallel")
# The goal's one JAX collective, which a body of that goal equals (the table above).
REFERENCES = {name: goal.jax_call for name, goal in GOALS.items() if goal.jax_call}  # psum, psum_scatter, ...


def why_not_expressible(program: Program) -> str | None:
    """None when every step maps to psum/psum_scatter/all_gather/all_to_all or is a Permute,
    else the reason."""
    for index, step in enumerate(program.steps):
        if step.is_permute:
            continue
        if step.collective not in PRIMITIVES:
            return (f"step {index + 1} ({step}) is a {step.collective}: JAX's collectives have no root, every device "
                    "of the named axes takes part and gets the result")
        if step.form not in FORMS:
            return (f"step {index + 1} ({step}) is a {step.form} step: a JAX collective over a mesh axis cannot "
                    "leave some of its devices out")
    return None


def expressible(program: Program | str) -> bool:
    return why_not_expressible(parse_program(program) if isinstance(program, str) else program) is None


def _goal(collective):
    goal = parse_goal(collective)
    if goal.jax_call is None:
        raise UsageError(f"collective {goal.name} cannot run in shard_map: JAX's collectives have no root (every "
                         "device of the named axes takes part and gets the same result), so a "
                         f"{goal.title} has no JAX counterpart; choose one of {', '.join(REFERENCES)}", inputs=("collective",))
    return goal


def _mesh_axes(level_names, axis_names: dict) -> tuple[str, ...]:
    axes: list[str] = []
    for name in level_names:
        mapped = axis_names.get(name, name)
        axes += [mapped] if isinstance(mapped, str) else list(mapped)
    return tuple(axes)


def step_axes(step, level_names: tuple[str, ...], axis_names: dict) -> tuple[str, ...]:
    """The mesh axes a step's groups vary over, outermost first."""
    level = level_names.index(step.level)
    levels = level_names[level:] if step.form == "InsideGroup" else (step.level,)
    return _mesh_axes(levels, axis_names)


def group_axes(hierarchy, axis_names: dict | None = None) -> tuple[str, ...]:
    """The mesh axes of the whole reduction group, outermost first: the `axis_name` of the one
    JAX collective a body equals (its block order is the program's member order)."""
    return _mesh_axes(tuple(hierarchy.level_names), dict(axis_names or {}))


def program_body(program: Program | str, hierarchy, axis_names: dict | None = None, collective="allreduce"):
    """The function to give shard_map: x (this device's buffer: its first dimension divisible by
    N; for an all-gather, this device's block) to what `collective`'s one JAX call over
    `group_axes(hierarchy, axis_names)` returns (the module's table). `axis_names` maps a
    hierarchy level to its mesh axis name (or tuple of names, outermost first), by default the
    level's own name. Raises InvalidProgramError for a program that is not valid for the goal on
    `hierarchy`, UsageError for one JAX cannot express."""
    import jax
    import jax.numpy as jnp

    from synth.lowering import lower

    goal = _goal(collective)
    program = parse_program(program) if isinstance(program, str) else program
    lowered = lower(program, hierarchy, goal)  # InvalidProgramError unless valid
    reason = why_not_expressible(program)
    if reason:
        raise UsageError(f"{program} cannot run in shard_map: {reason}; choose a program of ReduceScatter, "
                         "AllReduce, AllGather and AllToAll over InsideGroup/Parallel "
                         "(synth.jax.best_expressible for the all-reduce)")
    names = tuple(hierarchy.level_names)
    axis_names = dict(axis_names or {})
    plan = []
    for step in lowered.steps:
        if step.places is None:
            plan.append((step.collective, step_axes(step.step, names, axis_names)))
        elif step.copied < 1:  # one block (an all-gather's input): its place changes, not what the device holds
            continue
        else:  # new place of the chunk at place p is places[p]: gather by the inverse
            inverse = [0] * len(step.places)
            for place, target in enumerate(step.places):
                inverse[target] = place
            plan.append(("Permute", tuple(inverse)))
    group_size = hierarchy.group_size
    whole = goal.start != OWN_BLOCK  # an all-gather's input is one block, of any length

    def body(x):
        if whole and x.shape[0] % group_size:
            raise ValueError(f"the buffer's first dimension ({x.shape[0]}) must be divisible by the group size "
                             f"{group_size}: pad it, or run the tail with the collective itself")
        for step, operand in plan:
            if step == "Permute":
                chunks = x.reshape((group_size, x.shape[0] // group_size) + x.shape[1:])
                x = jnp.take(chunks, jnp.asarray(operand), axis=0).reshape(x.shape)
            elif step == "AllReduce":
                x = jax.lax.psum(x, operand)
            elif step == "ReduceScatter":
                x = jax.lax.psum_scatter(x, operand, scatter_dimension=0, tiled=True)
            elif step == "AllGather":
                x = jax.lax.all_gather(x, operand, axis=0, tiled=True)
            else:
                x = jax.lax.all_to_all(x, operand, 0, 0, tiled=True)
        return x

    return body


def _axis_tuple(axis_name) -> tuple[str, ...]:
    return (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)


def collective_body(program: Program | str, hierarchy, collective, axis_name, axis_names: dict | None = None, *,
                    tiled: bool = True, dimension: int = 0, split_axis: int = 0, concat_axis: int = 0):
    """`program_body` in place of the JAX call it replaces, given with that call's arguments:
    `psum(x, axis_name)`, `psum_scatter(x, axis_name, scatter_dimension=dimension, tiled=tiled)`,
    `all_gather(x, axis_name, axis=dimension, tiled=tiled)` or `all_to_all(x, axis_name,
    split_axis, concat_axis, tiled=tiled)`. Raises UsageError where the program's result could
    differ from that call's: `axis_name` not the group's mesh axes outermost first (JAX numbers
    the blocks by the order given), an untiled call, a dimension other than 0."""
    goal = _goal(collective)
    axes = _axis_tuple(axis_name)
    mine = group_axes(hierarchy, axis_names)
    call = goal.jax_call
    if sorted(axes) != sorted(mine):
        raise UsageError(f"{call} over {axes} is not this hierarchy's group: the program runs over the mesh axes "
                         f"{mine} (the levels {', '.join(hierarchy.level_names)}); give axis_names to map levels to "
                         "mesh axes, or plan the group the call reduces over")
    if axes != mine and goal.permutes:  # its result is laid out in blocks numbered by the axis order
        raise UsageError(f"{call} over {axes} numbers the blocks in that axis order; the program numbers them "
                         f"{mine} (outermost level first), so block i would land on another device: call it over "
                         f"{mine}, or lay the mesh out so that its outermost axis comes first")
    if goal.permutes and not tiled:
        raise UsageError(f"{call}(..., tiled=False) adds or removes a dimension of size N; the program runs the "
                         "tiled form: call it with tiled=True and reshape the result yourself")
    if goal.jax_call == "all_to_all" and (split_axis, concat_axis) != (0, 0):
        raise UsageError(f"all_to_all with split_axis={split_axis}, concat_axis={concat_axis}: the program splits "
                         "and joins dimension 0; move the axis to the front (jnp.moveaxis) around the call")
    if goal.jax_call in ("psum_scatter", "all_gather") and dimension != 0:
        raise UsageError(f"{call} along dimension {dimension}: the program scatters and gathers dimension 0; move "
                         "the axis to the front (jnp.moveaxis) around the call")
    return program_body(program, hierarchy, axis_names, goal)


def reference_call(hierarchy, collective="allreduce", axis_names: dict | None = None):
    """The one JAX collective a body of `collective` equals, over the group's mesh axes
    outermost first (what tests compare with, and what runs where no program is wanted)."""
    import jax

    goal = _goal(collective)
    axes = group_axes(hierarchy, axis_names)
    calls = {"psum": lambda x: jax.lax.psum(x, axes),
             "psum_scatter": lambda x: jax.lax.psum_scatter(x, axes, scatter_dimension=0, tiled=True),
             "all_gather": lambda x: jax.lax.all_gather(x, axes, axis=0, tiled=True),
             "all_to_all": lambda x: jax.lax.all_to_all(x, axes, 0, 0, tiled=True)}  # JAX's calls by name
    return calls[goal.jax_call]


def best_expressible(hierarchy, topology, nbytes: int, backend: str = "nccl", max_len: int = 5,
                     collective="allreduce") -> str:
    """The fastest program of the goal JAX can express at `nbytes` per device, by the
    simulator's ranking."""
    from synth.model.context import cost_context

    goal = _goal(collective)
    context = cost_context(hierarchy, topology, backend)
    from synth.search.rank import Ranker

    for row in Ranker(context, max_len, goal=goal).rank([nbytes])[0]:
        if expressible(str(row.program)):
            return str(row.program)
    # the flat call always is expressible
    raise UsageError(f"no program of the {goal.title} over InsideGroup/Parallel steps is valid here")


def shard_map_function(mesh, body, axes: tuple[str, ...]):
    """`body` under shard_map on `mesh`, the input's first dimension sharded over `axes`."""
    import jax
    from jax.sharding import PartitionSpec

    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:  # jax < 0.6
        from jax.experimental.shard_map import shard_map
    spec = PartitionSpec(tuple(axes))
    return shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec)
