"""The ZeRO-3 (FSDP) term: each layer's weights all-gathered before its forward and its backward
(and its recomputation), its gradients reduce-scattered after its backward, every micro-batch,
prefetched behind compute; a MoE layer's dense part over the whole data-parallel group, its
routed experts over the expert data-parallel group (Megatron-FSDP); HSDP shards inside a node
(`hsdp_placement`). The gathers and scatters share links with the layer's critical-path
collectives (synth/plan/contention.py): that slowdown is returned beside them."""

from __future__ import annotations

from dataclasses import dataclass

from synth.placement import Placement
from synth.plan import formulas, moe
from synth.plan.contention import Background, extra_seconds, moved_bytes
from synth.plan.terms import Route


@dataclass(frozen=True)
class ShardedLayers:
    """Per layer per micro-batch: exposed gathers and scatters of a dense layer and what a MoE layer
    adds, the contention they cause (dense, MoE); the shard groups' placement, size and replicas."""

    zero3: bool
    sharding: Placement
    shard: int
    replicas: int
    layer: float = 0.0
    moe_layer: float = 0.0
    shared: float = 0.0
    moe_shared: float = 0.0
    routes: tuple[Route, ...] = ()


def sharded_layers(model, costs, degrees, placement: Placement, settings, m: int, layer, tp1: float, cp1: float,
                   ep1: float) -> ShardedLayers:
    """The ZeRO-3 term of one layer (`settings`: step.Settings, `layer`: terms.compute.LayerCompute;
    `tp1`, `cp1`, `ep1`: the layer's critical-path collectives the gathers and scatters slow)."""
    dp, tp, act_bytes = degrees.dp, degrees.tp, model.bytes_per_value
    full = settings.recompute == "full"
    forward1, backward1, compute1 = layer.forward, layer.backward, layer.layer
    routes: list[Route] = []
    zero3 = settings.sharded_optimizer and settings.zero == 3 and dp > 1
    fsdp1 = 0.0
    sharding, shard, replicas = placement, dp, 1  # the shard groups' placement ("dp": the shard axis)
    if zero3 and settings.hsdp:
        sharding = hsdp_placement(placement)
        shard = sharding.axis_sizes[sharding.axis_index("dp")]
        replicas = dp // shard
    fsdp_moe1 = 0.0  # what a MoE layer's gathers and scatters expose beyond a dense layer's
    shared1 = shared_moe1 = 0.0  # critical-path collectives slowed by those gathers and scatters, per layer
    if zero3 and shard > 1:
        shard_axes = ("dp",) if settings.hsdp else degrees.data_axes()

        def exposed_fsdp(gather_s: float, scatter_s: float) -> float:
            gathers_forward = gather_s * (2 if full else 1)
            if settings.overlap_gradients:  # prefetched behind the previous layer's compute (FSDP's prefetch)
                return (max(0.0, gathers_forward - forward1 * (2 if full else 1))
                        + max(0.0, gather_s + scatter_s - backward1))
            return gathers_forward + gather_s + scatter_s

        layer_params = formulas.layer_shape(model).per_device(tp)
        gather_w = costs.all_gather(sharding, shard_axes, int(layer_params * act_bytes))
        scatter_g = costs.reduce_scatter(sharding, shard_axes, int(layer_params * model.grad_bytes_per_value))
        fsdp1 = exposed_fsdp(gather_w.time_s, scatter_g.time_s)
        routes.append(Route("data-shard" if settings.hsdp else "data", f"{gather_w.program}; {scatter_g.program}",
                            gather_w.levels,
                            gather_w.time_s + scatter_g.time_s, m * model.layers, int(layer_params * act_bytes),
                            shard_axes if shard_axes != ("dp",) else ()))
        moe_layers_all = moe.moe_layer_count(model)
        if moe_layers_all:
            # A MoE layer (Megatron-FSDP): its dense part (attention, shared experts, router) sharded
            # over the whole data-parallel group, its E/ep routed experts over the expert
            # data-parallel group only (dp / ep replicas; none to gather when ep = dp); the two
            # gathers and the two scatters run one after the other on the same stream.
            dense_part, experts = moe.moe_layer_parameters_per_device(model, layer_params, tp, degrees.ep, degrees.etp)
            gather_d = costs.all_gather(sharding, shard_axes, int(dense_part * act_bytes))
            scatter_d = costs.reduce_scatter(sharding, shard_axes, int(dense_part * model.grad_bytes_per_value))
            gather_s, scatter_s = gather_d.time_s, scatter_d.time_s
            if degrees.expert_dp > 1:
                expert_axes = degrees.expert_data_axes()
                gather_e = costs.all_gather(placement, expert_axes, int(experts * act_bytes))
                scatter_e = costs.reduce_scatter(placement, expert_axes, int(experts * model.grad_bytes_per_value))
                gather_s, scatter_s = gather_s + gather_e.time_s, scatter_s + scatter_e.time_s
                routes.append(Route("expert-data", f"{gather_e.program}; {scatter_e.program}", gather_e.levels,
                                    gather_e.time_s + scatter_e.time_s, m * moe_layers_all, int(experts * act_bytes),
                                    expert_axes))
            fsdp_moe1 = exposed_fsdp(gather_s, scatter_s) - fsdp1
        # The gathers and scatters run behind the layer's compute, sharing links with its
        # critical-path collectives (contention.py), every layer of every micro-batch.
        members = sharding.axis_sizes[sharding.axis_index("dp")] if settings.hsdp else dp
        layer_background = Background(shard_axes, moved_bytes(layer_params * (act_bytes * (2 if full else 1) + act_bytes
                                                                              + model.grad_bytes_per_value), members),
                                      gather_w.time_s * (3 if full else 2) + scatter_g.time_s,
                                      min(1.0, (gather_w.time_s * (3 if full else 2) + scatter_g.time_s)
                                          / max(compute1, 1e-12)))
        if settings.overlap_gradients:
            shared1 = extra_seconds(costs, sharding, {("tp",): tp1, ("cp",): cp1}, layer_background)
        if settings.overlap_gradients and degrees.ep > 1:
            shared_moe1 = extra_seconds(costs, placement, {degrees.expert_group(): ep1}, layer_background)
    return ShardedLayers(zero3, sharding, shard, replicas, fsdp1, fsdp_moe1, shared1, shared_moe1, tuple(routes))


def hsdp_placement(placement: Placement) -> Placement:
    """The placement with the data-parallel axis split in two: `dp` keeps its part in the
    innermost level (the shard groups of HSDP, inside a node) and `dp_replica` its parts in the
    outer levels (the replica groups). The groups are the same ranks; only their roles split."""
    index = placement.axis_index("dp")
    row = placement.matrix[index]
    inner = (1,) * (len(row) - 1) + (row[-1],)
    outer = tuple(row[:-1]) + (1,)
    names = placement.axis_names[:index] + ("dp_replica", "dp") + placement.axis_names[index + 1:]
    sizes = placement.axis_sizes[:index] + (placement.axis_sizes[index] // row[-1], row[-1]) + placement.axis_sizes[index + 1:]
    matrix = placement.matrix[:index] + (outer, inner) + placement.matrix[index + 1:]
    return Placement(placement.level_names, placement.level_sizes, names, sizes, matrix)
