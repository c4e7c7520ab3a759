"""Plan files are input (synth.torch.plan_document, synth.export.plan_proof): any change to a
valid plan of any goal, in either file format (ReductionPlan.save and `synth export --format
json`), either raises PlanFileError or loads a plan that still computes the goal's result,
checked by an executor written here apart from the proof, on numbers, as the torch runtime
runs the calls. Without torch processes; the gloo check is in tests/test_torch_collectives.py."""

from __future__ import annotations

import copy
import json
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import synth.torch as synth_torch
from export_cases import CASES
from synth.errors import PlanFileError
from synth.export import json_plan
from synth.export.plan import PlanEntry, build_plan
from synth.export.provenance import Provenance, hierarchy_metadata, placement_metadata
from synth.search import Enumerator, SearchOptions, semantics_for
from synth.topology import topology_from_levels
from synth.torch.plan import ReductionPlan

GOALS = ("allreduce", "reducescatter", "allgather", "alltoall", "broadcast", "reduce")
RS = "Permute(gpu,node); ReduceScatter(InsideGroup(gpu)); ReduceScatter(Parallel(node))"


@lru_cache(maxsize=None)
def documents() -> tuple[tuple[str, str], ...]:
    """(name, JSON text) of valid plans: every goal, two cases, both formats, two programs each."""
    result = []
    for case in (CASES[0], CASES[2]):
        for goal in GOALS:
            programs = list(Enumerator(semantics_for(case.built, goal=goal), SearchOptions(max_len=3)).programs())
            programs = [programs[0], programs[-1]]
            saved = synth_torch.plan_programs(case.built, programs, collective=goal).to_document()
            result.append((f"{case.name}-{goal}-saved", json.dumps(saved)))
            plan = build_plan(PlanEntry(case.built, program, goal=goal) for program in programs)
            metadata = placement_metadata(topology_from_levels(case.levels), case.built.placement)
            metadata.update(hierarchy_metadata(case.built))
            document = json_plan.plan_document(plan, Provenance(("t",)), metadata, 96)
            result.append((f"{case.name}-{goal}-export", json.dumps(document)))
    return tuple(result)


# --- an executor of loaded plans, apart from the proof ------------------------------------------


def computes_its_goal(loaded) -> bool:
    """Every program of the loaded plan, run on random integers as the torch runtime runs it
    (each rank's own call on its communicator's group; undefined data NaN), leaves what the
    goal's flat collective leaves over each reduction group, where the framework reads it."""
    plan = loaded.plan
    world, n = plan.world_size, loaded.group_size
    rng = np.random.default_rng(7)
    for program in plan.programs:
        start = rng.integers(-1000, 1000, size=(world, n)).astype(np.float64)
        buffers = start.copy()
        if program.goal.name == "allgather":
            for group in loaded.reduction_groups:
                for key, rank in enumerate(group):
                    keep = buffers[rank, key]
                    buffers[rank] = np.nan
                    buffers[rank, key] = keep
        for step in program.steps:
            if step.places is not None:
                moved = np.empty_like(buffers)
                moved[:, list(step.places)] = buffers
                buffers = moved
                continue
            for members in plan.communicators[step.communicator].groups:
                calls = [step.calls[rank] for rank in members]
                if any(call is None for call in calls) or len({(c.lo, c.hi, c.root) for c in calls}) != 1:
                    return False  # a rank of the group would not join it: a hang
                if any(c.key != i or c.size != len(members) for i, c in enumerate(calls)):
                    return False
                run_call(step.collective, buffers, list(members), calls[0])
            if any(call is not None and all(call_rank not in g for g in plan.communicators[step.communicator].groups)
                   for call_rank, call in enumerate(step.calls)):
                return False
        if not matches(program, loaded.reduction_groups, start, buffers):
            return False
    return True


def run_call(name, buffers, members, call) -> None:
    lo, hi, k = call.lo, call.hi, len(members)
    if (hi - lo) % k and name in ("ReduceScatter", "AllGather", "AllToAll"):
        buffers[members] = np.nan
        return
    block = (hi - lo) // k
    span = buffers[members, lo:hi].copy()
    if name == "AllReduce":
        buffers[members, lo:hi] = span.sum(axis=0)
    elif name == "ReduceScatter":
        total = span.sum(axis=0)
        for i, rank in enumerate(members):
            buffers[rank, lo:hi] = np.nan
            buffers[rank, lo + i * block:lo + (i + 1) * block] = total[i * block:(i + 1) * block]
    elif name == "AllGather":
        joined = np.concatenate([span[i, i * block:(i + 1) * block] for i in range(k)])
        buffers[members, lo:hi] = joined
    elif name == "Reduce":
        total = span.sum(axis=0)
        buffers[members, lo:hi] = np.nan
        buffers[members[call.root], lo:hi] = total
    elif name == "Broadcast":
        buffers[members, lo:hi] = span[call.root]
    elif name == "AllToAll":
        for j, rank in enumerate(members):
            buffers[rank, lo:hi] = np.concatenate([span[i, j * block:(j + 1) * block] for i in range(k)])
    else:
        raise AssertionError(name)


def matches(program, groups, start, buffers) -> bool:
    for group in groups:
        group = list(group)
        inputs = start[group]
        total = inputs.sum(axis=0)
        for key, rank in enumerate(group):
            got = buffers[rank]
            if program.goal.name == "allreduce":
                want = total
            elif program.goal.name == "reduce":
                got, want = (got, total) if key == 0 else (got[:0], total[:0])
            elif program.goal.name == "reducescatter":
                place = program.final_places[key] if program.final_places else key
                got, want = got[place:place + 1], total[key:key + 1]
            elif program.goal.name == "allgather":
                want = np.diagonal(inputs).copy()
            elif program.goal.name == "alltoall":
                want = inputs[:, key]
            else:
                want = inputs[0]
            if not np.array_equal(got, want):
                return False
    return True


# --- mutations ----------------------------------------------------------------------------------


def paths(value, prefix=()):
    """Every place in a JSON value: (path,) for the value itself and each part of it."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, prefix + (index,))


def nested(depth: int):
    value: list = [0]
    for _ in range(depth):
        value = [value]
    return value


OTHER_VALUES = [None, "x", "", 1.5, float("nan"), True, False, [], {}, -1, 0, 2**70, "deep"]


def other_value(draw):
    value = draw(st.sampled_from(OTHER_VALUES))
    return nested(5000) if value == "deep" else copy.deepcopy(value)
KINDS = ("delete", "replace", "shift", "swap", "constant", "truncate", "extend")


class Mutant:
    """A changed document; shown by what was changed (the value may be nested too deep to print)."""

    def __init__(self, name, document, change):
        self.name, self.document, self.change = name, document, change

    def __repr__(self) -> str:
        return f"Mutant({self.name}, {self.change})"


@st.composite
def mutated(draw):
    name, text = draw(st.sampled_from(documents()))
    document = json.loads(text)
    where = draw(st.sampled_from([p for p in paths(document) if p]))
    kind = draw(st.sampled_from(KINDS))
    parent = document
    for key in where[:-1]:
        parent = parent[key]
    key = where[-1]
    value = parent[key]
    if kind == "delete":
        del parent[key]
    elif kind == "replace":
        parent[key] = other_value(draw)
    elif kind == "shift" and type(value) is int:
        parent[key] = value + draw(st.sampled_from([-2, -1, 1, 2, 7]))
    elif kind == "swap" and isinstance(value, list) and len(value) >= 2:
        i = draw(st.integers(0, len(value) - 1))
        j = draw(st.integers(0, len(value) - 1).filter(lambda j: j != i))
        value[i], value[j] = value[j], value[i]
    elif kind == "constant" and isinstance(value, list) and value:
        parent[key] = [copy.deepcopy(value[0]) for _ in value]
    elif kind == "truncate" and isinstance(value, list) and value:
        parent[key] = value[:-1]
    elif kind == "extend" and isinstance(value, list) and value:
        parent[key] = value + [copy.deepcopy(value[-1])]
    else:  # the kind does not apply here: a value of another type
        parent[key] = other_value(draw)
    return Mutant(name, document, (kind, where))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated())
def test_a_changed_plan_is_refused_or_still_computes_its_goal(mutant):
    try:
        loaded = ReductionPlan.from_document(mutant.document)
    except PlanFileError as error:
        assert "\n" not in str(error)
        return
    assert computes_its_goal(loaded), mutant


@pytest.mark.parametrize("name, text", documents(), ids=[name for name, _ in documents()])
def test_every_valid_plan_loads_and_computes_its_goal(name, text):
    assert computes_its_goal(ReductionPlan.from_document(json.loads(text)))


def test_the_issues_reduce_scatter_with_places_all_zero_is_refused(tmp_path):
    """The export of the issue: places [0]*8 loaded and returned wrong sums on all 8 ranks."""
    case = CASES[0]
    plan = synth_torch.plan_programs(case.built, [RS], collective="reducescatter")
    metadata = placement_metadata(topology_from_levels(case.levels), case.built.placement)
    metadata.update(hierarchy_metadata(case.built))
    document = json_plan.plan_document(plan.plan, Provenance(("t",)), metadata, 96)
    assert document["programs"][0]["steps"][0]["places"] != [0] * 8
    path = tmp_path / "rs.json"
    path.write_text(json.dumps(document))
    assert synth_torch.load_plan(path).plan == plan.plan
    document["programs"][0]["steps"][0]["places"] = [0] * 8
    path.write_text(json.dumps(document))
    with pytest.raises(PlanFileError, match=r"programs\[0\]\.steps\[0\]\.places .* not a permutation"):
        synth_torch.load_plan(path)
    document["programs"][0]["steps"][0]["places"] = list(range(8))  # a permutation, the wrong one
    path.write_text(json.dumps(document))
    with pytest.raises(PlanFileError, match=r"programs\[0\]\.steps\[0\]\.places .* not the places of Permute"):
        synth_torch.load_plan(path)  # the export names its hierarchy: the text's lowering decides
    document["programs"][0]["steps"][0]["places"] = list(plan.plan.programs[0].steps[0].places)
    document["programs"][0]["final_places"] = plan.plan.programs[0].final_places[::-1]
    path.write_text(json.dumps(document))
    with pytest.raises(PlanFileError, match=r"programs\[0\]\.final_places"):
        synth_torch.load_plan(path)
    saved = plan.to_document()  # no hierarchy: the proof on numbers decides
    saved["programs"][0]["steps"][0]["places"] = list(range(8))
    with pytest.raises(PlanFileError, match=r"programs\[0\].*does not compute the reducescatter"):
        synth_torch.ReductionPlan.from_document(saved)
    saved = plan.to_document()
    saved["programs"][0]["final_places"] = saved["programs"][0]["final_places"][::-1]
    with pytest.raises(PlanFileError, match="does not compute"):
        synth_torch.ReductionPlan.from_document(saved)


@pytest.mark.parametrize("text", ["[" * 100000 + "]" * 100000, "{\"format\": 1" + "0" * 5000 + "}", "\xff\xfe",
                                  "", "null", "[]", '{"format": "synth-plan"}', '{"format": "synth-reduction"}'])
def test_unreadable_plan_files_are_refused_in_one_line(tmp_path, text):
    path = tmp_path / "plan.json"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(PlanFileError) as raised:
        synth_torch.load_plan(path)
    assert "\n" not in str(raised.value) and "plan.json" in str(raised.value)
