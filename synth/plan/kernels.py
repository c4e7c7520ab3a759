"""Kernel times from shapes: matrix multiplications, attention and memory-bound work on one
accelerator (a synth.devices.KernelDevice).

* A matrix multiplication `C[m,n] = A[m,k] B[k,n]` (`batch` of them at once) is cut into
  thread-block tiles of `Tm x Tn` outputs; the tiles run in waves of one per SM. Its compute
  time is `ceil(tiles / SMs)` waves (wave quantization), each wave as long as one tile's
  `2 Tm Tn k` FLOPs at the per-SM share of the achievable rate; tiles overhanging m or n
  compute padding (tile quantization). The library's choice among its tiles is modelled as the
  fastest (NVIDIA, "Matrix Multiplication Background User's Guide", DU-09799-001, chapter 3).
  When the tiles fill less than one wave the reduction is split over the idle SMs (split-K).
  On Hopper the library's persistent kernels spread a part-empty last wave over all SMs
  (stream-K, synth/devices.py): the waves count fractionally.
  Each tile ends by writing its `Tm x Tn` outputs at one SM's share of the memory bandwidth (the
  epilogue), which is what makes a shallow reduction (small k) slow.
  Below the ridge point the operands' bytes (`(mk + kn + mn)` values, each moved once) at the
  memory bandwidth take longer, and that is the time (the roofline).
* Attention with FlashAttention runs as one kernel over blocks of 128 queries per sequence and
  head (the kernels' block size), quantized in waves the same way, at the device's attention
  rate; causal masking skips half the score blocks. Its backward runs 2.5x the forward's
  FLOPs (the scores recomputed: five matrix products against two, as flash-attention's
  benchmarks/benchmark_flash_attention.py counts them). Without FlashAttention the scores are two batched matrix
  multiplications and a memory-bound softmax (synth/plan/formulas.py's traffic).
* Element-wise and normalization work moves its bytes at the memory bandwidth.
* Each micro-batch's weight gradients reach fp32 main gradients (mixed precision; Megatron
  accumulates over the micro-batches in them). With Megatron's gradient-accumulation fusion
  (`--gradient-accumulation-fusion`, Megatron-Core's default; Transformer Engine's
  `fuse_wgrad_accumulation`) the weight-gradient GEMM reads and writes the fp32 main gradient
  as its output (apex csrc/megatron/fused_weight_gradient_dense.cu, `wgrad_gemm_accum_fp32`:
  cublasGemmEx with C in CUDA_R_32F and beta = 1): its epilogue moves 8 bytes per output
  instead of 2 ("fused"). Megatron-LM's 2021 local DDP let the GEMM write the 16-bit
  gradient and a backward hook add it to the main-gradient buffer (`param.main_grad.add_(param.grad)`,
  the buffer in the precision gradients are reduced in): the gradient read, the buffer read
  and written, per weight at the memory bandwidth ("hook"). torch DDP over 16-bit
  gradients does neither ("none").
* Under back-to-back matrix products a device's power cap lowers its clock below the
  benchmark's: every tensor-core rate is scaled by the device's measured `power_capped`
  fraction (synth/devices.py; 1 where not measured).

`sustained` scales every tensor-core rate on top of the power cap: the fraction of the
(power-capped) benchmark rate the kernels keep inside a whole training step (gaps between
kernels, caches shared with communication kernels, what the shapes above miss). With
`host_s` it is one of the two figures fitted to published training runs (benchmarks/plan.py,
results/plan/), never to the run it is reported on; the mechanisms above are each checked
against kernels measured on an H100 (benchmarks/kernel_rates.py, results/kernels/).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from synth.plan import attention, formulas, moe
from synth.devices import KernelDevice
from synth.plan.gemms import Gemm, layer_gemms  # noqa: F401 (priced here; layer_gemms re-exported)
from synth.topology import Figure

_FITTED = ("fitted by benchmarks/plan.py (results/plan/README.md, 'Fitted on one table, predicting the other') on the "
           "nine rows of Megatron-Core r0.8's H100 weak-scaling table only; Narayanan et al.'s A100 Table 1 is its "
           "held-out check")
SUSTAINED = Figure(0.8115, f"sustained fraction of the benchmark matmul and attention rates, {_FITTED}")
HOST_LAYER_S = Figure(0.0, f"host time to issue one layer's forward and backward kernels per micro-batch, {_FITTED} "
                           "(the fit puts it at 0: no published row's layers are short enough to be issue-bound)")
MIN_SPLIT_K = 256  # the shallowest reduction one split-K block is given (one pipeline of 4 64-deep k-tiles)
FLASH_BLOCK = 128  # queries per thread block (FlashAttention-2/3 forward kernels)
FLASH_BACKWARD_FLOPS = 2.5  # backward over forward FLOPs (flash-attention, benchmarks/benchmark_flash_attention.py)
MAIN_GRAD_BYTES = 4  # fp32 main gradients (Megatron's mixed precision)
GRAD_ACCUMULATION = ("fused", "hook", "none")  # module docstring


@dataclass(frozen=True)
class KernelRates:
    """One device at one matmul precision, with the sustained fraction applied."""

    device: KernelDevice
    matmul_flops: float  # the tiles' own rate, all SMs together (from the benchmark's, see mainloop_rate)
    attention_flops: float  # attention kernel FLOP/s
    sustained: float = 1.0
    host_s: float = 0.0  # host time to issue one layer's forward and backward kernels (a floor on the layer)
    grad_accumulation: str = "fused"  # how weight gradients reach the fp32 main gradients (module docstring)

    @property
    def bandwidth(self) -> float:
        return self.device.memory_bandwidth.value

    @property
    def clock(self) -> float:
        """The fraction of the benchmark's tensor-core rates kept: the fitted sustained fraction
        times the device's measured power-capped clock."""
        return self.sustained * self.device.power_capped.value

    def wgrad_output_bytes(self, value_bytes: float) -> float:
        """Bytes per output a weight-gradient GEMM's epilogue moves: the fp32 main gradient read
        and written with gradient-accumulation fusion, else the gradient in the model's precision."""
        if self.grad_accumulation == "fused" and value_bytes < MAIN_GRAD_BYTES:
            return 2 * MAIN_GRAD_BYTES
        return value_bytes

    def accumulation_seconds(self, weights: float, value_bytes: float, main_bytes: float) -> float:
        """The hook's separate accumulation of `weights` gradients into the main gradients
        (`main_bytes` each, the precision they are reduced in): read the gradient, read and
        write the main gradient."""
        if self.grad_accumulation == "hook" and value_bytes < MAIN_GRAD_BYTES:
            return weights * (value_bytes + 2 * main_bytes) / self.bandwidth
        return 0.0

    def tiles(self, gemm: Gemm, tile: tuple[int, int]) -> int:
        return math.ceil(gemm.m / tile[0]) * math.ceil(gemm.n / tile[1]) * gemm.batch

    def split_k(self, gemm: Gemm, tile: tuple[int, int]) -> int:
        """Reduction splits when the tiles fill less than one wave (cuBLAS's split-K): each split a
        separate thread block over k/splits, at least MIN_SPLIT_K deep."""
        return max(1, min(int(self.device.sms.value) // self.tiles(gemm, tile), gemm.k // MIN_SPLIT_K))

    def waves(self, gemm: Gemm, tile: tuple[int, int]) -> float:
        """Whole waves of thread blocks; with stream-K (Hopper) the blocks' work spread evenly."""
        blocks = self.tiles(gemm, tile) * self.split_k(gemm, tile)
        if self.device.stream_k:
            return blocks / int(self.device.sms.value)
        return math.ceil(blocks / int(self.device.sms.value))

    def gemm_seconds(self, gemm: Gemm, value_bytes: float, output_bytes: float | None = None) -> float:
        """Wave-quantized compute time or the operands' traffic, whichever is longer; the epilogue
        moves `output_bytes` per output (default: the operands' precision, written once)."""
        output_bytes = value_bytes if output_bytes is None else output_bytes
        per_sm = self.matmul_flops * self.clock / self.device.sms.value
        share = self.bandwidth / self.device.sms.value  # one SM's share of the memory bandwidth
        compute = min(self.waves(gemm, tile) * (2.0 * tile[0] * tile[1] * math.ceil(gemm.k / self.split_k(gemm, tile))
                                                / per_sm + tile[0] * tile[1] * output_bytes / share)
                      for tile in self.device.tiles)
        traffic = ((gemm.m * gemm.k + gemm.k * gemm.n) * value_bytes + gemm.m * gemm.n * output_bytes) * gemm.batch
        return max(compute, traffic / self.bandwidth)

    def attention_seconds(self, queries: int, keys: int, head_dim: int, heads: int, batch: int,
                          causal: bool = True) -> tuple[float, float]:
        """(forward, backward) seconds of FlashAttention over `heads` heads of `batch` sequences."""
        flops = 4.0 * queries * keys * head_dim * heads * batch * (0.5 if causal else 1.0)
        blocks = math.ceil(queries / FLASH_BLOCK) * heads * batch
        sms = int(self.device.sms.value)
        fill = blocks / (math.ceil(blocks / sms) * sms)  # wave quantization: the last wave's empty SMs
        forward = flops / (self.attention_flops * self.clock * fill)
        return forward, FLASH_BACKWARD_FLOPS * forward

    def memory_seconds(self, nbytes: float) -> float:
        return nbytes / self.bandwidth


def rates_for(device: KernelDevice, precision: str, sustained: float = 1.0, matmul_precision: str | None = None,
              host_s: float = 0.0, attention_kernel: str | None = None,
              grad_accumulation: str = "fused") -> KernelRates | None:
    """The device's rates for a model in `precision` (matmuls in `matmul_precision`, e.g. fp8
    with Transformer Engine; attention stays in the 16-bit precision), or None when the device
    has no achievable-rate figure for it."""
    matmul = device.matmul_for(matmul_precision or precision)
    peak = device.peak_for("bf16" if precision == "fp16" else precision)
    attention = device.attention_for(attention_kernel)
    if matmul is None or peak is None or attention is None:
        return None
    shape = device.matmul_shape_for(matmul_precision or precision)
    value_bytes = 1 if (matmul_precision or precision) == "fp8" else 2
    if grad_accumulation not in GRAD_ACCUMULATION:
        raise ValueError(f"grad_accumulation {grad_accumulation!r}: one of {', '.join(GRAD_ACCUMULATION)}")
    return KernelRates(device, mainloop_rate(device, matmul.value, shape, value_bytes), attention.value * peak,
                       sustained, host_s, grad_accumulation)


def mainloop_rate(device: KernelDevice, benchmark_flops: float, shape: tuple[int, int, int], value_bytes: int) -> float:
    """The tiles' own rate (all SMs): the benchmark's rate with the epilogues of its best shape
    taken out. A best-of-grid search picks shapes that fill their waves, so only the epilogue is
    removed (Hopper's library kernels also rebalance part-empty waves, which the tile model
    does not credit). For every built-in device the result lies between the benchmark's rate
    and the dense peak (tests/test_plan_kernels.py)."""
    k = shape[2]
    tile = device.tiles[0]
    sms = device.sms.value
    mainloop = 2.0 * tile[0] * tile[1] * k
    epilogue = tile[0] * tile[1] * value_bytes / (device.memory_bandwidth.value / sms)
    per_sm = mainloop / (mainloop * sms / benchmark_flops - epilogue)
    return per_sm * sms


@dataclass(frozen=True)
class LayerTimes:
    """One transformer layer on one device, one micro-batch, in seconds."""

    forward: float  # matmuls, attention and memory-bound work
    backward: float
    attention_forward: float  # the attention scores part of forward (what selective recomputation redoes)
    matmul_forward: float  # the weight matmuls of forward (what tensor-parallel overlap hides communication behind)


def gemms_seconds(rates: KernelRates, gemms, value_bytes: float, weights: bool = True,
                  main_bytes: float = MAIN_GRAD_BYTES) -> tuple[float, float]:
    """(forward, backward) seconds of matmuls: backward is each one's two gradients. With
    `weights` the second operand is a weight: its gradient reaches the fp32 main gradient
    (KernelRates.wgrad_output_bytes, accumulation_seconds); else both are activations."""
    forward = sum(rates.gemm_seconds(g, value_bytes) for g in gemms)
    backward = 0.0
    for g in gemms:
        data, weight = g.backward()
        backward += rates.gemm_seconds(data, value_bytes)
        if weights:
            backward += (rates.gemm_seconds(weight, value_bytes, rates.wgrad_output_bytes(value_bytes))
                         + rates.accumulation_seconds(g.k * g.n * g.batch, value_bytes, main_bytes))
        else:
            backward += rates.gemm_seconds(weight, value_bytes)
    return forward, backward


def expert_gemms(model, tokens: int, tp: int, ep: int, sequence_parallel: bool, etp: int = 0):
    """(the MoE FFN's weight matmuls, the dense FFN's it replaces) of one MoE layer's forward on
    one device, `tokens` the tensor-parallel group's tokens (synth/plan/moe.py's routing):
    the router (`tokens x E`, over the sequence-parallel shard with sequence parallelism), each
    of the `E / ep` local experts as one product of the group's routed tokens an expert gets,
    `ep tokens k c / E` rows (Megatron's grouped GEMM), by `f_e / tp` (up, and gate) and back,
    and the shared experts over every token. Few rows per expert fill few tiles: this is where
    fine-grained experts lose rate (wave quantization, module docstring). With an expert
    tensor-parallel degree `etp` of its own (MoE parallel folding, synth/plan/folding.py; 0: tp)
    the rows are the routed tokens of the `ep x etp` ranks that share the device's experts, each
    routing its `tokens / tp` (sequence-parallel shard), by `f_e / etp`: the same FLOPs.

    Why one `Gemm` of `E / ep` problems, each rounded to whole tiles: Megatron's grouped GEMM
    (`--moe-grouped-gemm`: Transformer Engine's GroupedLinear, or the grouped_gemm package over
    CUTLASS) runs the experts' products as one persistent kernel whose thread blocks walk the
    concatenated tile list of every problem (CUTLASS include/cutlass/gemm/kernel/
    grouped_problem_visitor.h: each problem's `ceil(m / tile) x ceil(n / tile)` tiles, no tile
    spans two problems). An expert's `m` rows are padded to the tile's rows, so 64 tokens per
    expert on a 128-row tile run at half rate, and the tiles of all problems share the waves:
    many small experts are not one big GEMM of the same FLOPs."""
    h, up = model.hidden, (2 if model.gated_mlp else 1)
    local = model.experts // ep
    routed = (tokens // tp if sequence_parallel else tokens) * etp * ep if etp else tokens * ep
    rows = max(1, round(moe.routed_tokens(model, routed) / model.experts))
    f, width = moe.expert_ffn(model), etp or tp
    router = Gemm(tokens // tp if sequence_parallel else tokens, model.experts, h)
    moe_gemms = [router, Gemm(rows, up * f // width, h, local), Gemm(rows, h, f // width, local)]
    if model.shared_ffn:
        moe_gemms += [Gemm(tokens, up * model.shared_ffn // tp, h), Gemm(tokens, h, model.shared_ffn // tp)]
    dense = (Gemm(tokens, up * model.ffn // tp, h), Gemm(tokens, h, model.ffn // tp))
    return tuple(moe_gemms), dense


def mean_gemm_delta_seconds(model, rates, tokens: int, tp: int, ep: int, sequence_parallel: bool,
                            etp: int = 0) -> tuple[float, float]:
    """Per layer (averaged over all layers, like the FLOPs and traffic terms), the (forward,
    backward) seconds the MoE layers' matmuls add over dense FFNs, each timed by its shape."""
    if not model.is_moe:
        return 0.0, 0.0
    moe_gemms, dense = expert_gemms(model, tokens, tp, ep, sequence_parallel, etp)
    moe_f, moe_b = gemms_seconds(rates, moe_gemms, model.bytes_per_value)
    dense_f, dense_b = gemms_seconds(rates, dense, model.bytes_per_value)
    share = moe.moe_layer_count(model) / model.layers
    return share * (moe_f - dense_f), share * (moe_b - dense_b)


@lru_cache(maxsize=4096)
def layer_times(model, rates: KernelRates, micro_batch: int, tp: int, cp: int, sequence_parallel: bool,
                ep: int = 1, etp: int = 0) -> LayerTimes:
    """One layer's kernels on one device for one micro-batch (module docstring): weight matmuls
    by shape, attention by its kernel, the rest at the memory bandwidth (formulas.layer_traffic_bytes,
    backward moving twice the forward's bytes). A MoE model's average layer: its experts' matmuls
    by their shapes over `ep` and `etp` (synth/plan/moe.py; 0: tp). Memoized: a plan's candidates share few
    (micro-batch, tp, cp, ep) choices, and the arguments are frozen values (the attention-form
    fields included, being part of the frozen Transformer)."""
    value = model.bytes_per_value
    queries = model.seq_len // cp
    tokens = micro_batch * queries
    heads = max(model.heads // tp, 1)
    gemms = attention.layer_gemms(model, tokens, tp)
    matmul_f, matmul_b = gemms_seconds(rates, gemms, value, main_bytes=model.grad_bytes_per_value)
    experts_f, experts_b = mean_gemm_delta_seconds(model, rates, tokens, tp, ep, sequence_parallel, etp)
    matmul_f, matmul_b = matmul_f + experts_f, matmul_b + experts_b
    qk, v = attention.qk_head_dim(model), attention.v_head_dim(model)
    if model.flash_attention:  # 4 q k d FLOPs per head at d = h/a; (d_qk + d_v)/2 for MLA's two sizes
        attention_f, attention_b = rates.attention_seconds(queries, model.seq_len, model.head_dim if qk == v
                                                           else (qk + v) / 2, heads, micro_batch)
    else:  # scores Q K^T and their product with V as batched matmuls (the softmax is in the traffic)
        scores = (Gemm(queries, model.seq_len, qk, micro_batch * heads),
                  Gemm(queries, v, model.seq_len, micro_batch * heads))
        attention_f, attention_b = gemms_seconds(rates, scores, value, weights=False)
    traffic = formulas.layer_traffic_bytes(model, micro_batch, tp, cp, sequence_parallel)
    memory_f = rates.memory_seconds(traffic.total)
    return LayerTimes(matmul_f + attention_f + memory_f, matmul_b + attention_b + 2 * memory_f,
                      attention_f + rates.memory_seconds(traffic.scores), matmul_f)


@lru_cache(maxsize=4096)
def head_times(model, rates: KernelRates, micro_batch: int, tp: int, cp: int) -> tuple[float, float]:
    """(forward, backward) of the output layer: the logits matmul and the cross entropy's passes."""
    tokens = micro_batch * model.seq_len // cp
    forward, backward = gemms_seconds(rates, (Gemm(tokens, model.vocab // tp, model.hidden),), model.bytes_per_value,
                                      main_bytes=model.grad_bytes_per_value)
    traffic_forward, traffic_backward = formulas.head_traffic_bytes(model, micro_batch, tp, cp)
    return forward + rates.memory_seconds(traffic_forward), backward + rates.memory_seconds(traffic_backward)
