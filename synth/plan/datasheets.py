"""Datasheet figures of the accelerators of 2025-2026 systems (B200, B300, GB200, GB300, H200,
H20): dense peak FLOP/s per precision, HBM capacity and bandwidth, NVLink bandwidth per
direction, each with its source.

Why a table apart from synth/devices.py: a kernel description there also needs measured
matmul rates (MAMF) and the shapes they were reached at, which have not been published for
most of these parts; the datasheet figures have, and a topology's [device] table (what
`synth plan` reads) and its NVLink level can be checked against them. Peaks are dense: NVIDIA
lists Blackwell's tensor rates with 2:4 sparsity, and the dense rate is half (the datasheets'
footnote). Where NVIDIA publishes no datasheet (H20), the source says whose figure it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from synth.topology import Figure


@dataclass(frozen=True)
class Datasheet:
    """One accelerator's published figures (module docstring); precisions in
    synth.topology.PRECISIONS order."""

    key: str
    names: tuple[str, ...]  # [device] names that select it
    peak: tuple[tuple[str, Figure], ...]  # precision -> dense FLOP/s
    memory: Figure  # bytes
    memory_bandwidth: Figure  # bytes/s
    nvlink: Figure  # bytes/s per direction, per GPU

    def peak_for(self, precision: str) -> Figure | None:
        return dict(self.peak).get(precision)


def _rates(sheet: str, **dense_tflops: float) -> tuple[tuple[str, Figure], ...]:
    order = ("fp32", "tf32", "fp16", "bf16", "fp8")
    return tuple((name, Figure(dense_tflops[name] * 1e12, f"{sheet}: {name.upper()} {dense_tflops[name]:g} TFLOP/s "
                                                          f"dense per GPU"))
                 for name in order if name in dense_tflops)


_GB200 = ("NVIDIA GB200 NVL72 product page (72 GPUs: FP32 5,760 TFLOPS; TF32 180, FP16/BF16 360, FP8 720 PFLOPS "
          "with sparsity; 13.4 TB HBM3e, 576 TB/s; NVLink 130 TB/s), per GPU and dense")
_GB300 = ("NVIDIA GB300 NVL72 product page (72 Blackwell Ultra GPUs: FP8 720, FP16/BF16 360, TF32 180 PFLOPS with "
          "sparsity; up to 20 TB HBM3e, 576 TB/s; NVLink 130 TB/s), per GPU and dense")
_HGX_B200 = ("NVIDIA HGX B200 specifications (8 GPUs: FP32 600 TFLOPS; TF32 18, FP16/BF16 36, FP8 72 PFLOPS with "
             "sparsity; NVLink 1.8 TB/s per GPU) and DGX B200 datasheet (1,440 GB HBM3e, 64 TB/s), per GPU and dense")
_HGX_B300 = ("NVIDIA HGX B300 specifications (8 Blackwell Ultra GPUs: FP8 72, FP16/BF16 36, TF32 18 PFLOPS with "
             "sparsity; NVLink 1.8 TB/s per GPU; 2.1 TB HBM3e), per GPU and dense")
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM; tensor rates listed with sparsity, half dense)"
_H20 = ("third-party reports of NVIDIA's H20 (no public NVIDIA datasheet): 148 TFLOP/s FP16/BF16 and 296 TFLOP/s FP8 "
        "dense, 74 TF32, 44 FP32, 96 GB HBM3 at 4.0 TB/s, NVLink 900 GB/s (willitrunai.com/gpus/h20-96gb; "
        "Geekbench-based reports of 78 SMs)")

DATASHEETS: tuple[Datasheet, ...] = (
    Datasheet("b200", ("NVIDIA B200", "NVIDIA B200-SXM-180GB", "B200"),
              _rates(_HGX_B200, fp32=75, tf32=1125, fp16=2250, bf16=2250, fp8=4500),
              Figure(180e9, f"{_HGX_B200}: 180 GB"), Figure(8e12, f"{_HGX_B200}: 8 TB/s"),
              Figure(900e9, f"{_HGX_B200}: 1.8 TB/s NVLink 5 both directions, 900 GB/s each")),
    Datasheet("b300", ("NVIDIA B300", "NVIDIA B300 SXM6 AC", "B300"),
              _rates(_HGX_B300, tf32=1125, fp16=2250, bf16=2250, fp8=4500),
              Figure(262.5e9, f"{_HGX_B300}: 2.1 TB for 8 GPUs, 262.5 GB each"),
              Figure(8e12, f"{_HGX_B300} and NVIDIA Blackwell Ultra technical blog: 8 TB/s HBM3e per GPU"),
              Figure(900e9, f"{_HGX_B300}: 1.8 TB/s NVLink 5 both directions, 900 GB/s each")),
    Datasheet("gb200", ("NVIDIA GB200", "GB200"),
              _rates(_GB200, fp32=80, tf32=1250, fp16=2500, bf16=2500, fp8=5000),
              Figure(186e9, f"{_GB200}: 13.4 TB / 72 = 186 GB"), Figure(8e12, f"{_GB200}: 576 TB/s / 72 = 8 TB/s"),
              Figure(900e9, f"{_GB200}: 1.8 TB/s per GPU both directions, 900 GB/s each")),
    Datasheet("gb300", ("NVIDIA GB300", "GB300"),
              _rates(_GB300, tf32=1250, fp16=2500, bf16=2500, fp8=5000),
              Figure(279e9, f"{_GB300}: 20 TB / 72 = 279 GB (288 GB per GPU before ECC and reserved space)"),
              Figure(8e12, f"{_GB300}: 576 TB/s / 72 = 8 TB/s"),
              Figure(900e9, f"{_GB300}: 1.8 TB/s per GPU both directions, 900 GB/s each")),
    Datasheet("h200", ("NVIDIA H200", "NVIDIA H200 141GB HBM3e", "H200-SXM-141GB"),
              _rates(_H200, fp32=67, tf32=494.5, fp16=989.5, bf16=989.5, fp8=1979),
              Figure(141e9, f"{_H200}: 141 GB HBM3e"), Figure(4.8e12, f"{_H200}: 4.8 TB/s"),
              Figure(450e9, f"{_H200}: NVLink 900 GB/s both directions, 450 GB/s each")),
    Datasheet("h20", ("NVIDIA H20", "H20"),
              _rates(_H20, fp32=44, tf32=74, fp16=148, bf16=148, fp8=296),
              Figure(96e9, f"{_H20}: 96 GB"), Figure(4.0e12, f"{_H20}: 4.0 TB/s"),
              Figure(450e9, f"{_H20}: 900 GB/s both directions, 450 GB/s each")),
)

_BY_NAME = {name.lower(): sheet for sheet in DATASHEETS for name in (sheet.key,) + sheet.names}


def datasheet_named(name: str) -> Datasheet | None:
    """The datasheet a [device] name (or key) selects, or None for another device."""
    return _BY_NAME.get(name.strip().lower())
