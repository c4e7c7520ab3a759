"""A topology as a picture: its levels from the outermost down, each drawn as the units inside
one parent (the first unit of each level opened into the next), the link that joins them, and
beside each level its figures: link kind, bandwidth and latency, uplinks, fabric, efficiency."""

from __future__ import annotations

import textwrap

from synth.plots.figure import footer, pyplot, save, style

SHOWN = 6  # units drawn per level; beyond, the first three, an ellipsis and the last
LEFT, RIGHT = 0.02, 0.56  # the part of the width the boxes take; the figures are written right of it
BOX = 0.34  # box height, in rows


def draw_topology(topology, path: str) -> None:
    """Write the picture of `topology` (a synth.topology.Topology) to `path` (PNG or SVG)."""
    levels = topology.levels
    with style():
        plt = pyplot()
        figure, axis = plt.subplots(figsize=(12, 1.2 + 1.55 * len(levels)), layout="constrained")
        axis.set_xlim(0, 1)
        axis.set_ylim(-0.1, len(levels) + 0.35)
        axis.axis("off")
        axis.text(LEFT, len(levels) + 0.15, f"system: {topology.device_count} devices", fontsize=9, fontweight="bold",
                  va="center")
        previous = None  # the first unit's box of the level above: (left, right, bottom)
        for index, level in enumerate(levels):
            y = len(levels) - index - 0.5
            boxes = _row(axis, level, y, last=index == len(levels) - 1)
            if previous is not None:  # the first unit of the level above, opened into this row
                left, right, bottom = previous
                for x_from, x_to in ((left, LEFT), (right, RIGHT)):
                    axis.plot([x_from, x_to], [bottom, y + 0.42], color="grey", linestyle=":", linewidth=0.8)
            first = boxes[0]
            previous = (first[0], first[1], y - BOX / 2)
            parent = "the system" if index == 0 else f"each {levels[index - 1].name}"
            axis.text(RIGHT + 0.04, y + 0.3, f"{level.name}: {level.size} in {parent}", fontsize=9,
                      fontweight="bold", va="top")
            axis.text(RIGHT + 0.04, y + 0.1, "\n".join(figure_lines(level)), fontsize=7.5, va="top")
        title = f"{topology.name}: " + " x ".join(f"{level.size} {level.name}" for level in levels)
        figure.suptitle(title, fontsize=11)
        notes = [textwrap.shorten(topology.description, 220)] if topology.description else []
        notes.append(system_line(topology))
        notes.append("bandwidth: per device, one direction, between units of the level inside their parent; "
                     "every figure's source: the topologies command, as a table or as JSON")
        footer(figure, *notes)
        save(figure, path)


def _row(axis, level, y: float, last: bool) -> list[tuple[float, float]]:
    """The level's units inside one parent as boxes joined by a bar (its link); their (left, right)."""
    shown = list(range(level.size)) if level.size <= SHOWN else [0, 1, 2, None, level.size - 1]
    slot = (RIGHT - LEFT) / len(shown)
    width = min(slot * 0.8, 0.11)
    boxes, centres = [], []
    for position, unit in enumerate(shown):
        centre = LEFT + slot * (position + 0.5)
        if unit is None:
            axis.text(centre, y, f"... {level.size - 4} more", ha="center", va="center", fontsize=7.5, color="dimgrey")
            continue
        colour = "#fde7c8" if last else "#dbe8f6"
        axis.add_patch(_box(centre - width / 2, y - BOX / 2, width, BOX, colour))
        axis.text(centre, y, f"{level.name} {unit}", ha="center", va="center", fontsize=7.5)
        boxes.append((centre - width / 2, centre + width / 2))
        centres.append(centre)
    if len(centres) > 1:  # the link joining the units: a bar above them
        bar = y + BOX / 2 + 0.12
        axis.plot([centres[0], centres[-1]], [bar, bar], color="black", linewidth=1.6)
        for centre in centres:
            axis.plot([centre, centre], [bar, y + BOX / 2], color="black", linewidth=0.8)
        if level.link is not None:
            axis.text((centres[0] + centres[-1]) / 2, bar + 0.03, level.link.kind, ha="center", va="bottom",
                      fontsize=7.5, color="dimgrey")
    return boxes


def _box(x: float, y: float, width: float, height: float, colour: str):
    from matplotlib.patches import FancyBboxPatch

    return FancyBboxPatch((x, y), width, height, boxstyle="round,pad=0.004,rounding_size=0.02", facecolor=colour,
                          edgecolor="black", linewidth=0.8)


def figure_lines(level) -> list[str]:
    """The level's figures, one per line, as a reader wants them (no sources: those are long)."""
    from synth.units import format_bandwidth, format_time

    lines = []
    if level.link is not None or level.transport is not None:
        link = level.link.kind if level.link is not None else ""
        if level.transport is not None:
            transport = level.transport
            detail = transport.kind + (", GPUDirect RDMA" if transport.kind == "ib" and transport.gdr else "")
            link = f"{link} (NCCL transport {detail})" if link else f"NCCL transport {detail}"
        lines.append(f"link: {link}")
    if level.bandwidth is not None:
        lines.append(f"bandwidth {format_bandwidth(level.bandwidth.value)}, latency "
                     f"{format_time(level.latency.value) if level.latency is not None else 'not given'}")
    else:
        lines.append("no bandwidth or latency (sizes only: placements and synthesis, no costs)")
    if level.uplinks is not None:
        lines.append(f"uplinks: {level.uplinks.count} x {format_bandwidth(level.uplinks.bandwidth.value)} "
                     f"per {level.name}, shared by its devices")
    if level.fabric is not None:
        lines.append(f"fabric: {format_bandwidth(level.fabric.value)} for the level's whole traffic")
    if level.efficiency is not None:
        lines.append(f"NCCL reaches {level.efficiency.value:.0%} of the line rate")
    if level.collectives:
        lines.append("per collective: " + ", ".join(
            f"{name} {format_bandwidth(figures.bandwidth.value)}" for name, figures in level.collectives))
    return [textwrap.shorten(line, 95) for line in lines]


def system_line(topology) -> str:
    """The device and NCCL's view of the system, in one line."""
    parts = []
    if topology.device is not None:
        from synth.units import format_bytes

        parts.append(f"device {topology.device.name}, {format_bytes(int(topology.device.memory.value))}")
    if topology.nccl is not None:
        parts.append(f"NCCL: {topology.nccl.generation}, NVLS {'on' if topology.nccl.nvls else 'off'}")
    if topology.calibration:
        parts.append(f"calibrated on {len(topology.calibration)} measured configuration(s)")
    return "; ".join(parts)
