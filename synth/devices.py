"""Built-in accelerator descriptions for the kernel model (synth/plan/kernels.py), each figure
with its source.

A topology's `[device]` table names its accelerator (`name = "NVIDIA A100-SXM4-80GB"`); when
the name is one of these, the step model times each kernel from its shape on this description
instead of one hand-written matmul efficiency (docs/plan.md, "Compute from kernels").

What a description holds and why:

* `sms`: streaming multiprocessors; thread-block tiles are scheduled on them in waves, so a
  matrix multiplication whose tile count leaves the last wave part-empty pays for a whole wave
  (NVIDIA, "Matrix Multiplication Background User's Guide", DU-09799-001, section 3.2);
* `matmul`: the achievable dense matrix-multiplication rate per precision and the shape it was
  reached at (`matmul_shapes`), measured as the best `torch.mm` over a grid of large shapes (S. Bekman, "Machine Learning Engineering",
  github.com/stas00/ml-engineering, compute/accelerator/README.md, "Maximum Achievable Matmul
  FLOPS comparison table", mean of 100 iterations after 50 warm-up): the rate a full wave of
  full tiles with a long reduction reaches;
* `attention`: per attention kernel (FlashAttention-2, FlashAttention-3), the fraction of the
  dense 16-bit peak it reaches on long sequences (the papers' headline figures); the first is
  the device's default;
* `tiles`: the thread-block tiles the vendor library picks among (the guide's section 2.3 names
  256x128 and 128x256 as the largest and most efficient cuBLAS tiles);
* `power_capped`: the fraction of the benchmark's matmul rate the device keeps once its power
  cap holds the clock down under back-to-back matrix products (the benchmark's 150 products
  finish before the cap bites; a training step runs for seconds). Measured on an H100 SXM
  (results/kernels/README.md); where not measured it is 1 and the fitted `sustained` carries
  whatever the device loses;
* `stream_k`: on Hopper the library's persistent kernels split the last wave's work over all
  SMs (stream-K), so a product pays its tiles' work spread evenly, not whole waves
  (CUTLASS 3.x's SM90 stream-K tile scheduler; measured against the layer shapes of the H100
  table in results/kernels/README.md: the whole-wave model was 1.10x slow at the median and up
  to 1.75x, the spread one 1.04x and at most 1.19x).

Peaks, memory and bandwidth come from the vendor datasheets (dense rates, without structured
sparsity).
"""

from __future__ import annotations

from dataclasses import dataclass

from synth.topology import Figure

_BEKMAN = ("S. Bekman, Machine Learning Engineering (github.com/stas00/ml-engineering), compute/accelerator/README.md, "
           "Maximum Achievable Matmul FLOPS (MAMF) comparison table")
_GUIDE = ("NVIDIA Matrix Multiplication Background User's Guide (DU-09799-001), section 2.3: cuBLAS tiles, "
          "256x128 and 128x256 the largest and most efficient")
_FA2 = ("T. Dao, FlashAttention-2 (arXiv:2307.08691), abstract: 50-73% of the theoretical maximum FLOP/s on A100 "
        "(the upper figure, reached on long sequences)")
_FA3 = ("J. Shah et al., FlashAttention-3 (arXiv:2407.08608), abstract: BF16 up to 740 TFLOP/s on H100 SXM5, 75% "
        "utilization")
_FA2_H100 = ("J. Shah et al., FlashAttention-3 (arXiv:2407.08608), abstract: FlashAttention-2 achieves only 35% "
             "utilization on H100")
ATTENTION_KERNELS = ("fa2", "fa3")
_STREAM_K = ("CUTLASS 3.x include/cutlass/gemm/kernel/sm90_tile_scheduler_stream_k.hpp (persistent stream-K tile "
             "scheduler for SM90); checked against cuBLAS on an H100 at the H100 table's layer shapes "
             "(results/kernels/README.md)")
_H100_POWER = ("measured (results/kernels/README.md, benchmarks/kernel_rates.py): an 8192^3 bf16 product repeated for "
               "15 s on an H100 80GB HBM3 SXM (700 W cap, driver 580.159.04, torch 2.11.0+cu130) ran 794 TFLOP/s for "
               "its first 60 ms, then 683 TFLOP/s mean (SM clock 1380 MHz at 691 W): 683/794.5")


@dataclass(frozen=True)
class KernelDevice:
    """What the kernel model needs of one accelerator (module docstring)."""

    key: str
    names: tuple[str, ...]  # [device] names that select it (as nvidia-smi or the topology spell them)
    sms: Figure
    peak: tuple[tuple[str, Figure], ...]  # precision -> dense FLOP/s
    matmul: tuple[tuple[str, Figure], ...]  # precision -> achievable matmul FLOP/s (MAMF)
    matmul_shapes: tuple[tuple[str, tuple[int, int, int]], ...]  # precision -> the benchmark's best M x N x K
    attention: tuple[tuple[str, Figure], ...]  # kernel -> fraction of the dense 16-bit peak (first: default)
    memory: Figure  # bytes
    memory_bandwidth: Figure  # bytes/s
    tiles: tuple[tuple[int, int], ...] = ((256, 128), (128, 256))
    tiles_source: str = _GUIDE
    power_capped: Figure = Figure(1.0, "not measured: 1 (the fitted sustained fraction carries it)")
    stream_k: str = ""  # where set, the source saying the library spreads a part-empty last wave over all SMs

    def attention_for(self, kernel: str | None) -> Figure | None:
        """The attention kernel's fraction of peak: the named kernel's, or the device's default."""
        return self.attention[0][1] if kernel is None else dict(self.attention).get(kernel)

    def peak_for(self, precision: str) -> float | None:
        return dict(self.peak)[precision].value if precision in dict(self.peak) else None

    def matmul_shape_for(self, precision: str) -> tuple[int, int, int]:
        table = dict(self.matmul_shapes)
        return table.get(precision) or table["bf16"]

    def matmul_for(self, precision: str) -> Figure | None:
        """The achievable rate; fp16 runs on the same tensor cores at the same rate as bf16."""
        table = dict(self.matmul)
        return table.get(precision) or (table.get("bf16") if precision == "fp16" else None)


def _tflops(value: float, source: str) -> Figure:
    return Figure(value * 1e12, source)


_A100_PEAK = (("fp32", _tflops(19.5, "NVIDIA A100 datasheet: FP32 19.5 TFLOPS")),
              ("tf32", _tflops(156, "NVIDIA A100 datasheet: TF32 Tensor Core 156 TFLOPS dense")),
              ("fp16", _tflops(312, "NVIDIA A100 datasheet: FP16 Tensor Core 312 TFLOPS dense")),
              ("bf16", _tflops(312, "NVIDIA A100 datasheet: BF16 Tensor Core 312 TFLOPS dense")))
_A100_MAMF = (("bf16", _tflops(271.2, f"{_BEKMAN}: NVIDIA A100 SXM BF16 271.2 TFLOPS (86.9%), best shape "
                                      "1024x10240x5120, torch 2.6.0+cu126")),)
_A100_SHAPES = (("bf16", (1024, 10240, 5120)),)
_A100_SMS = Figure(108, "NVIDIA A100 Tensor Core GPU Architecture whitepaper: 108 SMs in the A100 product")
_H100_PEAK = (("fp32", _tflops(67, "NVIDIA H100 datasheet: H100 SXM FP32 67 TFLOPS")),
              ("tf32", _tflops(494.5, "NVIDIA H100 datasheet: H100 SXM TF32 989 TFLOPS with sparsity, half dense")),
              ("fp16", _tflops(989.5, "NVIDIA H100 datasheet: H100 SXM FP16 1,979 TFLOPS with sparsity, half dense")),
              ("bf16", _tflops(989.5, "NVIDIA H100 datasheet: H100 SXM BF16 1,979 TFLOPS with sparsity, half dense")),
              ("fp8", _tflops(1979, "NVIDIA H100 datasheet: H100 SXM FP8 3,958 TFLOPS with sparsity, half dense")))
_H100_SMS = Figure(132, "NVIDIA H100 Tensor Core GPU Architecture whitepaper: 132 SMs in the H100 SXM5")

DEVICES: tuple[KernelDevice, ...] = (
    KernelDevice(
        "a100-sxm4-80gb", ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB", "A100-SXM4-80GB"), _A100_SMS, _A100_PEAK,
        _A100_MAMF, _A100_SHAPES, (("fa2", Figure(0.73, _FA2)),),
        Figure(80 * 2**30, "NVIDIA A100 datasheet: A100 80GB SXM"),
        Figure(2039e9, "NVIDIA A100 datasheet: A100 80GB SXM, 2,039 GB/s")),
    KernelDevice(
        "a100-sxm4-40gb", ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB", "A100-SXM4-40GB"), _A100_SMS, _A100_PEAK,
        _A100_MAMF, _A100_SHAPES, (("fa2", Figure(0.73, _FA2)),),
        Figure(40 * 2**30, "NVIDIA A100 datasheet: A100 40GB SXM"),
        Figure(1555e9, "NVIDIA A100 datasheet: A100 40GB SXM, 1,555 GB/s")),
    KernelDevice(
        "h100-sxm5-80gb", ("NVIDIA H100 80GB HBM3 (SXM5)", "NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"), _H100_SMS,
        _H100_PEAK,
        (("bf16", _tflops(794.5, f"{_BEKMAN}: NVIDIA H100 SXM BF16 794.5 TFLOPS (80.3%), torch 2.7.0+cu126")),
         ("fp8", _tflops(1402.6, f"{_BEKMAN}: NVIDIA H100 SXM FP8 (e4m3) 1402.6 TFLOPS (70.9%), torch 2.7.0+cu126"))),
        (("bf16", (2048, 2048, 13312)), ("fp8", (1024, 9216, 14336))),
        (("fa3", Figure(0.75, _FA3)), ("fa2", Figure(0.35, _FA2_H100))),
        Figure(80 * 2**30, "NVIDIA H100 datasheet: H100 SXM 80 GB"),
        Figure(3.35e12, "NVIDIA H100 datasheet: H100 SXM 3.35 TB/s"),
        power_capped=Figure(0.86, _H100_POWER), stream_k=_STREAM_K),
    KernelDevice(
        "h200-sxm-141gb", ("NVIDIA H200", "NVIDIA H200 141GB HBM3e", "H200-SXM-141GB"), _H100_SMS,
        tuple((name, Figure(figure.value, figure.source.replace("H100 datasheet: H100 SXM", "H200 datasheet: H200 SXM")))
              for name, figure in _H100_PEAK),
        (("bf16", _tflops(794.5, f"{_BEKMAN}: NVIDIA H100 SXM BF16 794.5 TFLOPS, noted there as the same on H200")),
         ("fp8", _tflops(1453.4, f"{_BEKMAN}: NVIDIA H200 SXM FP8 (e4m3) 1453.4 TFLOPS (73.4%), torch 2.7.1+cu128"))),
        (("bf16", (2048, 2048, 13312)), ("fp8", (1280, 4096, 12032))),
        (("fa3", Figure(0.75, _FA3 + " (the H200 is the same GH100 chip)")),
         ("fa2", Figure(0.35, _FA2_H100 + " (the H200 is the same GH100 chip)"))),
        Figure(141e9, "NVIDIA H200 datasheet: 141 GB HBM3e"),
        Figure(4.8e12, "NVIDIA H200 datasheet: 4.8 TB/s"), stream_k=_STREAM_K + " (the H200 is the same GH100 chip)"),
)

def name_key(name: str) -> str:
    """A device name as matched: case, spaces, hyphens and a leading vendor name do not count, so
    'NVIDIA A100-SXM4-40GB' (as nvidia-smi spells it) selects the same description as a100-sxm4-40gb."""
    key = "".join(character for character in name.lower() if character.isascii() and character.isalnum())
    return key.removeprefix("nvidia")


_BY_NAME = {name_key(name): device for device in DEVICES for name in (device.key,) + device.names}


def device_named(name: str) -> KernelDevice | None:
    """The built-in description a [device] name (or key) selects, or None for another device."""
    return _BY_NAME.get(name_key(name))


def device_keys() -> tuple[str, ...]:
    return tuple(device.key for device in DEVICES)
