"""The compute term: one layer's and the output layer's kernels per micro-batch (forward,
backward, recomputation), timed by shape on a described device (synth/plan/kernels.py) or
from FLOPs at `peak x efficiency` plus memory-bound bytes at the memory bandwidth."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from synth.plan import formulas
from synth.plan.kernels import head_times, layer_times


@dataclass(frozen=True)
class LayerCompute:
    """Seconds per micro-batch on one device: one layer's forward, backward, attention-score
    forward (what selective recomputation repeats) and recomputation; the output layer's."""

    forward: float
    backward: float
    scores: float
    recompute: float
    layer: float  # forward + backward + recomputation, at least the host's issue time
    head_forward: float
    head_backward: float

    @property
    def head(self) -> float:
        return self.head_forward + self.head_backward


@lru_cache(maxsize=4096)  # asked per candidate, the same few arguments: computed once each
def layer_compute(model, compute, settings, tp: int, cp: int, ep: int, etp: int = 0) -> LayerCompute:
    """One layer's and the output layer's compute (`compute`: step.Compute, `settings`: step.Settings;
    `etp` the expert tensor-parallel degree, 0: tp)."""
    tokens = settings.micro_batch * model.seq_len // cp
    if compute.kernels is not None:
        kernels = compute.kernels
        if settings.sharded_optimizer and settings.zero > 1 and kernels.grad_accumulation == "fused":
            # Megatron-FSDP runs without gradient-accumulation fusion (launch.py): a separate add per weight
            kernels = dataclasses.replace(kernels, grad_accumulation="hook")
        times = layer_times(model, kernels, settings.micro_batch, tp, cp, settings.sequence_parallel, ep, etp)
        forward, backward, scores = times.forward, times.backward, times.attention_forward
        head_forward, head_backward = head_times(model, kernels, settings.micro_batch, tp, cp)
    else:
        layer_flops, score_flops = formulas.layer_forward_flops(model, tokens, model.seq_len)
        traffic = formulas.layer_traffic_bytes(model, settings.micro_batch, tp, cp, settings.sequence_parallel)
        bandwidth = compute.memory_bandwidth or float("inf")  # no figure: memory-bound operations not costed
        forward = layer_flops / tp / compute.rate + traffic.total / bandwidth
        backward = 2 * forward
        scores = score_flops / tp / compute.rate + traffic.scores / bandwidth
        head_flops_s = formulas.head_forward_flops(model, tokens) / tp / compute.rate
        head_bytes = formulas.head_traffic_bytes(model, settings.micro_batch, tp, cp)
        head_forward = head_flops_s + head_bytes[0] / bandwidth
        head_backward = 2 * head_flops_s + head_bytes[1] / bandwidth
    recompute = forward if settings.recompute == "full" else (scores if settings.recompute == "selective" else 0.0)
    layer = forward + backward + recompute
    if compute.kernels is not None and compute.kernels.host_s > 0:
        # Kernels are issued asynchronously: a layer takes at least the host's time to issue them.
        layer = max(layer, compute.kernels.host_s)
    return LayerCompute(forward, backward, scores, recompute, layer, head_forward, head_backward)
