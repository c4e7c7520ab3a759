"""A probe's fit and its intervals (issue 25): the heavy-tailed probe priors let a link at half
its documented rate through but hold a figure that one size alone asks for, a sweep keeps its
own priors, and the model-structure term of an interval is the smallest that covers its share
of held-out residuals (synth/calibrate/transfer_error.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from synth.calibrate.measurements import Measurement, Span
from synth.calibrate.nccl_fit import PROBE_MAX_SIZES, PROBE_PRIORS, SWEEP_PRIORS, calibrate_nccl, priors_for
from synth.calibrate.probe import PROBE_SIZES
from synth.calibrate.transfer_error import combined, structure_sigma
from synth.calibrate.uncertainty import Z_90
from synth.model.nccl.hardware import estimate_group
from synth.topology import Figure
from synth.topology_file import load_topology

DEVICES = (0, 1, 8, 9)  # two DGX H100s, two GPUs each


def _probe(truth, slow: dict[int, float] | None = None) -> list[Measurement]:
    """The probe's four sizes of an all-reduce over DEVICES, timed by the model of `truth`."""
    span = Span(truth.levels[0].name, 2, 2, 2)
    return [Measurement("AllReduce", size, estimate_group(truth, DEVICES, "AllReduce", size).time_s
                        * (slow or {}).get(size, 1.0), span, "probe.txt", line, "nccl")
            for line, size in enumerate(PROBE_SIZES, 1)]


def _with_network_efficiency(efficiency: float):
    base = load_topology("dgx-h100-x2")
    levels = list(base.levels)
    levels[0] = replace(levels[0], efficiency=Figure(efficiency, "test truth"))
    return replace(base, levels=tuple(levels))


def test_a_probe_takes_the_probe_priors_and_a_sweep_the_sweep_ones():
    assert priors_for(len(PROBE_SIZES)) == PROBE_PRIORS
    assert priors_for(PROBE_MAX_SIZES + 1) == SWEEP_PRIORS
    assert PROBE_PRIORS.weight is not None and SWEEP_PRIORS.weight is None


def test_scaling_the_priors_scales_every_figure_and_keeps_the_shape():
    wider = PROBE_PRIORS.scaled(2.0)
    assert (wider.rate, wider.latency, wider.overhead, wider.floor, wider.stages) == pytest.approx(
        tuple(2 * v for v in (PROBE_PRIORS.rate, PROBE_PRIORS.latency, PROBE_PRIORS.overhead, PROBE_PRIORS.floor,
                              PROBE_PRIORS.stages)))
    assert wider.weight == PROBE_PRIORS.weight
    with pytest.raises(ValueError, match="positive"):
        PROBE_PRIORS.scaled(0.0)


def test_a_probe_recovers_a_link_at_half_its_documented_rate():
    """Both bandwidth sizes of the probe 2x slow: far beyond the prior's scale, so it moves."""
    measurements = _probe(_with_network_efficiency(0.5))
    fit = calibrate_nccl(measurements, load_topology("dgx-h100-x2"))
    (level,) = fit.fits
    assert dict(level.efficiencies)["node"] == pytest.approx(0.5, rel=0.05)
    for m in measurements:
        assert estimate_group(fit.topology, DEVICES, "AllReduce", m.bytes).time_s == pytest.approx(m.time_s, rel=0.03)


def test_a_probe_shrinks_a_small_rate_miss_towards_the_documented_value():
    """A link 20% slow (inside the prior's scale, about what the model's structure misses on other
    systems) moves the efficiency part of the way; the sweep's priors would take all of it."""
    measurements = _probe(_with_network_efficiency(0.8))
    documented = load_topology("dgx-h100-x2").levels[0].efficiency
    base_value = documented.value if documented is not None else 1.0
    (probe,) = calibrate_nccl(measurements, load_topology("dgx-h100-x2")).fits
    (sweep,) = calibrate_nccl(measurements, load_topology("dgx-h100-x2"), priors=SWEEP_PRIORS).fits
    shrunk, free = dict(probe.efficiencies)["node"], dict(sweep.efficiencies)["node"]
    assert free == pytest.approx(0.8, rel=0.02)
    assert free < shrunk < base_value


def test_the_structure_term_is_zero_where_the_fits_own_spread_covers():
    residuals = np.array([0.01, -0.02, 0.03, -0.01])
    assert structure_sigma(residuals, np.full(4, 0.05)) == 0.0


def test_the_structure_term_is_the_smallest_that_covers_the_share():
    rng = np.random.default_rng(5)
    residuals = rng.normal(0.0, 0.2, 400) + rng.standard_cauchy(400) * 0.02
    fit = rng.uniform(0.0, 0.1, 400)
    s = structure_sigma(residuals, fit)

    def covered(term: float) -> float:
        return float(np.mean(np.abs(residuals) <= Z_90 * np.sqrt(fit ** 2 + term ** 2)))

    assert covered(s) >= 0.90
    assert covered(s * 0.99) < 0.90
    assert combined(0.03, 0.04) == pytest.approx(0.05)


@pytest.mark.parametrize("residuals, sigmas, coverage, message", [
    ([], [], 0.9, "no held-out residuals"),
    ([0.1, 0.2], [0.1], 0.9, "one of each"),
    ([0.1], [0.1], 1.0, "between 0 and 1"),
])
def test_the_structure_term_refuses_what_it_cannot_measure(residuals, sigmas, coverage, message):
    with pytest.raises(ValueError, match=message):
        structure_sigma(residuals, sigmas, coverage)


def test_the_structure_term_widens_an_interval_as_combined():
    low, high = math.exp(-Z_90 * combined(0.05, 0.1)), math.exp(Z_90 * combined(0.05, 0.1))
    assert low < math.exp(-Z_90 * 0.1) and high > math.exp(Z_90 * 0.1)


def _row(source_bytes: int, predicted: float, same: bool = True) -> dict:
    return {"bytes": source_bytes, "measured_s": 1.0, "predicted_s": predicted, "same_log": same, "sigma_fit": 0.05,
            "low_fit_s": predicted * 0.9, "high_fit_s": predicted * 1.1}


def test_the_transfer_study_chooses_a_sources_scale_and_term_on_the_other_sources_alone():
    """benchmarks/calibration_transfer.py's `select`: source A's rows are right at scale 1 and far off
    at scale 2, B's the other way round; A is judged at B's best scale and B at A's."""
    from benchmarks.calibration_transfer import select

    def fold(source: str, predicted: float) -> dict:
        return {"probe_log": f"{source}.txt", "source": source, "rows": [_row(2 ** 30, predicted)] * 30}

    runs = {1.0: [fold("A", 1.0), fold("B", 1.5)], 2.0: [fold("A", 1.5), fold("B", 1.0)]}
    folds, choices = select(runs)
    assert choices["A"]["scale"] == 2.0 and choices["B"]["scale"] == 1.0
    assert [f["scale"] for f in folds] == [2.0, 1.0]
    # A judged at scale 2 (its own rows 50% off) with B's term at scale 2 (B's rows exact there): not covered
    assert choices["A"]["structure_sigma"][">= 64 MiB | same log"] == 0.0
    assert not any(r["low_s"] <= r["measured_s"] <= r["high_s"] for r in folds[0]["rows"])


def test_a_calibrated_prediction_carries_the_structure_term(monkeypatch):
    """confidence.py: sigma = sqrt(the fit's own^2 + the table's term at the size's band), the
    measured configuration's term where the record is exact, the other configurations' elsewhere."""
    from synth.calibrate import transfer_error
    from synth.calibrate.confidence import Confidence
    from synth.topology import CalibrationRecord

    monkeypatch.setattr(transfer_error, "STRUCTURE_SIGMA", {">= 64 MiB": (0.03, 0.2)})
    record = CalibrationRecord("AllReduce", "node", 2, 8, 8, 1 << 31, 4, 0.02, 0.03, "probe.txt", "nccl", (), 0.04)
    assert Confidence(record, True).fit_sigma(1 << 30) == 0.04
    assert Confidence(record, True).sigma(1 << 30) == pytest.approx(0.05)
    assert Confidence(record, False).sigma(1 << 30) == pytest.approx(math.hypot(0.04, 0.2))
    assert Confidence(record, False).sigma(1 << 10) == pytest.approx(0.04)  # a band the study has no term for
