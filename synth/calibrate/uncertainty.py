"""How uncertain a fit's figures and its predictions are, from the fit's own Jacobian.

A fit minimizes the relative (log) residuals r(x) of its measured calls over the figures x
it declares (nccl_fit.py's `_Param` list, fit.py's latency and bandwidth), each with a prior
of scale `prior` in x's units (none: flat). Near the solution that is a Gaussian
least-squares problem, so with the residuals' noise scale s

    C = s^2 (J^T J + diag(1 / prior^2))^-1        (the figures' covariance)
    p = trace(J (J^T J + diag(1 / prior^2))^-1 J^T)  (how many figures the data pin)

and s^2 is the residuals' sum of squares over n - p degrees of freedom, floored at
`NOISE_FLOOR` (a probe of four sizes leaves almost no degrees of freedom: an exact fit says
nothing about the scatter a repeat would show). A prediction of a call like the fitted ones
has log-time standard deviation sigma = s * sqrt(1 + p / n): the noise of the call itself
plus the figures' spread, averaged over the fitted calls (for linear least squares exactly
the mean prediction variance there); and at least the RMS error of refits that each leave a
share of the sizes out, on the sizes they left out, and, where several groups were measured
(a probe's levels and flat calls), of refits that leave each group out, on that group
(`with_held_out`): the fit's own estimate of how it does on sizes and configurations it did
not see. That sigma is written with every `[[calibration]]`
record, and a prediction's interval is predicted x exp(+-Z sigma) (synth/calibrate/confidence.py).
A new figure a fit declares enters J, the prior and p with no change here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

NOISE_FLOOR = 0.05  # a timed collective repeats to within about 5% (nccl-tests' -n cycles; the fits' robust scale)
Z_90 = 1.6448536  # two-sided 90% of a normal: the interval's coverage target


@dataclass(frozen=True)
class Uncertainty:
    sigma: float  # a prediction's standard deviation of log(time), at a call like the fitted ones
    noise: float  # s: the residuals' scale (floored)
    pinned: float  # p: the effective number of figures the data determine
    standard_errors: tuple[float, ...]  # per figure, in the fit's units of x (logs of factors)
    held_out: float | None = None  # RMS log error on sizes left out of refits (`with_held_out`)


def uncertainty(residuals: np.ndarray, jacobian: np.ndarray, priors: np.ndarray | None = None) -> Uncertainty:
    """residuals: log(predicted / measured) of the fitted calls; jacobian: their derivatives
    by the figures (n x k); priors: each figure's prior scale in x units (inf or None: flat)."""
    residuals = np.asarray(residuals, dtype=float)
    if len(residuals) == 0:
        raise ValueError("no fitted calls to estimate an uncertainty from")
    jacobian = np.asarray(jacobian, dtype=float).reshape(len(residuals), -1)
    n, k = jacobian.shape
    prior = np.zeros(k) if priors is None else 1.0 / np.square(np.asarray(priors, dtype=float))
    information = jacobian.T @ jacobian + np.diag(prior)
    inverse = np.linalg.pinv(information)
    pinned = float(np.trace(jacobian @ inverse @ jacobian.T)) if k else 0.0
    freedom = max(n - pinned, 1.0)
    noise = max(math.sqrt(float(residuals @ residuals) / freedom), NOISE_FLOOR)
    covariance = noise ** 2 * inverse
    errors = tuple(float(math.sqrt(max(v, 0.0))) for v in np.diag(covariance))
    return Uncertainty(noise * math.sqrt(1 + pinned / n), noise, pinned, errors)


def size_folds(sizes, folds: int = 4) -> tuple[frozenset, ...]:
    """The distinct sizes dealt into at most `folds` sets, each spanning the range (every
    folds-th size), for refits that leave one set out."""
    distinct = sorted(set(sizes))
    count = min(folds, len(distinct))
    return tuple(frozenset(distinct[i::count]) for i in range(count)) if count >= 2 else ()


def with_held_out(spread: Uncertainty, residuals) -> Uncertainty:
    """The spread with a prediction's sigma at least the RMS log error on sizes a refit left out:
    in-sample residuals of a four-size fit say little of the sizes between and beyond."""
    values = np.asarray(residuals, dtype=float)
    if values.size == 0:
        return spread
    held = math.sqrt(float(np.mean(values ** 2)))
    return Uncertainty(max(spread.sigma, held), spread.noise, spread.pinned, spread.standard_errors, held)


def interval(predicted_s: float, sigma: float, z: float = Z_90) -> tuple[float, float]:
    """(low, high) seconds: the prediction times exp(-z sigma) and exp(+z sigma)."""
    return predicted_s * math.exp(-z * sigma), predicted_s * math.exp(z * sigma)


def numeric_jacobian(function, x: np.ndarray, step: float = 1e-4) -> np.ndarray:
    """Central differences of a vector function of x (the fits' models are piecewise smooth)."""
    x = np.asarray(x, dtype=float)
    columns = []
    for i in range(len(x)):
        up, down = x.copy(), x.copy()
        up[i] += step
        down[i] -= step
        columns.append((np.asarray(function(up)) - np.asarray(function(down))) / (2 * step))
    return np.stack(columns, axis=1) if columns else np.zeros((len(np.asarray(function(x))), 0))
