"""What a training job needs from synth to reduce its tensors, as a value without torch.

A `ReductionPlan` holds every rank's calls for one or more programs over one reduction request
(synth.export.plan: communicators and per-rank chunk ranges), the reduction groups, and which
program runs at which size: `ranges[i]` starts at `min_bytes` and runs program `program` up to
the next range. It is built once, before training:

- from the search, at each size the program the simulator ranks first (`plan_reduction`, or
  `best_by_size` on a hierarchy): the sizes where the best program changes are found once, by
  bisection between powers of two on the exact ranking (synth.search.best);
- from given programs (`plan_programs`): one program runs at every size, or the ranges given;
- from a file: the JSON plan `synth export --format json` writes (`load_plan`), or a plan
  saved with `ReductionPlan.save` (which keeps the size ranges); a file is input, so every
  field is checked and the calls are re-proved to compute their goal before it is used
  (synth.torch.plan_document: PlanFileError, one line naming the field, otherwise).

Every rank must use the same plan (each builds it the same way, deterministically: ties in
the ranking are broken by program text, or rank 0 saves it and the others load it).
`synth.torch.HierarchicalReducer` runs it.
"""

from __future__ import annotations

import json
import os
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

from synth.errors import PlanFileError, UsageError
from synth.export.plan import Plan
from synth.goals import Goal
from synth.torch.plan_document import FIX, SizeRange, read_document

FORMAT = "synth-reduction"
VERSION = 1
DEFAULT_MIN_BYTES = 2**10
DEFAULT_MAX_BYTES = 2**30


@dataclass(frozen=True)
class ReductionPlan:
    plan: Plan
    reduction_groups: tuple[tuple[int, ...], ...]  # each in member order (global ranks)
    ranges: tuple[SizeRange, ...]  # sorted by min_bytes, the first at 0
    description: str = ""  # where the plan came from, for logs

    def __post_init__(self):
        if not self.ranges or self.ranges[0].min_bytes != 0:
            raise UsageError("a reduction plan's size ranges must start at 0 bytes")
        starts = [r.min_bytes for r in self.ranges]
        if starts != sorted(set(starts)):
            raise UsageError("a reduction plan's size ranges must be increasing")
        for r in self.ranges:
            if not 0 <= r.program < len(self.plan.programs):
                raise UsageError(f"size range from {r.min_bytes} B names program {r.program}, "
                                 f"the plan has {len(self.plan.programs)}")
        if len({p.reduction for p in self.plan.programs}) != 1:
            raise UsageError("a reduction plan's programs must reduce over the same groups")
        if len({p.goal for p in self.plan.programs}) != 1:
            raise UsageError("a reduction plan's programs must compute the same collective (one plan per goal)")

    @property
    def goal(self) -> Goal:
        """The goal every program of the plan computes (synth/goals.py)."""
        return self.plan.programs[0].goal

    @property
    def collective(self) -> str:
        """The name of the plan's goal: allreduce, reducescatter, ..."""
        return self.goal.name

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    @property
    def group_size(self) -> int:
        """N: members per reduction group, the number of chunks a tensor is cut into."""
        return self.plan.programs[0].chunks

    @property
    def reduction_communicator(self) -> int:
        return self.plan.programs[0].reduction

    def program_for(self, nbytes: int) -> int:
        """The index of the program that runs for a tensor of `nbytes` per device."""
        starts = [r.min_bytes for r in self.ranges]
        return self.ranges[bisect_right(starts, nbytes) - 1].program

    def describe(self) -> list[str]:
        """One line per size range: from which size which program runs."""
        lines = []
        for index, r in enumerate(self.ranges):
            end = self.ranges[index + 1].min_bytes if index + 1 < len(self.ranges) else None
            span = f"{r.min_bytes} B and up" if end is None else f"{r.min_bytes} B to {end - 1} B"
            lines.append(f"{span}: {self.plan.programs[r.program].text}")
        return lines

    # --- files ---------------------------------------------------------------------------------

    def to_document(self) -> dict:
        from synth.export.torch_script import plan_data

        document = {"format": FORMAT, "version": VERSION, "description": self.description}
        document.update(plan_data(self.plan))
        document["reduction_groups"] = [list(group) for group in self.reduction_groups]
        document["size_ranges"] = [{"min_bytes": r.min_bytes, "program": r.program} for r in self.ranges]
        return document

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        from synth.output_files import write_text

        write_text(path, json.dumps(self.to_document(), indent=1, sort_keys=True) + "\n")
        return path

    @staticmethod
    def from_document(document: dict, source: str = "the plan") -> ReductionPlan:
        """The plan a document holds (either file format), every field checked and the calls
        re-proved to compute their goal (synth.torch.plan_document); PlanFileError otherwise."""
        return ReductionPlan(*read_document(document, source))


def load_plan(path: str | os.PathLike, program: int | None = None) -> ReductionPlan:
    """A plan from a file: one saved by `ReductionPlan.save` (with its size ranges), or the JSON
    plan of `synth export --format json` (its first program at every size, or `program`)."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise UsageError(f"cannot read the plan {os.fspath(path)!r}: {error}") from None
    except (ValueError, RecursionError) as error:  # not UTF-8, not JSON, nested too deep, a 5000-digit number
        raise PlanFileError(f"cannot read the plan {os.fspath(path)!r}: not a JSON plan "
                            f"({' '.join(str(error).split())[:80] or type(error).__name__}); {FIX}") from None
    plan = ReductionPlan.from_document(document, f"plan {os.fspath(path)!r}")
    if program is not None:
        if not 0 <= program < len(plan.plan.programs):
            raise UsageError(f"program {program}: the plan {os.fspath(path)!r} has {len(plan.plan.programs)} program(s)")
        plan = ReductionPlan(plan.plan, plan.reduction_groups, (SizeRange(0, program),), plan.description)
    return plan


# --- from the search ----------------------------------------------------------------------------


def plan_programs(hierarchy, programs, ranges: tuple[SizeRange, ...] | None = None,
                  description: str = "", collective: str = "allreduce") -> ReductionPlan:
    """Given programs (Program values or text) on one hierarchy, computing `collective`
    (synth/goals.py: allreduce, reducescatter, allgather, alltoall, ...); the first runs at
    every size unless `ranges` says otherwise. Raises InvalidProgramError for a program that
    is not valid for the goal."""
    from synth.export.plan import PlanEntry, build_plan
    from synth.goals import parse_goal
    from synth.language import Program, parse_program

    goal = parse_goal(collective)
    parsed = [program if isinstance(program, Program) else parse_program(program) for program in programs]
    plan = build_plan(PlanEntry(hierarchy, program, goal=goal) for program in parsed)
    return ReductionPlan(plan, tuple(tuple(map(int, g)) for g in hierarchy.groups), ranges or (SizeRange(0, 0),),
                         description)


def size_thresholds(choose, low: int, high: int) -> list[tuple[int, str]]:
    """[(from size, program)], the sizes in [low, high] where `choose(size)` (the best program's
    text) changes, found by bisection between consecutive powers of two: a program best only
    strictly inside an interval whose two ends agree is not seen (the ranking is piecewise
    affine in the size, so such islands are rare and small)."""
    sizes = [low]
    while sizes[-1] < high:
        sizes.append(min(high, sizes[-1] * 2))
    changes = [(low, choose(low))]

    def split(lo: int, hi: int, at_lo: str, at_hi: str) -> None:
        if at_lo == at_hi:
            return
        if hi - lo == 1:
            changes.append((hi, at_hi))
            return
        middle = (lo + hi) // 2
        at_middle = choose(middle)
        split(lo, middle, at_lo, at_middle)
        split(middle, hi, at_middle, at_hi)

    for lo, hi in zip(sizes, sizes[1:]):
        split(lo, hi, choose(lo), choose(hi))
    return changes


def best_by_size(hierarchy, topology, backend: str = "nccl", max_len: int = 5, min_bytes: int = DEFAULT_MIN_BYTES,
                 max_bytes: int = DEFAULT_MAX_BYTES, estimate: str | None = None,
                 collective: str = "allreduce") -> ReductionPlan:
    """At every size the program of `collective` the simulator ranks first on `topology` for
    `backend` (the best-first search of synth.search.rank.Ranker, every goal alike): the
    ranking (synth.search.best) is asked at powers of two from `min_bytes` to `max_bytes`
    and bisected where its answer changes; below `min_bytes` the first program runs, above
    `max_bytes` the last. `estimate` is the model's (synth.model.estimate: "pipelined", the
    default, or "lockstep"), as `synth rank --estimate` takes it."""
    from synth.search import BestPrograms
    from synth.model.context import cost_context
    from synth.model.estimate import ESTIMATES, resolve_estimate

    if not 1 <= min_bytes <= max_bytes:
        raise UsageError(f"size range {min_bytes}..{max_bytes} B: give 1 <= min_bytes <= max_bytes")
    if estimate is not None and estimate not in ESTIMATES:
        raise UsageError(f"estimate {estimate!r}: choose one of {', '.join(ESTIMATES)}")
    from synth.goals import parse_goal

    estimate = resolve_estimate(estimate).name
    goal = parse_goal(collective)
    context = cost_context(hierarchy, topology, backend)
    best = BestPrograms(context, max_len, estimate, goal=goal)

    def choose(size: int) -> str:
        return str(best.best(size).program)

    changes = size_thresholds(choose, min_bytes, max_bytes)
    texts = list(dict.fromkeys(text for _, text in changes))
    ranges = tuple(SizeRange(0 if i == 0 else size, texts.index(text)) for i, (size, text) in enumerate(changes))
    description = (f"best {goal.title} program per size on {topology.name} ({backend} model, {estimate} estimate, "
                   f"up to {max_len} steps), {min_bytes}..{max_bytes} B")
    return plan_programs(hierarchy, texts, ranges, description, goal.name)


def plan_reduction(topology, axes: str, reduce: str, placement, hierarchy: str = "merged",
                   programs=None, backend: str = "nccl", max_len: int = 5, min_bytes: int = DEFAULT_MIN_BYTES,
                   max_bytes: int = DEFAULT_MAX_BYTES, estimate: str | None = None,
                   collective: str = "allreduce") -> ReductionPlan:
    """The plan for one job, from the same values the command line takes (`collective` as
    --collective: the goal its programs compute over each group, all-reduce by default):

        plan_reduction("dgx-a100-x4", "data=8,model=4", "data", [[4, 2], [1, 4]])

    `topology`: a built-in name, a TOML path or a Topology (or `levels(...)` text as in
    --levels, e.g. "node=2,gpu=4", which has no link figures: then give `programs`);
    `placement`: the matrix (rows per axis) as a list or its JSON text. Without `programs`,
    each size runs the program ranked first for it (`best_by_size`)."""
    from synth.hierarchy import build_hierarchy, parse_reduce
    from synth.placement import make_placement, parse_axes, parse_matrix
    from synth.topology import Topology, topology_from_levels
    from synth.topology_file import load_topology

    if not isinstance(topology, Topology):
        text = str(topology)
        topology = topology_from_levels(text) if "=" in text else load_topology(text)
    parsed_axes = parse_axes(axes)
    matrix = parse_matrix(placement) if isinstance(placement, str) else placement
    built = make_placement(topology, parsed_axes, matrix)
    hierarchy_value = build_hierarchy(built, parse_reduce(reduce, built.axis_names), hierarchy)
    if hierarchy_value.group_size < 2:
        raise UsageError(f"reducing over {reduce} involves one device per group: there is nothing to reduce")
    if programs is not None:
        programs = [programs] if isinstance(programs, str) else list(programs)
        return plan_programs(hierarchy_value, programs, description=f"given program(s) on {topology.name}",
                             collective=collective)
    if not topology.has_link_figures:
        raise UsageError(f"{topology.name} has no link figures to rank programs by: give programs=... or a "
                         "topology with bandwidths and latencies")
    return best_by_size(hierarchy_value, topology, backend, max_len, min_bytes, max_bytes, estimate, collective)
