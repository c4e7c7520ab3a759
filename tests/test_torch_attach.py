"""`reducer.attach(model)` for real, under torchrun with gloo on 4 CPU processes (a 2 x 2 mesh,
replicate x shard): FSDP2 sharded per layer against native HSDP, DDP against native DDP, the
error when a backward leaves sharded modules unreduced, the groups' timeout, and ranks that
disagree on the program failing at once instead of hanging (tests/torch_attach_worker.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import synth.torch as st

WORKER = Path(__file__).resolve().parent / "torch_attach_worker.py"
RS_AG = "ReduceScatter(InsideGroup(node)); AllGather(InsideGroup(node))"
RS_AR_AG = "ReduceScatter(InsideGroup(gpu)); AllReduce(Parallel(node)); AllGather(InsideGroup(gpu))"
R_M_B = "Reduce(InsideGroup(gpu)); AllReduce(Master(node)); Broadcast(InsideGroup(gpu))"
TIMEOUT_S = 20  # init_process_group's timeout in the worker


def run(tmp_path, args, timeout):
    pytest.importorskip("torch")
    from synth.execute.launch import torchrun

    result = torchrun(WORKER, 4, args, timeout=timeout)
    assert result.returncode == 0, result.log[-6000:]
    return result.report["ranks"]


def test_errors_import_without_torch():
    assert issubclass(st.ReducerSetupError, ValueError)
    assert issubclass(st.MissingReductionError, RuntimeError) and issubclass(st.RankDisagreementError, RuntimeError)


def test_the_agreement_signature_is_the_same_on_every_rank():
    """What ranks compare must not depend on the process: a digest of the plan's document (not
    Python's salted hash), types by a fixed code."""
    torch = pytest.importorskip("torch")
    from synth.torch import agreement

    plan = st.plan_reduction("node=2,gpu=2", "data=4", "data", [[2, 2]], programs=RS_AR_AG)
    document = plan.to_document()
    assert agreement.digest(document) == agreement.digest(dict(reversed(list(document.items()))))
    assert 0 <= agreement.digest(document) < 2**63
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert agreement.dtype_name(agreement.dtype_code(dtype)) == str(dtype).removeprefix("torch.")


@pytest.mark.torchrun
def test_attach_trains_like_native_hsdp_and_ddp_and_refuses_what_would_drift(tmp_path):
    # replicate over nodes (rep), shard inside each node: the plan reduces over rep
    plan = st.plan_reduction("node=2,gpu=2", "rep=2,shard=2", "rep", [[2, 1], [1, 2]], programs=RS_AG)
    plan.save(tmp_path / "fsdp.json")
    st.plan_reduction("node=2,gpu=2", "data=4", "data", [[2, 2]], programs=RS_AR_AG).save(tmp_path / "ddp.json")
    ranks = run(tmp_path, ["--case", "train", "--fsdp-plan", str(tmp_path / "fsdp.json"),
                           "--ddp-plan", str(tmp_path / "ddp.json"), "--timeout-s", str(TIMEOUT_S)], timeout=600)
    for report in ranks:
        fsdp = report["fsdp"]
        assert fsdp["max_abs_diff"] <= 1e-6, fsdp
        assert fsdp["modules"] == ["", "layers.0", "layers.1", "layers.2"] and fsdp["backwards_checked"] == 4
        # the root's parameter and every layer's went through the program: 4 tensors per step
        assert sum(int(line.split()[0]) for line in fsdp["summary"] if "by program" in line) >= 4 * 4
        # gradient accumulation: a backward without sync reduces nothing, and that is no error
        assert report["accumulating"]["max_abs_diff"] <= 1e-6 and report["accumulating"]["backwards_checked"] == 4
        # a root that owns no parameter: attach exact; the hook set by hand (which FSDP drops on such
        # a root, leaving the layers unreduced) raises, however it is given
        alone = report["no_root_parameter"]
        assert alone["max_abs_diff"] <= 1e-6 and alone["backwards_checked"] == 4, alone
        assert alone["modules"] == ["", "layers.0", "layers.1", "layers.2"]
        hand_set = report["hand_set"]
        for way in ("attribute", "hasattr", "reducer", "method", "lambda", "partial", "called_by_fsdp"):
            assert "set by hand" in hand_set[way] and "reducer.attach(model)" in hand_set[way], (way, hand_set)
        assert "'<root>', 'layers.1', 'layers.2' have no all-reduce hook" in report["missing_hook"]
        assert "this backward reduced 1 module(s): 'layers.0'" in report["missing_hook"]
        assert "'layers.1' has another hook" in report["replaced_hook"]
        assert "2-D mesh" in report["hsdp_refused"]
        assert "no fully_shard module" in report["unsharded_refused"]
        assert "'layers.1.weight'" in report["loose_parameters_refused"]
        assert "process_group=reducer.ddp_process_group()" in report["ddp_group_refused"]
        assert report["ddp_replicas_diff"] <= 1e-6 and len(report["ddp_group_ranks"]) == 2, report
        assert report["ddp"]["max_abs_diff"] <= 1e-6 and report["ddp"]["kind"] == "ddp", report["ddp"]
        assert report["timeouts_s"] == [TIMEOUT_S]  # the default group's, not gloo's 30 minutes
        assert f"timeout 0:00:{TIMEOUT_S}" in report["ddp"]["summary"][1]


@pytest.mark.torchrun
def test_ranks_that_disagree_fail_at_once_instead_of_hanging(tmp_path):
    """One rank reduces float32 where the others reduce bfloat16: every rank raises
    RankDisagreementError naming both sides, in seconds, though the job's timeout is 10
    minutes; so do ranks built from different plans. Ranks that diverge later fail after the
    reducer's timeout."""
    st.plan_reduction("node=2,gpu=2", "data=4", "data", [[2, 2]], programs=RS_AR_AG).save(tmp_path / "a.json")
    st.plan_reduction("node=2,gpu=2", "data=4", "data", [[2, 2]], programs=R_M_B).save(tmp_path / "b.json")
    pytest.importorskip("torch")
    from synth.execute.launch import torchrun

    result = torchrun(WORKER, 4, ["--case", "disagree", "--plans", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                                  "--timeout-s", "600"], timeout=300)
    assert result.returncode == 0, result.log[-6000:]
    for report in result.report["ranks"]:
        assert "rank 0: plan" in report["plan_error"] and "ranks 1, 2, 3: plan" in report["plan_error"], report
        assert "rank 0: 1003 float32 elements" in report["dtype_error"], report["dtype_error"]
        assert "ranks 1, 2, 3: 1003 bfloat16 elements" in report["dtype_error"], report["dtype_error"]
        assert report["untouched"]
        assert report["plan_seconds"] < 10 and report["dtype_seconds"] < 10, report
    # Ranks that agreed and then diverge (rank 0 skips a reduction the others make) are stopped
    # by the reducer's timeout (5 s here; by default the job's), not the backend's 30 minutes.
    for stalled in result.report["stall"][1:]:
        assert "Timed out" in stalled["error"] and 4 <= stalled["seconds"] < 60, stalled
