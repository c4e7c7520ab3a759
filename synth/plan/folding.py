"""MoE parallel folding: the expert layers' groups on a mesh of their own (Megatron-core).

Megatron-core (parallel_state.py, initialize_model_parallel) numbers the ranks twice: the dense
layers by `tp-cp-dp-pp` (tensor fastest) and the expert layers by `etp-ep-edp-pp` (expert
tensor parallelism fastest, then expert parallelism, then expert data parallelism), with
`etp x ep x edp = tp x cp x dp` per pipeline stage, so that the two meshes share the pipeline
groups. A rank's index inside its stage, `i = x_tp + tp (x_cp + cp x_dp)` (its dense
coordinates), is then also `x_etp + etp (x_ep + ep x_edp)`: the expert groups are digit ranges
of `i` read as one mixed-radix number, the expert-tensor group its digits below `etp`, the
expert-parallel group those from `etp` to `etp ep`, the expert data-parallel group the rest.
An expert-parallel group may so span tensor, context and data-parallel ranks at once (expert
parallelism wider than data parallelism, or with context parallelism, often with `etp = 1`).

`DigitGroup` is one such range on a placement whose axes are the dense ones (pp, dp, cp, tp:
synth/plan/degrees.py). Each axis's coordinate is itself a mixed-radix number over the system
levels it spans, the innermost level fastest (docs/model.md section 2), so `i` is a sequence of
(level, radix) digits, and a digit range spans, at each level, the product of its digits'
radices there: the same per-level span a whole axis has (costs.factors), which is all the cost
model reads. A range whose ends cut a digit other than at a divisor of its radix has no such
span (its groups are not alike on every level): `span` refuses it, and the search skips those
placements (`aligned`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from synth.placement import Placement

STAGE_ORDER = ("tp", "cp", "dp")  # a rank's index inside its pipeline stage, fastest first (Megatron's order)


class UnalignedGroupError(ValueError):
    """A digit range that cuts a placement's level digit unevenly (no per-level span)."""


@dataclass(frozen=True)
class DigitGroup:
    """The groups of ranks whose stage index differs only in its digits from place value `low`
    to `high` (module docstring), named as the exports name them (`ep`, `etp`, `edp`)."""

    name: str
    low: int
    high: int

    def __str__(self) -> str:
        return self.name

    @property
    def size(self) -> int:
        return self.high // self.low

    def span(self, placement: Placement) -> tuple[int, ...]:
        """The groups' span per system level (as synth.plan.equivalent.span gives an axis's)."""
        factors = [1] * len(placement.level_sizes)
        place = 1
        for level, radix in _stage_digits(placement):
            for cut in (self.low, self.high):
                if place < cut < place * radix and (cut % place or radix % (cut // place)):
                    raise UnalignedGroupError(f"the {self.name} group (stage-index digits {self.low} to {self.high}) "
                                              f"cuts a digit of {radix} at level {placement.level_names[level]} "
                                              f"unevenly")
            low = min(radix, max(1, self.low // place))
            high = min(radix, max(1, self.high // place))
            factors[level] *= high // low
            place *= radix
        return tuple(factors)

    def aligned(self, placement: Placement) -> bool:
        try:
            self.span(placement)
        except UnalignedGroupError:
            return False
        return True

    def groups(self, placement: Placement) -> list[list[int]]:
        """The rank lists of the groups, each ordered by its digits, the lists by their first rank."""
        coordinates = placement.axis_coordinates
        index = np.zeros(placement.device_count, dtype=np.int64)
        stride = 1
        for name in STAGE_ORDER:
            if name in placement.axis_names:
                a = placement.axis_index(name)
                index += coordinates[:, a] * stride
                stride *= placement.axis_sizes[a]
        stage = (coordinates[:, placement.axis_index("pp")] if "pp" in placement.axis_names
                 else np.zeros(placement.device_count, dtype=np.int64))
        outside = (stage * stride + index // self.high) * self.low + index % self.low
        member = (index // self.low) % self.size
        found: dict[int, list[int]] = {}
        for rank in np.lexsort((member, outside)):
            found.setdefault(int(outside[rank]), []).append(int(rank))
        return sorted(found.values(), key=lambda group: group[0])


def _stage_digits(placement: Placement):
    """(level, radix) of the stage index's digits, fastest first: each dense axis in Megatron's
    order, its levels innermost first."""
    for name in STAGE_ORDER:
        if name not in placement.axis_names:
            continue
        row = placement.matrix[placement.axis_index(name)]
        for level in reversed(range(len(row))):
            if row[level] > 1:
                yield level, row[level]
