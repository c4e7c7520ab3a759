"""The model-structure term of a calibrated prediction's interval, from held-out residuals.

A fit's own spread (synth/calibrate/uncertainty.py) says how well its figures are pinned on the
sizes it saw; it does not say how far the model's structure is off at a size, collective or node
count it never saw, where a figure fitted on one configuration is applied to another. That term
is measured, not assumed: on residuals log(predicted / measured) of predictions made by other
folds (fits that never saw the judged source), the smallest `s` such that intervals
predicted x exp(+-z sqrt(sigma_fit^2 + s^2)) cover `coverage` of them. The judged source's
prediction then carries sqrt(sigma_fit^2 + s^2) (`combined`).
"""

from __future__ import annotations

import math

import numpy as np

from synth.calibrate.uncertainty import Z_90

COVERAGE = 0.90


def structure_sigma(residuals, fit_sigmas, coverage: float = COVERAGE, z: float = Z_90) -> float:
    """The smallest s >= 0 with |r| <= z sqrt(sigma^2 + s^2) for at least `coverage` of the
    (residual r, fit sigma) pairs; 0 when the fit's own sigma already covers that share."""
    r = np.abs(np.asarray(residuals, dtype=float))
    sigma = np.asarray(fit_sigmas, dtype=float)
    if r.shape != sigma.shape:
        raise ValueError(f"{r.size} residuals but {sigma.size} fit sigmas: one of each per prediction")
    if r.size == 0:
        raise ValueError("no held-out residuals to measure a structure error from")
    if not 0 < coverage < 1:
        raise ValueError(f"coverage {coverage} is not a share between 0 and 1")
    # the s at which each residual is just covered; the coverage-quantile of those is the answer
    needed = np.sqrt(np.maximum((r / z) ** 2 - sigma ** 2, 0.0))
    rank = max(math.ceil(coverage * r.size) - 1, 0)
    return float(np.sort(needed)[rank])


def combined(fit_sigma: float, structure: float) -> float:
    """A prediction's log-time standard deviation: the fit's spread and the structure term."""
    return math.sqrt(fit_sigma ** 2 + structure ** 2)
