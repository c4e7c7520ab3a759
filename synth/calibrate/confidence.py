"""How sure a prediction is: the model's error on the nearest configuration a calibrated
topology was fitted on (its `[[calibration]]` records), or "uncalibrated" when it has none.

Nearness counts, in order: the same collective, then how far apart node counts and ranks per
node are (factors of two, each), then how far the size lies outside the measured sizes
(factors of 1024). The error reported is the record's relative RMS and worst error after
the fit: what the model missed where it was measured, a floor for what it misses elsewhere.
The interval is predicted x exp(+-1.645 sigma), sigma the fit's prediction spread
(synth/calibrate/uncertainty.py; for a record written before fits had one its RMS error at the
size's band, at least the noise floor) combined with the model's structure error at the size's
band on the measured configuration or another (synth/calibrate/transfer_error.py). Where the
launch leaves a process more busy threads than CPUs (synth/model/nccl/proxy.py host_stall_s),
the interval's upper end adds the scheduler slice a call can wait for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from synth.calibrate.transfer_error import combined, structure_term
from synth.calibrate.uncertainty import NOISE_FLOOR, Z_90
from synth.model.heldout import BANDS, band_of
from synth.topology import CalibrationRecord, Topology


@dataclass(frozen=True)
class Confidence:
    record: CalibrationRecord | None
    exact: bool  # the same collective and group shape, and the size inside the measured range
    stall_s: float = 0.0  # what the call may wait for its host's CPUs beyond the prediction (proxy.host_stall_s)

    @property
    def calibrated(self) -> bool:
        return self.record is not None

    def fit_sigma(self, nbytes: float | None = None) -> float | None:
        """The fit's own standard deviation of log(time) here (its record's); None uncalibrated."""
        if self.record is None:
            return None
        if self.record.sigma is not None:
            return self.record.sigma
        band = None if nbytes is None else band_of(nbytes)
        at = next((entry for entry in self.record.bands if entry[0] == band), None)
        return max(at[1] if at is not None else self.record.rms_error, NOISE_FLOOR)

    def sigma(self, nbytes: float | None = None) -> float | None:
        """The standard deviation of log(time) of a prediction here: the fit's own and the model's
        structure error at this size band, on the measured configuration or another
        (synth/calibrate/transfer_error.py); None uncalibrated."""
        own = self.fit_sigma(nbytes)
        if own is None or nbytes is None:
            return own
        return combined(own, structure_term(band_of(nbytes), self.exact))

    def interval(self, predicted_s: float, nbytes: float | None = None) -> tuple[float, float] | None:
        """The 90% interval (low, high) in seconds around a prediction; None uncalibrated."""
        sigma = self.sigma(nbytes)
        if sigma is None:
            return None
        return predicted_s * math.exp(-Z_90 * sigma), predicted_s * math.exp(Z_90 * sigma) + self.stall_s

    def _interval_text(self, nbytes: float | None) -> str:
        sigma = self.sigma(nbytes)
        stall = f" plus up to {self.stall_s * 1e3:g} ms waiting for the host's CPUs" if self.stall_s else ""
        return f"; 90% interval x{math.exp(-Z_90 * sigma):.2f}-x{math.exp(Z_90 * sigma):.2f} of the prediction{stall}"

    def describe(self, nbytes: float | None = None) -> str:
        """The record's error at the size band of `nbytes` where it measured that band (the whole
        record's beside it), else over all its sizes, saying so."""
        if self.record is None:
            return "uncalibrated (no measurements: synth calibrate writes them into the topology)"
        r = self.record
        where = "measured configuration" if self.exact else "nearest measured configuration"
        shape = (f"{r.collective} over {r.nodes} x {r.ranks_per_node} ranks, {_size(r.min_bytes)}-{_size(r.max_bytes)} "
                 f"({r.file})")
        band = None if nbytes is None else band_of(nbytes)
        at = next((entry for entry in r.bands if entry[0] == band), None)
        if at is not None:
            _, rms, worst, points = at
            return (f"model error at {band} (this size's band) {rms:.1%} RMS (worst {worst:.1%}, {points} sizes) on the "
                    f"{where}: {shape}; {r.rms_error:.1%} RMS over all its sizes{self._interval_text(nbytes)}")
        missing = f" (it measured no size in {band}, this size's band)" if band is not None and r.bands else ""
        return (f"model error {r.rms_error:.1%} RMS (worst {r.worst_error:.1%}) over all its sizes on the {where}"
                f"{missing}: {shape}{self._interval_text(nbytes)}")


def band_errors(errors) -> tuple[tuple[str, float, float, int], ...]:
    """(band, relative RMS, worst, points) per size band (synth/model/heldout.py's bands) of
    (bytes, relative error) pairs: what a [[calibration]] record keeps so that a prediction
    states the error at its own size."""
    by_band: dict[str, list[float]] = {}
    for nbytes, error in errors:
        by_band.setdefault(band_of(nbytes), []).append(float(error))
    return tuple((band, float(np.sqrt(np.mean(np.square(values)))), float(np.max(np.abs(values))), len(values))
                 for band, _, _ in BANDS if (values := by_band.get(band)))


def _size(nbytes: int) -> str:
    from synth.units import format_bytes

    return format_bytes(nbytes)


def _distance(record: CalibrationRecord, collective: str, nodes: int, ranks_per_node: int, nbytes: float) -> float:
    distance = 0.0 if record.collective == collective else 100.0
    distance += abs(math.log2(max(nodes, 1) / record.nodes)) + abs(math.log2(max(ranks_per_node, 1) / record.ranks_per_node))
    if nbytes < record.min_bytes:
        distance += math.log2(record.min_bytes / max(nbytes, 1)) / 10
    elif nbytes > record.max_bytes:
        distance += math.log2(nbytes / record.max_bytes) / 10
    return distance


def model_error(topology: Topology, collective: str, nodes: int, ranks_per_node: int, nbytes: float) -> Confidence:
    """The error on the nearest measured configuration of a calibrated topology."""
    if not topology.calibration:
        return Confidence(None, False)
    distances = [_distance(r, collective, nodes, ranks_per_node, nbytes) for r in topology.calibration]
    best = int(np.argmin(distances))
    return Confidence(topology.calibration[best], distances[best] == 0)


def model_error_for_group(topology: Topology, devices, collective: str, nbytes: float) -> Confidence:
    """`model_error` for a group of device ranks (its nodes and ranks per node as NCCL sees them)."""
    if not topology.calibration:
        return Confidence(None, False)
    from synth.model.nccl.hardware import call_for, group_layout, nccl_view
    from synth.model.nccl.proxy import host_stall_s

    view = nccl_view(topology)
    nodes, per_node, _ = group_layout(topology, view, devices)
    found = model_error(topology, collective, nodes, per_node, nbytes)
    if found.record is None:
        return found
    return replace(found, stall_s=host_stall_s(*call_for(topology, view, devices, collective, nbytes)))
