"""What `synth calibrate` shows of an NCCL-model fit: one row per fitted level and group, one
row per measured size (measured, predicted, error, NCCL's choice, what dominates), and the
same as JSON. Plain strings and dicts; the command renders them."""

from __future__ import annotations

from synth.calibrate.nccl_fit import GroupFit, NcclCalibration
from synth.units import format_bytes, format_time


def nccl_fit_rows(result: NcclCalibration) -> tuple[list[str], list[list[str]]]:
    headers = ["level", "group", "file", "points", "sizes", "efficiency", "overhead", "stages/hop",
               "protocols (rate, latency)", "fit rel. RMS (group)", "fit worst (group)", "outliers"]
    rows = []
    for fit in result.fits:
        efficiency = ", ".join(f"{name} {value:.3f}" for name, value in fit.efficiencies) or "kept"
        protocols = ", ".join(f"{p} {_factor(rate)} {_factor(latency)}" for p, rate, latency in fit.protocols) or "-"
        for group in fit.groups:
            sizes = f"{format_bytes(group.errors[0].nbytes)}-{format_bytes(group.errors[-1].nbytes)}"
            rows.append([fit.level, group.group, group.file.replace("\\", "/").rsplit("/", 1)[-1], str(len(group.errors)),
                         sizes, efficiency, format_time(fit.overhead_s) if fit.overhead_s else "-",
                         f"{fit.stages:.2f}" if fit.stages is not None else "-", protocols, f"{group.rms:.2%}",
                         f"{group.worst:.2%}{' (poor)' if group.poor else ''}", str(group.outliers)])
    return headers, rows


def _factor(value: float | None) -> str:
    return "kept" if value is None else f"x{value:.2f}"


def nccl_size_rows(group: GroupFit) -> tuple[list[str], list[list[str]]]:
    headers = ["size", "measured", "predicted", "error", "NCCL choice", "bound by"]
    rows = [[format_bytes(e.nbytes), format_time(e.measured_s), format_time(e.predicted_s),
             f"{e.error:+.1%}{' outlier' if e.outlier else ''}", f"{e.algorithm}/{e.protocol}", e.regime]
            for e in group.errors]
    return headers, rows


def nccl_fit_json(result: NcclCalibration, formats: dict[str, str], errors, output: str | None, text: str) -> dict:
    return {
        "topology": result.topology.name,
        "model": "nccl",
        "output": output,
        "toml": text,
        "files": [{"path": path, "format": kind} for path, kind in formats.items()],
        "assumptions": list(result.assumptions),
        "fits": [{
            "level": fit.level,
            "efficiencies": {name: value for name, value in fit.efficiencies},
            "overhead_s": fit.overhead_s,
            "stages_per_hop": fit.stages,
            "protocols": {p: {"bandwidth": rate, "latency": latency} for p, rate, latency in fit.protocols},
            "notes": list(fit.notes),
            "uncertainty": _uncertainty_json(fit),
            "groups": [{
                "file": group.file, "collective": group.collective, "group": group.group, "nodes": group.nodes,
                "ranks_per_node": group.ranks_per_node, "relative_rms": group.rms, "worst_error": group.worst,
                "poor": group.poor, "outliers": group.outliers,
                "sizes": [{"bytes": e.nbytes, "measured_s": e.measured_s, "predicted_s": e.predicted_s,
                           "error": e.error, "algorithm": e.algorithm, "protocol": e.protocol, "bound_by": e.regime,
                           "outlier": e.outlier}
                          for e in group.errors],
            } for group in fit.groups],
        } for fit in result.fits],
        "replay_relative_rms": float((errors ** 2).mean() ** 0.5),
        "replay_max_relative_error": float(abs(errors).max()),
    }


def _uncertainty_json(fit) -> dict | None:
    """The fit's spread: a prediction's sigma of log time, and each figure's standard error (in
    the fit's units: the log of a factor or efficiency, the overhead's units, stages)."""
    spread = fit.uncertainty
    if spread is None:
        return None
    return {"sigma": spread.sigma, "noise": spread.noise, "pinned": spread.pinned, "held_out_rms": spread.held_out,
            "standard_errors": {f"{kind} {key}": error for (kind, key), error in zip(fit.figures,
                                                                                    spread.standard_errors)}}


def uncertainty_line(fit) -> str | None:
    """One line of the fit's spread for the terminal."""
    from synth.calibrate.uncertainty import Z_90
    import math

    spread = fit.uncertainty
    if spread is None:
        return None
    held = f", {spread.held_out:.1%} RMS on the sizes (and groups) refits left out" if spread.held_out is not None else ""
    return (f"level {fit.level}: a prediction's sigma {spread.sigma:.1%} of log time (90% interval "
            f"x{math.exp(-Z_90 * spread.sigma):.2f}-x{math.exp(Z_90 * spread.sigma):.2f}): residual scale "
            f"{spread.noise:.1%}, {spread.pinned:.1f} figures pinned by the data{held}")
