"""The NCCL fit (synth/calibrate/nccl_fit.py): per-protocol figures come back from times the
model itself made (with noise and wild outliers), the outliers are flagged and do not drag the
fit, fitted figures never move NCCL's choice, and what one node count fits predicts another by
mechanism. Then, on the real logs shipped with the project, the fidelity targets of issue 9
that the model meets are held as regression tests (results/fidelity/README.md has all of them)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from synth.calibrate import read_measurements
from synth.calibrate.measurements import Measurement, Span
from synth.calibrate.nccl_fit import calibrate_nccl
from synth.model import nccl
from synth.model.nccl.hardware import estimate_group, nccl_view
from synth.topology import Figure, ProtocolFactors
from synth.topology_file import load_topology, render_topology

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "docs" / "examples"
DATA = ROOT / "tests" / "data" / "nccl-logs"
SIZES = [2 ** e for e in range(3, 35)]  # 8 B .. 16 GiB, nccl-tests -b 8 -e 16G -f 2
NOISE = 0.02


def _truth(base: str, efficiencies: dict[str, float], overhead: float, protocols: dict[str, tuple[float, float]]):
    """A topology whose NCCL figures are known: the base with these efficiencies, this per-call
    overhead on the network level and these (rate, latency) factors per protocol."""
    topology = load_topology(base)
    levels = list(topology.levels)
    for i, level in enumerate(levels):
        if level.name in efficiencies:
            levels[i] = replace(level, efficiency=Figure(efficiencies[level.name], "test truth"))
    factors = tuple((p, ProtocolFactors(Figure(rate, "test truth"), Figure(latency, "test truth")))
                    for p, (rate, latency) in protocols.items())
    levels[0] = replace(levels[0], overhead=Figure(overhead, "test truth"), protocols=factors)
    return replace(topology, levels=tuple(levels))


def _measure(truth, hosts: int, per_host: int, rng, outliers: dict[int, float] = ()) -> list[Measurement]:
    """AllReduce over `hosts` x `per_host` ranks at every size, the model's time of the truth
    times lognormal noise, and the sizes in `outliers` slowed by their factor (a stall)."""
    per_node = truth.sizes[1]
    devices = tuple(h * per_node + r for h in range(hosts) for r in range(per_host))
    span = Span(truth.levels[0].name, hosts, per_host, hosts)
    result = []
    for line, size in enumerate(SIZES):
        seconds = estimate_group(truth, devices, "AllReduce", size).time_s * float(np.exp(rng.normal(0, NOISE)))
        seconds *= dict(outliers).get(size, 1.0)
        result.append(Measurement("AllReduce", size, seconds, span, f"truth-{hosts}x{per_host}.txt", line + 1, "nccl"))
    return result


def _factors(fit) -> dict[str, tuple[float | None, float | None]]:
    return {protocol: (rate, latency) for protocol, rate, latency in fit.protocols}


def test_per_protocol_figures_come_back_from_noisy_times_with_outliers():
    """Two hosts of two GPUs on DGX H100s: NCCL runs ring LL up to 512 KiB, LL128 from 1 to
    64 MiB and Simple above, so each protocol's rate and latency have sizes of their own.
    Three sizes stall (x3, x8, x1.6); the fit flags exactly those and recovers the truth."""
    truth = _truth("dgx-h100-x2", {"node": 0.9}, 4e-6, {"LL": (0.5, 1.0), "LL128": (0.7, 1.2), "Simple": (1.0, 1.0)})
    stalls = {64 * 2 ** 10: 3.0, 2 * 2 ** 20: 8.0, 256 * 2 ** 20: 1.6}
    measurements = _measure(truth, 2, 2, np.random.default_rng(7), stalls)
    result = calibrate_nccl(measurements, load_topology("dgx-h100-x2"))
    (fit,) = result.fits
    factors = _factors(fit)
    assert factors["LL"][0] == pytest.approx(0.5, rel=0.1)
    assert factors["LL128"][0] == pytest.approx(0.7, rel=0.1)
    assert factors["LL"][1] == pytest.approx(1.0, rel=0.1)
    assert factors["LL128"][1] == pytest.approx(1.2, rel=0.1)
    assert dict(fit.efficiencies)["node"] == pytest.approx(0.9, rel=0.05)
    (group,) = fit.groups
    assert {e.nbytes for e in group.errors if e.outlier} == set(stalls)
    assert group.inlier_rms < 2 * NOISE
    assert all(abs(e.error) < 4 * NOISE for e in group.errors if not e.outlier)
    assert any("flagged as outliers" in note for note in fit.notes)


def test_fitted_figures_are_written_with_their_sources_and_read_back(tmp_path):
    truth = _truth("dgx-h100-x2", {"node": 0.9}, 4e-6, {"LL": (0.5, 1.0), "LL128": (0.7, 1.2)})
    measurements = _measure(truth, 2, 2, np.random.default_rng(3))
    result = calibrate_nccl(measurements, load_topology("dgx-h100-x2"))
    path = tmp_path / "fitted.toml"
    path.write_text(render_topology(result.topology))
    written = load_topology(path)
    factors = dict(written.levels[0].protocols)
    assert factors["LL"].bandwidth.value == pytest.approx(0.5, rel=0.1)
    assert "LL's rate over the modelled one" in factors["LL"].bandwidth.source
    assert "at which NCCL picks LL" in factors["LL"].bandwidth.source
    for m in measurements:  # the file predicts what the fit did
        devices = tuple(range(2)) + tuple(8 + r for r in range(2))
        again = estimate_group(written, devices, "AllReduce", m.bytes).time_s
        assert again == pytest.approx(estimate_group(result.topology, devices, "AllReduce", m.bytes).time_s, rel=1e-4)


def test_what_one_node_count_fits_predicts_another_by_mechanism():
    """Calibrated on 2 HGX H100 servers, the figures (link efficiencies, per-protocol factors
    on NCCL's per-hop latencies and per-channel ceilings, stages per network hop) predict 4
    servers, whose tree is one level deeper, within the noise."""
    truth = _truth("hgx-h100-ib-4x8", {"node": 0.92, "gpu": 0.8}, 0.0, {"LL": (0.55, 1.0), "LL128": (0.8, 1.0)})
    two = _measure(truth, 2, 8, np.random.default_rng(11))
    fitted = calibrate_nccl(two, load_topology("hgx-h100-ib-4x8")).topology
    devices = tuple(range(32))
    for size in SIZES:
        expected = estimate_group(truth, devices, "AllReduce", size).time_s
        assert estimate_group(fitted, devices, "AllReduce", size).time_s == pytest.approx(expected, rel=0.06), size


def test_fitted_figures_never_move_nccls_choice():
    """NCCL picks from its own tables: efficiencies, overheads and protocol factors change the
    time of what it picks, not the pick (the switch points stay NCCL's)."""
    base = nccl_view(load_topology("hgx-h100-ib-4x8")).hardware
    odd = replace(base, intra=replace(base.intra, efficiency=0.3), overhead_s=1e-3,
                  network=replace(base.network, link=replace(base.network.link, efficiency=0.2), stages=40.0),
                  protocol_figures=(nccl.ProtocolFigures("LL", 0.1, 3.0), nccl.ProtocolFigures("Simple", 0.5, 0.5)))
    for nodes in (2, 4):
        for size in SIZES:
            call = nccl.Call("AllReduce", nodes, 8, size)
            assert nccl.choose(odd, call) == nccl.choose(base, call)
            slow, fast = nccl.estimate(odd, call), nccl.estimate(base, call)
            assert slow.time_s > fast.time_s


def test_a_protocol_factor_scales_only_its_own_sizes():
    base = nccl_view(load_topology("hgx-h100-ib-4x8")).hardware
    slow_ll = replace(base, protocol_figures=(nccl.ProtocolFigures("LL", 0.5, 1.0),))
    for size in SIZES:
        call = nccl.Call("AllReduce", 2, 8, size)
        before, after = nccl.estimate(base, call), nccl.estimate(slow_ll, call)
        if before.choice.protocol == "LL":
            assert after.transfer_s == pytest.approx(2 * before.transfer_s)
            assert after.latency_s == pytest.approx(before.latency_s)
        else:
            assert after.time_s == before.time_s


# --- the targets the model meets on the shipped logs (results/fidelity/README.md) ---------------------


def _busbw_errors(topology, measurements) -> dict[int, float]:
    """predicted / measured busbw - 1 per size (busbw is inverse in time)."""
    view = nccl_view(topology)
    result = {}
    for m in measurements:
        devices = _devices(topology, m)
        result[m.bytes] = m.time_s / estimate_group(topology, devices, m.collective, m.bytes, view).time_s - 1
    return result


def _devices(topology, m) -> tuple[int, ...]:
    from synth.calibrate.groups import devices
    return devices(m, topology)[1]


def _read(path: Path):
    return read_measurements(str(path))[1]


LARGE = 64 * 2 ** 20


@pytest.mark.parametrize("name, misses", [
    ("all_reduce_perf-h100-ib-4x8.txt", set()),
    # 512 KiB (+35%, NCCL's estimates tie there) came within 30% (+17%) with the tree's measured
    # mid-size efficiency and the LL128 tree's fill (tables.tree_correction, chunking.ll128_tree_stages)
    ("all_reduce_perf-h100-ib-2x8.txt", set()),
])
def test_a_built_in_topology_predicts_the_infiniband_runs(name, misses):
    """(a): within 10% at >= 64 MiB and within 30% below, from hgx-h100-ib-4x8's sourced figures."""
    errors = _busbw_errors(load_topology("hgx-h100-ib-4x8"), _read(EXAMPLES / name))
    off = {size for size, error in errors.items() if abs(error) > (0.10 if size >= LARGE else 0.30)}
    assert off == misses


def test_a_built_in_topology_predicts_the_other_issue_309_cluster():
    errors = _busbw_errors(load_topology("hgx-h100-ib-4x8"), _read(DATA / "h100-ib-2x8-nt309b-all_reduce_perf.txt"))
    assert all(abs(error) <= (0.10 if size >= LARGE else 0.30) for size, error in errors.items())


def test_b_calibrated_on_the_single_node_nvls_run():
    """(b) within 5% at every size."""
    measurements = _read(EXAMPLES / "all_reduce_perf-h100-1x8-nvls.txt")
    fitted = calibrate_nccl(measurements, load_topology("dgx-h100")).topology
    assert all(abs(e) <= 0.05 for e in _busbw_errors(fitted, measurements).values())


def test_b_and_c_on_the_infiniband_runs():
    """(b) on the 4-node run: at least 26 of 32 sizes within 5%; (c): calibrated on the 2-node
    run it predicts the 4-node one at 24 of 32 sizes within 10%, and the other way 26 of 32
    (the misses are the NVLS-tree pipeline between 1 and 32 MiB, results/fidelity/README.md).
    Before the tree's measured mid-size efficiency (tables.tree_correction) these were 28, 26
    and 27: NCCL's LL factor falls from 0.6 at 64 KiB to 0.5 at 128 KiB where these two runs'
    LL trees do not (4 nodes fitted: 32 KiB +5%, 128 KiB -10%), and the 2-node fit of the LL128
    tree (its 512 KiB runs 35% slow) carries with the 4-node tree's longer fill to 256 KiB-1 MiB
    25% slow; the pooled held-out figures improve (results/calibration-transfer)."""
    two, four = _read(EXAMPLES / "all_reduce_perf-h100-ib-2x8.txt"), _read(EXAMPLES / "all_reduce_perf-h100-ib-4x8.txt")
    base = load_topology("hgx-h100-ib-4x8")
    on_two, on_four = calibrate_nccl(two, base).topology, calibrate_nccl(four, base).topology
    b = _busbw_errors(on_four, four)
    assert sum(abs(e) <= 0.05 for e in b.values()) >= 26
    assert sum(abs(e) <= 0.10 for e in _busbw_errors(on_two, four).values()) >= 24
    assert sum(abs(e) <= 0.10 for e in _busbw_errors(on_four, two).values()) >= 26


def test_the_stalls_of_a_one_process_per_node_run_are_flagged_not_fitted():
    """dgx-06/07 with -g 8 (one process drives a node's 8 GPUs, bound to one core by mpirun's
    default for two processes): calls from 32 KiB to 64 MiB take milliseconds. The fit flags
    them as outliers and keeps NCCL's per-protocol figures for the rest."""
    measurements = _read(DATA / "h100-2x8-dgx0607-all_reduce_perf.txt")
    (fit,) = calibrate_nccl(measurements, load_topology("dgx-h100-x2")).fits
    (group,) = fit.groups
    flagged = {e.nbytes for e in group.errors if e.outlier}
    # 32 KiB to 32 MiB (64 MiB, 2.5 ms against 0.9 ms, sits with the large sizes the stages fit)
    assert {2 ** e for e in range(15, 26)} - {256 * 2 ** 10} <= flagged
    assert not {size for size in flagged if size <= 16 * 2 ** 10 or size >= 512 * 2 ** 20}
    assert group.poor
