"""The data-parallel term: the first stage's gradients (it finishes its backward last) reduced in
buckets behind the last micro-batch's backward (synth.analysis.fusion's dynamic program through
the cost model's gradient schedules), the routed experts' over the expert data-parallel groups
on the same stream, the sharded optimizer's all-gather of the updated weights (behind the next
forward with `overlap_param_gather`), HSDP's all-reduce across the replicas; and the slowdown
these overlapped calls cause to the critical-path collectives on the same links (contention.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from synth.plan import formulas, moe
from synth.plan.contention import Background, extra_seconds, moved_bytes
from synth.plan.costs import fuse_tensors
from synth.plan.terms import Route


@dataclass(frozen=True)
class DataParallel:
    """Seconds per step: exposed, hidden behind backward (not in the step), and the contention they cause."""

    exposed: float = 0.0
    overlapped: float = 0.0
    contention: float = 0.0
    routes: tuple[Route, ...] = ()


def data_parallel_terms(model, costs, degrees, placement, settings, first: int, first_range: tuple[int, int], params,
                        experts_first: float, layer, head_backward: float, tp_backward1: float,
                        window_forward: dict, window_backward: dict, sharded, data_parallel: bool = True,
                        floor: bool = False) -> DataParallel:
    """The data-parallel term of the first stage (`first` layers, `first_range` their indices;
    `params`: formulas.stage_parameters; `layer`: terms.compute.LayerCompute; `head_backward`: the
    output layer's backward when the first stage runs it; `window_*`: the first stage's
    critical-path collectives of one micro-batch's forward and backward, by axes;
    `sharded`: terms.sharded.ShardedLayers). `data_parallel=False`: nothing (the search's bound).
    `floor`: the gradient schedules' exposed time replaced by its lower bound
    (costs.gradient_floor), no contention and no routes: a lower bound on `exposed` that the
    search tries before running the schedules; the weight gathers are priced exactly."""
    dp, tp = degrees.dp, degrees.tp
    zero3, sharding, shard, replicas = sharded.zero3, sharded.sharding, sharded.shard, sharded.replicas
    forward1, backward1, recompute1 = layer.forward, layer.backward, layer.recompute
    grad_bytes = model.grad_bytes_per_value
    routes: list[Route] = []
    data_axes, expert_axes = degrees.data_axes(), degrees.expert_data_axes()
    dp_exposed = dp_overlapped = 0.0
    contention_s = 0.0  # critical-path collectives slowed by the gradient reduction and the weight gather
    data_members = math.prod(costs.factors(placement, data_axes)) if dp > 1 else 1

    def weights_gather_exposed(seconds: float) -> float:
        if settings.overlap_param_gather:
            # Megatron gathers bucket by bucket, each behind the previous bucket's forward: the first
            # layer's share is exposed, and whatever the first micro-batch's forward cannot hide.
            first_forward = first * forward1
            return seconds / (first + 1) + max(0.0, seconds * first / (first + 1) - first_forward)
        return seconds

    if dp > 1 and data_parallel and not zero3:
        stage_layer_params = (formulas.layer_shape(model).per_device(tp) * first
                              + moe.stage_parameter_delta(model, tp, degrees.ep, *first_range, degrees.etp))
        layer_grad = int((stage_layer_params - experts_first) / first * grad_bytes)
        embedding_grad = int(max(params.first - stage_layer_params, 1) * grad_bytes)
        tensors = fuse_tensors(tuple([layer_grad] * first + [embedding_grad]))
        # the first stage's last backward (with the output layer too when it is also the last stage)
        backward_s = first * (backward1 + recompute1 + tp_backward1) + head_backward
        backward_s = backward_s if settings.overlap_gradients else 0.0
        if floor:
            dp_exposed = costs.gradient_floor(placement, data_axes, tensors, backward_s, settings.sharded_optimizer)
            if experts_first and expert_axes:
                expert_tensors = fuse_tensors(tuple([int(experts_first / first * grad_bytes)] * first))
                dp_exposed += costs.gradient_floor(placement, expert_axes, expert_tensors, backward_s,
                                                   settings.sharded_optimizer)
            if settings.sharded_optimizer:
                dp_exposed += weights_gather_exposed(
                    costs.all_gather(placement, data_axes, int((params.first - experts_first) * model.bytes_per_value)).time_s)
                if experts_first and expert_axes:
                    dp_exposed += weights_gather_exposed(
                        costs.all_gather(placement, expert_axes, int(experts_first * model.bytes_per_value)).time_s)
            return DataParallel(dp_exposed)
        gradients = costs.gradient_schedule(placement, data_axes, tensors, backward_s, settings.sharded_optimizer)
        dp_exposed = gradients.exposed_s
        dp_overlapped = gradients.busy_s - dp_exposed
        routes.append(Route("data", gradients.program, gradients.levels, gradients.busy_s / gradients.buckets,
                            gradients.buckets, sum(tensors) // gradients.buckets, data_axes, gradients))
        if backward_s > 0:  # the reduction behind the last backward shares links with its collectives
            contention_s += extra_seconds(costs, placement, window_backward, Background(
                data_axes, moved_bytes(sum(tensors), data_members, not settings.sharded_optimizer), gradients.busy_s,
                min(1.0, gradients.busy_s / backward_s)))
        if experts_first and expert_axes:
            # The experts' gradients on the same stream after the dense ones (both exposures counted).
            expert_grad = int(experts_first / first * grad_bytes)
            expert_tensors = fuse_tensors(tuple([expert_grad] * first))
            experts = costs.gradient_schedule(placement, expert_axes, expert_tensors, backward_s,
                                              settings.sharded_optimizer)
            dp_exposed += experts.exposed_s
            dp_overlapped += experts.busy_s - experts.exposed_s
            routes.append(Route("expert-data", experts.program, experts.levels, experts.busy_s / experts.buckets,
                                experts.buckets, sum(expert_tensors) // experts.buckets, expert_axes, experts))
        if settings.sharded_optimizer:
            weights = int((params.first - experts_first) * model.bytes_per_value)
            gather = costs.all_gather(placement, data_axes, weights)
            dp_exposed += weights_gather_exposed(gather.time_s)
            routes.append(Route("data", gather.program, gather.levels, gather.time_s, 1, weights, data_axes))
            if settings.overlap_param_gather:  # behind the first forward, sharing links with its collectives
                contention_s += extra_seconds(costs, placement, window_forward, Background(
                    data_axes, moved_bytes(weights, data_members), gather.time_s,
                    min(1.0, gather.time_s / max(first * forward1, 1e-12))))
            if experts_first and expert_axes:
                weights = int(experts_first * model.bytes_per_value)
                gather = costs.all_gather(placement, expert_axes, weights)
                dp_exposed += weights_gather_exposed(gather.time_s)
                routes.append(Route("expert-data", gather.program, gather.levels, gather.time_s, 1, weights,
                                    expert_axes))

    if zero3 and replicas > 1 and data_parallel:
        # HSDP: each shard's gradients all-reduced across the replicas, in buckets behind the last
        # micro-batch's backward (the shards are 1/shard of the first stage's gradients).
        layer_grad = int(formulas.layer_shape(model).per_device(tp) * grad_bytes / shard)
        embedding_grad = int(max(params.first - formulas.layer_shape(model).per_device(tp) * first, 1) * grad_bytes / shard)
        tensors = fuse_tensors(tuple([layer_grad] * first + [embedding_grad]))
        backward_s = first * (backward1 + recompute1 + tp_backward1) if settings.overlap_gradients else 0.0
        if floor:
            return DataParallel(costs.gradient_floor(sharding, ("dp_replica",), tensors, backward_s, False))
        gradients = costs.gradient_schedule(sharding, ("dp_replica",), tensors, backward_s, False)
        dp_exposed = gradients.exposed_s
        dp_overlapped = gradients.busy_s - dp_exposed
        routes.append(Route("data-replica", gradients.program, gradients.levels, gradients.busy_s / gradients.buckets,
                            gradients.buckets, sum(tensors) // gradients.buckets, schedule=gradients))
    return DataParallel(dp_exposed, dp_overlapped, contention_s, tuple(routes))
