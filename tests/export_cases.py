"""Requests the export tests run: 8-device systems covering a 2x4 and a 2x2x2 hierarchy, a
reduced axis inside one level and across several, two reduced axes, and every hierarchy kind."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from synth.export.plan import PlanEntry
from synth.hierarchy import SynthesisHierarchy, build_hierarchy
from synth.placement import make_placement, parse_axes
from synth.search import Enumerator, SearchOptions, semantics_for
from synth.topology import topology_from_levels


@dataclass(frozen=True)
class Case:
    name: str
    levels: str
    axes: str
    reduce: str
    matrix: tuple[tuple[int, ...], ...]
    hierarchy: str = "merged"

    @property
    def built(self) -> SynthesisHierarchy:
        return _hierarchy(self)


CASES = (
    Case("2x4", "node=2,gpu=4", "data=8", "data", ((2, 4),)),
    Case("2x2x2", "node=2,sock=2,gpu=2", "data=8", "data", ((2, 2, 2),)),
    Case("axis-in-one-level", "node=2,gpu=4", "data=2,model=4", "model", ((2, 1), (1, 4))),
    Case("axis-across-levels", "node=2,gpu=4", "data=2,model=4", "model", ((1, 2), (2, 2))),
    Case("two-axes", "node=2,sock=2,gpu=2", "a=2,b=2,c=2", "a,c", ((1, 2, 1), (2, 1, 1), (1, 1, 2))),
    Case("two-axes-split", "node=2,gpu=4", "data=4,model=2", "data,model", ((2, 2), (1, 2)), "split"),
    Case("two-axes-system", "node=2,gpu=4", "data=4,model=2", "data,model", ((2, 2), (1, 2)), "system"),
)


@lru_cache(maxsize=None)
def _hierarchy(case: Case) -> SynthesisHierarchy:
    placement = make_placement(topology_from_levels(case.levels), parse_axes(case.axes), case.matrix)
    return build_hierarchy(placement, tuple(case.reduce.split(",")), case.hierarchy)


@lru_cache(maxsize=None)
def programs_of(case: Case, max_len: int):
    return tuple(Enumerator(semantics_for(case.built), SearchOptions(max_len=max_len)).programs())


def entries(max_len: int) -> list[PlanEntry]:
    """Every valid program up to `max_len` steps of every case."""
    return [PlanEntry(case.built, program, case.name) for case in CASES for program in programs_of(case, max_len)]


def goal_entries(max_len: int) -> list[PlanEntry]:
    """Every valid program up to `max_len` steps of every case, for every goal but all-reduce."""
    from synth.goals import GOALS

    return [PlanEntry(case.built, program, f"{case.name} {goal}", goal)
            for case in CASES for goal in GOALS if goal != "allreduce"
            for program in Enumerator(semantics_for(case.built, goal=goal), SearchOptions(max_len=max_len)).programs()]
