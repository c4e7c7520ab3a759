"""A topology as the project's TOML (synth/topology.py), so calibrated figures load with
`load_topology` like any other file. Values keep six significant digits for fitted figures
(far below measurement noise) and fifteen for figures copied from the base, so a copy is
exact; every figure keeps its source."""

from __future__ import annotations

import json

from synth.topology import Figure, Topology
from synth.units import format_bandwidth, format_time


def _string(text: str) -> str:
    """A TOML basic string: JSON's escapes (\\" \\\\ \\n \\uXXXX) are TOML's."""
    return json.dumps(text, ensure_ascii=False)


def _digits(figure: Figure) -> int:
    return 6 if figure.source.startswith(("fitted by synth calibrate", "scaled by synth calibrate")) else 15


def _figure(table: str, figure: Figure, render) -> list[str]:
    return ["", f"[{table}]", f"value = {_string(render(figure.value, _digits(figure)))}",
            f"source = {_string(figure.source)}"]


def render_topology(topology: Topology, header: str = "") -> str:
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    lines += [f"name = {_string(topology.name)}", f"description = {_string(topology.description)}"]
    for level in topology.levels:
        lines += ["", "[[levels]]", f"name = {_string(level.name)}", f"size = {level.size}"]
        if level.bandwidth is not None:
            lines += _figure("levels.bandwidth", level.bandwidth, format_bandwidth)
            lines += _figure("levels.latency", level.latency, format_time)
        if level.uplinks is not None:
            uplinks = level.uplinks
            lines += ["", "[levels.uplinks]", f"count = {uplinks.count}",
                      f"bandwidth = {_string(format_bandwidth(uplinks.bandwidth.value, _digits(uplinks.bandwidth)))}",
                      f"source = {_string(uplinks.bandwidth.source)}"]
        if level.fabric is not None:
            lines += _figure("levels.fabric", level.fabric, format_bandwidth)
        for name, figures in level.collectives:
            lines += _figure(f"levels.collectives.{name}.bandwidth", figures.bandwidth, format_bandwidth)
            lines += _figure(f"levels.collectives.{name}.latency", figures.latency, format_time)
    return "\n".join(lines) + "\n"
