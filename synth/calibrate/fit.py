"""Least-squares fit of one level's latency and bandwidth for one collective.

Minimizes the sum of squared relative errors, sum ((t_model - t) / t)^2, so a 8-byte call
at 20 us and a 1 GiB call at 50 ms weigh the same: the small sizes fix the latency, the
large ones the bandwidth. The model (synth/calibrate/model.py) is piecewise linear in the
latency alpha and the inverse bandwidth x = 1 / beta; the fit solves the weighted linear
least squares of the pieces active at the current estimate, moves there, and repeats until
the active pieces stop changing (Gauss-Newton, exact on each piece; a few rounds). It starts
from the pieces in which level l's links bound every transfer.

Non-physical results: a negative latency is clamped to the smallest positive figure the
topology format takes (1 ns) and the bandwidth refitted, with a note; a bandwidth that is
not positive (times that do not grow with size) is refused. When no point's transfer is
bounded by level l's links (another link is the bottleneck throughout), the data cannot
tell its bandwidth beyond a lower bound: the estimate is kept, with a note.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from synth.calibrate.model import CallModel
from synth.errors import UsageError
from synth.units import format_time



class UnfitError(UsageError):
    """The measurements of one collective at one level give no positive bandwidth."""


MIN_LATENCY_S = 1e-9  # the format needs a positive time; 1 ns is below anything measurable here
MAX_ROUNDS = 50


@dataclass(frozen=True)
class Point:
    model: CallModel
    nbytes: int
    time_s: float


@dataclass(frozen=True)
class Solution:
    latency_s: float
    bandwidth: float  # bytes/s
    r_squared: float
    relative_rms: float
    max_relative_error: float
    algorithms: tuple[str, ...]  # what the backend runs at the fitted figures, over the points
    notes: tuple[str, ...]


def predictions(points: list[Point], alpha: float, x: float) -> np.ndarray:
    return np.array([point.model.time(alpha, x, point.nbytes)[0] for point in points])


def _loss(points: list[Point], alpha: float, x: float) -> float:
    times = np.array([point.time_s for point in points])
    return float(np.sum(((predictions(points, alpha, x) - times) / times) ** 2))


def _solve(points: list[Point], alpha: float, x: float, level_bound: bool, where: str):
    """One weighted least-squares step on the pieces active at (alpha, x):
    (alpha, x, choices, notes, x_identified)."""
    rows, rhs, choices = [], [], []
    for point in points:
        line = point.model.line(alpha, x, point.nbytes, level_bound)
        rows.append([line.alpha_slope / point.time_s, line.x_slope / point.time_s])
        rhs.append((point.time_s - line.constant) / point.time_s)
        choices.append(line.choice)
    matrix, target = np.array(rows), np.array(rhs)
    notes = []
    if not np.any(matrix[:, 1] > 0):  # level l's links bound no transfer: x is not identifiable
        alpha_new = _one_column(matrix[:, 0], target)
        if alpha_new < MIN_LATENCY_S:
            notes.append(f"latency fit {_signed_time(alpha_new)} clamped to {format_time(MIN_LATENCY_S)}")
        return max(alpha_new, MIN_LATENCY_S), x, tuple(choices), notes, False
    (alpha_new, x_new), *_ = np.linalg.lstsq(matrix, target, rcond=None)
    if alpha_new < MIN_LATENCY_S:
        notes.append(f"latency fit {_signed_time(alpha_new)} clamped to {format_time(MIN_LATENCY_S)}")
        alpha_new = MIN_LATENCY_S
        x_new = _one_column(matrix[:, 1], target - matrix[:, 0] * alpha_new)
    if not x_new > 0:
        return float(alpha_new), None, tuple(choices), notes, True
    return float(alpha_new), float(x_new), tuple(choices), notes, True


def _signed_time(seconds: float) -> str:
    if seconds == 0:
        return "0 s"
    return ("-" if seconds < 0 else "") + format_time(abs(seconds))


def _one_column(column: np.ndarray, target: np.ndarray) -> float:
    denominator = float(column @ column)
    return float(column @ target) / denominator if denominator > 0 else 0.0


def fit_points(points: list[Point], alpha0: float, x0: float, where: str) -> Solution:
    """Fit (latency, bandwidth) to the points; alpha0 and x0 are the base figures (or guesses)."""
    if len({point.nbytes for point in points}) < 2:
        raise UsageError(f"{where}: every measurement has the same size; latency and bandwidth need at least two "
                         f"sizes (a sweep, e.g. nccl-tests -b 8 -e 1G -f 2)")
    alpha, x, choices, notes, identified = _solve(points, alpha0, x0, True, where)
    if x is None:
        raise UnfitError(f"{where}: the times do not grow with the size (the fitted bandwidth is not positive); "
                         f"check that the files measure this collective at this level")
    best = (_loss(points, alpha, x), alpha, x, notes, identified)
    seen = {choices}
    for _ in range(MAX_ROUNDS):
        alpha, x, choices, notes, identified = _solve(points, alpha, x, False, where)
        if x is None:
            break
        loss = _loss(points, alpha, x)
        if loss < best[0]:
            best = (loss, alpha, x, notes, identified)
        if choices in seen:
            break
        seen.add(choices)
    _, alpha, x, notes, identified = best
    if not identified:
        notes = [*notes, "no measured transfer is bounded by this level's links: the data give only a lower "
                         "bound on its bandwidth"]
    return _solution(points, alpha, x, tuple(notes))


def _solution(points: list[Point], alpha: float, x: float, notes: tuple[str, ...]) -> Solution:
    times = np.array([point.time_s for point in points])
    predicted = predictions(points, alpha, x)
    relative = (predicted - times) / times
    spread = float(np.sum((times - times.mean()) ** 2))
    r_squared = 1 - float(np.sum((predicted - times) ** 2)) / spread if spread > 0 else 1.0
    algorithms = sorted({point.model.algorithm_name(point.model.time(alpha, x, point.nbytes)[1]) for point in points})
    return Solution(alpha, 1 / x, r_squared, math.sqrt(float(np.mean(relative ** 2))),
                    float(np.max(np.abs(relative))), tuple(algorithms), notes)
