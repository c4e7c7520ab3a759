"""One point of the sweep planned: its system and request built, the planner run, a result row made.

Shared work. A collective's cost depends only on its groups' span per level and on the figures of
the smallest equivalent system (synth/plan/equivalent.py), not on the system's name, its other
levels' sizes or the model. So a worker keeps one pool of cost contexts, program searches (all-
reduce and goal programs) and point-to-point figures, keyed by (backend, max_len, equivalent
system without its name, span), and every point it plans starts from it (`SharedCosts`): points
that differ in the model, the batch, the node count or a figure their groups never cross price
those collectives once. The searches' estimates (counts only) are kept per worker too, keyed by
what they count (sizes, link kinds, the model, the limits and settings). Both memos return what a
fresh computation returns (tests/test_codesign.py checks rows against plans without them).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from functools import lru_cache

from synth.codesign.grid import NCCL_AXES
from synth.codesign.points import Point
from synth.plan.costs import CommunicationCosts
from synth.plan.equivalent import equivalent
from synth.topology import Figure, Topology, Uplinks

SWEPT = "swept by a co-design grid (synth codesign)"
RESULT_COLUMNS = ("status", "error", "devices", "device", "step_s", "memory_bytes", "mfu", "tokens_per_s", "degrees",
                  "placement", "settings", "price_per_device_hour", "cost_per_token", "time_to_train_s",
                  "cost_to_train", "cpu_s", "memo_hits", "memo_misses")
MEASURED = ("cpu_s", "memo_hits", "memo_misses")  # differ run to run; every other column is the plan's


@dataclass(frozen=True)
class RunOptions:
    """What every point of a sweep shares: budgets are fixed by the caller (not read off the
    worker's machine), so every worker refuses the same points."""

    token_budget: float | None = None
    prices: tuple[tuple[str, float], ...] = ()
    max_len: int = 5
    backend: str = "nccl"
    memory_headroom: float = 0.1
    point_budget_s: float = 300.0
    point_memory_bytes: float = float(1 << 40)
    share: bool = True  # SharedCosts; False: a fresh CommunicationCosts per point (for checking)


# --- the worker's memo -------------------------------------------------------------------------------


class Pool:
    """One worker's priced collectives, shared by every point it plans."""

    def __init__(self):
        self.entries: dict[tuple, object] = {}
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple, make):
        found = self.entries.get(key)
        if found is None:
            self.misses += 1
            found = self.entries[key] = make()
        else:
            self.hits += 1
        return found


POOL = Pool()
_LOCK = threading.Lock()  # threads of one worker (Dask with processes=False) plan one point at a time


def _anonymous(topology: Topology) -> Topology:
    return dataclasses.replace(topology, name="", description="", source_path=None)


class SharedCosts(CommunicationCosts):
    """CommunicationCosts whose program searches and point-to-point figures come from the
    worker's pool (module docstring); everything per placement stays per point."""

    def __init__(self, topology: Topology, backend: str, max_len: int, pool: Pool = POOL):
        super().__init__(topology, backend, max_len)
        self._pool = pool
        self._backend_name = backend

    def _shared_key(self, kind: str, factors: tuple[int, ...], *rest) -> tuple:
        small = equivalent(self.topology, factors).topology
        return (kind, self._backend_name, self.max_len, _anonymous(small), factors, *rest)

    def _context(self, key):
        found = self._contexts.get(key)
        if found is None:
            found = self._contexts[key] = self._pool.get(self._shared_key("context", key),
                                                         lambda: CommunicationCosts._context(self, key))
        return found

    def _best_programs(self, placement, axes):
        key = self.factors(placement, axes)
        found = self._best.get(key)
        if found is None:
            found = self._best[key] = self._pool.get(self._shared_key("best", key),
                                                     lambda: CommunicationCosts._best_programs(self, placement, axes))
        return found

    def goal_programs(self, collective, placement, axes):
        key = (collective, self.factors(placement, axes))
        found = self._goals.get(key)
        if found is None:
            found = self._goals[key] = self._pool.get(
                self._shared_key("goal", key[1], collective),
                lambda: CommunicationCosts.goal_programs(self, collective, placement, axes))
        return found

    def point_to_point(self, placement, axis, size, first=None, last=None):
        key = (self.factors(placement, (axis,)), first, last)
        if key not in self._p2p:
            self._p2p[key] = self._pool.get(self._shared_key("p2p", key[0], first, last),
                                            lambda: self._p2p_on_equivalent(key))
        return super().point_to_point(placement, axis, size, first, last)

    def _p2p_on_equivalent(self, key):
        small = equivalent(self.topology, key[0])
        return self._p2p_figures(small.topology, small.placement, small.axes[0], key[1], key[2])


_SIZES: dict[tuple, object] = {}


def search_size(request):
    """The planner's estimate of a request, kept per worker by what it counts (the counts do not
    depend on bandwidths, latencies or uplinks)."""
    from synth.plan.search import estimate

    topology = request.topology
    shape = tuple((level.name, level.size, level.fabric is not None, level.link, level.transport)
                  for level in topology.levels)
    key = (shape, topology.nccl, request.model, request.limits, request.constraints, request.space, request.max_len,
           request.compute.host_bandwidth is not None)
    found = _SIZES.get(key)
    if found is None:
        found = _SIZES[key] = estimate(request)
    return found


# --- a point's system and request ------------------------------------------------------------------


@lru_cache(maxsize=64)
def _topology(name: str) -> Topology:
    from synth.topology_file import load_topology

    return load_topology(name)


@lru_cache(maxsize=64)
def _model(name: str):
    from synth.plan.model import read_model

    return read_model(name, "model").model


def system_of(point: Point) -> tuple[Topology, str]:
    """The point's system and the name of the topology its device comes from (prices key on it)."""
    return _system(point.system_values())


@lru_cache(maxsize=256)
def _system(values: tuple[tuple[str, object], ...]) -> tuple[Topology, str]:
    """The system of these values (neighbouring points share it: built once)."""
    from synth.names import echo
    from synth.topology import check_levels
    from synth.units import parse_bandwidth, parse_time
    from synth.errors import UsageError

    given = dict(values)
    base = given.get("topology")
    topology = _topology(base)
    device = given.get("device")
    if device is not None:
        other = _topology(device)
        if other.device is None:
            raise UsageError(f"device {echo(device)}: that topology has no [device] table; name one that has")
        topology = dataclasses.replace(topology, device=other.device, nccl=other.nccl or topology.nccl)
    settings = {name.removeprefix("nccl_"): value for name, value in values if name in NCCL_AXES}
    if settings:
        if topology.nccl is None:
            raise UsageError(f"topology {echo(base)} has no [nccl] table to give an NCCL version or symmetric "
                             f"registration to; give it an [nccl] table")
        topology = dataclasses.replace(topology, nccl=dataclasses.replace(topology.nccl, **settings))
    levels = list(topology.levels)
    changes: dict[str, dict[str, object]] = {}
    for name, value in values:
        if "." in name and not name.startswith("plan."):
            level, figure = name.split(".", 1)
            changes.setdefault(level, {})[figure] = value
    for level_name, figures in changes.items():
        index = topology.level_index(level_name)
        level = levels[index]
        replaced = {}
        if "size" in figures:
            replaced["size"] = figures["size"]
        if "bandwidth" in figures:
            replaced["bandwidth"] = Figure(parse_bandwidth(figures["bandwidth"]), SWEPT)
        if "latency" in figures:
            replaced["latency"] = Figure(parse_time(figures["latency"]), SWEPT)
        uplinks = level.uplinks
        if any(key in figures for key in ("nics", "nic_bandwidth", "oversubscription")):
            if uplinks is None and "nics" not in figures:
                raise UsageError(f"level {level_name} of {base} has no uplinks: sweep its nics to give it some")
            if uplinks is None:
                bandwidth = replaced.get("bandwidth", level.bandwidth)
                if bandwidth is None:
                    raise UsageError(f"level {level_name} of {base} has no bandwidth for its uplinks: sweep its bandwidth")
                uplinks = Uplinks(figures["nics"], Figure(bandwidth.value, SWEPT))
            count = figures.get("nics", uplinks.count)
            rate = parse_bandwidth(figures["nic_bandwidth"]) if "nic_bandwidth" in figures else uplinks.bandwidth.value
            rate /= float(figures.get("oversubscription", 1))
            uplinks = Uplinks(count, Figure(rate, SWEPT) if rate != uplinks.bandwidth.value else uplinks.bandwidth)
            replaced["uplinks"] = uplinks
        levels[index] = dataclasses.replace(level, **replaced)
    if changes:
        check_levels(tuple(levels), "the grid's level figures")
        topology = dataclasses.replace(topology, levels=tuple(levels))
    return topology, device or base


def request_of(point: Point, options: RunOptions):
    """The planner's request for the point (what `synth plan` builds from its flags, with its defaults)."""
    from synth.model.network import check_costable
    from synth.plan.degrees import DegreeLimits
    from synth.plan.formulas import attention_dominant
    from synth.plan.reserve import DEFAULT_RESERVE
    from synth.plan.search import PlanRequest, SearchSpace
    from synth.plan.step import compute_of

    topology, _ = system_of(point)
    model = _model(point.get("model"))
    if point.get("global_batch") is not None:
        model = dataclasses.replace(model, global_batch=point.get("global_batch"), micro_batch=1)
    if point.get("seq_len") is not None:
        model = dataclasses.replace(model, seq_len=point.get("seq_len"))
    compute = compute_of(topology.device, model.precision, None, topology.name,
                         matmul_precision="fp8" if point.get("plan.fp8") else None)
    check_costable(topology)
    cp = point.get("plan.cp")
    if cp is None:
        cp = None if attention_dominant(model) else 1
    limits = DegreeLimits(point.get("plan.dp"), point.get("plan.tp"), point.get("plan.pp"), cp,
                          point.get("plan.max_tp"), point.get("plan.ep"), point.get("plan.etp"))
    switch = {"on": (True,), "off": (False,), "both": (False, True)}

    def listed(name, default, convert=str):
        text = point.get(f"plan.{name}")
        return default if text is None else tuple(convert(part.strip()) for part in text.split(","))
    space = SearchSpace(micro_batches=listed("micro_batch", (), int), virtual=listed("virtual_stages", (), int),
                        sequence_parallel=switch[point.get("plan.sequence_parallel", "both")],
                        recompute=listed("recompute", ("none", "selective", "full")),
                        sharded_optimizer=switch[point.get("plan.zero1", "both")],
                        zero_stages=tuple(sorted(set(listed("zero_stage", (1,), int)))),
                        activation_offload=switch[point.get("plan.offload", "both")])
    return PlanRequest(model, topology, compute, limits, (), space, options.backend, options.max_len,
                       options.memory_headroom, 1, options.point_budget_s, options.point_memory_bytes,
                       memory_reserve=DEFAULT_RESERVE)


# --- a point planned ---------------------------------------------------------------------------------


def plan_point(point: Point, options: RunOptions) -> dict:
    """The point's row: the best plan and its figures, or the error that stopped it (never raised)."""
    from synth.errors import NoSolutionError
    from synth.plan.search import check_size, plan

    cpu = time.process_time()
    hits, misses = POOL.hits, POOL.misses
    row = {"key": point.key, "index": point.index, **dict(point.values)}
    try:
        request = request_of(point, options)
        _, device = system_of(point)
        size = search_size(request)
        check_size(size, request)
        costs = SharedCosts(request.topology, request.backend, request.max_len) if options.share else None
        result = plan(request, size=size, costs=costs)
        if not result.ranked:
            raise NoSolutionError(f"no candidate fits in the memory left per device ({result.dropped_memory} dropped)")
        row.update(_figures(result, request, device, options))
    except KeyboardInterrupt:
        raise
    except Exception as error:  # a point's failure is its row, not the sweep's end
        message = " ".join(str(error).split()) or type(error).__name__
        row.update({"status": "error", "error": f"{type(error).__name__}: {message}"[:500]})
    row["cpu_s"] = time.process_time() - cpu
    row["memo_hits"] = POOL.hits - hits
    row["memo_misses"] = POOL.misses - misses
    for column in RESULT_COLUMNS:
        row.setdefault(column, None)
    return row


def _figures(result, request, device: str, options: RunOptions) -> dict:
    best = result.ranked[0]
    devices = request.topology.device_count
    tokens_per_s = best.tokens_per_s(request.model)
    price = dict(options.prices).get(device)
    row = {"status": "ok", "error": None, "devices": devices, "device": device, "step_s": best.step_s,
           "memory_bytes": best.memory.peak, "mfu": best.mfu(request.compute.peak_flops),
           "tokens_per_s": tokens_per_s, "degrees": best.degrees.text, "placement": best.placement.to_text(),
           "settings": best.settings.text, "price_per_device_hour": price}
    if price is not None:
        row["cost_per_token"] = price * devices / 3600 / tokens_per_s
    if options.token_budget is not None:
        row["time_to_train_s"] = options.token_budget / tokens_per_s
        if price is not None:
            row["cost_to_train"] = price * devices * row["time_to_train_s"] / 3600
    return row


def run_chunk(chunk: tuple[Point, ...], options: RunOptions) -> list[dict]:
    """The rows of consecutive points, planned in order on this worker (the remote task)."""
    with _LOCK:
        return [plan_point(point, options) for point in chunk]
