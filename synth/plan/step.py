"""One training step of one candidate (degrees, placement, settings): its time and its memory.

Time (docs/plan.md derives each term and names its source). Per micro-batch, the slowest
pipeline stage (each stage's own layers; the last one also runs the output layer) spends

    t_mb = compute + exposed tensor-parallel collectives + context-parallel exchange
           + exposed ZeRO-3 gathers and scatters + pipeline point-to-point
           + expert-parallel all-to-alls (MoE layers)

* compute: on a device with a built-in description (synth/devices.py), each kernel timed
  from its shape (synth/plan/kernels.py: matmuls by tile and wave on the SMs, attention by its
  kernel, memory-bound work at the memory bandwidth, the two fitted figures); otherwise the
  layers' FLOPs (formulas.py) at `peak x matmul efficiency` plus the bytes the memory-bound
  operations move at the memory bandwidth. Forward, backward, recomputation (a whole forward
  with full recomputation, the attention scores' with selective), the output layer;
* tensor parallelism (Megatron-LM, Shoeybi et al. 2019, section 3): two all-reduces of the
  layer's `b s h` activations in forward and two in backward (two more in the recomputed
  forward), on the critical path; with sequence parallelism (Korthikanti et al. 2022, section
  4.2.2) each all-reduce becomes a reduce-scatter and an all-gather of the same size; + one
  all-reduce for the vocabulary-parallel output layer. With `tp_overlap` (inside a node or NVLink domain)
  each runs inside its GEMM and only the computed remainder counts (`tp_overlap_exposed`);
* pipeline (Narayanan et al. 2021, section 2.2 and 4.1): each micro-batch sends its `b s h`
  activations forward and their gradient back, v times with the interleaved schedule; with
  tensor parallelism the scatter/gather optimization (section 4.1) sends `1/t` of it over the
  network and all-gathers it inside the stage (sequence parallelism already holds `1/t`);
* context parallelism: the keys and values all-gathered in forward (and recomputation) and
  their gradients reduce-scattered in backward, exposed where they exceed the attention's
  own compute (the ring exchange overlaps with it);
* ZeRO-3: each layer's weights all-gathered before forward and backward, its gradients
  reduce-scattered after backward, every micro-batch, prefetched behind compute (with experts:
  a MoE layer's dense part over the whole data-parallel group, its routed experts over the
  expert data-parallel group, as Megatron-FSDP shards them);
* expert parallelism (MoE models, synth/plan/moe.py): the token dispatch and combine
  all-to-alls over the `ep` groups, 4 per MoE layer of the stage (6 with full recomputation),
  each of `tokens x h x k x c` values per device, on the critical path, and with tensor
  parallelism the routed tokens' all-gather and reduce-scatter over `tp` beyond the dense
  FFN's; the MoE layers' matmuls (router, the local experts' grouped GEMMs of the routed
  tokens, shared experts) are timed by their shapes in the compute term.

The step is `m t_mb + bubble` (the 1F1B and interleaved schedules; `pipeline_bubble`: the
other stages' time per micro-batch over v, `(p-1)/v t_mb` with even stages, plus the warm-up and
cool-down chain of overlapped transfers), then the exposed part of the gradient reduction (bucketed behind the last
micro-batch's backward by synth.analysis.fusion's dynamic program, or one call after it when
not overlapped), the tied embedding's gradient exchange between first and last stage, the
sharded optimizer's all-gather of the updated weights (behind the next forward with
`overlap_param_gather`), and the optimizer step itself, which reads and writes its states
once at the device's memory bandwidth. Overlapped collectives (the gradient reduction, the
weight all-gather, ZeRO-3's gathers and scatters, overlapped pipeline transfers) slow the
critical-path collectives that cross the same links (synth/plan/contention.py), and activation
offload pays its host copies beyond the compute they run behind (synth/plan/offload.py).

Memory: weights, gradients and optimizer states of the device's stage (formulas.py, per ZeRO
stage), plus the activations of the micro-batches it holds in flight (one layer's with
activation offload); a candidate fits when the
first and the last stage's devices both fit.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

from synth.frozen import cached_hash, state_without_hash
from synth.errors import UsageError
from synth.plan.errors import MissingFigureError
from synth.placement import Placement
from synth.plan import formulas, moe, offload
from synth.plan.contention import Background, extra_seconds
from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import Degrees
from synth.devices import device_keys, device_named
from synth.plan.kernels import HOST_LAYER_S, SUSTAINED, KernelRates, rates_for
from synth.plan.terms import Route, Term
from synth.plan.terms.compute import layer_compute
from synth.plan.terms.data import data_parallel_terms
from synth.plan.terms.context import context_parallel
from synth.plan.terms.expert import ep_overlap_steady, expert_parallel
from synth.plan.terms.offload import offload_seconds
from synth.plan.terms.pipeline import pipeline_bubble, pipeline_transfer
from synth.plan.terms.sharded import hsdp_placement, sharded_layers  # noqa: F401  (hsdp_placement: launch.py's)
from synth.plan.terms.tensor import (PIPELINE_SMS, PIPELINE_SPLITS, RING_EXCHANGE_SMS, _overlapped,  # noqa: F401
                                     tensor_parallel, tp_overlap_exposed)
from synth.plan.model import Transformer
from synth.topology import Device


@dataclass(frozen=True)
class Settings:
    """What a framework lets a user choose besides the degrees."""

    __hash__ = cached_hash  # (synth/frozen.py) it keys many caches
    __getstate__ = state_without_hash

    micro_batch: int
    virtual: int = 1  # model chunks per pipeline device (1: 1F1B; > 1: interleaved)
    sequence_parallel: bool = False
    recompute: str = "none"  # none | selective | full
    sharded_optimizer: bool = False  # ZeRO-1 / Megatron's distributed optimizer
    overlap_gradients: bool = True  # gradient reduction in buckets behind backward
    tp_overlap: bool = False  # tensor-parallel communication inside the GEMMs (Transformer Engine userbuffers)
    overlap_param_gather: bool = False  # sharded optimizer: weights all-gathered behind the next step's forward
    zero: int = 1  # with sharded_optimizer: ZeRO stage 1 (optimizer states), 2 (+ gradients), 3 (+ weights: FSDP)
    hsdp: bool = False  # with ZeRO-3: shard inside the innermost level (a node), replicate across it (HSDP)
    overlap_p2p: bool = False  # interleaved schedule: sends and receives behind the next chunk's compute
    offload_layers: int = 0  # layers whose activations are copied to host memory (megatron-core cpu_offloading)
    # MoE: dispatch and combine behind the other micro-batch's compute (Megatron's combined 1F1B
    # schedule, --overlap-moe-expert-parallel-comm; terms/expert.py prices it)
    ep_overlap: bool = False

    @cached_property
    def text(self) -> str:  # kept: a ranking key, asked thousands of times
        parts = [f"mb={self.micro_batch}"]
        if self.virtual > 1:
            parts.append(f"v={self.virtual}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.recompute != "none":
            parts.append(f"rc={self.recompute}")
        if self.sharded_optimizer:
            parts.append(f"zero{self.zero}" + ("-hsdp" if self.hsdp else ""))
        if not self.overlap_gradients:
            parts.append("no-overlap")
        if self.tp_overlap:
            parts.append("tp-overlap")
        if self.overlap_param_gather:
            parts.append("param-overlap")
        if self.overlap_p2p:
            parts.append("p2p-overlap")
        if self.offload_layers:
            parts.append(f"offload={self.offload_layers}")
        if self.ep_overlap:
            parts.append("ep-overlap")
        return " ".join(parts)

    def to_json(self) -> dict:
        return {"micro_batch": self.micro_batch, "virtual_stages": self.virtual,
                "sequence_parallel": self.sequence_parallel, "recompute": self.recompute,
                "sharded_optimizer": self.sharded_optimizer, "overlap_gradients": self.overlap_gradients,
                "tp_overlap": self.tp_overlap, "overlap_param_gather": self.overlap_param_gather,
                "zero_stage": self.zero if self.sharded_optimizer else 0, "hsdp": self.hsdp,
                "overlap_p2p": self.overlap_p2p, "activation_offload_layers": self.offload_layers,
                "ep_overlap": self.ep_overlap}


@dataclass(frozen=True)
class Compute:
    """The device's peak for the model's precision and how its kernels are timed: by shape on a
    built-in device description (`kernels`, synth/plan/kernels.py), or, for a device without
    one, every matmul at `peak x efficiency` (the topology's stated matmul_efficiency)."""

    __hash__ = cached_hash  # (synth/frozen.py) it keys many caches
    __getstate__ = state_without_hash

    peak_flops: float
    efficiency: float | None
    memory_bytes: float
    memory_bandwidth: float | None
    kernels: KernelRates | None = None
    host_bandwidth: float | None = None  # bytes/s per device each way to host memory (offload.py), None: unknown

    @property
    def rate(self) -> float:
        return self.peak_flops * self.efficiency

    @property
    def text(self) -> str:
        if self.kernels is not None:
            return (f"kernels timed by shape on {self.kernels.device.key} "
                    f"(sustained {self.kernels.sustained:.3g} of the benchmark rate)")
        return f"matmul efficiency {self.efficiency:.3g}"


def compute_of(device: Device | None, precision: str, efficiency: float | None = None, topology_name: str = "",
               sustained: float | None = None, matmul_precision: str | None = None,
               host_s: float | None = None, attention_kernel: str | None = None,
               grad_accumulation: str = "fused") -> Compute:
    """The figures the step model needs from a topology's [device] table (or a refusal naming what
    is missing). A device with a built-in description (synth/devices.py) gets the kernel model
    unless `efficiency` is given; another device needs its matmul_efficiency (or `efficiency`)."""
    where = f"topology {topology_name}" if topology_name else "the topology"
    if device is None:
        raise UsageError(f"{where} has no [device] table: planning needs each device's peak FLOP/s and memory; "
                         f"use a built-in with one (selene, dgx-a100-x4, dgx-h100-2x8x8, ...) or add [device] to the file")
    bandwidth = device.memory_bandwidth.value if device.memory_bandwidth is not None else None
    peak = device.peak_for(precision).value
    described = device_named(device.name)
    if efficiency is None and described is not None:
        rates = rates_for(described, precision, SUSTAINED.value if sustained is None else sustained, matmul_precision,
                          HOST_LAYER_S.value if host_s is None else host_s, attention_kernel, grad_accumulation)
        if rates is None and matmul_precision is not None and described.matmul_for(matmul_precision) is None:
            raise UsageError(f"{where}: device {described.key} has no {matmul_precision} matmul rate; it has "
                             f"{', '.join(name for name, _ in described.matmul)}")
        if rates is None and attention_kernel is not None and described.attention_for(attention_kernel) is None:
            raise UsageError(f"{where}: device {described.key} has no {attention_kernel} attention figure; it has "
                             f"{', '.join(name for name, _ in described.attention)}")
        if rates is not None:  # the stated bandwidth where there is one, else the description's
            figure = device.memory_bandwidth or described.memory_bandwidth
            rates = dataclasses.replace(rates, device=dataclasses.replace(described, memory_bandwidth=figure))
            return Compute(peak, None, device.memory.value, figure.value, rates, _host_bandwidth(device))
    if matmul_precision not in (None, precision):
        raise UsageError(f"{where}: matmuls in {matmul_precision} need a built-in device description "
                         f"({', '.join(device_keys())}); device {device.name!r} is not one")
    if efficiency is None:
        if device.matmul_efficiency is None:
            why = (f"is none of the built-in descriptions ({', '.join(device_keys())})" if described is None else
                   f"(built-in {described.key}) has no kernel rates for {precision}")
            raise MissingFigureError(f"{where}: device {device.name!r} {why}, so its matmul_efficiency is missing: add "
                                     f'matmul_efficiency = {{ value = "46%", source = "..." }} to [device], name a '
                                     f"built-in device, or give a matmul efficiency", figure="matmul_efficiency")
        efficiency = device.matmul_efficiency.value
    return Compute(peak, efficiency, device.memory.value, bandwidth, None, _host_bandwidth(device))


def _host_bandwidth(device: Device) -> float | None:
    link = offload.host_link(device.name)
    return link.bytes_per_s if link is not None else None


@dataclass(frozen=True)
class Breakdown:
    """Where one step's time goes, in seconds (they add up to the step time)."""

    compute: float
    tensor_parallel: float  # exposed TP collectives
    context_parallel: float  # exposed KV exchange
    pipeline_p2p: float
    pipeline_bubble: float
    data_parallel: float  # exposed gradient reduction (+ the sharded optimizer's all-gather)
    embedding_sync: float
    optimizer: float
    data_parallel_overlapped: float  # gradient reduction hidden behind backward (not in the sum)
    expert_parallel: float = 0.0  # MoE token all-to-alls (dispatch and combine), on the critical path
    contention: float = 0.0  # critical-path collectives slowed by overlapped ones on the same links (contention.py)
    offload: float = 0.0  # activation copies to and from host memory not hidden behind compute (offload.py)

    @property
    def total(self) -> float:
        return (self.compute + self.tensor_parallel + self.context_parallel + self.pipeline_p2p
                + self.pipeline_bubble + self.data_parallel + self.embedding_sync + self.optimizer
                + self.expert_parallel + self.contention + self.offload)

    def terms(self) -> tuple[Term, ...]:
        """The step's addends in the order `total` sums them, each with what it counts (its module)."""
        return (Term("compute", self.compute, "kernels of the slowest stage's layers (and output layer), "
                     "every micro-batch (terms/compute.py)"),
                Term("tensor_parallel", self.tensor_parallel, "exposed tensor-parallel collectives (terms/tensor.py)"),
                Term("context_parallel", self.context_parallel, "key/value exchange beyond the attention it hides "
                     "behind (terms/context.py)"),
                Term("pipeline_p2p", self.pipeline_p2p, "exposed sends and receives between stages "
                     "(terms/pipeline.py)"),
                Term("pipeline_bubble", self.pipeline_bubble, "warm-up and cool-down of the pipeline schedule "
                     "(terms/pipeline.py)"),
                Term("data_parallel", self.data_parallel, "exposed gradient reduction, weight gathers and ZeRO-3 "
                     "gathers and scatters"),
                Term("embedding_sync", self.embedding_sync, "tied embedding's gradient between first and last stage"),
                Term("optimizer", self.optimizer, "the optimizer reading and writing its states"),
                Term("expert_parallel", self.expert_parallel, "MoE dispatch and combine all-to-alls "
                     "(terms/expert.py)"),
                Term("contention", self.contention, "critical-path collectives slowed by overlapped ones on the "
                     "same links (contention.py)"),
                Term("offload", self.offload, "activation copies to host not hidden behind compute (offload.py)"))

    def explain(self) -> str:
        """One line per nonzero term: its seconds, its share of the step and what it counts."""
        total = self.total
        return "\n".join(f"{term.name:>17} {term.seconds * 1e3:10.3f} ms {term.seconds / total:6.1%}  {term.what}"
                         for term in self.terms() if term.seconds) if total > 0 else ""

    def to_json(self) -> dict:
        return {"compute_s": self.compute, "tensor_parallel_s": self.tensor_parallel,
                "context_parallel_s": self.context_parallel, "pipeline_p2p_s": self.pipeline_p2p,
                "pipeline_bubble_s": self.pipeline_bubble, "data_parallel_exposed_s": self.data_parallel,
                "embedding_sync_s": self.embedding_sync, "optimizer_s": self.optimizer,
                "data_parallel_overlapped_s": self.data_parallel_overlapped, "expert_parallel_s": self.expert_parallel,
                "contention_s": self.contention, "activation_offload_s": self.offload}


@dataclass(frozen=True)
class Memory:
    """Bytes per device at peak, on the first and the last pipeline stage."""

    states_first: float
    activations_first: float
    states_last: float
    activations_last: float

    @property
    def first(self) -> float:
        return self.states_first + self.activations_first

    @property
    def last(self) -> float:
        return self.states_last + self.activations_last

    @cached_property
    def peak(self) -> float:  # kept: the search compares every candidate's against the Pareto set's
        return max(self.first, self.last)

    def to_json(self) -> dict:
        return {"peak_bytes": self.peak, "first_stage_bytes": self.first, "last_stage_bytes": self.last,
                "states_first_bytes": self.states_first, "activations_first_bytes": self.activations_first,
                "states_last_bytes": self.states_last, "activations_last_bytes": self.activations_last}


@dataclass(frozen=True)
class Prediction:
    degrees: Degrees
    placement: Placement
    settings: Settings
    microbatches: int
    step_s: float
    breakdown: Breakdown
    memory: Memory
    routes: tuple[Route, ...]
    model_flops: float  # per step, no recomputation
    hardware_flops: float  # per step, recomputation included

    def tokens_per_s(self, model: Transformer) -> float:
        return model.tokens_per_step / self.step_s

    def mfu(self, peak_flops: float) -> float:
        """Model FLOPs utilization: model FLOPs per second per device over the peak."""
        return self.model_flops / (self.step_s * self.placement.device_count * peak_flops)

    def flops_per_device(self) -> float:
        """Hardware FLOP/s per device (recomputation counted, as Narayanan et al. count it)."""
        return self.hardware_flops / (self.step_s * self.placement.device_count)


def microbatches_of(model: Transformer, degrees: Degrees, micro_batch: int) -> int | None:
    """m = global batch / (micro-batch x data-parallel degree), or None when it does not divide."""
    per_replica, remainder = divmod(model.global_batch, micro_batch * degrees.dp)
    return per_replica if remainder == 0 and per_replica > 0 else None


def settings_problem(model: Transformer, degrees: Degrees, settings: Settings) -> str | None:
    """Why these settings are not runnable with these degrees (Megatron's own checks), or None."""
    m = microbatches_of(model, degrees, settings.micro_batch)
    if m is None:
        return "batch"
    if settings.virtual > 1:
        if degrees.pp == 1 or model.layers % (degrees.pp * settings.virtual) or m % degrees.pp:
            return "interleaving"
    if settings.sequence_parallel and degrees.tp == 1:
        return "sequence parallelism without tensor parallelism"
    if settings.sharded_optimizer and degrees.dp == 1:
        return "sharded optimizer without data parallelism"
    if settings.tp_overlap and not settings.sequence_parallel:
        return "tensor-parallel overlap without sequence parallelism"
    if settings.overlap_param_gather and not settings.sharded_optimizer:
        return "parameter all-gather overlap without the sharded optimizer"
    if settings.zero not in (1, 2, 3):
        return "ZeRO stage not 1, 2 or 3"
    if settings.zero > 1 and not settings.sharded_optimizer:
        return "ZeRO stage 2 or 3 without the sharded optimizer"
    if settings.zero == 3 and settings.overlap_param_gather:
        return "ZeRO-3 gathers weights per layer, not after the step"
    if settings.hsdp and not (settings.sharded_optimizer and settings.zero == 3):
        return "HSDP without ZeRO-3"
    if settings.overlap_p2p and settings.virtual == 1:
        return "pipeline send/receive overlap without the interleaved schedule"
    if model.is_moe and degrees.tp > 1 and not settings.sequence_parallel:
        return "MoE with tensor parallelism needs sequence parallelism"  # Megatron-LM's validate_args
    problem = offload.offload_problem(model.layers, settings.offload_layers, degrees.pp, settings.recompute)
    if problem is not None:
        return problem
    problem = ep_overlap_problem(model, degrees, settings)
    if problem is not None:
        return problem
    if model.is_moe and settings.hsdp:
        # megatron-core 0.16.1's Megatron-FSDP builds no expert data-parallel group under HSDP
        # (mcore_fsdp_adapter.py) and refuses expert parameters without one.
        return "HSDP with experts (Megatron-FSDP has no expert group under HSDP): use ZeRO-3 without HSDP"
    return None


def ep_overlap_problem(model: Transformer, degrees: Degrees, settings: Settings) -> str | None:
    """megatron-core's TransformerConfig checks for overlap_moe_expert_parallel_comm (0.16:
    transformer_config.py): expert parallelism, no full recomputation, bf16 or fp16, and the
    interleaved schedule when there is a pipeline; the shared-expert overlap it also refuses
    is never exported with it (launch.py)."""
    if not settings.ep_overlap:
        return None
    if degrees.ep == 1:
        return "expert-parallel overlap without expert parallelism"
    if settings.recompute == "full":
        return "expert-parallel overlap with full recomputation"
    if model.precision not in ("bf16", "fp16"):
        return "expert-parallel overlap outside bf16 or fp16"
    if degrees.pp > 1 and settings.virtual == 1:
        return "expert-parallel overlap with a pipeline needs the interleaved schedule"
    return None


@lru_cache(maxsize=1024)
def _without_tp_overlap(settings: Settings) -> Settings:
    return dataclasses.replace(settings, tp_overlap=False)


def predict(model: Transformer, compute: Compute, costs: CommunicationCosts, degrees: Degrees, placement: Placement,
            settings: Settings, data_parallel: bool = True, floor: bool = False) -> Prediction:
    """The step time and memory of one candidate (module docstring); settings must be runnable.
    With `data_parallel=False` the gradient reduction is left out: a lower bound on the step
    time (every term is >= 0) for the search to skip candidates that cannot rank; with `floor=True`
    the gradient schedules are replaced by their lower bounds (terms/data.py): a tighter one."""
    dp, tp, pp, cp, v = degrees.dp, degrees.tp, degrees.pp, degrees.cp, settings.virtual
    if settings.tp_overlap and any(span > 1 for span in costs.factors(placement, ("tp",))[:costs.userbuffers_level]):
        # Transformer Engine's userbuffers overlap runs over the GPUs' own interconnect (CUDA IPC
        # inside a node, fabric handles inside a multi-node NVLink domain: costs.userbuffers_level):
        # tensor-parallel groups that cross it run their collectives unoverlapped.
        settings = _without_tp_overlap(settings)
    m = microbatches_of(model, degrees, settings.micro_batch)
    tokens = settings.micro_batch * model.seq_len // cp  # per device per micro-batch
    stages = formulas.stage_layers(model.layers, pp)
    act_bytes = model.bytes_per_value
    full = settings.recompute == "full"
    routes: list[Route] = []

    # --- compute per layer and for the output layer, per micro-batch (terms/compute.py) ----------
    layer = layer_compute(model, compute, settings, tp, cp, degrees.ep, degrees.etp)
    forward1, backward1, scores1 = layer.forward, layer.backward, layer.scores
    head_backward = layer.head_backward
    recompute1, compute1, compute_head = layer.recompute, layer.layer, layer.head

    # --- tensor parallelism (terms/tensor.py) ----------------------------------------------------
    activation = tokens * model.hidden * act_bytes
    tensor = tensor_parallel(model, compute, costs, placement, settings, tp, cp, activation)
    tp1, tp_backward1, tp_head, calls1 = tensor.layer, tensor.backward, tensor.head, tensor.calls

    # --- context parallelism (terms/context.py) --------------------------------------------------
    context = context_parallel(model, costs, placement, settings, tp, cp, tokens, scores1)
    cp1, cp_backward1 = context.layer, context.backward

    # --- expert parallelism: the MoE layers' token all-to-alls, per MoE layer (terms/expert.py) ---
    expert = expert_parallel(model, costs, placement, settings, tp, degrees.ep, tokens, activation,
                             forward1, backward1, ep_overlap_steady(m, pp, v), *_expert_groups(degrees))
    ep1, ep_backward1 = expert.layer, expert.backward
    ranges = moe.stage_ranges(model, stages)
    moe_first, moe_middle, moe_last = moe.stage_moe_layers(model, stages)

    # --- pipeline point to point (terms/pipeline.py) ---------------------------------------------
    transfer = pipeline_transfer(costs, placement, settings, tp, pp, activation)
    p2p_mb, per_transfer, sent = transfer.blocking, transfer.seconds, transfer.sent

    # --- ZeRO-3 / FSDP: per layer, exposed gathers and scatters (terms/sharded.py) -----------------
    sharded = sharded_layers(model, costs, degrees, placement, settings, m, layer, tp1, cp1, ep1)
    zero3, sharding, shard, replicas = sharded.zero3, sharded.sharding, sharded.shard, sharded.replicas
    fsdp1, fsdp_moe1, shared1, shared_moe1 = sharded.layer, sharded.moe_layer, sharded.shared, sharded.moe_shared
    routes.extend(sharded.routes)

    # --- activation offload (pp = 1 only): copies to host not hidden behind compute (terms/offload.py)
    offload_mb = offload_seconds(model, compute, settings, tp, cp, forward1, backward1, degrees.etp)

    # --- the slowest stage sets the pace (the last one also runs the output layer) ----------------
    def stage_work(count: int, head: bool, moe_count: int = 0) -> float:
        return (count * (compute1 + tp1 + cp1 + fsdp1 + shared1) + moe_count * (ep1 + fsdp_moe1 + shared_moe1)
                + (compute_head + tp_head + offload_mb if head else 0.0))

    def exposed_p2p(work: float) -> float:
        """With the overlap (Megatron's default for the interleaved schedule) each transfer runs
        behind the next chunk's compute (a 2v-th of the stage's work) and shows only beyond it."""
        if not settings.overlap_p2p:
            return p2p_mb
        return 2 * v * max(0.0, per_transfer - work / (2 * v))

    def p2p_shared(count: int, moe_count: int, work: float) -> float:
        """Overlapped transfers share links with the chunk's critical-path collectives (contention.py)."""
        if not settings.overlap_p2p or pp == 1 or per_transfer <= 0:
            return 0.0
        background = Background(("pp",), float(sent), per_transfer, min(1.0, 2 * v * per_transfer / max(work, 1e-12)))
        return extra_seconds(costs, placement, {("tp",): count * tp1, ("cp",): count * cp1,
                                                degrees.expert_group(): moe_count * ep1}, background)

    stage_times: dict[tuple[int, bool, int], float] = {}  # the middle stages repeat: each kind costed once

    def stage_mb(count: int, head: bool, moe_count: int) -> float:
        found = stage_times.get((count, head, moe_count))
        if found is None:
            work = stage_work(count, head, moe_count)
            found = stage_times[count, head, moe_count] = work + exposed_p2p(work) + p2p_shared(count, moe_count, work)
        return found

    candidates = [(stage_mb(stages.last, True, moe_last), stages.last, True, moe_last)]
    if pp > 1:
        candidates += [(stage_mb(stages.first, False, moe_first), stages.first, False, moe_first)]
        if stages.middle:
            candidates += [(stage_mb(stages.middle, False, moe_middle), stages.middle, False, moe_middle)]
    t_mb, layers, with_head, moe_layers = max(candidates, key=lambda c: (c[0], c[2]))
    # every stage's time per micro-batch, first to last (the bubble is the stages other than the slowest)
    counts = [(stages.first, False, moe_first)] + [(stages.middle, False, moe_middle)] * (pp - 2) if pp > 1 else []
    counts.append((stages.last, True, moe_last))
    share = forward1 / max(compute1, 1e-12)  # the forward's share of a layer's work (warm-up forwards)
    if settings.overlap_p2p and pp > 1:
        # overlapped transfers are hidden in the steady state but not on the warm-up and cool-down
        # chain: the bubble is the stages' work plus that chain's transfers (pipeline_bubble)
        bubble = pipeline_bubble([stage_work(*c) for c in counts], m, v, per_transfer, share)
    else:  # blocking transfers: each stage's time already holds its 2v transfers per micro-batch
        bubble = pipeline_bubble([stage_mb(*c) for c in counts], m, v, 0.0, share)
    p2p_mb = exposed_p2p(stage_work(layers, with_head, moe_layers)) if pp > 1 else 0.0
    ep_mb = moe_layers * ep1
    compute_mb = layers * compute1 + (compute_head if with_head else 0.0)
    tp_mb = layers * tp1 + (tp_head if with_head else 0.0)
    cp_mb = layers * cp1
    fsdp_mb = layers * fsdp1 + moe_layers * fsdp_moe1
    shared_mb = (layers * shared1 + moe_layers * shared_moe1
                 + (p2p_shared(layers, moe_layers, stage_work(layers, with_head, moe_layers)) if pp > 1 else 0.0))
    if tp > 1:
        routes.append(Route("tensor", tensor.program, tensor.levels, tensor.per_call, m * (layers * calls1 + with_head),
                            activation))
    if cp > 1:
        routes.append(Route("context", context.program, context.levels, context.exchange, m * layers, context.kv_bytes))
    if degrees.ep > 1 and moe_layers:
        routes.append(Route("expert", expert.program, expert.levels, expert.call_s, m * moe_layers * expert.calls,
                            expert.bytes, degrees.expert_group() if degrees.folded else ()))
    if pp > 1:
        routes.append(Route("pipeline", f"send/recv to the next stage ({transfer.link})", "", per_transfer, 2 * v * m,
                            sent))
    pipeline_s = m * t_mb + bubble

    # --- data parallelism: gradients of the first stage (it finishes its backward last) -----------
    params = formulas.stage_parameters(model, tp, pp, stages, degrees.ep, degrees.etp)
    first = stages.first
    grad_bytes = model.grad_bytes_per_value
    # Routed experts of each stage's device: their gradients and optimizer states belong to the
    # expert data-parallel group (dp / ep replicas), the rest to the whole data-parallel group.
    experts_first = moe.expert_parameters_per_device(model, degrees.expert_tp, degrees.ep, *ranges[0])
    experts_last = moe.expert_parameters_per_device(model, degrees.expert_tp, degrees.ep, *ranges[-1])
    def window(forward: bool) -> dict[tuple[str, ...], float]:
        """The first stage's critical-path collectives of one micro-batch's backward (or forward)."""
        tp_s = first * (tp_backward1 if not forward else tp1 - tp_backward1) if tp > 1 else 0.0
        cp_s = first * (cp_backward1 if not forward else cp1 - cp_backward1)
        return {("tp",): tp_s, ("cp",): cp_s, degrees.expert_group(): moe_first * ep_backward1}

    data = data_parallel_terms(model, costs, degrees, placement, settings, stages.first, ranges[0], params,
                               experts_first, layer, head_backward if pp == 1 else 0.0, tp_backward1,
                               window(True), window(False), sharded, data_parallel, floor)
    dp_exposed, dp_overlapped, contention_s = data.exposed, data.overlapped, data.contention
    routes.extend(data.routes)

    # --- the tied embedding's gradient between the first and the last stage (Megatron) ------------
    embedding_s = 0.0
    if pp > 1 and model.tied_embeddings:
        size = model.vocab * model.hidden // tp * grad_bytes
        embedding_s, link = costs.point_to_point(placement, "pp", size, first=0, last=pp - 1)
        routes.append(Route("embedding", f"exchange first and last stage ({link})", "", embedding_s, 1, size))

    # --- optimizer step: its states read and written once -----------------------------------------
    optimizer_s = _optimizer_seconds(model, compute, degrees, settings, params, experts_first, experts_last)

    breakdown = Breakdown(m * compute_mb, m * tp_mb, m * cp_mb, m * p2p_mb, bubble, dp_exposed + m * fsdp_mb,
                          embedding_s, optimizer_s, dp_overlapped, m * ep_mb, contention_s + m * shared_mb,
                          m * offload_mb)
    step_s = pipeline_s + dp_exposed + embedding_s + optimizer_s + contention_s  # pipeline_s holds m * shared_mb

    # --- memory -----------------------------------------------------------------------------------
    memory = _memory(model, degrees, settings, m, stages, params, experts_first, experts_last, zero3, shard)
    return Prediction(degrees, placement, settings, m, step_s, breakdown, memory, tuple(routes),
                      formulas.model_flops_per_step(model), formulas.hardware_flops_per_step(model, settings.recompute))


def _optimizer_seconds(model: Transformer, compute: Compute, degrees: Degrees, settings: Settings, params,
                       experts_first: float, experts_last: float) -> float:
    """The optimizer step: its states read and written once (placement-independent)."""
    dp, optimizer_s = degrees.dp, 0.0
    if compute.memory_bandwidth:
        # fp32 weights (or main copies) and states read and written, the fp32 gradient read, and the
        # low-precision weights written back in mixed precision.
        weights = model.bytes_per_value
        states = formulas.ADAM_STATE_BYTES if model.optimizer == "adam" else formulas.SGD_STATE_BYTES
        touched = 2 * (formulas.FP32 + states) + formulas.FP32 + (weights if weights < formulas.FP32 else 0)
        if settings.sharded_optimizer:
            local = max((params.first - experts_first) / dp + experts_first / degrees.expert_dp,
                        (params.last - experts_last) / dp + experts_last / degrees.expert_dp)
        else:
            local = params.most
        optimizer_s = local * touched / compute.memory_bandwidth
    return optimizer_s


def _memory(model: Transformer, degrees: Degrees, settings: Settings, m: int, stages, params,
            experts_first: float, experts_last: float, zero3: bool, shard: int) -> Memory:
    """Bytes per device at peak: the same on every placement but for HSDP's shard groups (`shard`:
    their size, terms/sharded.py)."""
    dp = degrees.dp
    tp, pp, cp, v = degrees.tp, degrees.pp, degrees.cp, settings.virtual
    act_bytes = model.bytes_per_value
    per_parameter = formulas.state_bytes_per_parameter(model, shard if zero3 else dp, settings.sharded_optimizer,
                                                       settings.zero if settings.sharded_optimizer else 0)
    gathered = 0.0
    if zero3 and shard > 1:  # two layers' weights gathered at once (the running one and the prefetched one) and one's gradients
        largest = formulas.layer_shape(model).per_device(tp)
        if model.is_moe:  # a MoE layer's dense part and its local experts, all gathered
            largest = max(largest, sum(moe.moe_layer_parameters_per_device(model, largest, tp, degrees.ep, degrees.etp)))
        gathered = largest * (2 * act_bytes + model.grad_bytes_per_value)
    per_layer = formulas.layer_activation_bytes(model, settings.micro_batch, tp, cp, settings.sequence_parallel,
                                                settings.recompute, degrees.etp)
    extra = formulas.embedding_activation_bytes(model, settings.micro_batch, tp, cp, settings.sequence_parallel, pp, m)
    first_layers = formulas.in_flight_layers(model, pp, v, m, stages.first)
    last_layers = stages.last
    if settings.ep_overlap and m > 1:  # the combined 1F1B schedule runs one more forward before its steady state
        first_layers += stages.first / v
        last_layers += stages.last / v
    # Routed experts shard their gradients and optimizer states over the expert data-parallel replicas only.
    per_expert = formulas.state_bytes_per_parameter(model, degrees.expert_dp, settings.sharded_optimizer,
                                                    settings.zero if settings.sharded_optimizer else 0)
    return Memory(params.first * per_parameter + experts_first * (per_expert - per_parameter) + gathered,
                  per_layer * (first_layers - settings.offload_layers) + extra.first,
                  params.last * per_parameter + experts_last * (per_expert - per_parameter) + gathered,
                  per_layer * (last_layers - settings.offload_layers) + extra.last)


def _expert_groups(degrees: Degrees) -> tuple:
    """(expert-parallel groups, expert tensor-parallel groups, etp) as terms/expert.py takes them."""
    return degrees.expert_group(), degrees.expert_tp_group(), degrees.etp


# Below every placement's step by this share, so that rounding never puts the floor above one.
FLOOR_MARGIN = 1e-9


@dataclass(frozen=True)
class GroupFloor:
    """What one (degrees, settings) pair gives every placement of a group: a step-time floor and the memory."""

    step_s: float
    memory: Memory


def representatives(costs: CommunicationCosts, degrees: Degrees, placements) -> tuple[Placement, ...]:
    """One placement per distinct span of the tensor-, context- and expert-parallel groups: the
    layer's own collectives (terms/tensor.py, context.py, expert.py) see the placement only
    through those spans (costs.factors), so they cost on each what they cost on its class."""
    axes = _term_axes(degrees)
    found: dict = {}
    for placement in placements:
        found.setdefault(tuple(costs.factors(placement, axis) for axis in axes), placement)
    return tuple(found.values())


def _term_axes(degrees: Degrees) -> list:
    """The groups whose spans are all the tensor-, context- and expert-parallel terms read of a placement."""
    axes = [(name,) for name, size in (("tp", degrees.tp), ("cp", degrees.cp)) if size > 1]
    axes += [degrees.expert_group()] if degrees.ep > 1 else []
    axes += [degrees.expert_tp_group()] if degrees.etp > 1 else []
    return axes


def group_floor(model: Transformer, compute: Compute, costs: CommunicationCosts, degrees: Degrees,
                settings: Settings, placements: tuple[Placement, ...], memo: dict | None = None,
                communication: bool = True) -> GroupFloor:
    """A lower bound on `predict`'s step on every placement whose representative (`representatives`)
    is among `placements`, and the candidates' memory (settings runnable and not HSDP, whose memory
    depends on the placement). Each stage's time per micro-batch keeps its layers' compute and
    tensor-, context- and expert-parallel collectives, exactly as predict has them, at their least
    over the representatives; the terms left out (ZeRO-3's exposed gathers, pipeline transfers,
    link contention, gradient reduction) are >= 0 and stage times only rise with them. The step
    keeps m times the slowest stage plus the part of the pipeline's longest chain that rises with
    every stage's time (pipeline_bubble: each chain holds m t_k + the stages before k; its other
    part, the wait for the later stages less the warm-up forwards, can fall as t_k rises and is
    left out), plus the optimizer step. Lets the search skip a whole group at once (search.py).
    `memo`: the terms by what they read (the degrees they take, the spans of their groups, the
    settings and the layer), shared by every group of a search.
    `communication=False` leaves the three collectives' terms out too (each is >= 0): a floor no
    higher, found without pricing a collective, that the search tries first (the same memory)."""
    tp, pp, cp, v = degrees.tp, degrees.pp, degrees.cp, settings.virtual
    m = microbatches_of(model, degrees, settings.micro_batch)
    stages = formulas.stage_layers(model.layers, pp)
    moe_first, moe_middle, moe_last = moe.stage_moe_layers(model, stages)
    # the stages' kinds (first, middle, last): the middle stages are alike, priced once each
    kinds = ([(stages.first, False, moe_first)] + ([(stages.middle, False, moe_middle)] if pp > 2 else [])
             if pp > 1 else [])
    kinds.append((stages.last, True, moe_last))
    tokens = settings.micro_batch * model.seq_len // cp
    activation = tokens * model.hidden * model.bytes_per_value
    steady = ep_overlap_steady(m, pp, v)
    term_axes = _term_axes(degrees)
    variants: dict = {}  # the settings used (with or without tp overlap) -> its layer and offload copies
    least: list[float] | None = None
    for placement in placements:
        overlap_off = settings.tp_overlap and any(
            span > 1 for span in costs.factors(placement, ("tp",))[:costs.userbuffers_level])
        variant = variants.get(overlap_off)
        if variant is None:
            used = _without_tp_overlap(settings) if overlap_off else settings
            layer = layer_compute(model, compute, used, tp, cp, degrees.ep, degrees.etp)
            variant = variants[overlap_off] = (used, layer, offload_seconds(model, compute, used, tp, cp, layer.forward,
                                                                             layer.backward, degrees.etp))
        used, layer, offload_mb = variant
        # what the three terms read (their own modules): the degrees they take, their groups' spans
        # (costs.factors), the settings and the layer; the same on every group that shares it
        key = (tp, cp, degrees.ep, degrees.etp, tuple(costs.factors(placement, axis) for axis in term_axes),
               used.micro_batch, used.recompute, used.sequence_parallel, used.tp_overlap,
               used.ep_overlap, layer.forward, layer.backward, layer.scores, steady)
        terms = memo.get(key) if memo is not None else None
        if not communication:
            terms = (0.0, 0.0, 0.0, 0.0)
        elif terms is None:
            tensor = tensor_parallel(model, compute, costs, placement, used, tp, cp, activation)
            context = context_parallel(model, costs, placement, used, tp, cp, tokens, layer.scores)
            expert = expert_parallel(model, costs, placement, used, tp, degrees.ep, tokens, activation,
                                     layer.forward, layer.backward, steady, *_expert_groups(degrees))
            terms = (tensor.layer, tensor.head, context.layer, expert.layer)
            if memo is not None:
                memo[key] = terms
        tensor_layer, tensor_head, context_layer, expert_layer = terms
        times = [count * (layer.layer + tensor_layer + context_layer) + moe_count * expert_layer
                 + (layer.head + tensor_head + offload_mb if head else 0.0) for count, head, moe_count in kinds]
        least = times if least is None else [min(a, b) for a, b in zip(least, times)]
    least = ([least[0]] + [least[1]] * (pp - 2) if pp > 1 else []) + [least[-1]]  # every stage, in order
    chain, before = 0.0, 0.0
    for t in least:
        chain = max(chain, m * t + before)
        before += t
    pipeline = m * max(least) * (1 - 1 / v) + chain / v
    params = formulas.stage_parameters(model, tp, pp, stages, degrees.ep, degrees.etp)
    ranges = moe.stage_ranges(model, stages)
    experts_first = moe.expert_parameters_per_device(model, degrees.expert_tp, degrees.ep, *ranges[0])
    experts_last = moe.expert_parameters_per_device(model, degrees.expert_tp, degrees.ep, *ranges[-1])
    optimizer_s = _optimizer_seconds(model, compute, degrees, settings, params, experts_first, experts_last)
    zero3 = settings.sharded_optimizer and settings.zero == 3 and degrees.dp > 1
    memory = _memory(model, degrees, settings, m, stages, params, experts_first, experts_last, zero3, degrees.dp)
    return GroupFloor((pipeline + optimizer_s) * (1 - FLOOR_MARGIN), memory)
