"""Whether a plan's tensor- and expert-parallel groups stay inside one NVLink domain, and what
crossing costs.

On a system with an NVLink domain that spans hosts (a level marked `nvlink_domain`, the trays of
a GB200 NVL72 rack), NCCL runs every call inside the domain over NVLink (multi-node NVLink) and
only calls that leave it over the network (synth/model/nccl/hardware.py). The planner prices
both; this says which the winner's tensor- and expert-parallel groups do, and how much of its
step their exposed collectives take, so a reader sees the price of a layout that crosses.
"""

from __future__ import annotations

from synth.model.nccl.hardware import nccl_view
from synth.plan.equivalent import span
from synth.topology import Topology
from synth.units import format_time

_ROLES = (("tp", "tensor-parallel", "tensor_parallel"), ("ep", "expert-parallel", "expert_parallel"))


def domain_note(topology: Topology, prediction) -> str | None:
    """One line on the winner's TP/EP groups and the NVLink domain; None on a system without a
    multi-host NVLink domain."""
    view = nccl_view(topology)
    if view.domain_level is None:
        return None
    inner = topology.levels[(view.node_level + 1) if view.node_level is not None else 0:]
    size = 1
    for level in inner:
        size *= level.size
    domain = f"one NVLink domain ({' x '.join(level.name for level in inner)}, {size} GPUs)"
    placement = prediction.placement
    parts = []
    degrees = prediction.degrees
    for axis, words, term in _ROLES:
        if axis == "ep" and degrees.folded:  # the folded expert groups (synth/plan/folding.py)
            if degrees.ep < 2:
                continue
            factors = span(placement, degrees.expert_group())
        elif axis not in placement.axis_names or placement.axis_sizes[placement.axis_index(axis)] < 2:
            continue
        else:
            factors = span(placement, (axis,))
        outer = view.node_level + 1 if view.node_level is not None else 0
        if any(factor > 1 for factor in factors[:outer]):
            seconds = getattr(prediction.breakdown, term)
            share = 100 * seconds / prediction.step_s if prediction.step_s > 0 else 0.0
            parts.append(f"{words} groups span more than {domain}: their calls cross the network between domains; "
                         f"their exposed collectives take {format_time(seconds)}, {share:.1f}% of the step")
        else:
            parts.append(f"{words} groups stay inside {domain}")
    return "; ".join(parts) if parts else None
