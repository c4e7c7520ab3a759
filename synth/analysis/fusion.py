"""Fusion planning: which consecutive gradients to fuse into one reduction, and which program
each bucket runs, so that the step's gradient reduction finishes first.

Small buckets start early but each call pays its launch and latency; big buckets amortize
that but start late, after their last gradient. The model (docs/explore.md has the same
formulas with an example):

* Backward produces tensors 0..n-1 of s_0..s_{n-1} bytes per device, in that order, at a
  compute rate r (bytes of gradient per second): tensor i is ready at
  `t_i = (s_0 + ... + s_i) / r` (all at 0 when r is infinite).
* A bucket is a run of consecutive tensors a..b of `S = s_a + ... + s_b` bytes. It can start
  when its last tensor is ready and the previous bucket's reduction has finished (one
  communication stream, as DDP's buckets are launched in order on one NCCL stream):
  `start = max(t_b, end of previous)`, `end = start + C(S)`, with `C(S)` the simulated time
  of the bucket's program for S bytes per device, launch and latency included.
* The step's communication finishes at the last bucket's end; that is what is minimized.

Dynamic programming over split points. With F(0) = 0 and, for b = 1..n (prefix 0..b-1),

    F(b) = min over 1 <= a <= b of  max(t_{b-1}, F(a-1)) + C(s_{a-1} + ... + s_{b-1})

F(n) is the optimum: the end of a bucket is nondecreasing in the previous bucket's end, so
the best plan of a prefix ends as early as possible (optimal substructure). O(n^2) buckets;
each bucket runs the fastest program at its size, which is optimal for the same reason.
Ties go to the smallest a (the larger last bucket), so the plan is deterministic.

Many plans often share that earliest finish: while backward is still producing gradients a
bucket's reduction is hidden, and the DP happily reduces every tensor alone. So the optimal
plan is then merged, left to right: two adjacent buckets become one whenever the step's
finish does not move (checked by running the schedule, so it stays exactly F(n)). Fewer
buckets means fewer calls (each pays a launch) and less stream time, for the same finish.

C(S) comes from `synth.search.best`: by default the fastest of the candidate programs (the
top 3 of the exact search at every power of two spanning the bucket sizes, and the default
all-reduce), each costed exactly at every bucket size (in batches); with `exact=True` the
exact top-1 search at every distinct bucket size. Buckets whose start plus the lower bound of
synth/model/bound.py already ends after the best found are not costed at all.

Other goals that reduce gradients (`GRADIENT_GOALS`: the sharded optimizer's and FSDP's
reduce-scatter, a reduce) are planned alike, C(S) being the fastest of every valid program
of the goal (synth.search.best.BestPrograms.every, exact) and the baseline's buckets running
the goal's flat call; a goal that moves no gradients (all-gather, all-to-all, broadcast) is
refused (FusionGoalError).

The baseline is PyTorch DDP's default bucketing running the default all-reduce:
`DistributedDataParallel(bucket_cap_mb=25)` (torch/nn/parallel/distributed.py; the cap is
`int(bucket_cap_mb * 1024 * 1024)` bytes, i.e. 25 MiB), and after the first iteration the
buckets are rebuilt in gradient-ready order with limits `[kDefaultFirstBucketBytes = 1 MiB,
bucket_bytes_cap]` (torch/csrc/distributed/c10d/reducer.cpp, `rebuild_buckets` and
`compute_bucket_assignment_by_size`): tensors are added in order and a bucket closes as soon
as its size reaches its limit, the first bucket's limit being 1 MiB and every later one's
25 MiB. The baseline is scheduled with the same model, so the gain compares plans, not models.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from synth.goals import ALL_REDUCE, GOALS
from synth.search import BestPrograms, Choice
from synth.language import Program
from synth.model.bound import bound_line
from synth.model.context import CostContext
from synth.model.estimate import Estimate, resolve_estimate

MiB = 2**20
DDP_BUCKET_CAP = 25 * MiB  # torch DistributedDataParallel bucket_cap_mb=25
DDP_FIRST_BUCKET_CAP = 1 * MiB  # c10d kDefaultFirstBucketBytes
# Default compute rate, bytes of gradient per second per device: an A100 sustaining 125 TFLOP/s
# (40% of its 312 TFLOP/s dense bf16 peak) on a transformer step of 4096 tokens per device,
# whose backward costs 4 FLOPs per parameter per token (Kaplan et al. 2020, "Scaling Laws for
# Neural Language Models", section 2.1: C_backward ~ 2 C_forward = 4N per token), writing
# 4-byte (fp32) gradients: 4 B * 125e12 / (4 * 4096) = 30.5e9 B/s, rounded to 30 GB/s.
DEFAULT_COMPUTE_RATE = 30e9
MAX_TENSORS = 2000  # the DP is O(n^2) buckets in Python: 2000 tensors is ~2 million, seconds


@dataclass(frozen=True)
class Bucket:
    first: int  # index of the first tensor (0 = produced first)
    last: int  # index of the last tensor, inclusive
    bytes: int
    program: Program
    ready_s: float  # its last tensor's ready time
    start_s: float
    end_s: float

    @property
    def tensors(self) -> int:
        return self.last - self.first + 1

    @property
    def time_s(self) -> float:
        return self.end_s - self.start_s

    def to_json(self) -> dict:
        return {"first": self.first, "last": self.last, "tensors": self.tensors, "bytes": self.bytes,
                "program": str(self.program), "ready_s": self.ready_s, "start_s": self.start_s, "end_s": self.end_s}


@dataclass(frozen=True)
class Schedule:
    buckets: tuple[Bucket, ...]
    compute_end_s: float  # when backward produces its last tensor

    @property
    def finish_s(self) -> float:
        """When the step's last reduction ends."""
        return self.buckets[-1].end_s

    @property
    def exposed_s(self) -> float:
        """Communication time not hidden behind backward: finish minus the end of backward."""
        return self.finish_s - self.compute_end_s

    @property
    def busy_s(self) -> float:
        """Total time the communication stream is busy."""
        return sum(bucket.time_s for bucket in self.buckets)

    def to_json(self) -> dict:
        return {"finish_s": self.finish_s, "exposed_s": self.exposed_s, "busy_s": self.busy_s,
                "buckets": [bucket.to_json() for bucket in self.buckets]}


@dataclass(frozen=True)
class FusionPlan:
    tensors: tuple[int, ...]
    compute_rate: float  # bytes/s; inf: every gradient ready at once
    plan: Schedule
    baseline: Schedule  # DDP's default buckets running the default all-reduce
    buckets_only: Schedule  # the planned buckets running the default all-reduce: what fusion alone buys
    programs_only: Schedule  # DDP's buckets running the fastest programs: what the programs alone buy
    bucket_cap: int
    first_bucket_cap: int
    times: str  # "candidates" or "exact": how C(S) was found

    @property
    def gain(self) -> float:
        """Baseline finish over planned finish (>= 1 under the model)."""
        return self.baseline.finish_s / self.plan.finish_s

    @property
    def saved_s(self) -> float:
        return self.baseline.finish_s - self.plan.finish_s


def ready_times(tensors: tuple[int, ...], compute_rate: float) -> tuple[float, ...]:
    """t_i = (s_0 + ... + s_i) / r, or all 0 for an infinite rate."""
    if not compute_rate > 0:
        raise ValueError("the compute rate must be positive (or infinite)")
    if math.isinf(compute_rate):
        return tuple(0.0 for _ in tensors)
    produced, result = 0, []
    for size in tensors:
        produced += size
        result.append(produced / compute_rate)
    return tuple(result)


def schedule(tensors: tuple[int, ...], ready: tuple[float, ...], ranges: list[tuple[int, int]],
             cost: Callable[[int], tuple[Program, float]]) -> Schedule:
    """Run the buckets `ranges` ((first, last) inclusive, covering 0..n-1 in order) on one
    stream; `cost(S)` gives (program, seconds) for a bucket of S bytes."""
    buckets, free = [], 0.0
    for first, last in ranges:
        size = sum(tensors[first:last + 1])
        program, seconds = cost(size)
        start = max(ready[last], free)
        free = start + seconds
        buckets.append(Bucket(first, last, size, program, ready[last], start, free))
    return Schedule(tuple(buckets), ready[-1] if ready else 0.0)


def optimal_ranges(tensors: tuple[int, ...], ready: tuple[float, ...], seconds: Callable[[int], float],
                   floor: Callable[[int], float] | None = None) -> list[tuple[int, int]]:
    """The bucketing minimizing the finish time (the DP in the module docstring).

    `floor(S)`, if given, must be a lower bound on `seconds(S)`: a bucket whose start plus
    floor already ends after the best found for its prefix is not costed (the lower bound of
    synth/model/bound.py holds for every program, so this skips work, never the optimum).
    Buckets are tried whole prefix first, then from the smallest up (a = 1, b, b-1, ..., 2),
    so that the best is usually found before most buckets are reached."""
    n = len(tensors)
    prefix = [0]
    for size in tensors:
        prefix.append(prefix[-1] + size)
    finish = [0.0] + [math.inf] * n
    choice = [0] * (n + 1)
    for b in range(1, n + 1):
        for a in (1, *range(b, 1, -1)):  # one bucket first: when gradients are ready early it is the one to beat
            start, size = max(ready[b - 1], finish[a - 1]), prefix[b] - prefix[a - 1]
            if floor is not None and start + floor(size) > finish[b]:
                continue
            end = start + seconds(size)
            if end < finish[b] or (end == finish[b] and a < choice[b]):  # ties: the larger last bucket
                finish[b], choice[b] = end, a
    ranges, b = [], n
    while b > 0:
        ranges.append((choice[b] - 1, b - 1))
        b = choice[b] - 1
    return ranges[::-1]


def _ends(tensors, ready, ranges, seconds) -> list[float]:
    free, ends = 0.0, []
    for first, last in ranges:
        free = max(ready[last], free) + seconds(sum(tensors[first:last + 1]))
        ends.append(free)
    return ends


def merge_idle(tensors: tuple[int, ...], ready: tuple[float, ...], ranges: list[tuple[int, int]],
               seconds: Callable[[int], float]) -> list[tuple[int, int]]:
    """Merge adjacent buckets, left to right, whenever the finish time does not move.

    A merge at i is tried by running the schedule on from bucket i; it is kept as soon as some
    later bucket ends no later than it did before (every bucket after it then ends no later
    either: ends are nondecreasing in the previous end), or when the merged bucket is the last
    and ends no later than the finish."""
    ranges = list(ranges)
    ends = _ends(tensors, ready, ranges, seconds)
    i = 0
    while i + 1 < len(ranges):
        merged = (ranges[i][0], ranges[i + 1][1])
        free = ends[i - 1] if i else 0.0
        free = max(ready[merged[1]], free) + seconds(sum(tensors[merged[0]:merged[1] + 1]))
        keep = free <= ends[i + 1]
        for k in range(i + 2, len(ranges)):
            if keep:
                break
            first, last = ranges[k]
            free = max(ready[last], free) + seconds(sum(tensors[first:last + 1]))
            keep = free <= ends[k]
        if keep:
            ranges[i:i + 2] = [merged]
            ends = _ends(tensors, ready, ranges, seconds)
        else:
            i += 1
    return ranges


def ddp_ranges(tensors: tuple[int, ...], bucket_cap: int = DDP_BUCKET_CAP,
               first_bucket_cap: int = DDP_FIRST_BUCKET_CAP) -> list[tuple[int, int]]:
    """DDP's buckets in gradient-ready order: a bucket closes once it reaches its limit
    (1 MiB for the first, `bucket_cap` after), the tensor that reaches it included."""
    ranges, first, size, limit = [], 0, 0, first_bucket_cap
    for index, tensor in enumerate(tensors):
        size += tensor
        if size >= limit:
            ranges.append((first, index))
            first, size, limit = index + 1, 0, bucket_cap
    if first < len(tensors):
        ranges.append((first, len(tensors) - 1))
    return ranges


def bound_floor(context: CostContext, estimate: str | Estimate | None = None) -> Callable[[int], float]:
    """The lower bound under the estimate as a function of the size (it is a line in S for the
    lockstep sum, the larger of its two parts for the pipelined estimate,
    synth/model/bound.py), shaved by a relative 1e-9 so rounding never lifts it above a
    program's time."""
    line, estimate = bound_line(context), resolve_estimate(estimate)
    return lambda size: float(estimate.bound_times(line, [size])[0]) * (1 - 1e-9)


def bucket_sizes(tensors: tuple[int, ...]) -> set[int]:
    """Every sum of consecutive tensors: the sizes a bucket can have."""
    prefix = [0]
    for size in tensors:
        prefix.append(prefix[-1] + size)
    return {prefix[b] - prefix[a] for a in range(len(tensors)) for b in range(a + 1, len(tensors) + 1)}


PREFETCH_TENSORS = 600  # up to here every bucket size is costed in batches up front (180k sizes)


def bucket_chooser(best: BestPrograms, tensors: tuple[int, ...], exact: bool = False) -> Callable[[int], Choice]:
    """C(S) for every bucket of these tensors: the exact search per size, or the candidates of
    the power-of-two grid from the smallest tensor to the sum of all (every bucket lies there),
    every bucket size costed in batches up front when there are not too many."""
    if exact:
        return best.best
    candidates = best.candidates((min(tensors), sum(tensors)))
    if len(tensors) <= PREFETCH_TENSORS:
        candidates.prefetch(bucket_sizes(tensors))
    return candidates


# The goals whose calls reduce gradients in buckets behind backward: DDP's all-reduce, the
# sharded optimizer's and FSDP's reduce-scatter, a reduce to one rank.
GRADIENT_GOALS = tuple(name for name, goal in GOALS.items() if goal.sums)  # allreduce, reducescatter, reduce


class FusionGoalError(ValueError):
    """A goal that does not reduce gradients: nothing for the bucketing to fuse."""


def goal_chooser(best: BestPrograms, tensors: tuple[int, ...]) -> Callable[[int], Choice]:
    """C(S) for a goal other than all-reduce: the fastest of every valid program of the goal
    (`BestPrograms.every`, exact: the goals' programs are few) and the goal's flat call, every
    bucket size costed in batches up front when there are not too many."""
    programs = best.every()
    if len(tensors) <= PREFETCH_TENSORS:
        programs.prefetch(bucket_sizes(tensors))
    return programs


def plan_fusion(context: CostContext, tensors: list[int] | tuple[int, ...],
                compute_rate: float = DEFAULT_COMPUTE_RATE, max_len: int = 5, exact: bool = False,
                bucket_cap: int = DDP_BUCKET_CAP, first_bucket_cap: int = DDP_FIRST_BUCKET_CAP,
                estimate: str | Estimate | None = None, goal=ALL_REDUCE) -> FusionPlan:
    """The optimal bucketing and programs for these gradients, and DDP's default beside it
    (its buckets running the goal's flat call: the default all-reduce, or one ReduceScatter
    or Reduce call over the group for those goals)."""
    from synth.goals import parse_goal

    goal = parse_goal(goal)
    if not goal.sums:
        raise FusionGoalError(f"fusion buckets gradients behind backward: its goals are {', '.join(GRADIENT_GOALS)}, "
                              f"not {goal.name}")
    tensors = tuple(int(size) for size in tensors)
    if not tensors:
        raise ValueError("no tensors to fuse")
    if any(size <= 0 for size in tensors):
        raise ValueError("tensor sizes must be positive byte counts")
    if len(tensors) > MAX_TENSORS:
        raise ValueError(f"{len(tensors)} tensors: the planner handles at most {MAX_TENSORS}")
    if bucket_cap < 1 or first_bucket_cap < 1:
        raise ValueError("bucket caps must be positive byte counts")
    best_programs = BestPrograms(context, max_len, estimate, goal=goal)
    default = goal.flat_call(context.hierarchy.level_names[0])
    if goal.is_all_reduce:  # too many programs to cost each at every bucket: the grid's candidates
        chooser = bucket_chooser(best_programs, tensors, exact)
        floor = bound_floor(context, estimate)
    else:  # every program of the goal costed exactly; no floor (the DP's floor is the all-reduce's bound)
        chooser = goal_chooser(best_programs, tensors)
        floor = None
    ready = ready_times(tensors, compute_rate)
    seconds = lambda size: chooser(size).time_s  # noqa: E731
    ranges = merge_idle(tensors, ready, optimal_ranges(tensors, ready, seconds, floor), seconds)
    ddp = ddp_ranges(tensors, bucket_cap, first_bucket_cap)
    best = lambda size: (chooser(size).program, chooser(size).time_s)  # noqa: E731
    fallback = lambda size: (default, chooser(size).baseline_time_s)  # noqa: E731
    return FusionPlan(tensors, compute_rate, plan=schedule(tensors, ready, ranges, best),
                      baseline=schedule(tensors, ready, ddp, fallback),
                      buckets_only=schedule(tensors, ready, ranges, fallback),
                      programs_only=schedule(tensors, ready, ddp, best), bucket_cap=bucket_cap,
                      first_bucket_cap=first_bucket_cap,
                      times="exact" if exact or not goal.is_all_reduce else "candidates")
