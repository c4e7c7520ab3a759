"""The attention block's shapes for the forms beyond GPT's and Llama's: a per-head size that is
not `h / a` (Qwen3, GPT-OSS, Llama 4: `head_size`) and multi-head latent attention (MLA,
DeepSeek-V2/V3: `kv_lora_rank > 0`).

A model whose attention is the classic one (`plain`: `head_size` 0, no MLA) is priced by the
formulas in formulas.py and kernels.py unchanged; this module answers only for the others.

With `a` heads, per-head sizes `d_qk` (query/key) and `d_v` (value), per token:

* grouped-query attention of `g` key/value heads of size `d`: weights `h (a d + 2 g d)` for the
  fused QKV projection (column-parallel) and `a d h` for the output projection (row-parallel);
* MLA (DeepSeek-V2 paper, arXiv:2405.04434, section 2.1; DeepSeek-V3's modeling_deepseek.py):
  the query is projected down to `q_lora_rank` (`h x r_q`, RMSNorm) and up to the heads
  (`r_q x a d_qk`, `d_qk = qk_nope_head_dim + qk_rope_head_dim`), or straight from `h` when
  `q_lora_rank` is 0; the keys and values share one latent: `h x (r_kv + d_rope)` down
  (the rotary key part `d_rope` shared by all heads), RMSNorm over `r_kv`, then
  `r_kv x a (d_nope + d_v)` up; the output projection is `a d_v x h`. Megatron-Core's
  MultiLatentAttention keeps the two down projections whole on every tensor-parallel rank
  (duplicated linears) and splits the up and output projections by `t`.

FLOPs: 2 per weight per token, plus `2 s a (d_qk + d_v)` per token for the scores and their
product with the values (`4 s h` when `d_qk = d_v = h/a`, formulas.py's count). Activations kept
for backward (Korthikanti et al.'s accounting, in 16-bit values): Q, K, V and the output
projection's input, `2 (a d_qk + k + v + a d_v)` bytes per token split by `t`; with MLA also
the two latents and their norms' inputs, `4 (r_q + r_kv + d_rope)` bytes per token, whole.
The key/value cache of a token per layer (what inference keeps; not a training figure) is
`2 g d` values, and `r_kv + d_rope` with MLA: the latent is cached, not the heads.
"""

from __future__ import annotations


def plain(model) -> bool:
    """Whether the attention is the classic one formulas.py prices directly."""
    return not model.head_size and not model.kv_lora_rank


def is_mla(model) -> bool:
    return model.kv_lora_rank > 0


def qk_head_dim(model) -> int:
    """A query's (and key's) size per head."""
    return model.qk_nope_head_dim + model.qk_rope_head_dim if is_mla(model) else model.head_dim


def v_head_dim(model) -> int:
    return model.v_head_dim if is_mla(model) else model.head_dim


def qkv_widths(model) -> tuple[int, int, int, int]:
    """Values per token of Q, K, V (all heads) and of the output projection's input."""
    a = model.heads
    if is_mla(model):
        return a * qk_head_dim(model), a * qk_head_dim(model), a * v_head_dim(model), a * v_head_dim(model)
    kv = model.query_groups * model.head_dim
    return a * model.head_dim, kv, kv, a * model.head_dim


def split_weights(model) -> int:
    """Attention weights split over tensor parallelism (column- and row-parallel projections)."""
    h, a = model.hidden, model.heads
    if not is_mla(model):
        q, k, v, out = qkv_widths(model)
        return h * (q + k + v) + out * h
    q_in = model.q_lora_rank or h
    q_up = q_in * a * qk_head_dim(model)
    kv_up = model.kv_lora_rank * a * (model.qk_nope_head_dim + model.v_head_dim)
    return q_up + kv_up + a * model.v_head_dim * h


def replicated_weights(model) -> int:
    """Attention matmul weights whole on every tensor-parallel rank: MLA's down projections."""
    if not is_mla(model):
        return 0
    h = model.hidden
    return h * model.q_lora_rank + h * (model.kv_lora_rank + model.qk_rope_head_dim)


def replicated_norms(model) -> int:
    """MLA's latent RMSNorm weights (the query's when it has a latent, the key/value one's)."""
    return model.q_lora_rank + model.kv_lora_rank if is_mla(model) else 0


def split_biases(model) -> int:
    """Column-parallel biases of the QKV projection (MLA models take none: check_attention)."""
    q, k, v, _ = qkv_widths(model)
    return q + k + v


def scores_flops_per_token(model, context: float) -> float:
    """Forward FLOPs of one token's scores against `context` keys and its product with the values."""
    return 2.0 * context * model.heads * (qk_head_dim(model) + v_head_dim(model))


def activation_bytes_per_token(model) -> tuple[float, float]:
    """(split by t, whole) bytes per token the attention keeps for backward beyond the layer
    input's (module docstring)."""
    q, k, v, out = qkv_widths(model)
    whole = 4 * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim) if is_mla(model) else 0
    return 2 * (q + k + v + out), whole


def norm_traffic_values_per_token(model) -> int:
    """Values MLA's latent norms read and write per token (each reads and writes its latent)."""
    return 2 * (model.q_lora_rank + model.kv_lora_rank) if is_mla(model) else 0


def kv_values_per_token(model) -> int:
    """Keys and values of one token per layer as attention consumes them (context parallelism
    gathers these): `2 g d`, MLA's per-head keys and values `a (d_qk + d_v)`."""
    _, k, v, _ = qkv_widths(model)
    return k + v


def kv_cache_values_per_token(model) -> int:
    """Values one token's key/value cache holds per layer (inference): MLA caches its latent."""
    if is_mla(model):
        return model.kv_lora_rank + model.qk_rope_head_dim
    return 2 * model.query_groups * model.head_dim


def attention_gemms(model, tokens: int, tp: int) -> tuple:
    """The attention's weight matmuls on one tensor-parallel rank (synth.plan.kernels.Gemm), the
    output projection last."""
    from synth.plan.gemms import Gemm  # kernels prices these; the shapes are this module's

    h, a = model.hidden, model.heads
    if not is_mla(model):
        q, k, v, out = qkv_widths(model)
        return Gemm(tokens, (q + k + v) // tp, h), Gemm(tokens, h, out // tp)
    d_qk = qk_head_dim(model)
    if model.q_lora_rank:
        query = (Gemm(tokens, model.q_lora_rank, h), Gemm(tokens, a * d_qk // tp, model.q_lora_rank))
    else:
        query = (Gemm(tokens, a * d_qk // tp, h),)
    kv = (Gemm(tokens, model.kv_lora_rank + model.qk_rope_head_dim, h),
          Gemm(tokens, a * (model.qk_nope_head_dim + model.v_head_dim) // tp, model.kv_lora_rank))
    return query + kv + (Gemm(tokens, h, a * model.v_head_dim // tp),)


def layer_gemms(model, tokens: int, tp: int) -> tuple:
    """One layer's weight matmuls (attention, then FFN up and down), as kernels.layer_gemms
    gives them for a plain model (which it returns, unchanged)."""
    from synth.plan.gemms import Gemm, layer_gemms as plain_gemms

    if plain(model):
        return plain_gemms(model.hidden, model.ffn, model.query_groups * model.head_dim, model.gated_mlp, tokens, tp)
    h, f = model.hidden, model.ffn
    return attention_gemms(model, tokens, tp) + (Gemm(tokens, (2 if model.gated_mlp else 1) * f // tp, h),
                                                 Gemm(tokens, h, f // tp))


def check_attention(model) -> str | None:
    """What is wrong with the attention keys, or None (Transformer names the model)."""
    mla = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    for key in ("head_size",) + mla:
        value = getattr(model, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"{key} = {value!r} is not a non-negative integer"
    if not model.kv_lora_rank:
        stated = [key for key in mla if getattr(model, key)]
        return (f"{', '.join(stated)} set without kv_lora_rank; give kv_lora_rank (multi-head latent attention) "
                f"or leave them out") if stated else None
    missing = [key for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim") if not getattr(model, key)]
    if missing:
        return f"multi-head latent attention needs {', '.join(missing)} (> 0)"
    if model.kv_heads or model.head_size:
        return "kv_heads and head_size do not apply to multi-head latent attention; leave them out"
    if model.biases:
        return "multi-head latent attention is modelled without biases; give biases = false"
    return None
