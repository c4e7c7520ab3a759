"""synth.torch: plans (without torch), and training for real under torchrun with gloo on 8
processes: plain DDP against DDP with the reducer's hook for a reduce-scatter/all-reduce/
all-gather program, a reduce/master/broadcast one and a best-program-per-size plan (buckets of
301156, 3150, 274788, 611 and 22607 elements, none a multiple of the group size of 8), the
reducer against all_reduce in three types, and FSDP2 with the hook against native HSDP."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import synth.torch as st
from export_cases import CASES, programs_of
from synth.errors import InvalidProgramError, UsageError
from synth.export import json_plan
from synth.export.plan import PlanEntry, build_plan
from synth.export.provenance import Provenance, hierarchy_metadata, placement_metadata
from synth.topology import topology_from_levels

RS_AR_AG = "ReduceScatter(InsideGroup(gpu)); AllReduce(Parallel(node)); AllGather(InsideGroup(gpu))"
R_M_B = "Reduce(InsideGroup(gpu)); AllReduce(Master(node)); Broadcast(InsideGroup(gpu))"
WORKER = Path(__file__).resolve().parent.parent / "benchmarks" / "training_worker.py"


# --- plans, without torch -----------------------------------------------------------------------


def test_importing_the_plans_does_not_import_torch():
    code = "import sys, synth.torch; synth.torch.plan_reduction('node=2,gpu=4', 'data=8', 'data', [[2, 4]], " \
           f"programs={RS_AR_AG!r}); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_given_program_runs_at_every_size_and_round_trips(tmp_path):
    plan = st.plan_reduction("node=2,gpu=4", "data=8", "data", "[[2,4]]", programs=RS_AR_AG)
    assert plan.world_size == 8 and plan.group_size == 8
    assert plan.reduction_groups == (tuple(range(8)),)
    assert {plan.program_for(size) for size in (0, 1, 10**6, 2**40)} == {0}
    assert st.load_plan(plan.save(tmp_path / "p.json")) == plan


def test_a_json_plan_export_gives_the_plan_it_was_made_from(tmp_path):
    """load_plan reads `synth export --format json` back into the same per-rank calls."""
    for case in CASES:
        programs = list(programs_of(case, 3))[:12]
        plan = build_plan(PlanEntry(case.built, program) for program in programs)
        metadata = placement_metadata(topology_from_levels(case.levels), case.built.placement)
        metadata.update(hierarchy_metadata(case.built))
        path = tmp_path / f"{case.name}.json"
        path.write_text(json_plan.render(plan, Provenance(("t",)), metadata, 3000))
        for index in (0, len(programs) - 1):
            loaded = st.load_plan(path, program=index)
            assert loaded.plan == plan, case.name
            assert loaded.reduction_groups == tuple(map(tuple, case.built.groups))
            assert loaded.program_for(12345) == index


def test_best_by_size_follows_the_ranking():
    """Each range's program is the ranking's first at both ends of the range, and the next
    range's start is where the first place changes (checked one byte either side)."""
    from synth.search import BestPrograms
    from synth.model.context import cost_context
    from synth.hierarchy import build_hierarchy
    from synth.placement import make_placement, parse_axes
    from synth.topology_file import load_topology

    topology = load_topology("emu-2x4")
    hierarchy = build_hierarchy(make_placement(topology, parse_axes("data=8"), [[2, 4]]), ("data",))
    plan = st.best_by_size(hierarchy, topology, "gloo", max_len=3, min_bytes=1024, max_bytes=2**20)
    best = BestPrograms(cost_context(hierarchy, topology, "gloo"), 3)
    assert len(plan.ranges) >= 2, plan.describe()
    texts = [program.text for program in plan.plan.programs]
    for index, size_range in enumerate(plan.ranges):
        start = max(size_range.min_bytes, 1024)
        assert str(best.best(start).program) == texts[size_range.program]
        if index + 1 < len(plan.ranges):
            end = plan.ranges[index + 1].min_bytes - 1
            assert str(best.best(end).program) == texts[size_range.program]
            assert str(best.best(end + 1).program) != texts[size_range.program]


def test_size_thresholds_finds_every_change_of_a_step_function():
    table = [(0, "a"), (37, "b"), (38, "c"), (1000, "a"), (4097, "d")]

    def choose(size):
        return [text for start, text in table if start <= size][-1]

    assert st.size_thresholds(choose, 1, 10**4) == [(1, "a"), (37, "b"), (38, "c"), (1000, "a"), (4097, "d")]


@pytest.mark.parametrize("call, fragment", [
    (lambda: st.plan_reduction("node=2,gpu=4", "data=8", "data", [[2, 4]]), "no link figures"),
    (lambda: st.plan_reduction("node=2,gpu=4", "data=4,model=2", "pipe", [[2, 2], [1, 2]], programs="AllReduce(InsideGroup(gpu))"), "unknown axis"),
    (lambda: st.plan_reduction("node=2,gpu=4", "data=8", "data", [[4, 2]], programs=RS_AR_AG), "placement|matrix|column|level"),
    (lambda: st.load_plan("/nonexistent/plan.json"), "cannot read the plan"),
])
def test_bad_plans_are_refused_in_one_line(call, fragment):
    with pytest.raises(UsageError, match=fragment):
        call()


def test_an_invalid_program_is_refused():
    with pytest.raises(InvalidProgramError):
        st.plan_reduction("node=2,gpu=4", "data=8", "data", [[2, 4]], programs="AllReduce(InsideGroup(gpu))")


# --- training for real --------------------------------------------------------------------------


@pytest.mark.torchrun
def test_ddp_with_the_hook_trains_like_plain_ddp(tmp_path):
    pytest.importorskip("torch")
    from synth.execute.launch import torchrun

    plans = {
        "rs-ar-ag.json": st.plan_reduction("node=2,gpu=4", "data=8", "data", [[2, 4]], programs=RS_AR_AG),
        "reduce-master-broadcast.json": st.plan_reduction("node=2,gpu=4", "data=8", "data", [[2, 4]], programs=R_M_B),
        "best-by-size.json": st.plan_reduction("emu-2x4", "data=8", "data", [[2, 4]], backend="gloo", max_len=3),
    }
    for name, plan in plans.items():
        plan.save(tmp_path / name)
    assert len({r.program for r in plans["best-by-size.json"].ranges}) >= 2
    st.plan_reduction("node=2,gpu=4", "rep=4,shard=2", "rep", [[2, 2], [1, 2]], programs=RS_AR_AG).save(tmp_path / "hsdp.json")
    args = ["--plans", *(str(tmp_path / name) for name in plans), "--mesh", "node=2,gpu=4", "--check-reduce",
            "--steps", "3", "--fsdp-plan", str(tmp_path / "hsdp.json"), "--fsdp-mesh", "rep=4,shard=2"]
    result = torchrun(WORKER, 8, args, timeout=900)
    assert result.returncode == 0, result.log[-6000:]
    report = result.report
    checks = report["reduce_checks"]
    assert len(checks) == 3 * 3 * 2 * 7 and not [c for c in checks if c["wrong"] or not c["same_storage"]]
    assert {c["dtype"] for c in checks} == {"float32", "bfloat16", "float16"}
    assert report["fsdp"]["ok"], report["fsdp"]
    for hook in report["hooks"]:
        assert hook["ok"] and hook["max_abs_diff"] <= 1e-5, hook
        buckets = set(hook["bucket_elements"])
        assert len(buckets) >= 3 and all(size % 8 for size in buckets), buckets
    by_name = {hook["plan"]: hook for hook in report["hooks"]}
    from synth.torch.reducer import describe_summary

    assert "communicator 1 = dimension gpu, communicator 2 = dimension node" in \
        describe_summary(by_name["rs-ar-ag.json"]["summary"]).splitlines()[0]
    used = by_name["best-by-size.json"]["summary"]["programs"]
    assert len(used) >= 2, used  # buckets of different sizes ran different programs
    (tmp_path / "report.json").write_text(json.dumps(report))


@pytest.mark.slow  # the two halves run apart in the default suite: DDP with the hook above, bench on an emulated cluster in test_emulate.py
@pytest.mark.emulate
@pytest.mark.torchrun
def test_ddp_with_the_hook_on_the_emulated_cluster():
    """Every rank in its node's namespace of an emulated emu-2x4 (links shaped with tc): DDP
    with the hooks trains like plain DDP (the worker exits 1 otherwise) and step times are
    measured for each (benchmarks/training.py writes them to results/ when run on purpose)."""
    pytest.importorskip("torch")
    from benchmarks import training

    reason = training.problem()
    if reason:
        pytest.skip(reason)
    results, scale = training.run("emu-2x4", 1 / 64, 2, training.CALIBRATED, cases=training.CASES[1:])
    (name, report, configurations), = results
    assert scale == 1 / 64 and len(configurations) == len(report["hooks"]) == 4
    assert report["plain"]["median_step_s"] > 0
    assert all(hook["ok"] and hook["median_step_s"] > 0 for hook in report["hooks"])


def test_the_background_thread_is_stopped_at_exit():
    """A daemon thread Python abandons at exit while it is inside torch's C++ frames aborts the
    process (seen on about one run in four of docs/training.md's DDP script): the reducer stops
    its thread at exit, before Python abandons it, as `close()` does."""
    torch = pytest.importorskip("torch")
    from datetime import timedelta

    reducer = object.__new__(st.HierarchicalReducer)
    reducer._worker, reducer.timeout = None, timedelta(seconds=30)
    reducer._reduce_now = lambda tensor: tensor.mul_(2)
    future = torch.futures.Future()
    reducer._submit(torch.ones(3), future)
    assert future.wait().tolist() == [2.0, 2.0, 2.0]
    assert reducer._stopper.atexit and reducer._worker.is_alive()
    reducer._stopper()  # what the interpreter runs at exit
    assert not reducer._worker.is_alive()
