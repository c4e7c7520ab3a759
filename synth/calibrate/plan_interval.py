"""How sure a plan's communication is: a 90% interval of a step's communication terms from the
calibrated topology's `[[calibration]]` records, as `synth rank` states it for one collective
(confidence.py: the nearest measured configuration's sigma, predicted x exp(+-1.645 sigma)).

Each exposed communication term of the step (tensor, context, pipeline, data-parallel,
embedding, expert, contention) takes the largest sigma among its routes, each route's
from the record nearest its collective, group shape (the levels it spans: the innermost
level's size as ranks per node, the product of the others as nodes) and bytes; a route
whose shape the plan does not state (pipeline sends) and the contention term take the
largest sigma of the records. The terms' intervals are added low to low and high to high:
their errors are taken as fully correlated (one fit's figures price them all), the wider
assumption. Compute is not in it: the calibration measures collectives only."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from synth.calibrate.confidence import model_error
from synth.calibrate.uncertainty import Z_90
from synth.topology import Topology

# Breakdown term -> the route names that make it (synth/plan/terms/__init__.py: Route.name)
TERMS = {"tensor_parallel": ("tensor",), "context_parallel": ("context",), "pipeline_p2p": ("pipeline",),
         "data_parallel": ("data", "data-shard", "data-replica", "expert-data"), "embedding_sync": ("embedding",),
         "expert_parallel": ("expert",), "contention": ()}
_COLLECTIVE = re.compile(r"(AllReduce|ReduceScatter|AllGather|AllToAll|Broadcast|Reduce)")


@dataclass(frozen=True)
class CommunicationInterval:
    """A step's communication seconds and their 90% interval; `sigmas`: the widest per term."""

    seconds: float
    low: float
    high: float
    sigmas: tuple[tuple[str, float], ...]


def calibrated_with_sigma(topology: Topology) -> bool:
    """Whether the topology's records carry fitted spreads (records written before fits had
    one give an error, not an interval)."""
    return any(record.sigma is not None for record in topology.calibration)


def _shape(topology: Topology, levels: str) -> tuple[int, int] | None:
    """(nodes, ranks per node) of a route's `levels` ("node=2,gpu=8"), or None unstated."""
    parts = [part.split("=") for part in levels.split(",") if "=" in part]
    if not parts:
        return None
    sizes = [(name.strip(), int(size)) for name, size in parts]
    innermost = topology.levels[-1].name
    per_node = sizes[-1][1] if sizes[-1][0] == innermost else 1
    nodes = math.prod(size for name, size in sizes if name != innermost)
    return max(nodes, 1), per_node


def _route_sigma(topology: Topology, route, widest: float) -> float:
    shape = _shape(topology, route.levels)
    found = _COLLECTIVE.search(route.program)
    if shape is None or found is None:
        return widest
    confidence = model_error(topology, found.group(1), shape[0], shape[1], float(route.bytes))
    sigma = confidence.sigma(float(route.bytes))
    return widest if sigma is None else sigma


def communication_interval(topology: Topology, prediction) -> CommunicationInterval | None:
    """The 90% interval of `prediction`'s (synth.plan.step.Prediction) communication terms, or
    None when the topology has no calibration records with a sigma."""
    if not calibrated_with_sigma(topology):
        return None
    from synth.calibrate.confidence import Confidence

    widest = max(Confidence(record, True).sigma() for record in topology.calibration)
    seconds = low = high = 0.0
    sigmas = []
    for term, names in TERMS.items():
        value = getattr(prediction.breakdown, term)
        if value <= 0:
            continue
        routes = [route for route in prediction.routes if route.name in names]
        sigma = max((_route_sigma(topology, route, widest) for route in routes), default=widest)
        seconds += value
        low += value * math.exp(-Z_90 * sigma)
        high += value * math.exp(Z_90 * sigma)
        sigmas.append((term, sigma))
    return CommunicationInterval(seconds, low, high, tuple(sigmas))
