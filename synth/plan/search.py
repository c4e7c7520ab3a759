"""The planner: every degree choice x every placement x every setting, predicted and ranked.

For each `Degrees` the model and the limits allow (degrees.py), every placement of its axes
on the system (synth.placement.enumerate_placements, with the user's --inside/--factor
constraints), and every runnable setting (micro-batch size, interleaving, sequence
parallelism, recomputation, sharded optimizer), the step is predicted (step.py). Candidates
whose memory exceeds the device's are dropped and counted; the rest are ranked by step time
(ties: less memory, then the degrees', placement's and settings' text, so every run agrees),
and the Pareto set of step time against memory is kept.

The size of the search is counted before it starts (placements per degree choice are counted
exactly by a product over primes, without enumerating them) and a search estimated to take
longer than the budget is refused with what to fix.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from synth.errors import NoSolutionError, UsageError
from synth.placement import Factor, Inside, enumerate_placements
from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import DegreeLimits, Degrees, divisors, enumerate_degrees
from synth.plan.formulas import RECOMPUTE
from synth.plan.model import Transformer
from synth.plan.step import Compute, Prediction, Settings, predict, settings_problem
from synth.topology import Topology

# Cost of the search on this project's 2-core machine (benchmarks/plan.py measures them):
# CPU seconds per predicted candidate and per placement enumerated (measured on 1024 and 4096 GPUs).
SECONDS_PER_CANDIDATE = 100e-6
SECONDS_PER_PLACEMENT = 5e-3
DEFAULT_BUDGET_S = 300.0
MAX_VIRTUAL = 8


@dataclass(frozen=True)
class SearchSpace:
    """The settings tried for every degree choice and placement (runnable ones only)."""

    micro_batches: tuple[int, ...] = ()  # empty: the model's own micro-batch
    virtual: tuple[int, ...] = ()  # empty: 1 and every divisor of L/p up to MAX_VIRTUAL
    sequence_parallel: tuple[bool, ...] = (False, True)
    recompute: tuple[str, ...] = RECOMPUTE
    sharded_optimizer: tuple[bool, ...] = (False, True)
    overlap_gradients: bool = True
    zero_stages: tuple[int, ...] = (1,)  # ZeRO stages tried with the sharded optimizer
    tp_overlap: bool = True  # with sequence parallelism (never slower in the step model: synth/plan/step.py)
    overlap_param_gather: bool = True  # with the sharded optimizer (never slower either)
    hsdp: tuple[bool, ...] = (False,)  # with ZeRO-3: also shard inside a node and replicate across (HSDP)
    overlap_p2p: bool = True  # interleaved schedule: pipeline transfers behind compute (Megatron's default)

    def settings(self, model: Transformer, degrees: Degrees) -> list[Settings]:
        micro = self.micro_batches or (model.micro_batch,)
        if self.virtual:
            virtual = self.virtual
        else:
            virtual = [v for v in divisors(model.layers // degrees.pp) if v <= MAX_VIRTUAL] if degrees.pp > 1 else [1]
        result = []
        for b in micro:
            for v in virtual:
                for sp in self.sequence_parallel:
                    for rc in self.recompute:
                        for sharded in self.sharded_optimizer:
                            for stage in (self.zero_stages if sharded else (1,)):
                                for hsdp in (self.hsdp if stage == 3 else (False,)):
                                    settings = Settings(b, v, sp, rc, sharded, self.overlap_gradients,
                                                        self.tp_overlap and sp,
                                                        self.overlap_param_gather and sharded and stage < 3, stage, hsdp,
                                                        self.overlap_p2p and v > 1)
                                    if settings_problem(model, degrees, settings) is None:
                                        result.append(settings)
        return result


@dataclass(frozen=True)
class PlanRequest:
    model: Transformer
    topology: Topology
    compute: Compute
    limits: DegreeLimits = DegreeLimits()
    constraints: tuple = ()  # synth.placement Inside / Factor on the roles pp, dp, cp, tp
    space: SearchSpace = SearchSpace()
    backend: str = "nccl"
    max_len: int = 5
    memory_headroom: float = 0.0  # fraction of the device memory kept free
    top: int = 10
    budget_s: float = DEFAULT_BUDGET_S

    @property
    def memory_limit(self) -> float:
        return self.compute.memory_bytes * (1 - self.memory_headroom)


@dataclass(frozen=True)
class SearchSize:
    degrees: int
    placements: int  # at most: constraints can only remove some
    candidates: int  # placements x runnable settings
    estimated_s: float
    refused: tuple[tuple[str, int], ...]  # degree choices the model or the limits refuse, by reason

    def to_json(self) -> dict:
        return {"degrees": self.degrees, "placements": self.placements, "candidates": self.candidates,
                "estimated_s": self.estimated_s, "refused_degrees": dict(self.refused)}


@dataclass
class PlanResult:
    request: PlanRequest
    size: SearchSize
    ranked: list[Prediction]  # the top candidates that fit, fastest first
    pareto: list[Prediction]  # no other is both faster and smaller, fastest first
    evaluated: int = 0
    bounded: int = 0  # candidates whose lower bound already lost to the top and the Pareto set (not costed further)
    dropped_memory: int = 0  # candidates that do not fit in the device's memory
    no_placement: int = 0  # degree choices whose axes have no placement under the constraints
    smallest_dropped: Prediction | None = None  # the least memory among the dropped (to say by how much)
    elapsed_s: float = 0.0
    costs: CommunicationCosts | None = None  # the search's memoized costs, for explaining rows


def _key(prediction: Prediction) -> tuple:
    return (prediction.step_s, prediction.memory.peak, prediction.degrees.text, prediction.placement.to_text(),
            prediction.settings.text)


@lru_cache(maxsize=None)
def _tables(rows: tuple[int, ...], columns: tuple[int, ...]) -> int:
    """Non-negative integer matrices with these row and column sums (one prime's exponents)."""
    if not rows:
        return 1 if all(c == 0 for c in columns) else 0
    first, rest = rows[0], rows[1:]
    total = 0

    def spread(level: int, remaining: int, used: tuple[int, ...]):
        nonlocal total
        if level == len(columns):
            if remaining == 0:
                total += _tables(rest, tuple(c - u for c, u in zip(columns, used)))
            return
        for take in range(min(remaining, columns[level]) + 1):
            spread(level + 1, remaining - take, used + (take,))

    spread(0, first, ())
    return total


def _exponents(n: int) -> dict[int, int]:
    result, p = {}, 2
    while p * p <= n:
        while n % p == 0:
            result[p] = result.get(p, 0) + 1
            n //= p
        p += 1
    if n > 1:
        result[n] = result.get(n, 0) + 1
    return result


def count_placements(level_sizes: tuple[int, ...], axis_sizes: tuple[int, ...]) -> int:
    """How many placements exist, without listing them: the prime exponents of each axis are
    spread over the levels independently for each prime, so the count is a product over primes
    of the number of exponent matrices with the axes' and levels' exponents as margins."""
    primes = set()
    for n in level_sizes + axis_sizes:
        primes |= set(_exponents(n))
    total = 1
    for p in sorted(primes):
        rows = tuple(_exponents(n).get(p, 0) for n in axis_sizes)
        columns = tuple(_exponents(n).get(p, 0) for n in level_sizes)
        total *= _tables(rows, columns)
    return total


def _constraints_for(degrees: Degrees, constraints) -> tuple | None:
    """The constraints on this choice's axes; None when a factor > 1 is fixed for a role of size 1."""
    present = {axis.name for axis in degrees.axes()}
    kept = []
    for constraint in constraints:
        if constraint.axis in present:
            kept.append(constraint)
        elif isinstance(constraint, Factor) and constraint.value != 1:
            return None
        elif not isinstance(constraint, (Inside, Factor)):
            raise UsageError(f"unknown placement constraint {constraint!r}")
    return tuple(kept)


def estimate(request: PlanRequest) -> SearchSize:
    refused: Counter = Counter()
    degrees = list(enumerate_degrees(request.topology.device_count, request.model, request.limits, refused))
    placements = candidates = 0
    for choice in degrees:
        count = count_placements(request.topology.sizes, tuple(axis.size for axis in choice.axes()))
        placements += count
        candidates += count * len(request.space.settings(request.model, choice))
    seconds = candidates * SECONDS_PER_CANDIDATE + placements * SECONDS_PER_PLACEMENT
    return SearchSize(len(degrees), placements, candidates, seconds, tuple(sorted(refused.items())))


def check_size(size: SearchSize, request: PlanRequest) -> None:
    if size.degrees == 0:
        reasons = "; ".join(f"{reason}: {count}" for reason, count in size.refused) or "none"
        raise NoSolutionError(f"no degree choice for {request.model.name} on {request.topology.device_count} devices "
                              f"passes the model's and the limits' rules (refused: {reasons}); relax a fixed degree")
    if size.estimated_s > request.budget_s:
        raise UsageError(
            f"the search has {size.degrees} degree choices, {size.placements} placements and {size.candidates} "
            f"candidates, about {size.estimated_s:.0f} s here, over the {request.budget_s:.0f} s budget: fix a degree "
            f"(--tp, --pp, --dp), keep axes inside levels (--inside tp=gpu), try fewer settings (--micro-batch, "
            f"--recompute, --virtual-stages), or raise --budget")


def plan(request: PlanRequest, progress: Callable[[int, int], None] | None = None) -> PlanResult:
    """Search, predict and rank (module docstring); `progress(done, total)` after each placement."""
    size = estimate(request)
    check_size(size, request)
    started = time.perf_counter()
    costs = CommunicationCosts(request.topology, request.backend, request.max_len)
    result = PlanResult(request, size, [], [], costs=costs)
    kept: list = []  # at least the `top` fastest so far, as (key, prediction)
    fitting: list[Prediction] = []  # Pareto candidates: kept only while nobody dominates them
    done = 0
    for degrees in enumerate_degrees(request.topology.device_count, request.model, request.limits):
        settings = request.space.settings(request.model, degrees)
        constraints = _constraints_for(degrees, request.constraints)
        if constraints is None or not settings:
            result.no_placement += constraints is None
            continue
        try:
            placements = enumerate_placements(request.topology, degrees.axes(), constraints)
        except NoSolutionError:
            result.no_placement += 1
            continue
        for placement in placements:
            for setting in settings:
                result.evaluated += 1
                prediction = predict(request.model, request.compute, costs, degrees, placement, setting,
                                     data_parallel=False)
                if prediction.memory.peak > request.memory_limit:
                    result.dropped_memory += 1
                    if result.smallest_dropped is None or prediction.memory.peak < result.smallest_dropped.memory.peak:
                        result.smallest_dropped = prediction
                    continue
                if degrees.dp > 1:
                    if _cannot_rank(prediction, kept, fitting, request.top):
                        result.bounded += 1
                        continue
                    prediction = predict(request.model, request.compute, costs, degrees, placement, setting)
                _keep(result, kept, fitting, prediction, request.top)
            done += 1
            if progress is not None:
                progress(done, size.placements)
    result.ranked = [prediction for _, prediction in sorted(kept, key=lambda entry: entry[0])[:request.top]]
    result.pareto = _pareto(fitting)
    result.elapsed_s = time.perf_counter() - started
    return result


def _keep(result: PlanResult, kept: list, fitting: list, prediction: Prediction, top: int) -> None:
    key = _key(prediction)
    kept.append((key, prediction))
    if len(kept) > 4 * top:
        kept.sort(key=lambda entry: entry[0])
        del kept[top:]
    if not any(_dominates(other, prediction) for other in fitting):
        fitting[:] = [other for other in fitting if not _dominates(prediction, other)]
        fitting.append(prediction)


def _cannot_rank(bound: Prediction, kept: list, fitting: list, top: int) -> bool:
    """Whether a candidate whose step is at least `bound.step_s` (its memory known exactly) can
    neither enter the top nor the Pareto set: both are already held by faster candidates."""
    if len(kept) < top:
        return False
    kept.sort(key=lambda entry: entry[0])
    del kept[top:]
    key = _key(bound)  # the full prediction's key is >= this one: its step can only grow
    if not kept[-1][0] < key:
        return False
    return any(other.step_s <= bound.step_s and other.memory.peak <= bound.memory.peak and _key(other) < key
               for other in fitting)


def _dominates(a: Prediction, b: Prediction) -> bool:
    """a is at least as fast and as small as b, and strictly better in one (or earlier on ties)."""
    if a.step_s <= b.step_s and a.memory.peak <= b.memory.peak:
        return a.step_s < b.step_s or a.memory.peak < b.memory.peak or _key(a) < _key(b)
    return False


def _pareto(candidates: list[Prediction]) -> list[Prediction]:
    return sorted(candidates, key=_key)
