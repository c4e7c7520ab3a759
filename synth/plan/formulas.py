"""Parameters, FLOPs and memory of a transformer training step, per device.

Every formula is the published one, generalized only where the published model is narrower
(FFN size, grouped-query attention, gated FFN, no dropout); docs/plan.md lists them with their
sources. In short:

* Parameters (Narayanan et al. SC'21, eq. 2, `12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h))` for GPT):
  per layer the attention matrices `h(h + 2 g d) + h^2` (g key/value heads of d = h/a), the FFN
  `2 h f` (`3 h f` gated), biases and two norms; embeddings `V h` (+ `s h` learned positions,
  + `V h` when the output layer is not tied).
* FLOPs (Narayanan et al. eq. 3, `96 B s l h^2 (1 + s/(6h) + V/(16 l h))` with full recomputation):
  a forward pass costs 2 FLOPs per weight per token in the matrix multiplications plus `4 s h`
  per token per layer for the attention scores and their product with the values (the full
  `s x s` square, as the paper counts it), `2 h V` per token for the output layer; backward
  costs twice forward; full recomputation adds one forward of the layers, selective
  recomputation (Korthikanti et al. 2022) the attention scores' forward.
* Activations per layer and micro-batch (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", eqs. 1-4): `s b h (34 + 5 a s / h)` bytes without
  parallelism, `s b h (10 + 24/t + 5 a s/(h t))` with tensor parallelism, `s b h/t (34 + 5 a s/h)`
  with sequence parallelism, `34 s b h / t` with selective recomputation (the `5 a s/h` scores
  recomputed), `2 s b h` (/t with sequence parallelism) with full recomputation; the first
  pipeline stage keeps `p` micro-batches in flight (`L` layers' worth in all), x(1 + (p-1)/(p v))
  interleaved (section 4.2.3); embedding dropout and output layer terms of section 4.3.
* Mixture-of-experts layers (synth/plan/moe.py) enter as additive terms over the dense FFN:
  all experts in the parameter count, `k` of them (x the capacity factor) in the FLOPs, the
  activations and the memory traffic, `E/ep` of them per device in the stage's parameters.
* Weights, gradients and optimizer states (Megatron-LM docs, distributed optimizer): bytes per
  parameter `20` (fp16 weights and gradients, Adam), `18` (bf16 weights, fp32 gradients), `16`
  (fp32); with the sharded optimizer (ZeRO-1, Rajbhandari et al. 2020) `4 + 16/d`, `6 + 12/d`,
  `8 + 8/d`: weights and gradients stay whole, fp32 main copies and Adam moments are split over
  the d data-parallel replicas.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from synth.plan import attention, moe
from synth.plan.model import Transformer

RECOMPUTE = ("none", "selective", "full")
ADAM_STATE_BYTES = 8  # two fp32 moments per parameter
SGD_STATE_BYTES = 4  # one fp32 momentum per parameter
FP32 = 4


# --- parameters -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerShape:
    """One transformer layer's parameters, split by how tensor parallelism treats them."""

    matmul: int  # weights of the matrix multiplications: split over t
    split_biases: int  # biases of column-parallel matrices: split over t
    replicated: int  # norms and row-parallel biases: whole on every tensor-parallel rank

    @property
    def total(self) -> int:
        return self.matmul + self.split_biases + self.replicated

    def per_device(self, tp: int) -> float:
        return (self.matmul + self.split_biases) / tp + self.replicated


@lru_cache(maxsize=4096)  # asked per candidate, the same few arguments: computed once each
def layer_shape(model: Transformer) -> LayerShape:
    h, f, kv = model.hidden, model.ffn, model.query_groups * model.head_dim
    mlp = (3 if model.gated_mlp else 2) * h * f
    norm = 2 * h if model.biases else h  # LayerNorm weight and bias, or RMSNorm weight
    row_biases = 2 * h if model.biases else 0
    if not attention.plain(model):  # MLA or a per-head size of its own (attention.py)
        ffn_biases = (2 * f if model.gated_mlp else f) if model.biases else 0
        split_biases = attention.split_biases(model) + ffn_biases if model.biases else 0
        replicated = 2 * norm + row_biases + attention.replicated_weights(model) + attention.replicated_norms(model)
        return LayerShape(attention.split_weights(model) + mlp, split_biases, replicated)
    qkv, out = h * (h + 2 * kv), h * h
    split_biases = (h + 2 * kv) + (2 * f if model.gated_mlp else f) if model.biases else 0
    return LayerShape(qkv + out + mlp, split_biases, 2 * norm + row_biases)


def embedding_parameters(model: Transformer) -> int:
    """Input embedding (+ learned positions), the untied output layer and the final norm."""
    h = model.hidden
    total = model.vocab * h + (model.seq_len * h if model.learned_positions else 0)
    total += 0 if model.tied_embeddings else model.vocab * h
    return total + (2 * h if model.biases else h)


def parameter_count(model: Transformer) -> int:
    """Every parameter; MoE layers with all their experts (synth/plan/moe.py)."""
    return model.layers * layer_shape(model).total + embedding_parameters(model) + moe.parameter_delta(model)


def active_parameter_count(model: Transformer) -> int:
    """The parameters one token uses: MoE layers with k routed experts (the dense count otherwise)."""
    return model.layers * layer_shape(model).total + embedding_parameters(model) + moe.active_parameter_delta(model)


def megatron_parameter_count(model: Transformer) -> float:
    """Narayanan et al. eq. 2, for checking: 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h))."""
    l, h = model.layers, model.hidden
    return 12 * l * h * h * (1 + 13 / (12 * h) + (model.vocab + model.seq_len) / (12 * l * h))


@dataclass(frozen=True)
class StageParameters:
    """Parameters one device holds: its layers and, on the first or last stage, the embeddings."""

    first: float  # the first pipeline stage's device
    last: float  # the last stage's device (the same device when p = 1)

    @property
    def most(self) -> float:
        return max(self.first, self.last)


@dataclass(frozen=True)
class StageLayers:
    """Layers per pipeline stage: the first, each middle one, the last (Megatron-LM's
    --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers, the middle stages
    splitting the rest evenly)."""

    first: int
    middle: int  # 0 when there are no middle stages (p <= 2)
    last: int

    @property
    def uneven(self) -> bool:
        return not (self.first == self.last and (self.middle in (0, self.first)))


def stage_layers(layers: int, pp: int, first: int | None = None, last: int | None = None) -> StageLayers | None:
    """The split of `layers` over `pp` stages, or None when there is none. Given first and last
    counts the middle stages share the rest evenly; otherwise an even split when pp divides the
    layers, else the middle stages get ceil(L/p) each and the first and the last (which also
    hold the embedding and the output layer) share the remainder, the last the smaller half."""
    if pp == 1:
        return StageLayers(layers, 0, layers) if first in (None, layers) and last in (None, layers) else None
    if first is None and last is None:
        if layers % pp == 0:
            return StageLayers(layers // pp, layers // pp if pp > 2 else 0, layers // pp)
        middle = -(-layers // pp)
        rest = layers - middle * (pp - 2)
        first, last = rest - rest // 2, rest // 2
        if last < 1:
            return None
        return StageLayers(first, middle if pp > 2 else 0, last)
    first = first if first is not None else (layers - last) // (pp - 1)
    last = last if last is not None else layers - first - (pp - 2) * ((layers - first) // (pp - 1))
    rest = layers - first - last
    if first < 1 or last < 1 or rest < 0:
        return None
    if pp == 2:
        return StageLayers(first, 0, last) if rest == 0 else None
    if rest % (pp - 2) or rest == 0:
        return None
    return StageLayers(first, rest // (pp - 2), last)


@lru_cache(maxsize=4096)  # asked per candidate, the same few arguments: computed once each
def stage_parameters(model: Transformer, tp: int, pp: int, stages: StageLayers | None = None,
                     ep: int = 1, etp: int = 0) -> StageParameters:
    """With MoE layers, each stage's own MoE layers hold E/ep experts per device, split by the
    expert tensor-parallel degree `etp` (0: tp) (moe.py)."""
    h = model.hidden
    per_layer = layer_shape(model).per_device(tp)
    stages = stages or stage_layers(model.layers, pp)
    layers = per_layer * model.layers / pp
    (first_start, first_stop), (last_start, last_stop) = moe.stage_layers(model, stages)
    first_moe = moe.stage_parameter_delta(model, tp, ep, first_start, first_stop, etp)
    last_moe = moe.stage_parameter_delta(model, tp, ep, last_start, last_stop, etp)
    embedding = model.vocab * h / tp + (model.seq_len * h if model.learned_positions else 0)
    output = model.vocab * h / tp  # tied: the last stage keeps a copy (Megatron); untied: its own
    final_norm = 2 * h if model.biases else h
    if pp == 1:
        whole = layers + first_moe + embedding + final_norm + (0 if model.tied_embeddings else output)
        return StageParameters(whole, whole)
    return StageParameters(per_layer * stages.first + first_moe + embedding,
                           per_layer * stages.last + last_moe + output + final_norm)


# --- FLOPs --------------------------------------------------------------------------------------


def layer_forward_flops(model: Transformer, tokens: int, context: int, padded: bool = True) -> tuple[float, float]:
    """(matrix-multiplication FLOPs, of which attention scores and values) of one layer's forward
    over `tokens` query tokens attending to `context` keys (whole model, no parallelism). With
    MoE layers, the average layer's: active experts only, x the capacity factor when `padded`."""
    shape = layer_shape(model)
    if attention.plain(model):
        scores = 4.0 * tokens * context * model.hidden
        return 2.0 * tokens * shape.matmul + moe.mean_flops_delta(model, tokens, padded) + scores, scores
    scores = tokens * attention.scores_flops_per_token(model, context)
    matmul = 2.0 * tokens * (shape.matmul + attention.replicated_weights(model))  # MLA's whole down projections
    return matmul + moe.mean_flops_delta(model, tokens, padded) + scores, scores


def attention_dominant(model: Transformer) -> bool:
    """Whether the attention scores cost at least as many FLOPs as the layer's weight matmuls
    (`4 s h` against `2 x weights` per token; s >= 6h for GPT): from there on context parallelism,
    which splits exactly that work, is worth searching by default."""
    layer, attention = layer_forward_flops(model, 1, model.seq_len)
    return attention >= layer - attention


def head_forward_flops(model: Transformer, tokens: int) -> float:
    """The output layer's logits: 2 h V per token."""
    return 2.0 * tokens * model.hidden * model.vocab


@lru_cache(maxsize=4096)  # asked per candidate, the same few arguments: computed once each
def model_flops_per_step(model: Transformer) -> float:
    """FLOPs of forward and backward (3x forward) for one optimizer step, no recomputation:
    the numerator of model FLOPs utilization (MFU)."""
    tokens = model.tokens_per_step
    layer, _ = layer_forward_flops(model, tokens, model.seq_len, padded=False)
    return 3.0 * (model.layers * layer + head_forward_flops(model, tokens))


@lru_cache(maxsize=4096)  # asked per candidate, the same few arguments: computed once each
def hardware_flops_per_step(model: Transformer, recompute: str) -> float:
    """The FLOPs the devices execute, recomputation included: with full recomputation this is
    Narayanan et al.'s eq. 3, the figure their TFLOP/s per GPU counts."""
    tokens = model.tokens_per_step
    layer, attention = layer_forward_flops(model, tokens, model.seq_len)
    extra = {"none": 0.0, "selective": attention, "full": layer}[recompute]
    return model.layers * (3.0 * layer + extra) + 3.0 * head_forward_flops(model, tokens)


def megatron_flops_per_step(model: Transformer) -> float:
    """Narayanan et al. eq. 3: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)), for checking."""
    B, s, l, h = model.global_batch, model.seq_len, model.layers, model.hidden
    return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + model.vocab / (16 * l * h))


# --- memory ---------------------------------------------------------------------------------------


def state_bytes_per_parameter(model: Transformer, dp: int, sharded_optimizer: bool, zero: int = 1) -> float:
    """Weights, gradients, fp32 main copies and optimizer states per parameter (module docstring);
    sharded over the d replicas: ZeRO-1 the main copies and states, ZeRO-2 the gradients too,
    ZeRO-3 (FSDP) the weights too (Rajbhandari et al. 2020, section 5)."""
    weights, grads = model.bytes_per_value, model.grad_bytes_per_value
    main_weights = FP32 if weights < FP32 else 0
    main_grads = FP32 if grads < FP32 else 0
    states = ADAM_STATE_BYTES if model.optimizer == "adam" else SGD_STATE_BYTES
    sharded = main_weights + main_grads + states
    if not sharded_optimizer or zero < 1:
        return weights + grads + sharded
    if zero == 1:
        return weights + grads + sharded / dp
    if zero == 2:
        return weights + (grads + sharded) / dp
    return (weights + grads + sharded) / dp


@lru_cache(maxsize=4096)  # asked per candidate, the same few arguments: computed once each
def layer_activation_bytes(model: Transformer, micro_batch: int, tp: int, cp: int, sequence_parallel: bool,
                           recompute: str, etp: int = 0) -> float:
    """Activations one layer keeps for backward, per micro-batch, per device (Korthikanti et al.
    eqs. 1-4, generalized to FFN size f, g key/value heads, gated FFNs, no dropout, FlashAttention;
    MoE layers with the expert tensor-parallel degree `etp`, 0: tp, moe.mean_activation_delta)."""
    s, b, h, f = model.seq_len / cp, micro_batch, model.hidden, model.ffn
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (tp if sequence_parallel else 1)  # the layer's input only
    kv = model.query_groups * model.head_dim
    dropout = 1 if model.dropout else 0
    # Not split by tensor parallelism: two norm inputs (4sbh), the QKV and first FFN inputs (4sbh),
    # the two dropout masks (2sbh).
    replicated = 8 * sbh + 2 * dropout * sbh
    # Split by tensor parallelism: Q (2sbh), K and V (4 s b g d), the output projection's input (2sbh),
    # the FFN's inner activations (4 s b f; 6 s b f gated).
    split = 4 * sbh + 4 * s * b * kv + (6 if model.gated_mlp else 4) * s * b * f
    if not attention.plain(model):  # Q, K, V and the projection's input as their own widths (attention.py)
        split_per_token, whole_per_token = attention.activation_bytes_per_token(model)
        split = s * b * split_per_token + (6 if model.gated_mlp else 4) * s * b * f
        replicated += s * b * whole_per_token
    # Attention scores: softmax output (2 a s^2 b), dropout mask (a s^2 b) and output (2 a s^2 b);
    # FlashAttention keeps only the fp32 log-sum-exp per query and head.
    if model.flash_attention:
        scores = 4 * model.heads * s * b
    else:
        scores = (2 + 3 * dropout) * model.heads * s * model.seq_len * b
    if recompute == "selective":
        scores = 0.0
    experts = moe.mean_activation_delta(model, s * b, tp, etp)  # the MoE layers' FFN part (moe.py)
    return replicated / (tp if sequence_parallel else 1) + (split + scores) / tp + experts


def in_flight_layers(model: Transformer, pp: int, virtual: int, microbatches: int, first: int | None = None) -> float:
    """Layers' worth of micro-batch activations the first pipeline stage's device holds at peak:
    min(p, m) micro-batches of its L/p layers in 1F1B, x(1 + (p-1)/(p v)) interleaved
    (Korthikanti et al. section 4.2.3; Narayanan et al. section 2.2)."""
    layers = (model.layers / pp if first is None else first) * min(pp, microbatches)
    if virtual > 1:
        layers *= 1 + (pp - 1) / (pp * virtual)
    return layers


def embedding_activation_bytes(model: Transformer, micro_batch: int, tp: int, cp: int, sequence_parallel: bool,
                               pp: int, microbatches: int) -> StageParameters:
    """Korthikanti et al. section 4.3: the first stage's embedding dropout masks (s b h per
    micro-batch in flight) and the last stage's final norm input, output layer input (2 s b h
    each) and fp32 logits for the cross entropy (4 s b V / t), as (first, last) bytes."""
    s, b, h = model.seq_len / cp, micro_batch, model.hidden
    shard = tp if sequence_parallel else 1
    first = (s * b * h / shard) * min(pp, microbatches) if model.dropout else 0.0
    last = 4 * s * b * h / shard + 4 * s * b * model.vocab / tp
    if pp == 1:
        return StageParameters(first + last, first + last)
    return StageParameters(first, last)


# --- memory traffic of the operations that are not matrix multiplications -------------------------


@dataclass(frozen=True)
class LayerTraffic:
    """HBM bytes one layer's forward reads and writes outside its matrix multiplications, per
    micro-batch and device: the norms, bias-dropout-adds, the FFN activation, and the attention
    scores' softmax and dropout (`scores`, the part selective recomputation repeats)."""

    total: float
    scores: float


def layer_traffic_bytes(model: Transformer, micro_batch: int, tp: int, cp: int, sequence_parallel: bool) -> LayerTraffic:
    """Memory-bound operations of a Megatron-LM layer, with its fused kernels (Narayanan et al.
    SC'21 section 4.2: fused bias+GeLU, bias+dropout+add, scale+mask+softmax): each reads its
    inputs and writes its output once, in elements per token:

    * two norms: read h, write h each (4h);
    * two bias-dropout-adds: read the branch and the residual, write h, and a 1-byte mask (3h + 2h
      masks; 3h without dropout);
    * the FFN activation: read f, write f (2f); gated: read gate and up, write f (3f);
    * softmax over the scores: read and write a s values per token (2as); dropout on them: read
      a s, write a s and a 1-byte mask; FlashAttention keeps the scores on chip (none).

    The norms and adds run on whole activations unless sequence parallelism splits them by t;
    the FFN and attention parts are split by t. Values are of the model's precision, masks 1 byte."""
    value = model.bytes_per_value
    tokens = model.seq_len / cp * micro_batch
    h, f, a = model.hidden, model.ffn, model.heads
    dropout = model.dropout
    replicated = (4 * h + 3 * h) * value + (2 * h if dropout else 0)
    if attention.is_mla(model):  # the latents' norms (attention.py)
        replicated += attention.norm_traffic_values_per_token(model) * value
    ffn = (3 if model.gated_mlp else 2) * f * value
    if model.flash_attention:
        scores = 0.0
    else:
        context = model.seq_len
        scores = 2 * a * context * value + ((2 * value + 1) * a * context if dropout else 0)
    total = tokens * (replicated / (tp if sequence_parallel else 1) + (ffn + scores) / tp)
    total += moe.mean_traffic_delta(model, tokens, tp)  # MoE layers' FFN part (moe.py)
    return LayerTraffic(total, tokens * scores / tp)


def head_traffic_bytes(model: Transformer, micro_batch: int, tp: int, cp: int) -> tuple[float, float]:
    """(forward, backward) bytes the vocabulary-parallel cross entropy moves over its s b V / t
    logits, pass by pass as Megatron-Core writes it (tensor_parallel/cross_entropy.py, unfused):
    forward, the cast to fp32 (read the model's precision, write 4 bytes), the max (read 4), the
    subtraction, the exp and the division in place (read and write 4 each), the sum (read 4);
    backward, the scaling by the output gradient in place (read and write 4) and the cast back
    to the model's precision for the output layer's gradient (read 4, write the precision)."""
    logits = model.seq_len / cp * micro_batch * model.vocab / tp
    value = model.bytes_per_value
    forward = (value + FP32) + FP32 + 3 * 2 * FP32 + FP32
    backward = 2 * FP32 + (FP32 + value)
    return logits * forward, logits * backward
