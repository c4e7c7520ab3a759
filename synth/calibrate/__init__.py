"""Calibration of the simulator from measurements (issue 3, `synth calibrate`).

readers: which format a file is in (nccl_text, nccl_csv, bench_csv parse them) into
measurements: one timed call of one collective on one group (a Span of a level).
groups: where a measured group sits on a topology.
model: the simulator's time for one call, piecewise linear in the fitted figures.
fit: weighted least squares of one level's latency and bandwidth for one collective.
calibration: every level and collective, innermost first, into a topology.
"""

from synth.calibrate.calibration import Calibration, Fit, calibrate, infer_base, replay
from synth.calibrate.measurements import Measurement, Span
from synth.calibrate.readers import FORMATS, read_measurements

__all__ = ["Calibration", "FORMATS", "Fit", "Measurement", "Span", "calibrate", "infer_base", "read_measurements",
           "replay"]
