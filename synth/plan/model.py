"""The model a training step runs: a decoder-only transformer described by its shape and batch.

`Transformer` is a value; built-in presets reproduce published models, each with its source,
and `load_model` reads the same fields from a TOML or JSON file::

    name = "my-model"
    source = "where the shape comes from"
    layers = 32
    hidden = 4096
    heads = 32
    kv_heads = 8          # grouped-query attention (0: as many as heads)
    ffn = 14336           # FFN inner size (4 * hidden in GPT)
    seq_len = 8192
    vocab = 128256
    micro_batch = 1       # sequences per micro-batch (the planner can search others)
    global_batch = 512    # sequences per optimizer step
    gated_mlp = true      # the architecture: state every key of ARCHITECTURE
    biases = false
    dropout = false
    learned_positions = false
    tied_embeddings = false
    flash_attention = true

`KEYS` holds every key's meaning and unit (docs/plan.md's table is checked against it). The
architecture keys default to GPT-3's (non-gated FFN, biases, dropout, learned positions, tied
embeddings, no FlashAttention): `read_model` names the ones a file leaves out, so that a
caller can say so. Every field is checked and a bad one named with its fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path

from synth.frozen import cached_hash, state_without_hash
from synth.errors import UsageError

PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# The largest shape and batch figures taken: a hundred times the largest published models'
# (a hidden size of 10^160 overflowed the FLOP count); beyond them a figure is a typo.
LARGEST = {"layers": 100_000, "hidden": 10_000_000, "heads": 100_000, "ffn": 100_000_000, "seq_len": 100_000_000,
           "vocab": 100_000_000, "micro_batch": 1_000_000, "global_batch": 100_000_000}


def _shown(value) -> str:
    """A field's value for a message: a huge integer by its size (its digits cannot even be printed)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a {int(value.bit_length() * 0.30103) + 1}-digit number"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"
OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer and its batch (GPT, Llama); sizes in elements and sequences."""

    __hash__ = cached_hash  # (synth/frozen.py) it keys many caches
    __getstate__ = state_without_hash

    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    seq_len: int
    vocab: int
    micro_batch: int
    global_batch: int
    kv_heads: int = 0  # 0: as many as heads (multi-head attention)
    precision: str = "bf16"  # weights and activations
    grad_precision: str = "fp32"  # gradients as reduced across data-parallel replicas
    optimizer: str = "adam"
    gated_mlp: bool = False  # SwiGLU/GeGLU FFN: gate, up and down matrices (Llama)
    biases: bool = True
    dropout: bool = True
    learned_positions: bool = True  # a seq_len x hidden position table (GPT); False: rotary (Llama)
    tied_embeddings: bool = True  # the output layer reuses the input embedding (GPT); False: Llama
    flash_attention: bool = False  # attention scores never stored (FlashAttention)
    experts: int = 0  # routed experts per MoE layer (0: a dense model; synth/plan/moe.py)
    top_k: int = 0  # experts each token is routed to
    expert_ffn: int = 0  # one routed expert's FFN inner size (0: ffn)
    shared_ffn: int = 0  # FFN inner size of the shared experts together (0: none)
    capacity_factor: float = 0.0  # tokens an expert takes over its even share (0: dropless, balanced)
    moe_every: int = 1  # every k-th layer is MoE (Megatron's --moe-layer-freq k)
    first_dense: int = 0  # the first k layers keep the dense FFN (DeepSeek's first_k_dense_replace)
    expert_imbalance: float = 1.0  # dropless: the busiest expert's tokens over the even share (1: balanced)
    router_groups: int = 0  # group-limited routing: the experts in this many equal groups (0: none; synth/plan/moe.py)
    router_group_topk: int = 0  # ... of which a token's experts come from at most this many
    head_size: int = 0  # per-head size when not hidden / heads (Qwen3, GPT-OSS); 0: hidden / heads
    q_lora_rank: int = 0  # multi-head latent attention (synth/plan/attention.py): the query's latent (0: none)
    kv_lora_rank: int = 0  # the keys' and values' shared latent (> 0: multi-head latent attention)
    qk_nope_head_dim: int = 0  # per-head query/key part without rotary positions
    qk_rope_head_dim: int = 0  # per-head query/key part with rotary positions (one key part shared by the heads)
    v_head_dim: int = 0  # per-head value size
    source: str = ""

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "ffn", "seq_len", "vocab", "micro_batch", "global_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"model {self.name!r}: {name} = {_shown(value)} is not a positive integer")
            if value > LARGEST[name]:
                raise UsageError(f"model {self.name!r}: {name} = {_shown(value)} is larger than any model's "
                                 f"(at most {LARGEST[name]:,})")
        if isinstance(self.kv_heads, bool) or not isinstance(self.kv_heads, int) or self.kv_heads < 0:
            raise UsageError(f"model {self.name!r}: kv_heads = {self.kv_heads!r} is not a positive integer (0: as many as heads)")
        from synth.plan.attention import check_attention  # the attention keys' own rules

        attention_problem = check_attention(self)
        if attention_problem:
            raise UsageError(f"model {self.name!r}: {attention_problem}")
        if self.hidden % self.heads and not self.head_size and not self.kv_lora_rank:
            raise UsageError(f"model {self.name!r}: hidden {self.hidden} is not a multiple of heads {self.heads}")
        if self.heads % self.query_groups:
            raise UsageError(f"model {self.name!r}: heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        for name in ("precision", "grad_precision"):
            if getattr(self, name) not in PRECISION_BYTES:
                raise UsageError(f"model {self.name!r}: {name} = {getattr(self, name)!r}; choose one of {', '.join(PRECISION_BYTES)}")
        if self.optimizer not in OPTIMIZERS:
            raise UsageError(f"model {self.name!r}: optimizer = {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
        if self.global_batch % self.micro_batch:
            raise UsageError(f"model {self.name!r}: global_batch {self.global_batch} is not a multiple of micro_batch {self.micro_batch}")
        from synth.plan.moe import check_moe  # the MoE keys' own rules

        check_moe(self)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def query_groups(self) -> int:
        """Key/value heads (grouped-query attention); the heads themselves when not grouped."""
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def bytes_per_value(self) -> int:
        return PRECISION_BYTES[self.precision]

    @property
    def grad_bytes_per_value(self) -> int:
        return PRECISION_BYTES[self.grad_precision]

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def to_json(self) -> dict:
        return {field.name: getattr(self, field.name) for field in fields(self)}


_GPT3 = ("Brown et al. 2020, 'Language Models are Few-Shot Learners' (arXiv:2005.14165), Table 2.1: "
         "layers, d_model, heads, context 2048; batch sizes of 1M, 2M and 3.2M tokens as 512, 1024 and 1536 "
         "sequences; FFN 4 x d_model, GPT-2 vocabulary of 50257; the 1.3B model with 16 heads of 128 (the "
         "table's 24 heads x d_head 128 does not make its d_model 2048)")
_MEGATRON = ("Narayanan et al., SC'21 'Efficient Large-Scale Language Model Training on GPU Clusters Using "
             "Megatron-LM' (arXiv:2104.04473), Table 1 (heads, hidden, layers, batch; vocabulary 51200, sequence "
             "2048, fp16); micro-batch from the authors' script examples/sc21/run_table_1.sh in NVIDIA/Megatron-LM")
_LLAMA2 = ("Touvron et al. 2023, 'Llama 2: Open Foundation and Fine-Tuned Chat Models' (arXiv:2307.09288), "
           "Table 1 and section 2.2 (context 4096, 4M-token batches, grouped-query attention for 70B); layers, "
           "hidden, heads, key/value heads, FFN sizes 11008 / 13824 / 28672 and vocabulary 32000 from the released "
           "model configurations (config.json of meta-llama/Llama-2-{7b,13b,70b}-hf); SwiGLU, RMSNorm, rotary "
           "positions, no biases, untied output layer")
_LLAMA3 = ("Llama Team 2024, 'The Llama 3 Herd of Models' (arXiv:2407.21783), Table 3 (layers, model dimension, "
           "FFN dimension, 128 attention / 8 key-value heads for 405B, vocabulary 128K, SwiGLU, RoPE) and section 3.4.1 "
           "(405B: sequences of 8,192 tokens, 16M-token batches in the main stage); 8B/70B/3.2 shapes from the released "
           "configurations (config.json of meta-llama/Meta-Llama-3-8B, -70B, Llama-3.2-1B, -3B: 3.2 ties the output "
           "layer to the embedding); their batch is not published: 4M tokens (512 sequences of 8192) is taken")
_MIXTRAL = ("Jiang et al. 2024, 'Mixtral of Experts' (arXiv:2401.04088), Table 1 (dim 4096, 32 layers, head_dim 128, "
            "hidden_dim 14336, 32 heads, 8 key/value heads, vocabulary 32000, 8 experts, top-2; 46.7B total, 12.9B "
            "active parameters per the Mistral AI release); 8x22B from the released configuration (config.json of "
            "mistralai/Mixtral-8x22B-v0.1: hidden 6144, 56 layers, 48 heads, 8 key/value heads, intermediate 16384, "
            "vocabulary 32000) and its announcement (141B total, 39B active); dropless routing (capacity_factor 0). "
            "The training batch and sequence are not published: 1024 sequences of 4096 tokens are taken")
_DEEPSEEK_MOE = ("Dai et al. 2024, 'DeepSeekMoE' (arXiv:2401.06066), section 5 (DeepSeekMoE 16B: 28 layers, hidden 2048, "
                 "16 heads, 2 shared + 64 routed experts of 1408, 6 routed per "
                 "token, the first layer dense, vocabulary 102400, sequences of 4K, batches of 4.5K sequences; 16.4B "
                 "total, 2.8B active); sizes from the released configuration (config.json of "
                 "deepseek-ai/deepseek-moe-16b-base: intermediate_size 10944, moe_intermediate_size 1408, "
                 "first_k_dense_replace 1)")
_QWEN_MOE = ("Qwen Team 2024, 'Qwen1.5-MoE: Matching 7B Model Performance with 1/3 Activated Parameters' (blog; "
             "14.3B total, 2.7B activated) and the released configuration (config.json of Qwen/Qwen1.5-MoE-A2.7B: "
             "24 layers, hidden 2048, 16 heads, 60 experts of 1408, 4 per token, shared_expert_intermediate_size 5632, "
             "vocabulary 151936, untied). Approximated: the query/key/value biases (6144 per layer) and the shared "
             "expert's sigmoid gate (2048 per layer) are left out. The batch is not published: 1024 sequences of "
             "4096 tokens are taken")

_DEEPSEEK_V3 = ("DeepSeek-AI 2024, 'DeepSeek-V3 Technical Report' (arXiv:2412.19437), sections 4.2 and 3.2 (61 layers, "
                "hidden 7168, 128 heads of multi-head latent attention: key/value latent 512, query latent 1536, per-head "
                "128 + 64 rotary, values 128; the first 3 layers dense, then 1 shared + 256 routed experts of 2048, 8 per "
                "token; 671B total, 37B active; sequences of 4K, the batch raised to 15360 sequences; trained on 2048 "
                "H800 with 16-way pipeline, 64-way expert parallelism over 8 nodes, ZeRO-1 data parallelism, no tensor "
                "parallelism) and the released configuration (config.json of deepseek-ai/DeepSeek-V3: intermediate_size "
                "18432, moe_intermediate_size 2048, n_shared_experts 1, first_k_dense_replace 3, vocab_size 129280, "
                "untied; n_group 8, topk_group 4: each token's experts on at most 4 of 8 groups, section 2.1.2's 'at "
                "most M = 4 nodes'). Approximated: the multi-token-prediction module (14B) is left out, as the 671B does")
_QWEN3 = ("Qwen Team 2025, 'Qwen3 Technical Report' (arXiv:2505.09388), Table 2 (235B-A22B: 94 layers, 64 query / 4 "
          "key-value heads, 128 experts, 8 per token, no shared experts; 30B-A3B: 48 layers, 32 / 4 heads, 128 experts, "
          "8 per token) and the released configurations (config.json of Qwen/Qwen3-235B-A22B: hidden 4096, head_dim 128, "
          "moe_intermediate_size 1536; Qwen/Qwen3-30B-A3B: hidden 2048, head_dim 128, moe_intermediate_size 768; vocabulary "
          "151936, untied, every layer MoE). Approximated: the query/key norms (2 x 128 per layer) are left out. The "
          "training batch is not published: 1024 sequences of 4096 tokens are taken")
_GPT_OSS = ("OpenAI 2025, 'gpt-oss-120b & gpt-oss-20b Model Card' (arXiv:2508.10925), section 2 (36 layers, residual width "
            "2880, 128 experts, top-4, 64 query heads of 64 and 8 key-value heads; 116.8B total, 5.1B active) and the "
            "released configuration (config.json of openai/gpt-oss-120b: intermediate_size 2880, head_dim 64, vocab_size "
            "201088, untied). Approximated: the biases (attention, experts, router), the attention sinks and the banded "
            "128-token window of every other layer (priced as full attention) are left out. The training batch is not "
            "published: 1024 sequences of 4096 tokens are taken")
_DBRX = ("Databricks 2024, 'Introducing DBRX' (technical blog: 132B total, 36B active, 16 experts, 4 per token, "
         "grouped-query attention) and the released configuration (config.json of databricks/dbrx-base: d_model 6144, "
         "n_layers 40, n_heads 48, kv_n_heads 8, ffn_hidden_size 10752, vocab_size 100352, no biases, untied). The "
         "training batch is not published: 1024 sequences of 4096 tokens are taken")
_LLAMA4 = ("Meta 2025, 'The Llama 4 herd' (announcement: Maverick 400B total, 17B active, 128 routed experts and a shared "
           "expert, dense and MoE layers alternating) and the released configuration (config.json of "
           "meta-llama/Llama-4-Maverick-17B-128E, text_config: 48 layers, hidden 5120, 40 heads, 8 key-value heads, "
           "head_dim 128, intermediate_size 8192 per expert and for the shared expert, intermediate_size_mlp 16384 for the "
           "dense layers, num_local_experts 128, num_experts_per_tok 1, interleave_moe_layer_step 2: layers 1, 3, 5, ... "
           "are MoE, vocab_size 202048, untied). The training batch is not published: 1024 sequences of 4096 tokens are "
           "taken")


def _gpt3(name: str, layers: int, hidden: int, heads: int, batch: int) -> Transformer:
    return Transformer(name, layers, hidden, heads, 4 * hidden, 2048, 50257, 1, batch,
                       precision="fp16", grad_precision="fp32", source=_GPT3)


def _megatron(name: str, heads: int, hidden: int, layers: int, micro: int, batch: int) -> Transformer:
    return Transformer(name, layers, hidden, heads, 4 * hidden, 2048, 51200, micro, batch, precision="fp16",
                       grad_precision="fp16", source=_MEGATRON)


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, seq_len: int, vocab: int,
           batch: int, source: str, tied: bool = False) -> Transformer:
    return Transformer(name, layers, hidden, heads, ffn, seq_len, vocab, 1, batch, kv_heads=kv_heads, precision="bf16",
                       grad_precision="fp32", gated_mlp=True, biases=False, dropout=False, learned_positions=False,
                       tied_embeddings=tied, flash_attention=True, source=source)


def _llama2(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int) -> Transformer:
    return _llama(name, layers, hidden, heads, kv_heads, ffn, 4096, 32000, 1024, _LLAMA2)


def _llama3(name: str, layers: int, hidden: int, heads: int, ffn: int, batch: int = 512, tied: bool = False) -> Transformer:
    return _llama(name, layers, hidden, heads, 8, ffn, 8192, 128256, batch, _LLAMA3, tied)


def _moe(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int, experts: int,
         top_k: int, source: str, expert_ffn: int = 0, shared_ffn: int = 0, first_dense: int = 0,
         seq_len: int = 4096, batch: int = 1024) -> Transformer:
    return replace(_llama(name, layers, hidden, heads, kv_heads, ffn, seq_len, vocab, batch, source),
                   experts=experts, top_k=top_k, expert_ffn=expert_ffn, shared_ffn=shared_ffn, first_dense=first_dense)


PRESETS: dict[str, Transformer] = {model.name: model for model in (
    _gpt3("gpt3-1.3b", 24, 2048, 16, 512),
    _gpt3("gpt3-2.7b", 32, 2560, 32, 512),
    _gpt3("gpt3-6.7b", 32, 4096, 32, 1024),
    _gpt3("gpt3-175b", 96, 12288, 96, 1536),
    _megatron("megatron-1.7b", 24, 2304, 24, 16, 512),
    _megatron("megatron-3.6b", 32, 3072, 30, 16, 512),
    _megatron("megatron-7.5b", 32, 4096, 36, 16, 512),
    _megatron("megatron-18.4b", 48, 6144, 40, 8, 1024),
    _megatron("megatron-39.1b", 64, 8192, 48, 4, 1536),
    _megatron("megatron-76.1b", 80, 10240, 60, 2, 1792),
    _megatron("megatron-145.6b", 96, 12288, 80, 2, 2304),
    _megatron("megatron-310.1b", 128, 16384, 96, 1, 2160),
    _megatron("megatron-529.6b", 128, 20480, 105, 1, 2520),
    _megatron("megatron-1t", 160, 25600, 128, 1, 3072),
    _llama2("llama2-7b", 32, 4096, 32, 0, 11008),
    _llama2("llama2-13b", 40, 5120, 40, 0, 13824),
    _llama2("llama2-70b", 80, 8192, 64, 8, 28672),
    _llama3("llama3.2-1b", 16, 2048, 32, 8192, tied=True),
    _llama3("llama3.2-3b", 28, 3072, 24, 8192, tied=True),
    _llama3("llama3-8b", 32, 4096, 32, 14336),
    _llama3("llama3-70b", 80, 8192, 64, 28672),
    _llama3("llama3.1-405b", 126, 16384, 128, 53248, batch=2048),
    _moe("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 8, 2, _MIXTRAL),
    _moe("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32000, 8, 2, _MIXTRAL),
    _moe("deepseek-moe-16b", 28, 2048, 16, 16, 10944, 102400, 64, 6, _DEEPSEEK_MOE, expert_ffn=1408,
         shared_ffn=2 * 1408, first_dense=1, batch=4608),
    _moe("qwen1.5-moe-a2.7b", 24, 2048, 16, 16, 5632, 151936, 60, 4, _QWEN_MOE, expert_ffn=1408, shared_ffn=5632),
    replace(_moe("deepseek-v3", 61, 7168, 128, 0, 18432, 129280, 256, 8, _DEEPSEEK_V3, expert_ffn=2048,
                 shared_ffn=2048, first_dense=3, batch=15360),
            q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
            router_groups=8, router_group_topk=4),
    replace(_moe("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936, 128, 8, _QWEN3, expert_ffn=1536), head_size=128),
    replace(_moe("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, 128, 8, _QWEN3, expert_ffn=768), head_size=128),
    replace(_moe("gpt-oss-120b", 36, 2880, 64, 8, 2880, 201088, 128, 4, _GPT_OSS), head_size=64),
    _moe("dbrx", 40, 6144, 48, 8, 10752, 100352, 16, 4, _DBRX),
    replace(_moe("llama4-maverick", 48, 5120, 40, 8, 16384, 202048, 128, 1, _LLAMA4, expert_ffn=8192, shared_ffn=8192,
                 first_dense=1), moe_every=2),
)}


def describe_architecture(model: Transformer) -> str:
    """What the model is made of, in words: the answers to the ARCHITECTURE keys."""
    ffn = f"gated FFN (SwiGLU, 3 matrices of f={model.ffn})" if model.gated_mlp else f"FFN (2 matrices of f={model.ffn})"
    if model.is_moe:
        from synth.plan import moe

        shared = f" + shared f={model.shared_ffn}" if model.shared_ffn else ""
        capacity = f", capacity {model.capacity_factor:g}" if model.capacity_factor else ", dropless"
        gated = "gated (SwiGLU) " if model.gated_mlp else ""
        dense = model.layers - moe.moe_layer_count(model)
        ffn = (f"MoE on {model.layers - dense} of {model.layers} layers ({model.experts} {gated}experts of "
               f"f={moe.expert_ffn(model)}, top-{model.top_k}{shared}{capacity})"
               + (f", dense FFN f={model.ffn} on {dense}" if dense else ""))
    if model.kv_lora_rank:
        query = f"query latent {model.q_lora_rank}, " if model.q_lora_rank else ""
        attention = (f"multi-head latent attention ({model.heads} heads, {query}key/value latent {model.kv_lora_rank}, "
                     f"head sizes {model.qk_nope_head_dim}+{model.qk_rope_head_dim} rotary / {model.v_head_dim})")
    elif model.query_groups == model.heads:
        attention = f"multi-head attention ({model.heads} heads)"
    else:
        attention = f"grouped-query attention ({model.heads} heads, {model.query_groups} key/value groups)"
    if model.head_size:
        attention = f"{attention[:-1]}, {model.head_size} per head)"
    return ", ".join((
        ffn, attention,
        "learned positions" if model.learned_positions else "rotary positions",
        "tied embeddings" if model.tied_embeddings else "untied embeddings",
        "biases (LayerNorm)" if model.biases else "no biases (RMSNorm)",
        "dropout" if model.dropout else "no dropout",
        "FlashAttention" if model.flash_attention else "attention scores stored"))


# Every key of a model file: (meaning, unit). Defaults are the dataclass's.
KEYS: dict[str, tuple[str, str]] = {
    "name": ("the model's name in the output", "text"),
    "layers": ("transformer layers `L`", "layers"),
    "hidden": ("hidden size `h`", "elements"),
    "heads": ("attention (query) heads `a`; `h` must be a multiple", "heads"),
    "ffn": ("FFN inner size `f` (`4h` in GPT; per matrix when gated)", "elements"),
    "seq_len": ("sequence length `s` (also the learned position table's rows)", "tokens"),
    "vocab": ("vocabulary size `V`", "tokens"),
    "micro_batch": ("sequences per micro-batch `b` (the plan searches others)", "sequences"),
    "global_batch": ("sequences per optimizer step `B`", "sequences"),
    "kv_heads": ("key/value heads `g` (grouped-query attention); 0: as many as `heads`", "heads"),
    "precision": ("weights and activations: bf16, fp16 or fp32", "type"),
    "grad_precision": ("gradients as reduced across data-parallel replicas: fp32, bf16 or fp16", "type"),
    "optimizer": ("adam (two fp32 moments) or sgd (one fp32 momentum)", "name"),
    "gated_mlp": ("gated FFN (SwiGLU/GeGLU: gate, up and down matrices, Llama) instead of two (GPT)", "true/false"),
    "biases": ("biases in the linear layers and LayerNorm; false: none, RMSNorm (Llama)", "true/false"),
    "dropout": ("dropout on attention scores and residual branches (masks kept for backward)", "true/false"),
    "learned_positions": ("a learned `s x h` position table (GPT); false: rotary positions, no weights (Llama)",
                          "true/false"),
    "tied_embeddings": ("the output layer reuses the input embedding (GPT); false: its own `V x h` matrix", "true/false"),
    "flash_attention": ("attention scores never stored (FlashAttention): no `a s^2` activations or traffic",
                        "true/false"),
    "experts": ("routed experts per MoE layer `E`; 0: a dense model (the MoE keys below unused)", "experts"),
    "top_k": ("experts each token is routed to `k` (required with `experts`)", "experts"),
    "expert_ffn": ("one routed expert's FFN inner size `f_e`; 0: `ffn`", "elements"),
    "shared_ffn": ("FFN inner size of the always-active shared experts together `f_s`; 0: none", "elements"),
    "capacity_factor": ("tokens an expert takes over its even share `c` (computed and sent padded); 0: dropless, "
                        "as if balanced (`c = 1`)", "ratio"),
    "expert_imbalance": ("dropless routing: the busiest expert's tokens over its even share `u`, which the step waits "
                         "for (1: balanced, an assumption; capacity_factor caps it instead)", "ratio"),
    "router_groups": ("group-limited routing (DeepSeek's `n_group`, Megatron's `moe_router_num_groups`): the "
                      "experts in this many equal groups, a token's from at most `router_group_topk` of them; 0: none",
                      "groups"),
    "router_group_topk": ("group-limited routing: the groups a token's experts come from at most (DeepSeek's "
                          "`topk_group`, Megatron's `moe_router_group_topk`)", "groups"),
    "moe_every": ("every k-th layer is MoE, the others dense (Megatron's `moe_layer_freq` k); 1: every layer", "layers"),
    "first_dense": ("the first k layers keep the dense FFN of size `ffn` (DeepSeek's `first_k_dense_replace`)",
                    "layers"),
    "head_size": ("per-head size `d` when it is not `h / a` (Qwen3, GPT-OSS); 0: `h / a`", "elements"),
    "q_lora_rank": ("multi-head latent attention: the query's latent size `r_q`; 0: queries projected from `h`",
                    "elements"),
    "kv_lora_rank": ("multi-head latent attention (DeepSeek-V2/V3) when > 0: the keys' and values' shared latent "
                     "`r_kv`", "elements"),
    "qk_nope_head_dim": ("multi-head latent attention: per-head query/key size without rotary positions", "elements"),
    "qk_rope_head_dim": ("multi-head latent attention: per-head query/key size with rotary positions", "elements"),
    "v_head_dim": ("multi-head latent attention: per-head value size", "elements"),
    "source": ("where the figures come from (shown in the list of models)", "text"),
}
ARCHITECTURE = ("kv_heads", "gated_mlp", "biases", "dropout", "learned_positions", "tied_embeddings", "flash_attention")

_FIELDS = {field.name: field for field in fields(Transformer)}
_REQUIRED = ("name", "layers", "hidden", "heads", "ffn", "seq_len", "vocab", "micro_batch", "global_batch")


@dataclass(frozen=True)
class ModelSource:
    """A model as read, with the architecture keys its file left to GPT-3's defaults."""

    model: Transformer
    defaulted: tuple[str, ...] = ()  # ARCHITECTURE keys the file did not state (none for presets)

    def defaults_text(self) -> str:
        """`key = default` for each defaulted key, in the file's syntax."""
        def value(key: str) -> str:
            default = _FIELDS[key].default
            return ("true" if default else "false") if isinstance(default, bool) else str(default)
        return ", ".join(f"{key} = {value(key)}" for key in self.defaulted)


def model_from_mapping(document: dict, where: str) -> Transformer:
    """A model from a parsed TOML/JSON table; unknown, missing or mistyped fields are named."""
    if not isinstance(document, dict):
        raise UsageError(f"{where}: a model is a table of fields ({', '.join(_REQUIRED)}, ...)")
    for key in document:
        if key not in _FIELDS:
            raise UsageError(f"{where}: unknown field {key!r}; the fields are {', '.join(_FIELDS)}")
    for key in _REQUIRED:
        if key not in document:
            raise UsageError(f"{where}: missing field {key!r}; a model needs {', '.join(_REQUIRED)}")
    values = {}
    for key, value in document.items():
        kind = _FIELDS[key].type
        if kind == "bool" and not isinstance(value, bool):
            raise UsageError(f"{where}: {key} = {value!r} is not true or false")
        if kind == "str" and not isinstance(value, str):
            raise UsageError(f"{where}: {key} = {value!r} is not a string")
        if kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise UsageError(f"{where}: {key} = {value!r} is not a number")
            value = float(value)
        values[key] = value
    return Transformer(**values)


def load_model(spec: str) -> Transformer:
    """A preset by name (`megatron-1t`) or a TOML/JSON file of the fields in the module docstring."""
    return read_model(spec).model


def read_model(spec: str, where: str = "model") -> ModelSource:
    """`load_model`, also naming the architecture keys a file leaves to their defaults; `where`
    names the value in errors (the command passes its option)."""
    if spec in PRESETS:
        return ModelSource(PRESETS[spec])
    path = Path(spec)
    try:
        is_file = path.is_file()
    except (OSError, ValueError) as error:  # a name too long for the file system, or holding a NUL
        raise UsageError(f"{where} {_shown(spec)}: not a file name this system takes "
                         f"({getattr(error, 'strerror', None) or error})") from None
    if not is_file:
        if spec.endswith((".toml", ".json")) or "/" in spec:
            raise UsageError(f"no model file {spec!r}: give a path to a .toml or .json file or a preset: {', '.join(PRESETS)}")
        raise UsageError(f"unknown model {spec!r}: use a preset ({', '.join(PRESETS)}) or a .toml/.json file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"{spec}: cannot read the file ({error}); give a readable UTF-8 file") from None
    if spec.endswith(".json"):
        try:
            document = json.loads(text)
        except json.JSONDecodeError as error:
            raise UsageError(f"{spec}: not valid JSON: {error}") from None
        except ValueError:  # an integer of thousands of digits
            raise UsageError(f"{spec}: a number in the file has too many digits for a model figure") from None
        except RecursionError:
            raise UsageError(f"{spec}: JSON nested too deeply to be a model (a model is one flat object)") from None
    else:
        from synth.topology_file import toml_loads  # the one TOML reader (tomllib, or tomli on 3.10)

        document = toml_loads(text, spec)
    model = model_from_mapping(document, spec)
    return ModelSource(model, tuple(key for key in ARCHITECTURE if key not in document))
