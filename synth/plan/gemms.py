"""The shapes of a layer's matrix products (what they are, not what they cost): the one place
both the attention forms (synth/plan/attention.py) and the kernel model (synth/plan/kernels.py)
take them from, so neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gemm:
    """`batch` independent products of an m x k and a k x n matrix."""

    m: int
    n: int
    k: int
    batch: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch

    def backward(self) -> tuple[Gemm, Gemm]:
        """The input gradient (m x n times n x k) and the weight gradient (k x m times m x n)."""
        return Gemm(self.m, self.k, self.n, self.batch), Gemm(self.k, self.n, self.m, self.batch)


def layer_gemms(hidden: int, ffn: int, kv: int, gated: bool, tokens: int, tp: int) -> tuple[Gemm, ...]:
    """The weight matmuls of one Megatron layer's forward on one tensor-parallel rank: fused QKV
    (column-parallel), attention output projection (row-parallel), FFN up (and gate) and down."""
    return (Gemm(tokens, (hidden + 2 * kv) // tp, hidden),
            Gemm(tokens, hidden, hidden // tp),
            Gemm(tokens, (2 if gated else 1) * ffn // tp, hidden),
            Gemm(tokens, hidden, ffn // tp))
