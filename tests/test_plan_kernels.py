"""The kernel model of the step (synth/plan/kernels.py, devices.py): worked cases of wave and tile
quantization, the roofline, device look-up and its fallback, tensor-parallel overlap."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from synth.errors import UsageError
from synth.devices import DEVICES, device_named
from synth.plan.kernels import Gemm, rates_for
from synth.plan.step import Compute, _overlapped, compute_of
from synth.topology import Figure
from synth.topology_file import load_topology

A100 = device_named("a100-sxm4-80gb")


def test_full_wave_runs_at_the_benchmark_rate_and_one_row_more_doubles_it():
    """2304 x 1536 outputs in 256x128 tiles are 9 x 12 = 108 tiles: one full wave on the A100's 108
    SMs, so the product runs at exactly the sustained benchmark rate. One more row needs a tenth
    tile row (120 tiles; 128x256 tiles give 19 x 6 = 114): two waves, twice the time. Each wave
    ends writing its output tiles (the epilogue)."""
    rates = rates_for(A100, "bf16", sustained=0.5)
    full = Gemm(2304, 1536, 8192)
    assert rates.waves(full, (256, 128)) == 1
    rate = rates.matmul_flops * 0.5  # the tiles' own rate, sustained at one half
    epilogue = 256 * 128 * 2 / (A100.memory_bandwidth.value / 108)  # the 256x128 bf16 outputs at one SM's share
    assert rates.gemm_seconds(full, 2) == pytest.approx(full.flops / rate + epilogue)
    assert rates.waves(Gemm(2305, 1536, 8192), (256, 128)) == 2
    assert rates.waves(Gemm(2305, 1536, 8192), (128, 256)) == 2
    assert rates.gemm_seconds(Gemm(2305, 1536, 8192), 2) == pytest.approx(2 * rates.gemm_seconds(full, 2))


def test_tile_rates_lie_between_the_benchmark_and_the_peak():
    """The benchmark's rate includes its best shape's epilogues; the tiles' own rate is a little
    higher and still below the datasheet's dense peak."""
    for device in DEVICES:
        for precision, figure in device.matmul:
            rates = rates_for(device, "bf16", matmul_precision=precision)
            assert figure.value < rates.matmul_flops < device.peak_for(precision)


def test_small_products_are_memory_bound():
    """A matrix-vector product (m = 1) moves its 8192 x 8192 weight once: within 20% of the time at
    the memory bandwidth (the epilogues are the rest), the 32 128x256 tiles split three ways over k
    to fill the 108 SMs."""
    rates = rates_for(A100, "bf16")
    gemm = Gemm(1, 8192, 8192)
    assert rates.split_k(gemm, (128, 256)) == 3
    traffic = (8192 + 8192 * 8192 + 8192) * 2 / A100.memory_bandwidth.value
    assert traffic <= rates.gemm_seconds(gemm, 2) <= 1.2 * traffic


def test_backward_is_the_input_and_the_weight_gradient():
    assert Gemm(4, 5, 6).backward() == (Gemm(4, 6, 5), Gemm(6, 5, 4))


def test_flash_attention_causal_halves_and_backward_is_two_and_a_half():
    rates = rates_for(A100, "bf16", sustained=1.0)
    heads = 108  # 108 heads x 1 block of 128 queries: one full wave
    forward, backward = rates.attention_seconds(128, 128, 64, heads, 1, causal=False)
    assert forward == pytest.approx(4 * 128 * 128 * 64 * heads / (0.73 * 312e12))
    assert backward == pytest.approx(2.5 * forward)
    causal, _ = rates.attention_seconds(128, 128, 64, heads, 1, causal=True)
    assert causal == pytest.approx(forward / 2)


def test_every_device_has_sourced_figures():
    for device in DEVICES:
        for figure in (device.sms, device.memory, device.memory_bandwidth):
            assert figure.value > 0 and figure.source
        for _, figure in device.peak + device.matmul + device.attention:
            assert figure.value > 0 and figure.source
        for precision, figure in device.matmul:
            assert figure.value < device.peak_for(precision)  # achievable below the datasheet peak


def test_topology_naming_a_built_in_device_gets_the_kernel_model():
    topology = load_topology("selene")
    compute = compute_of(topology.device, "fp16")
    assert compute.kernels is not None and compute.kernels.device.key == "a100-sxm4-80gb"
    assert "a100-sxm4-80gb" in compute.text
    flat = compute_of(topology.device, "fp16", efficiency=0.5)  # --efficiency: one figure for every matmul
    assert flat.kernels is None and flat.rate == pytest.approx(0.5 * 312e12)


def test_unknown_device_keeps_its_stated_efficiency():
    device = load_topology("selene").device
    other = dataclasses.replace(device, name="some accelerator", matmul_efficiency=Figure(0.4, "s"))
    compute = compute_of(other, "fp16")
    assert compute.kernels is None and compute.efficiency == 0.4
    with pytest.raises(UsageError, match="none of the built-in descriptions.*matmul_efficiency is missing"):
        compute_of(dataclasses.replace(other, matmul_efficiency=None), "fp16")
    with pytest.raises(UsageError, match="need a built-in device description"):
        compute_of(other, "bf16", matmul_precision="fp8")


def test_fp8_matmuls_run_at_the_fp8_rate():
    device = load_topology("dgx-h100-2x8x8").device
    bf16 = compute_of(device, "bf16")
    fp8 = compute_of(device, "bf16", matmul_precision="fp8")
    assert fp8.kernels.matmul_flops / bf16.kernels.matmul_flops == pytest.approx(1402.6 / 794.5, rel=0.02)
    assert fp8.kernels.attention_flops == bf16.kernels.attention_flops  # attention stays in 16 bits
    with pytest.raises(UsageError, match="no fp8 matmul rate"):
        compute_of(load_topology("selene").device, "fp16", matmul_precision="fp8")
    with pytest.raises(UsageError, match="no fp9"):
        compute_of(device, "bf16", attention_kernel="fp9")


def test_overlap_exposes_what_outlasts_the_slowed_gemm():
    # Hidden: the GEMM loses 16 of 132 SMs while the 1 ms collective runs inside its 4 ms.
    assert _overlapped(1.0, 4.0, 16, 132, 0.0) == pytest.approx(1.0 * (1 - 116 / 132))
    # Longer than the slowed GEMM: the collective shows past the GEMM's own time.
    assert _overlapped(5.0, 1.0, 16, 132, 0.0) == pytest.approx(4.0)
    # A pipelined reduce-scatter's last split runs after the GEMM.
    assert _overlapped(1.0, 4.0, 16, 132, 0.25) == pytest.approx(0.25 + 0.75 * (1 - 116 / 132))


SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "training-runs" / "README.md"


def _table(text: str, heading: str) -> list[list[float]]:
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip().rstrip("%") for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0].replace(".", "").isdigit():
            rows.append([float(cell) for cell in cells])
    return rows


@pytest.mark.skipif(not SHARED.is_file(), reason="../shared/training-runs/ (the published tables) is not beside this checkout")
def test_benchmark_tables_are_the_shared_ones():
    """The rows benchmarks/plan.py fits and checks are the two shared tables, as read there."""
    from benchmarks.plan import H100_TABLE, TABLE_1

    text = SHARED.read_text(encoding="utf-8")
    a100 = _table(text, "## 1.")
    h100 = _table(text, "## 2.")
    assert [(r[4], r[5], r[6], r[8]) for r in a100] == [(t, p, gpus, tflops) for _, t, p, gpus, _, _, _, tflops in TABLE_1]
    assert [tuple(r[:10]) for r in h100] == [tuple(map(float, row)) for row in H100_TABLE]


def test_compute_without_kernels_is_the_flat_model():
    compute = Compute(100e12, 0.5, 80 * 2**30, 2e12)
    assert compute.rate == 50e12 and "0.5" in compute.text and math.isfinite(compute.memory_bytes)
