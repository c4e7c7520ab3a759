"""One rank of the `reducer.attach` checks (tests/test_torch_attach.py runs it under torchrun
with gloo on 4 CPU processes: a 2 x 2 mesh, replicate x shard).

--case train: FSDP2 sharded per layer (each Linear, then the root, with and without a
parameter of its own) with `reducer.attach(model)` against native HSDP on the 2-D mesh; the
reducer set by hand as an FSDP hook (the root-only hook of old instructions, which drifts when
the root owns no parameter), refused every way it can be given; the missing-hook and setup
errors; DDP with `attach` against native DDP; the timeout of the groups the reducer made.
--case disagree: ranks built from different plans, and rank 0 reducing float32 where the
others reduce bfloat16: both must raise RankDisagreementError on every rank, in seconds; then
rank 0 skips a reduction the others make (a tensor all have reduced before, so not compared):
they must fail after the reducer's timeout (5 s), not the backend's 30 minutes.

Rank 0 writes a JSON report to --json-out; the test reads and asserts on it.
"""

import argparse
import functools
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

try:
    import synth  # noqa: F401  (installed)
except ImportError:  # run from a checkout: the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synth.torch import (HandSetHookError, HierarchicalReducer, MissingReductionError, RankDisagreementError, ReducerSetupError,
                         load_plan)
from synth.torch.agreement import group_timeout

WIDTHS = (37, 61, 29, 7)  # odd sizes: shards and buckets are not multiples of the group size
STEPS = 4
STALL_TIMEOUT_S = 5


class Net(torch.nn.Module):
    """Linear layers (each sharded on its own) and a parameter of the root's own (unless
    `root_parameter` is False: then the root owns none, and FSDP drops a hook set on it)."""

    def __init__(self, seed: int, root_parameter: bool = True):
        super().__init__()
        torch.manual_seed(seed)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(WIDTHS, WIDTHS[1:]))
        self.offset = torch.nn.Parameter(torch.randn(WIDTHS[-1])) if root_parameter else None

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            x = layer(x)
            if index + 1 < len(self.layers):
                x = torch.tanh(x)
        return x if self.offset is None else x + self.offset


def batch(rank: int, step: int):
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, WIDTHS[0], generator=generator), torch.randn(8, WIDTHS[-1], generator=generator)


def shard_per_layer(model, mesh):
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def train(model, rank: int, steps: int = STEPS):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        x, y = batch(rank, step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return [p.full_tensor().detach().clone() if hasattr(p, "full_tensor") else p.detach().clone()
            for p in model.parameters()]


def train_accumulating(model, rank: int, steps: int = 2):
    """Two micro-batches per step, the first without gradient sync (FSDP reduces nothing and
    calls no hook), the second with it."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        optimizer.zero_grad()
        for micro in range(2):
            model.set_requires_gradient_sync(micro == 1)
            x, y = batch(rank, 2 * step + micro)
            torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def spread(a, b) -> float:
    """The largest |difference| between two parameter lists, over every rank."""
    diff = torch.tensor([max(float((x - y).abs().max()) for x, y in zip(a, b))], dtype=torch.float64)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    return float(diff)


def expect(error_class, action) -> str:
    """Run `action`; the message of the `error_class` it raises ('' if none)."""
    try:
        action()
    except error_class as error:
        return str(error)
    return ""


def case_train(args, rank: int) -> dict:
    report = {}
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("rep", "shard"))
    reducer = HierarchicalReducer(load_plan(args.fsdp_plan), op="avg", mesh=mesh)

    native = train(shard_per_layer(Net(0), mesh), rank)  # HSDP: replicate over rep, shard over shard
    model = shard_per_layer(Net(0), mesh["shard"])
    attachment = reducer.attach(model)
    attached = train(model, rank)
    report["fsdp"] = {"max_abs_diff": spread(native, attached), "modules": list(attachment.modules),
                      "backwards_checked": attachment.backwards_checked, "summary": reducer.summary()}
    native = train_accumulating(shard_per_layer(Net(0), mesh), rank)
    model = shard_per_layer(Net(0), mesh["shard"])
    attachment = reducer.attach(model)
    report["accumulating"] = {"max_abs_diff": spread(native, train_accumulating(model, rank)),
                              "backwards_checked": attachment.backwards_checked}

    # A root that owns no parameter: attach is exact against native HSDP; the reducer set by hand
    # as the root's hook (which FSDP would drop, leaving every layer unreduced) raises instead,
    # whichever way it is given, and so does a reducer FSDP calls other than through attach.
    native = train(shard_per_layer(Net(0, root_parameter=False), mesh), rank)
    model = shard_per_layer(Net(0, root_parameter=False), mesh["shard"])
    attachment = reducer.attach(model)
    report["no_root_parameter"] = {"max_abs_diff": spread(native, train(model, rank)),
                                   "modules": list(attachment.modules),
                                   "backwards_checked": attachment.backwards_checked}
    hand_set = {}
    model = shard_per_layer(Net(0, root_parameter=False), mesh["shard"])
    hand_set["attribute"] = expect(HandSetHookError, lambda: model.set_all_reduce_hook(reducer.fsdp_all_reduce_hook))
    hand_set["reducer"] = expect(HandSetHookError, lambda: model.set_all_reduce_hook(reducer))
    hand_set["method"] = expect(HandSetHookError, lambda: model.set_all_reduce_hook(reducer.reduce))
    hand_set["lambda"] = expect(HandSetHookError, lambda: model.set_all_reduce_hook(lambda t: reducer.reduce(t)))
    hand_set["partial"] = expect(HandSetHookError, lambda: model.layers[0].set_all_reduce_hook(
        functools.partial(HierarchicalReducer.reduce, reducer)))
    hand_set["hasattr"] = expect(HandSetHookError, lambda: hasattr(reducer, "fsdp_all_reduce_hook"))
    for layer in model.layers:  # past the setter, into FSDP's own field: raises when FSDP calls it
        layer._get_fsdp_state()._fsdp_param_groups[0]._all_reduce_hook = reducer.reduce
    hand_set["called_by_fsdp"] = expect(HandSetHookError, lambda: train(model, rank, 1))
    report["hand_set"] = hand_set

    # Attached to one layer only, or a layer's hook replaced after attach: an error at the end
    # of the first backward, on every rank.
    model = shard_per_layer(Net(0), mesh["shard"])
    reducer.attach(model.layers[0])
    report["missing_hook"] = expect(MissingReductionError, lambda: train(model, rank, 1))
    model = shard_per_layer(Net(0), mesh["shard"])
    reducer.attach(model)
    model.layers[1].set_all_reduce_hook(lambda tensor: None)
    report["replaced_hook"] = expect(MissingReductionError, lambda: train(model, rank, 1))

    # Setup errors, before training.
    report["hsdp_refused"] = expect(ReducerSetupError, lambda: reducer.attach(shard_per_layer(Net(0), mesh)))
    report["unsharded_refused"] = expect(ReducerSetupError, lambda: reducer.attach(Net(0)))
    partly = Net(0)
    fully_shard(partly.layers[0], mesh=mesh["shard"])
    report["loose_parameters_refused"] = expect(ReducerSetupError, lambda: reducer.attach(partly))
    report["ddp_group_refused"] = expect(ReducerSetupError, lambda: reducer.attach(DistributedDataParallel(Net(0))))

    # DDP over the replicas only (the plan's two reduction groups), with its own groups.
    group = reducer.ddp_process_group()
    native = train(DistributedDataParallel(Net(0), bucket_cap_mb=1 / 1024, process_group=group), rank)
    model = DistributedDataParallel(Net(0), bucket_cap_mb=1 / 1024, process_group=group)
    reducer.attach(model)
    report["ddp_replicas_diff"] = spread(native, train(model, rank))
    report["ddp_group_ranks"] = dist.get_process_group_ranks(group)
    reducer.close()

    # DDP over the world (one reduction group of 4) with attach, against native DDP.
    ddp_reducer = HierarchicalReducer(load_plan(args.ddp_plan), op="avg")
    native = train(DistributedDataParallel(Net(0), bucket_cap_mb=1 / 1024), rank)
    model = DistributedDataParallel(Net(0), bucket_cap_mb=1 / 1024, process_group=ddp_reducer.ddp_process_group())
    attachment = ddp_reducer.attach(model)
    report["ddp"] = {"max_abs_diff": spread(native, train(model, rank)), "kind": attachment.kind,
                     "summary": ddp_reducer.summary()}
    report["timeouts_s"] = sorted({group_timeout(group).total_seconds() for group in ddp_reducer.comms.groups})
    ddp_reducer.close()
    return report


def case_disagree(args, rank: int) -> dict:
    report = {}
    plans = [load_plan(path) for path in args.plans]
    start = time.perf_counter()
    report["plan_error"] = expect(RankDisagreementError,
                                  lambda: HierarchicalReducer(plans[1] if rank == 0 else plans[0]))
    report["plan_seconds"] = time.perf_counter() - start
    reducer = HierarchicalReducer(plans[0])
    tensor = torch.ones(1003, dtype=torch.float32 if rank == 0 else torch.bfloat16)
    start = time.perf_counter()
    report["dtype_error"] = expect(RankDisagreementError, lambda: reducer.reduce(tensor))
    report["dtype_seconds"] = time.perf_counter() - start
    report["untouched"] = bool((tensor == 1).all())  # refused before any change
    reducer.close()
    return report


def stall(args, rank: int) -> dict:
    """Ranks 1-3 reduce a tensor rank 0 never reduces: the groups are broken afterwards."""
    reducer = HierarchicalReducer(load_plan(args.plans[0]), timeout=timedelta(seconds=STALL_TIMEOUT_S))
    tensor = torch.ones(1000)
    reducer.reduce(tensor)  # every rank: the signature is agreed
    dist.barrier()
    if rank == 0:
        return {"rank": rank}
    start = time.perf_counter()
    try:
        reducer.reduce(tensor)
        error = ""
    except RuntimeError as failure:
        error = str(failure)[:300]
    return {"rank": rank, "error": error, "seconds": time.perf_counter() - start}


def collect(path: str, rank: int, result: dict, world: int, wait_s: float = 120.0) -> list[dict]:
    """Every rank's result through files beside `path` (the process groups may be broken)."""
    # Written whole, then renamed: another rank never reads a file half written.
    partial = Path(f"{path}.{rank}.partial")
    partial.write_text(json.dumps(result), encoding="utf-8")
    os.replace(partial, f"{path}.{rank}")
    deadline = time.monotonic() + wait_s  # every rank waits: none closes its sockets on the others early
    results = []
    for other in range(world):
        while not Path(f"{path}.{other}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        results.append(json.loads(Path(f"{path}.{other}").read_text()) if Path(f"{path}.{other}").exists() else None)
    return results


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=("train", "disagree"), required=True)
    parser.add_argument("--fsdp-plan")
    parser.add_argument("--ddp-plan")
    parser.add_argument("--plans", nargs="*", default=[])
    parser.add_argument("--timeout-s", type=float, default=20.0, help="init_process_group's timeout")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout_s))
    rank = dist.get_rank()
    report = case_train(args, rank) if args.case == "train" else case_disagree(args, rank)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, report)
    if args.case == "disagree":
        stalled = collect(args.json_out, rank, stall(args, rank), dist.get_world_size())
        if rank == 0:
            with open(args.json_out, "w", encoding="utf-8") as handle:
                json.dump({"ranks": gathered, "stall": stalled}, handle, indent=1)
        sys.stdout.flush()
        os._exit(0)  # the groups are broken: no barrier, no destroy
    if rank == 0 and args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as handle:
            json.dump({"ranks": gathered}, handle, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
