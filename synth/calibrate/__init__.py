"""Calibration of the simulator from measurements (issue 3, `synth calibrate`).

readers: which format a file is in (nccl_text, nccl_csv, bench_csv parse them) into
measurements: one timed call of one collective on one group (a Span of a level).
groups: where a measured group sits on a topology.
model: the simulator's time for one call, piecewise linear in the fitted figures.
fit: weighted least squares of one level's latency and bandwidth for one collective.
calibration: every level and collective, innermost first, into a topology (link model, gloo).
nccl_fit: the NCCL model's figures (efficiency, overhead, pipeline stages) per level (nccl).
all_to_all: all-to-all measurements under the NCCL model (the spanned level's AllToAll figures).
infer: a base topology from nccl-tests rank lines, with what it assumed.
confidence: the model's error on the nearest measured configuration of a calibrated topology.
synth_bench: the CSV `synth bench` writes; report: what the command prints of an NCCL fit.
"""

from synth.calibrate.calibration import Calibration, Fit, calibrate, infer_base, replay
from synth.calibrate.confidence import Confidence, model_error, model_error_for_group
from synth.calibrate.infer import infer_nccl_base
from synth.calibrate.nccl_fit import NcclCalibration, calibrate_nccl, replay_nccl
from synth.calibrate.measurements import Measurement, Span
from synth.calibrate.readers import FORMATS, read_measurements

__all__ = ["Calibration", "Confidence", "FORMATS", "Fit", "Measurement", "NcclCalibration", "Span", "calibrate",
           "calibrate_nccl", "infer_base", "infer_nccl_base", "model_error", "model_error_for_group",
           "read_measurements", "replay", "replay_nccl"]
