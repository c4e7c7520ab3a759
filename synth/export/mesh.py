"""Export a placement in the forms frameworks take to lay out parallelism axes over ranks.

- per-axis rank lists: for each axis, the groups of ranks that agree on every other axis
  (what `torch.distributed.new_group` or a launcher config takes);
- the rank array for `torch.distributed.device_mesh.DeviceMesh(device_type, mesh=...,
  mesh_dim_names=...)`: `mesh[x_0][x_1]...` is the global rank of the device with those axis
  coordinates (docs/model.md section 2);
- the device permutation for `jax.sharding.Mesh`:
  `Mesh(np.array(jax.devices())[perm].reshape(axis_sizes), axis_names)`, assuming
  `jax.devices()` lists devices in global rank order (one process per node, local devices in
  order), which is how multi-process JAX on GPU clusters numbers them;
- the rank order: the axes from innermost to outermost in rank numbering (`tp-dp` style). It
  exists only when the placement is a pure permutation of whole axes, i.e. each axis's digits
  form one contiguous block of the rank's mixed-radix digits; otherwise a statement says which
  axis is interleaved with which;
- Megatron-LM's order, only where Megatron can take it: the axes are named with its tokens
  (`tp cp ep dp pp`) and the rank order is one its command line selects (RankGenerator in
  megatron/core/parallel_state.py with `tp-cp-ep-dp-pp`, or `tp-cp-ep-pp-dp` with
  `--use-tp-pp-dp-mapping`); otherwise null and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations

import numpy as np

from synth.export import jsonfmt
from synth.export.provenance import Provenance
from synth.names import check_name
from synth.placement import Placement

FORMAT = "synth-mesh"
VERSION = 2  # 2: rank_order (any axis names) apart from megatron (Megatron's tokens only)


@dataclass(frozen=True)
class AxisOrder:
    """The Megatron-style order, or why there is none."""

    order: tuple[str, ...] | None  # innermost first
    statement: str


MEGATRON_TOKENS = ("tp", "cp", "ep", "dp", "pp")
MEGATRON_ORDERS = (("tp-cp-ep-dp-pp", None), ("tp-cp-ep-pp-dp", "--use-tp-pp-dp-mapping"))


@dataclass(frozen=True)
class MegatronOrder:
    order: str | None  # the order string Megatron is given, None when not expressible
    flag: str | None  # the command-line flag that selects it (None for the default)
    reason: str  # why it is or is not expressible


def megatron_order(placement: Placement) -> MegatronOrder:
    """The Megatron order that numbers ranks exactly like the placement, or why there is none."""
    names = [name for name, size in zip(placement.axis_names, placement.axis_sizes) if size > 1]
    foreign = [name for name in names if name not in MEGATRON_TOKENS]
    if foreign:
        return MegatronOrder(None, None, (
            f"not expressible in Megatron's rank order: Megatron names its axes {', '.join(MEGATRON_TOKENS)}, "
            f"not {', '.join(foreign)}; name the axes so (e.g. dp=8,tp=4) or use the rank lists"))
    found = axis_order(placement)
    if found.order is None:
        return MegatronOrder(None, None, f"not expressible in Megatron's rank order: {found.statement}")
    ours = [name for name in found.order if name in names]
    for order, flag in MEGATRON_ORDERS:
        tokens = [token for token in order.split("-") if token in ours]
        if tokens == ours:
            if flag and "cp" in ours and "pp" in ours:
                return MegatronOrder(None, None, (
                    f"not launchable by Megatron: the placement numbers ranks {'-'.join(ours)} innermost first "
                    f"({flag}), which megatron-core's initialize_model_parallel refuses with context and pipeline "
                    f"parallelism both on (its data-parallel groups of attention and MoE layers differ); "
                    f"use the rank lists or the DeviceMesh"))
            how = f"Megatron's {'default order' if flag is None else 'order with ' + flag}"
            return MegatronOrder(order, flag, f"ranks numbered {'-'.join(ours)} innermost first: {how}")
    return MegatronOrder(None, None, (
        f"not expressible on Megatron's command line: the placement numbers ranks {'-'.join(ours)} innermost first, "
        f"but Megatron takes only tp-cp-ep-dp-pp or tp-cp-ep-pp-dp (--use-tp-pp-dp-mapping); "
        f"use the rank lists or the DeviceMesh"))


def device_mesh_array(placement: Placement) -> np.ndarray:
    """`mesh[x_0, x_1, ...]` = global rank of the device with axis coordinates x."""
    mesh = np.empty(placement.axis_sizes, dtype=np.int64)
    mesh[tuple(placement.axis_coordinates.T)] = np.arange(placement.device_count)
    return mesh


def jax_permutation(placement: Placement) -> list[int]:
    """`perm` with `np.array(devices)[perm].reshape(axis_sizes)` = the mesh of devices."""
    return [int(rank) for rank in device_mesh_array(placement).reshape(-1)]


def _digit_sequence(placement: Placement) -> list[tuple[int, int]]:
    """(axis, level) of every rank digit with radix > 1, most significant first: levels
    outermost first, inside a level the axes in axis order (docs/model.md section 2, step 1)."""
    return [(a, l) for l in range(len(placement.level_sizes)) for a in range(len(placement.axis_sizes))
            if placement.matrix[a][l] > 1]


def axis_order(placement: Placement) -> AxisOrder:
    names = placement.axis_names
    sequence = _digit_sequence(placement)
    outermost_first: list[int] = []
    for position, (a, level) in enumerate(sequence):
        if outermost_first and outermost_first[-1] == a:
            continue
        if a in outermost_first:
            first = next(l for b, l in sequence if b == a)
            between = sorted({names[b] for b, _ in sequence[sequence.index((a, first)) + 1:position] if b != a})
            return AxisOrder(None, (
                f"not a permutation of whole axes: axis {names[a]} spans levels "
                f"{placement.level_names[first]} and {placement.level_names[level]} with axis "
                f"{', '.join(between)} numbered between its parts, so no order string describes it; "
                f"use the rank lists or the DeviceMesh array"))
        outermost_first.append(a)
    trivial = [a for a in range(len(names)) if a not in outermost_first]
    order = tuple(names[a] for a in reversed(outermost_first)) + tuple(names[a] for a in trivial)
    _check_order(placement, order)
    identity = order == tuple(reversed(names))
    statement = "a permutation of whole axes" + (
        ": the identity, the numbering of init_device_mesh(device_type, axis sizes)" if identity else "")
    return AxisOrder(order, statement)


def _check_order(placement: Placement, order: tuple[str, ...]) -> None:
    """rank = mixed radix of the axis coordinates, `order[0]` least significant."""
    rank = np.zeros(placement.device_count, dtype=np.int64)
    stride = 1
    for name in order:
        a = placement.axis_index(name)
        rank += placement.axis_coordinates[:, a] * stride
        stride *= placement.axis_sizes[a]
    if not np.array_equal(rank, np.arange(placement.device_count)):
        raise AssertionError(f"axis order {order} does not number the ranks of {placement.to_text()}")


JAX_CALLS = {"psum_scatter": "psum_scatter(x, {axes}, scatter_dimension=0, tiled=True)",  # by Goal.jax_call
             "all_gather": "all_gather(x, {axes}, axis=0, tiled=True)",
             "all_to_all": "all_to_all(x, {axes}, 0, 0, tiled=True)"}


def jax_axis_order(hierarchy) -> tuple[str, ...] | None:
    """The order of the reduced axes (those of more than one device) whose row-major numbering
    of a group's devices is its member order in every group (JAX numbers the members of a
    collective over several axes so), or None when no order does."""
    placement = hierarchy.placement
    axes = [name for name in hierarchy.reduce_axes if placement.axis_sizes[placement.axis_index(name)] > 1]
    coords = placement.axis_coordinates
    for order in permutations(axes):
        index = [placement.axis_index(name) for name in order]
        sizes = [placement.axis_sizes[a] for a in index]
        if all(int(np.ravel_multi_index(tuple(coords[rank, index]), sizes)) == member
               for group in hierarchy.groups for member, rank in enumerate(group)):
            return order
    return None


def collective_layout(hierarchy, goal) -> dict:
    """Where the goal's blocks (or its root) are on the framework meshes (see the module docstring)."""
    groups = hierarchy.groups
    in_rank_order = all(list(group) == sorted(group) for group in groups)
    axes = list(hierarchy.reduce_axes)
    layout = {"name": goal.name, "torch_call": goal.torch_call}
    if goal.rooted:
        layout["root"] = "the first rank of each reduction group (member 0, its lowest global rank)"
        layout["jax"] = {"axis_name": None, "statement": (
            f"no JAX counterpart: a {goal.title} has a root, and JAX's collectives have none (every device of the "
            "named axes takes part and gets the result)")}
        return layout
    layout["blocks"] = ("block r of each reduction group is its member r: reduction_groups lists each group's ranks "
                        "in that order (global rank order)")
    layout["torch"] = {"in_rank_order": in_rank_order, "statement": (
        f"{goal.torch_call} over the group of the mesh dimension(s) {', '.join(axes)} lays the blocks out so: "
        "torch numbers a group's ranks by global rank" if in_rank_order else
        "the members are not in global rank order, which torch's groups use: torch would number the blocks otherwise")}
    order = jax_axis_order(hierarchy)
    if order is None:
        layout["jax"] = {"axis_name": None, "statement": (
            f"no order of the axes {', '.join(axes)} numbers each group's devices in member order (an axis is split "
            "around another one): a JAX call over them would lay blocks out otherwise; use a mesh whose axes are the "
            "reduced axes split per level (synth.jax.group_axes)")}
    else:
        call = JAX_CALLS[goal.jax_call].format(axes=tuple(order))
        layout["jax"] = {"axis_name": list(order), "statement": f"{call} lays the blocks out in member order"}
    return layout


def mesh_document(placement: Placement, provenance: Provenance, metadata: dict) -> dict:
    for name in placement.axis_names:
        check_name(name, "axis")
    order = axis_order(placement)
    mesh = device_mesh_array(placement)
    names = list(placement.axis_names)
    document = {"format": FORMAT, "version": VERSION, "generated_by": provenance.version,
                "command": provenance.command}
    document.update(metadata)
    document["axis_groups"] = {name: placement.axis_groups(name) for name in names}
    document["torch_device_mesh"] = {
        "mesh": mesh.tolist(),
        "mesh_dim_names": names,
        "usage": f"DeviceMesh(\"cuda\", mesh=torch.tensor(mesh), mesh_dim_names={tuple(names)!r})",
    }
    document["jax_mesh"] = {
        "device_permutation": jax_permutation(placement),
        "shape": list(placement.axis_sizes),
        "axis_names": names,
        "usage": f"Mesh(np.array(jax.devices())[perm].reshape({tuple(placement.axis_sizes)!r}), {tuple(names)!r})",
    }
    document["rank_order"] = {
        "order": "-".join(order.order) if order.order else None,
        "innermost_first": list(order.order) if order.order else None,
        "statement": order.statement,
    }
    megatron = megatron_order(placement)
    document["megatron"] = {"order": megatron.order, "flag": megatron.flag, "statement": megatron.reason}
    return document


def render(placement: Placement, provenance: Provenance, metadata: dict) -> str:
    return jsonfmt.dumps(mesh_document(placement, provenance, metadata)) + "\n"
