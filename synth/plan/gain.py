"""Which modelled effects carry the winner's predicted gain over the next layout.

A free search picks the fastest candidate; whether to trust the pick depends on where its
advantage comes from. The winner is compared with the fastest ranked candidate of another
layout (other degrees or another placement): each step term (step.py's Breakdown) that the
winner spends less on carries part of the gain, in seconds; the terms it spends more on are
what it gives up. Every term is a modelled mechanism, named with what it rests on (BASIS), so
a gain carried by a bounded or sourced-but-unmeasured term is visible as such. Effects the
model leaves out (docs/plan.md, "What it leaves out") carry nothing by construction; those that
could favour a layout are kept from doing so where they are known: tensor-parallel overlap is
credited only inside a node or NVLink domain, contention is charged where overlapped and critical-path
collectives share links.
"""

from __future__ import annotations

from dataclasses import dataclass

from synth.plan.step import Prediction

# Breakdown JSON key -> (what the term is, what it rests on)
BASIS: dict[str, tuple[str, str]] = {
    "compute_s": ("compute", "kernel shapes on the device description, or FLOPs at the stated matmul efficiency"),
    "tensor_parallel_s": ("tensor-parallel collectives", "the cost model's programs; overlap computed per GEMM"),
    "context_parallel_s": ("context-parallel exchange", "the cost model, beyond the attention it overlaps"),
    "pipeline_p2p_s": ("pipeline send/receive", "the network's link loads"),
    "pipeline_bubble_s": ("pipeline bubble", "the 1F1B / interleaved schedule: the other stages' time over v, "
                                             "plus overlapped transfers on the warm-up and cool-down"),
    "data_parallel_exposed_s": ("exposed data-parallel reduction and gathers", "the bucket schedule behind backward"),
    "embedding_sync_s": ("tied embedding's gradient exchange", "the network's link loads"),
    "optimizer_s": ("optimizer step", "states read and written at the memory bandwidth"),
    "expert_parallel_s": ("expert all-to-alls", "the cost model, balanced routing"),
    "contention_s": ("link contention", "shared links' capacity (an upper bound: whole calls stretched)"),
    "activation_offload_s": ("activation offload copies", "the host link's line rate"),
}


@dataclass(frozen=True)
class Carry:
    term: str  # the Breakdown JSON key
    seconds: float  # the other layout's seconds minus the winner's (> 0: the winner saves them)

    def to_json(self) -> dict:
        what, basis = BASIS.get(self.term, (self.term, ""))
        return {"term": self.term, "what": what, "seconds_saved": self.seconds, "rests_on": basis}


def next_layout(ranked: list[Prediction]) -> Prediction | None:
    """The fastest ranked candidate whose degrees or placement differ from the winner's."""
    if not ranked:
        return None
    winner = ranked[0]
    for other in ranked[1:]:
        if other.degrees != winner.degrees or other.placement.to_text() != winner.placement.to_text():
            return other
    return None


def carried_by(winner: Prediction, other: Prediction) -> tuple[Carry, ...]:
    """Per step term, the seconds the winner saves over `other` (largest gain first; losses last)."""
    mine, theirs = winner.breakdown.to_json(), other.breakdown.to_json()
    terms = [key for key in mine if key != "data_parallel_overlapped_s"]
    carries = [Carry(key, theirs[key] - mine[key]) for key in terms if abs(theirs[key] - mine[key]) > 0]
    return tuple(sorted(carries, key=lambda carry: -carry.seconds))


def gain_json(ranked: list[Prediction]) -> dict | None:
    """The winner's gain over the next layout and the terms that carry it (None: no other layout ranked)."""
    other = next_layout(ranked)
    if other is None:
        return None
    winner = ranked[0]
    return {"over": {"degrees": other.degrees.text, "placement": other.placement.to_text(),
                     "settings": other.settings.text, "step_s": other.step_s},
            "seconds_saved": other.step_s - winner.step_s,
            "carried_by": [carry.to_json() for carry in carried_by(winner, other) if carry.seconds > 0],
            "given_up": [carry.to_json() for carry in carried_by(winner, other) if carry.seconds < 0]}


def gain_text(ranked: list[Prediction]) -> str | None:
    """One line for the console: the gain over the next layout and what carries it."""
    document = gain_json(ranked)
    if document is None:
        return None
    carried = ", ".join(f"{BASIS.get(c['term'], (c['term'],))[0]} {c['seconds_saved'] * 1e3:.3g} ms"
                        for c in document["carried_by"][:3])
    given = ", ".join(f"{BASIS.get(c['term'], (c['term'],))[0]} {-c['seconds_saved'] * 1e3:.3g} ms"
                      for c in document["given_up"][:2])
    over = document["over"]
    text = (f"Gain over the next layout ({over['degrees']}, {over['placement']}): "
            f"{document['seconds_saved'] * 1e3:.3g} ms per step, carried by {carried or 'nothing'}")
    return text + (f"; it spends more on {given}" if given else "")
