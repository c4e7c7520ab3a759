"""The costing engine: every predicted time comes from here, for any set of steps and sizes.

A step (`StepCalls`) is what the model needs of one program step: the collective, each call's
member ranks (all reduction groups make the same calls, docs/model.md section 3) and the chunks each
call spans. Every call i of a step holds B_i = chunks_i * S / N bytes (S bytes per device
cut into N chunks); the backend (synth/model/backend.py) gives each call's candidate plans
and picks one per size; all groups' calls of the step then run at once and share links.
With the choices fixed a step is linear in S (a "regime"), so the engine computes, once per
(step, choices), per phase:

* the slowest call's latency and the busiest link's drain time per byte of B = B_max, the
  largest call's bytes, with every call's flows weighted by B_i / B_max and 1/efficiency;
* the same drain for one reduction group's calls alone (what the group's own chain pays);
* the link-seconds per byte of S the step puts on every link (what the pipelined estimate
  sums over a program's steps),

and a size costs a few multiply-adds, vectorized over sizes and steps. A step's lockstep time is

    launch + sum over phases (latency_p + B_max * drain_p) + residual

and one group's own time of it (its chain step) `launch + max_i latency_i + sum over phases
B_max * drain0_p + residual`, `residual` being the backend's own time alone minus the flows'
and its headroom (0 for the built-in flow backends); a backend with its own time of a call
alone also holds every step to at least `launch + ` its costliest call alone (the seam's rule,
synth/model/backend.py). The estimates (synth/model/estimate.py) combine steps into
program times; `ProgramTable` holds many programs as rows of step indices so that a batch
costs each distinct step once.

Engines are shared: two contexts whose groups sit on the system alike (the same unit pattern
up to renumbering units inside their parents, which the network cannot tell apart) have the
same costs, so `engine_for` keys engines by that pattern and costs it on canonical devices.

Translated groups: where every group splits its members over the system's units as group 0
does (a data-parallel group of 16,384 members on 131,072 devices has 7 such translates), a
device's own links carry the same bytes as group 0's device of the same member rank, so the
engine prices those from group 0's flows alone and keeps, per regime, the shared links and
group 0's own (`translated_columns`): the same figures, to the last bit, for a sixth of the
links (tests/test_translated_groups.py checks them against the engine over every link).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from synth.frozen import cached_hash, state_without_hash
from synth.lowering import LoweredProgram, LoweredStep
from synth.model.algorithms import Plan
from synth.model.backend import CallSite, FlowArrays, PairwiseFlows, canonical_coords, canonical_labels
from synth.model.context import CostContext
from synth.model.network import NO_LINK

PAD = -1  # past the end of a program in a ProgramTable row


@dataclass(frozen=True)
class StepCalls:
    """One step as the cost model sees it (names aside): the collective, every call's member
    ranks (sorted, each call root first) and the chunks each call spans, in the same order."""

    collective: str
    calls: tuple[tuple[int, ...], ...]
    chunks: tuple[int, ...]

    @property
    def largest(self) -> int:
        return max(self.chunks)

    # hashed once (synth/frozen.py): a step keys several caches, and its thousands of member
    # tuples make a deep hash; pickled without it
    __hash__ = cached_hash
    __getstate__ = state_without_hash


def step_calls(lowered: LoweredStep) -> StepCalls:
    """A lowered step's calls, sorted by members (the engine's canonical order)."""
    calls = sorted(lowered.calls, key=lambda call: call.members)
    return StepCalls(lowered.collective, tuple(call.members for call in calls), tuple(call.chunks for call in calls))


def steps_of(lowered: LoweredProgram) -> tuple[StepCalls, ...]:
    return tuple(step_calls(step) for step in lowered.steps)


@dataclass(frozen=True, eq=False)
class ProgramTable:
    """Programs as rows of indices into their distinct steps: a batch costs each step once."""

    steps: tuple[StepCalls, ...]
    rows: np.ndarray  # [program, position] -> index into `steps`; PAD past a program's end

    @classmethod
    def of(cls, programs: Iterable[Sequence[StepCalls]]) -> ProgramTable:
        index: dict[StepCalls, int] = {}
        rows = [[index.setdefault(step, len(index)) for step in steps] for steps in programs]
        width = max((len(row) for row in rows), default=0)
        table = np.full((len(rows), width), PAD, dtype=np.int64)
        for i, row in enumerate(rows):
            table[i, :len(row)] = row
        return cls(tuple(index), table)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def lengths(self) -> np.ndarray:
        return (self.rows != PAD).sum(axis=1)

    def program(self, i: int) -> tuple[StepCalls, ...]:
        return tuple(self.steps[j] for j in self.rows[i] if j != PAD)


@dataclass(frozen=True)
class StepRegime:
    """One step with the backend's choice fixed for every call: all of it linear in S."""

    algorithm: str  # what the calls run, e.g. "ring", "ring+tree" or (NCCL) "tree/LL128"
    latency_s: float  # launch + sum over phases of the slowest call's phase latency
    drain_s: tuple[float, ...]  # per phase: busiest link's seconds per byte of B_max, all groups
    links: tuple[int, ...]  # per phase: that busiest link (NO_LINK when nothing moves)
    chain_latency_s: float  # launch + the largest latency sum of one call
    chain_drain_s: tuple[float, ...]  # per phase: seconds per byte of B_max, one group's calls alone
    extra_memory: float  # largest scratch per device, per byte of B_max
    # `link_s`, or (its nonzero columns, their values) where they are at most a quarter, or a
    # `Palette` where it has few distinct values: an engine keeps thousands of regimes, most of
    # them loading one level's links, the others a few levels' alike (a tenth of the memory)
    stored: np.ndarray | tuple[np.ndarray, np.ndarray] | Palette
    columns: int  # the length of `link_s`

    @classmethod
    def of(cls, link_s: np.ndarray, **fields) -> StepRegime:
        """A regime with its `link_s` stored compactly (`stored`), to the last bit."""
        columns, stored = len(link_s), link_s
        if 4 * np.count_nonzero(link_s) <= columns:
            where = np.flatnonzero(link_s)
            stored = (where.astype(np.int32 if columns < 2**31 else np.int64), link_s[where])
        else:
            stored = Palette.of(link_s) or link_s
        return cls(**fields, stored=stored, columns=columns)

    @property
    def link_s(self) -> np.ndarray:
        """Seconds per byte of S the step keeps each link busy (all phases, all groups)."""
        if isinstance(self.stored, np.ndarray):
            return self.stored
        if isinstance(self.stored, Palette):
            return self.stored.values[self.stored.codes]
        found = np.zeros(self.columns)
        found[self.stored[0]] = self.stored[1]
        return found

    @property
    def busy_links(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(the links the step keeps busy, their `link_s`), or None when that is most links:
        a prefix's link sums then grow where they change only."""
        return self.stored if isinstance(self.stored, tuple) else None


@dataclass(frozen=True, eq=False)
class Palette:
    """An array of few distinct values as those values and a byte per element naming one:
    `values[codes]` is the array, bit for bit (values compared as their bits)."""

    values: np.ndarray  # [distinct] float64
    codes: np.ndarray  # [element] uint8 index into `values`

    LARGEST = 16  # the most distinct values kept so (each finding costs a pass over the array)

    @classmethod
    def of(cls, array: np.ndarray) -> Palette | None:
        """The array's palette, None where it has more than LARGEST distinct values."""
        bits = np.ascontiguousarray(array, dtype=np.float64).view(np.int64)
        if not len(bits):
            return None  # nothing to name (kept as the empty array it is)
        codes = np.zeros(len(bits), dtype=np.uint8)
        pending = np.ones(len(bits), dtype=bool)
        values = []
        at = 0
        while len(values) < cls.LARGEST:
            same = bits == bits[at]
            if values:  # each element matches one value: add its code (a masked store was 20x slower)
                codes += same.view(np.uint8) * np.uint8(len(values))
            values.append(bits[at])
            pending &= ~same
            at = int(np.argmax(pending))
            if not pending[at]:
                return cls(np.array(values, dtype=np.int64).view(np.float64), codes)
        return None


@dataclass(frozen=True)
class StepFigures:
    """Steps x sizes: what the estimates combine."""

    sizes: np.ndarray  # [size], bytes per device
    time_s: np.ndarray  # [step, size] lockstep time of the step
    chain_s: np.ndarray  # [step, size] one group's own time of the step
    regime: np.ndarray  # [step, size] index into CostEngine.regimes
    residual_s: np.ndarray  # [step, size] the backend's own time alone beyond its flows' and headroom (0 for flow backends)
    alone_s: np.ndarray  # [step, size] launch + the costliest call's own time alone (0 for flow backends)


@dataclass(frozen=True)
class _SiteCosts:
    """What every call at one site shares (calls at alike sites cost alike: the network cannot
    tell their units apart): its plans, their latencies and one group's time alone."""

    plans: tuple[Plan, ...]
    latencies: tuple[tuple[float, ...], ...]  # [candidate] per phase
    latency: np.ndarray  # [candidate] latency sum
    per_byte: np.ndarray  # [candidate] alone seconds per byte of B


class _Call:
    """One call of a step: its site and what every call there shares (a plain class with
    slots: a step makes thousands, and a frozen dataclass's construction cost more than the
    lookups around it)."""

    __slots__ = ("site", "site_id", "shared", "site_members")

    def __init__(self, site: CallSite, site_id: int, shared: _SiteCosts, site_members: tuple[int, ...]):
        self.site = site
        self.site_id = site_id  # the engine's number for the site (hashing a site is slow)
        self.shared = shared
        self.site_members = site_members  # the call's member ranks, as the tuple it was asked with

    @property
    def members(self) -> np.ndarray:
        """The member ranks as an array (built when asked: most calls are only looked up)."""
        return np.array(self.site_members, dtype=np.int64)

    @property
    def plans(self) -> tuple[Plan, ...]:
        return self.shared.plans

    @property
    def latency(self) -> np.ndarray:
        return self.shared.latency

    @property
    def per_byte(self) -> np.ndarray:
        return self.shared.per_byte


@dataclass(frozen=True)
class _Pairs:
    """A phase of every ordered pair of a call's members (PairwiseFlows) over the plan's
    efficiency: priced per class of equal flows (Network.pair_loads), one by one as `arrays`
    where that does not apply."""

    flows: PairwiseFlows
    efficiency: float

    @property
    def node(self) -> np.ndarray | None:
        return None if self.flows.node is None else np.array(self.flows.node, dtype=np.int64)

    def weights(self) -> tuple[float, float]:
        """(across nodes, within one) bytes of one flow per byte of B."""
        return self.flows.weight(False, self.efficiency), self.flows.weight(True, self.efficiency)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.flows.src, self.flows.dst, self.flows.fraction / self.efficiency


@lru_cache(maxsize=4096)
def _local_flows(plan: Plan) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray] | _Pairs, ...]:
    """A plan's flows per phase as (from member, to member, bytes per byte of B) arrays, or a
    pairwise phase's classes."""
    result = []
    for phase in plan.phases:
        if isinstance(phase.flows, PairwiseFlows):
            result.append(_Pairs(phase.flows, plan.efficiency))
            continue
        if isinstance(phase.flows, FlowArrays):
            result.append((phase.flows.src, phase.flows.dst, phase.flows.fraction / plan.efficiency))
            continue
        pairs = np.array([(a, b) for a, b, _ in phase.flows], dtype=np.int64).reshape(-1, 2)
        weight = np.array([f for _, _, f in phase.flows], dtype=float) / plan.efficiency
        result.append((pairs[:, 0], pairs[:, 1], weight))
    return tuple(result)


def _flow_arrays(local) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return local.arrays() if isinstance(local, _Pairs) else local


_PLANS: dict[tuple, tuple[Plan, ...]] = {}


def _plans(backend, site: CallSite) -> tuple[Plan, ...]:
    key = (backend, site)
    if key not in _PLANS:
        _PLANS[key] = tuple(backend.plans(site))
    return _PLANS[key]


class CostEngine:
    """Costs steps of one context at any sizes; caches what repeats (calls, regimes)."""

    def __init__(self, context: CostContext, devices: np.ndarray | None = None):
        self.context = context
        self.backend = context.backend
        self.group_size = context.group_size
        self.devices = context.devices if devices is None else devices  # [group, member] -> device
        self.network = context.network
        self.regimes: list[StepRegime] = []
        self._calls: dict[tuple[str, tuple[int, ...]], _Call] = {}
        self._regime_ids: dict[tuple[StepCalls, tuple[int, ...]], int] = {}
        self._choices: dict[tuple, tuple[np.ndarray, np.ndarray | None]] = {}
        self._site_ids: dict[CallSite, int] = {}
        self._site_costs: dict[int, _SiteCosts] = {}
        self._step_calls: dict[StepCalls, _KnownStep] = {}
        self._shapes: dict[tuple[int, ...], int] = {}  # members -> number of their canonical coordinates
        self._shape_ids: dict[bytes, int] = {}  # canonical coordinates' bytes -> their number
        self._site_of_shape: dict[tuple[str, int], tuple[CallSite, int]] = {}
        self._shape_by_id: list[np.ndarray] = []  # [member, level] canonical coordinates
        self._sites_of: dict[tuple[str, tuple[tuple[int, ...], ...]], tuple[tuple[int, ...], ...]] = {}
        self._least_sites: dict[tuple[str, int], tuple[tuple[int, ...], CallSite]] = {}
        # The links a regime's `link_s` covers: every link, or (translated groups) the shared
        # links and group 0's own (`translated_columns`); `columns[i]` is column i's link.
        self.columns = translated_columns(self.network, self.devices)
        self.link_count = len(self.network.capacity) if self.columns is None else len(self.columns)

    # --- one call ------------------------------------------------------------------------------

    def _shape_id(self, members: tuple[int, ...]) -> int:
        """The number of the members' canonical coordinates (every collective on these members
        sits alike: one relabelling per member tuple)."""
        shape_id = self._shapes.get(members)
        if shape_id is None:
            self._shape_calls((members,))
            shape_id = self._shapes[members]
        return shape_id

    def _shape_calls(self, calls: tuple[tuple[int, ...], ...]) -> None:
        """Numbers the shapes of calls not seen yet, those of one size in one pass (shapes are
        compared as bytes: a tuple per member cost more than the relabelling)."""
        by_size: dict[int, list[tuple[int, ...]]] = {}
        for members in calls:
            if members not in self._shapes:
                by_size.setdefault(len(members), []).append(members)
        shape_ids, by_id = self._shape_ids, self._shape_by_id
        for unseen in by_size.values():
            coords = self.network.coords[self.devices[0, np.array(unseen, dtype=np.int64)]]
            if len(unseen) == 1 and len(unseen[0]) <= 64:  # one small call: the plain relabelling is quicker
                labels = np.array(canonical_coords(coords[0]), dtype=np.int64).reshape(coords.shape)
            else:
                labels = canonical_labels(coords)
            for members, shape in zip(unseen, labels):
                key = shape.tobytes()
                shape_id = shape_ids.get(key)
                if shape_id is None:
                    shape_id = shape_ids[key] = len(by_id)
                    by_id.append(shape)
                self._shapes[members] = shape_id

    def _site(self, collective: str, members: tuple[int, ...]) -> tuple[CallSite, int]:
        """The call's site and the engine's number for it (nothing costed yet)."""
        shape_id = self._shape_id(members)
        found_site = self._site_of_shape.get((collective, shape_id))
        if found_site is None:  # hashing a site (every member's coordinates) is slow: once per shape
            shape = tuple(map(tuple, self._shape_by_id[shape_id].tolist()))
            site = CallSite(collective, shape, self.context.levels_of(collective), self.context.topology.nccl)
            found_site = self._site_of_shape[collective, shape_id] = (
                site, self._site_ids.setdefault(site, len(self._site_ids)))
        return found_site

    def _site_of(self, collective: str, members: tuple[int, ...]) -> CallSite:
        """`_site(...)[0]`, kept by the members tuple's identity: the search's bounds ask the
        same few tuples (`sites`') at every size, and hashing a call of thousands of members
        cost more than the answer. The tuple is kept with it, so its identity is not reused."""
        found = self._least_sites.get((collective, id(members)))
        if found is None or found[0] is not members:
            found = self._least_sites[collective, id(members)] = (members, self._site(collective, members)[0])
        return found[1]

    def call(self, collective: str, members: tuple[int, ...]) -> _Call:
        key = (collective, members)
        found = self._calls.get(key)
        if found is not None:
            return found
        site, site_id = self._site(collective, members)
        shared = self._site_costs.get(site_id)
        if shared is None:
            shared = self._site_costs[site_id] = self._site_figures(collective, site,
                                                                    np.array(members, dtype=np.int64))
        found = _Call(site, site_id, shared, members)
        self._calls[key] = found
        return found

    def sites(self, collective: str, calls: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
        """One call's members per distinct site among `calls`, in order of first appearance
        (asked once per step by every size's search bound, so kept)."""
        key = (collective, calls)
        found = self._sites_of.get(key)
        if found is None:
            # one collective's sites and its members' shapes correspond one to one
            by_shape: dict[int, tuple[int, ...]] = {}
            self._shape_calls(calls)
            shapes, shape_id = self._shapes, self._shape_id
            for members in calls:
                found_id = shapes.get(members)
                by_shape.setdefault(shape_id(members) if found_id is None else found_id, members)
            found = self._sites_of[key] = tuple(by_shape.values())
        return found

    def _site_figures(self, collective: str, site: CallSite, members: np.ndarray) -> _SiteCosts:
        """The site's plans, their latencies and one group's time alone, from one of its calls."""
        network = self.context.network_of(collective)
        plans = _plans(self.backend, site)
        devices = self.devices[0]
        latencies, alone = [], []
        for plan in plans:
            total = 0.0
            for local in _local_flows(plan):
                if isinstance(local, _Pairs):
                    inter, intra = local.weights()
                    loads = network.pair_loads(devices[members][None, :], local.node, np.array([inter]),
                                               np.array([intra]))
                    if loads is not None:
                        total += float((loads / network.capacity).max())
                        continue
                src_local, dst_local, weight = _flow_arrays(local)
                total += network.makespan(devices[members[src_local]], devices[members[dst_local]], weight)[0]
            latencies.append(tuple(phase.latency_s for phase in plan.phases))
            alone.append(total)
        return _SiteCosts(plans, tuple(latencies), np.array([sum(phase) for phase in latencies]), np.array(alone))

    def _call_choices(self, call: _Call, chunks: int, sizes: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Per size, the candidate the backend's own estimate of the call alone prefers (the
        first on a tie), that estimate minus the flows' and the candidate's headroom, and the
        estimate itself (both None when the estimate is the flows')."""
        key = (call.site_id, chunks, sizes.tobytes())
        found = self._choices.get(key)
        if found is not None:
            return found
        call_bytes = chunks * sizes / self.group_size
        flow = call.latency[None, :] + call_bytes[:, None] * call.per_byte[None, :]
        own = self.backend.alone_s(call.site, call.plans, call_bytes, flow)
        choice = np.argmin(own, axis=1) if own.shape[1] > 1 else np.zeros(len(sizes), dtype=np.int64)
        residual = alone = None
        if own is not flow:
            picked = np.arange(len(sizes))
            alone = own[picked, choice]
            residual = alone - flow[picked, choice]
            headroom = getattr(self.backend, "headroom_s", None)
            if headroom is not None:
                residual = residual - headroom(call.site, call.plans, call_bytes, flow)[picked, choice]
        self._choices[key] = (choice, residual, alone)
        return choice, residual, alone

    def least_step_s(self, collective: str, calls: tuple[tuple[int, ...], ...], size: int) -> float:
        """A lower bound on the step's time (lockstep, and one group's chain) whatever chunks its
        calls span: launch plus, for its costliest call, the least the backend's own estimate
        of the call alone gives any candidate at one chunk (a step's time is at least launch +
        each call's time alone, and a call of more bytes is never faster alone)."""
        sizes = np.array([size], dtype=np.int64)
        least = 0.0
        least_alone = getattr(self.backend, "least_alone_s", None)
        for members in calls:
            call_bytes = sizes / self.group_size
            found = None if least_alone is None else least_alone(self._site_of(collective, members), call_bytes)
            if found is None:  # the backend's own estimate over the call's plans
                call = self.call(collective, members)
                flow = call.latency[None, :] + call_bytes[:, None] * call.per_byte[None, :]
                found = float(self.backend.alone_s(call.site, call.plans, call_bytes, flow).min())
            least = max(least, found)
        return self.backend.launch_s + least

    # --- one step, choices fixed -----------------------------------------------------------------

    def regime(self, step: StepCalls, choices: tuple[int, ...]) -> int:
        """The index in `regimes` of the step with these candidate choices (computed once)."""
        key = (step, choices)
        found = self._regime_ids.get(key)
        if found is not None:
            return found
        known = self._step_calls.get(step) or self._known_step(step)
        runs = _runs(known.site_ids, choices)
        # per run of calls at one site with one choice (start -> what each of its calls runs)
        shared = {start: known.call(start).shared for start, _ in runs}
        plans = {start: shared[start].plans[choices[start]] for start, _ in runs}
        phase_latencies = {start: shared[start].latencies[choices[start]] for start, _ in runs}
        largest = step.largest
        network = self.context.network_of(step.collective)
        capacity = network.capacity
        latencies, drains, links, chain_drains = [], [], [], []
        columns = self.columns
        link_s = np.zeros(self.link_count)
        column_capacity = capacity if columns is None else capacity[columns]
        one_group = len(self.devices) == 1
        for phase in range(max(len(p) for p in phase_latencies.values())):
            in_phase = [(start, stop) for start, stop in runs if phase < len(phase_latencies[start])]
            pairs = self._pair_loads(network, known, plans, in_phase, phase)
            if pairs is not None:
                seconds = pairs[0] / column_capacity
                busiest = int(np.argmax(seconds))
                drains.append(float(seconds[busiest]))
                links.append(self.column_link(busiest) if seconds[busiest] > 0 else NO_LINK)
                link_s += seconds
                latencies.append(max(p[phase] for p in phase_latencies.values() if phase < len(p)))
                chain_drains.append(float(seconds.max()) if one_group else float((pairs[1] / capacity).max()))
                continue
            if columns is not None:  # the shared links from every group's flows, the devices' own from group 0's
                every, alone = self._translated_loads(network, known, plans, in_phase, phase)
                seconds = every / column_capacity
                moved = True  # group 0's loads are zeros where it moves nothing: their maximum is 0.0
            else:
                parts = [self._run_flows(known, plans, start, stop, phase) for start, stop in in_phase]
                src = np.concatenate([part[0] for part in parts])
                dst = np.concatenate([part[1] for part in parts])
                nbytes = np.concatenate([part[2] for part in parts])
                seconds = network.loads(src, dst, nbytes) / capacity
                if not one_group:
                    src0 = np.concatenate([part[3] for part in parts])
                    alone = network.loads(src0, np.concatenate([part[4] for part in parts]),
                                          np.concatenate([part[5] for part in parts]))
                    moved = len(src0) > 0
            busiest = int(np.argmax(seconds))  # the first of equals: deterministic
            drains.append(float(seconds[busiest]))
            links.append(self.column_link(busiest) if seconds[busiest] > 0 else NO_LINK)
            link_s += seconds
            latencies.append(max(p[phase] for p in phase_latencies.values() if phase < len(p)))
            if one_group:  # one group: its calls alone are all the flows
                chain_drains.append(float(seconds.max()) if len(src) else 0.0)
                continue
            chain_drains.append(float((alone / capacity).max()) if moved else 0.0)
        chosen_latency = [float(shared[start].latency[choices[start]]) for start, _ in runs]
        launch = self.backend.launch_s
        regime = StepRegime.of(
            link_s * (largest / self.group_size), algorithm="+".join(sorted({plan.algorithm for plan in plans.values()})),
            latency_s=launch + sum(latencies), drain_s=tuple(drains), links=tuple(links),
            chain_latency_s=launch + max(chosen_latency), chain_drain_s=tuple(chain_drains),
            extra_memory=max(plan.extra_memory for plan in plans.values()))
        self.regimes.append(regime)
        self._regime_ids[key] = len(self.regimes) - 1
        return len(self.regimes) - 1

    def _pair_loads(self, network, known: _KnownStep, plans, runs, phase: int):
        """(every group's, group 0's) link loads of a phase whose runs are all pairwise flows
        of one member count and node layout, priced per class of equal flows, every group's on
        the engine's columns; None otherwise (or where Network.pair_loads declines), for the
        flows one by one."""
        found = [_local_flows(plans[start])[phase] for start, _ in runs]
        if not found or not all(isinstance(local, _Pairs) for local in found):
            return None
        if len({(local.flows.k, local.flows.node) for local in found}) != 1:
            return None
        members = np.concatenate([known.members(start, stop) for start, stop in runs])
        weights = known.weights
        inter, intra = [], []
        for local, (start, stop) in zip(found, runs):
            across, within = local.weights()
            for scale in weights[start:stop]:  # as the flows' weight times the call's scale
                inter.append(np.float64(across) * np.float64(scale))
                intra.append(np.float64(within) * np.float64(scale))
        inter, intra, node = np.array(inter), np.array(intra), found[0].node
        groups = len(self.devices)
        if self.columns is not None:  # translated groups: the devices' own links from group 0's (regime)
            alone = network.pair_loads(self.devices[0, members], node, inter, intra)
            if alone is None:
                return None
            shared = network.pair_loads(self.devices[:, members].reshape(-1, members.shape[1]), node,
                                        np.tile(inter, groups), np.tile(intra, groups), shared_only=True)
            if shared is None:
                return None
            return np.concatenate([shared, alone[self.columns[network.shared_links:]]]), alone
        every = network.pair_loads(self.devices[:, members].reshape(-1, members.shape[1]), node,
                                   np.tile(inter, groups), np.tile(intra, groups))
        if every is None:
            return None
        if groups == 1:
            return every, every
        alone = network.pair_loads(self.devices[0, members], node, inter, intra)
        return None if alone is None else (every, alone)

    def _translated_loads(self, network, known: _KnownStep, plans, runs, phase: int):
        """(every group's loads on the engine's columns, group 0's on every link) of a phase of
        translated groups: group 0's flows price its own links (and so every group's, column
        for column), every group's flows the shared links, and only where some flow crosses
        one (a step inside the nodes of a system whose uplinks join nodes leaves them empty).
        A flow of group g first differs where group 0's does (translated_columns)."""
        own = [self._run_flows(known, plans, start, stop, phase, every=False) for start, stop in runs]
        src0, dst0 = np.concatenate([part[0] for part in own]), np.concatenate([part[1] for part in own])
        level0 = network.first_difference(src0, dst0) if len(src0) else np.zeros(0, dtype=np.int64)
        alone = network.loads(src0, dst0, np.concatenate([part[2] for part in own]), level0)
        crossing = len(level0) and (
            (network.uplink_levels and int(level0.min()) <= max(network.uplink_levels))
            or bool(np.isin(level0, network.fabric_levels).any()))
        if not crossing:
            shared = np.zeros(network.shared_links)
        else:
            parts = [self._run_flows(known, plans, start, stop, phase) for start, stop in runs]
            level, at, groups = [], 0, len(self.devices)
            for (start, stop), part in zip(runs, own):
                calls, count = stop - start, len(part[0])
                level.append(np.broadcast_to(level0[at:at + count].reshape(calls, 1, -1),
                                             (calls, groups, count // max(calls, 1))).ravel())
                at += count
            shared = network.shared_loads(np.concatenate([part[0] for part in parts]),
                                          np.concatenate([part[1] for part in parts]),
                                          np.concatenate([part[2] for part in parts]), np.concatenate(level))
        return np.concatenate([shared, alone[self.columns[network.shared_links:]]]), alone

    def _run_flows(self, known: _KnownStep, plans, start: int, stop: int, phase: int, every: bool = True):
        """The flows of calls[start:stop] (one site, one plan) in one phase, in call order and,
        within a call, group by group: (src, dst, bytes per byte of B_max) on every group's
        devices, then the same on group 0's alone (`every=False`: group 0's alone, first).
        One gather for the whole run."""
        src_local, dst_local, weight = _flow_arrays(_local_flows(plans[start])[phase])
        members = known.members(start, stop)  # [call, member]
        scale = np.array(known.weights[start:stop])[:, None]
        devices = self.devices
        if not every:
            return (devices[0, members[:, src_local]].ravel(), devices[0, members[:, dst_local]].ravel(),
                    (weight[None, :] * scale).ravel())
        src = devices[:, members[:, src_local]]  # [group, call, flow]
        dst = devices[:, members[:, dst_local]]
        if len(devices) == 1:  # one group: its flows are all the flows (the caller reads no second copy)
            return src.ravel(), dst.ravel(), (weight[None, :] * scale).ravel(), None, None, None
        nbytes = (np.tile(weight, len(devices))[None, :] * scale).ravel()
        return (src.transpose(1, 0, 2).ravel(), dst.transpose(1, 0, 2).ravel(), nbytes,
                src[0].ravel(), dst[0].ravel(), (weight[None, :] * scale).ravel())

    # --- steps x sizes -------------------------------------------------------------------------------

    def figures(self, steps: Sequence[StepCalls], sizes) -> StepFigures:
        """Lockstep time, one group's chain time and the regime of every step at every size."""
        sizes = np.asarray(sizes, dtype=np.int64).reshape(-1)
        count = len(steps)
        regime = np.empty((count, len(sizes)), dtype=np.int64)
        residual = np.zeros((count, len(sizes)))
        alone = np.zeros((count, len(sizes)))
        for d, step in enumerate(steps):
            columns, extra, own = self._step_choices(step, sizes)
            if extra is not None:
                residual[d] = extra
                alone[d] = self.backend.launch_s + own
            if columns is None:
                regime[d] = self.regime(step, (0,) * len(step.calls))
                continue
            ids: dict[bytes, int] = {}
            columns = np.ascontiguousarray(columns.T)  # [size, call]
            for z in range(len(sizes)):
                key = columns[z].tobytes()
                if key not in ids:
                    ids[key] = self.regime(step, tuple(columns[z].tolist()))
                regime[d, z] = ids[key]
        return self._combine(steps, sizes, regime, residual, alone)

    def _step_choices(self, step: StepCalls, sizes: np.ndarray
                      ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        """[call, size] candidate choices (None: every call has one candidate and nothing to
        choose), the step's residual per size and its costliest call's own time alone (both
        None for a flow backend)."""
        known = self._step_calls.get(step) or self._known_step(step)
        chunks = step.chunks
        # one answer per distinct (site, chunks), in order of first appearance
        answers = [self._call_choices(known.call(first), chunks[first], sizes) for first in known.firsts]
        residual = alone = None
        for _, extra, own in answers:
            if extra is not None:
                residual = extra if residual is None else np.maximum(residual, extra)
                alone = own if alone is None else np.maximum(alone, own)
        columns = np.stack([answer[0] for answer in answers])[known.kinds] if known.varied else None
        return columns, residual, alone

    def _known_step(self, step: StepCalls) -> _KnownStep:
        """What a step's costs need of its calls, once per step."""
        self._shape_calls(step.calls)
        call, collective, calls = self.call, step.collective, step.calls
        shape_ids = np.fromiter(map(self._shapes.__getitem__, calls), dtype=np.int64, count=len(calls))
        # the calls of one shape sit at one site: asked once per shape, in order of first appearance
        shapes, first_of_shape, shape_of_call = np.unique(shape_ids, return_index=True, return_inverse=True)
        site_of_shape = np.empty(len(shapes), dtype=np.int64)
        for position in np.argsort(first_of_shape, kind="stable").tolist():
            site_of_shape[position] = call(collective, calls[int(first_of_shape[position])]).site_id
        site_ids = site_of_shape[shape_of_call.reshape(-1)]
        # each call's kind: its (site, chunks) numbered in order of first appearance
        chunks = np.array(step.chunks, dtype=np.int64)
        _, first_of_kind, kind_of_call = np.unique(site_ids * (int(chunks.max()) + 1) + chunks,
                                                    return_index=True, return_inverse=True)
        order = np.argsort(first_of_kind, kind="stable")
        number = np.empty(len(order), dtype=np.int64)
        number[order] = np.arange(len(order))
        firsts = tuple(first_of_kind[order].tolist())
        largest = step.largest
        known = self._step_calls[step] = _KnownStep(
            step, call, number[kind_of_call.reshape(-1)], firsts,
            any(len(call(collective, calls[first]).plans) > 1 for first in firsts),
            site_ids, [part / largest for part in step.chunks])
        return known

    def _combine(self, steps, sizes, regime, residual, alone) -> StepFigures:
        """Times from regimes, elementwise in a fixed order (phases in order) so every caller
        that costs the same step at the same size gets the same float. A backend's own time
        of its costliest call alone is a floor (0 for flow backends, which changes nothing)."""
        used, position = np.unique(regime, return_inverse=True)
        position = position.reshape(regime.shape)
        chosen = [self.regimes[i] for i in used.tolist()]
        phases = max(len(r.drain_s) for r in chosen)
        latency = np.array([r.latency_s for r in chosen])[position]
        chain_latency = np.array([r.chain_latency_s for r in chosen])[position]
        drain = np.array([r.drain_s + (0.0,) * (phases - len(r.drain_s)) for r in chosen])
        chain_drain = np.array([r.chain_drain_s + (0.0,) * (phases - len(r.chain_drain_s)) for r in chosen])
        largest = np.array([step.largest for step in steps], dtype=np.int64)
        call_bytes = largest[:, None] * sizes[None, :] / self.group_size
        transfer = np.zeros(regime.shape)
        chain_transfer = np.zeros(regime.shape)
        for phase in range(phases):
            transfer = transfer + call_bytes * drain[position, phase]
            chain_transfer = chain_transfer + call_bytes * chain_drain[position, phase]
        time = np.maximum(latency + transfer + residual, alone)
        chain = np.maximum(chain_latency + chain_transfer + residual, alone)
        return StepFigures(sizes, time, chain, regime, residual, alone)

    def column_link(self, column: int) -> int:
        """The link of a column of `StepRegime.link_s`."""
        return column if self.columns is None else int(self.columns[column])

    def link_rows(self, regimes: np.ndarray | None = None) -> np.ndarray:
        """[regime, link] link-seconds per byte of S (for the pipelined estimate), of every regime
        or of the given ones in that order; stacked per call, not kept: a kept copy doubled
        the regimes' memory (32 MB of a 2793-configuration sweep)."""
        chosen = self.regimes if regimes is None else [self.regimes[i] for i in np.asarray(regimes).tolist()]
        if not chosen:
            return np.zeros((0, 0))
        rows = np.zeros((len(chosen), chosen[0].columns))
        for row, regime in zip(rows, chosen):
            if isinstance(regime.stored, np.ndarray):
                row[:] = regime.stored
            elif isinstance(regime.stored, Palette):
                row[:] = regime.stored.values[regime.stored.codes]  # np.take of bytes was 6x slower
            else:
                row[regime.stored[0]] = regime.stored[1]
        return rows

    def call_bytes(self, step: StepCalls, size: int) -> float:
        return step.largest * size / self.group_size

    def link_name(self, link: int) -> str:
        return self.network.link_name(link)


class _KnownStep:
    """What a step's regimes read of its calls, kept per step: each call's kind (the index of
    its (site, chunks) among the step's distinct ones), each kind's first call, whether any
    call has a choice to make, each call's site and its chunks over the largest. A call's own
    record is made when asked (`call`): a regime reads one per run of calls at one site."""

    __slots__ = ("step", "_engine_call", "kinds", "firsts", "varied", "site_ids", "weights", "_members")

    def __init__(self, step: StepCalls, engine_call, kinds: np.ndarray, firsts: tuple[int, ...],
                 varied: bool, site_ids: np.ndarray, weights: list[float]):
        self.step, self._engine_call, self.kinds, self.firsts = step, engine_call, kinds, firsts
        self.varied, self.site_ids, self.weights = varied, site_ids, weights
        self._members: dict[int, np.ndarray] = {}  # member count -> [call, member] of the calls of that many

    def call(self, index: int) -> _Call:
        """The step's call `index` (CostEngine.call)."""
        return self._engine_call(self.step.collective, self.step.calls[index])

    def members(self, start: int, stop: int) -> np.ndarray:
        """[call, member] ranks of calls[start:stop] (one site: one member count), converted
        once per step (stacking thousands of small arrays was slower)."""
        calls = self.step.calls
        found = self._members.get(len(calls[start]))
        if found is None:
            if len({len(members) for members in calls}) == 1:
                found = self._members[len(calls[start])] = np.array(calls, dtype=np.int64).reshape(len(calls), -1)
            else:  # calls of several sizes: this run's alone
                return np.array(calls[start:stop], dtype=np.int64).reshape(stop - start, -1)
        return found[start:stop]


def _runs(site_ids: np.ndarray, choices) -> list[tuple[int, int]]:
    """[start, stop) of each run of consecutive calls at one site with one choice."""
    choices = np.asarray(choices, dtype=np.int64)
    changes = np.flatnonzero((site_ids[1:] != site_ids[:-1]) | (choices[1:] != choices[:-1])) + 1
    bounds = [0, *changes.tolist(), len(site_ids)]
    return list(zip(bounds, bounds[1:]))


def translated_columns(network, devices: np.ndarray) -> np.ndarray | None:
    """The links `StepRegime.link_s` needs when the groups are translates of group 0, in link
    order: every shared link (fabrics, uplinks) and group 0's devices' own links; None (every
    link) otherwise.

    A device's own links (its injection and ejection link per level) carry only its group's
    flows. When every group splits its members alike at every level (members i and j share a
    unit of level l in group g exactly when they do in group 0), member m's flows in group g
    are those of group 0 at the same levels with the same bytes in the same order, so the
    device of member m has, link for link, group 0's loads to the last bit; and when group 0's
    device of every member is the least of the groups', each such link is the least among its
    equals, so the busiest column is the busiest link `np.argmax` over every link would find
    (the first of equals). The other groups' own links add no column then: a sum or a maximum
    over the columns is the one over every link. None unless both hold."""
    groups = len(devices)
    if groups == 1 or not (devices[0][None, :] < devices[1:]).all():
        return None
    members = devices.shape[1]
    strides = [int(np.prod(network.sizes[p:], dtype=np.int64)) for p in range(1, network.depth + 1)]
    rows = np.arange(groups, dtype=np.int64)[:, None] * (network.device_count + 1)
    for stride in strides:
        # each member's first fellow member in its unit of this level, per group
        _, first, inverse = np.unique(rows + devices // stride, return_index=True, return_inverse=True)
        fellow = first[inverse.reshape(devices.shape)] - rows // (network.device_count + 1) * members
        if not (fellow == fellow[0][None, :]).all():
            return None
    own = np.concatenate([network.inject[devices[0]].ravel(), network.eject[devices[0]].ravel()])
    return np.concatenate([np.arange(network.shared_links, dtype=np.int64), np.sort(own)])


def canonical_devices(context: CostContext) -> np.ndarray:
    """The context's [group, member] devices with every unit renumbered, inside its parent,
    in order of first appearance: an isomorphic copy of the same groups on the same network."""
    network = context.network
    coords = network.coords[context.devices.reshape(-1)]
    relabelled = canonical_labels(coords[None])[0]  # canonical_coords, vectorized (thousands of devices)
    return np.ravel_multi_index(tuple(relabelled.T), network.sizes).reshape(context.devices.shape)


_ENGINES: dict[tuple, CostEngine] = {}
MAX_ENGINES = 256


def engine_for(context: CostContext) -> CostEngine:
    """A shared engine for every context whose groups sit on the system alike (same backend,
    topology, hierarchy sizes and canonical devices): their step costs are the same numbers.
    Its `context` is the first that asked and its link names are the canonical devices'; a
    cost shown in detail (synth/model/cost.py) uses `CostEngine(context)`, with the real ones."""
    devices = canonical_devices(context)
    key = (context.backend, context.topology, context.hierarchy.sizes, devices.tobytes())
    engine = _ENGINES.get(key)
    if engine is None:
        if len(_ENGINES) >= MAX_ENGINES:
            _ENGINES.pop(next(iter(_ENGINES)))
        engine = _ENGINES[key] = CostEngine(context, devices)
    return engine
