"""One process of the training check and benchmark (run as a script, one per rank, with the
interpreter synth and torch are installed in; under torchrun or in an emulated node).

A small MLP (layer sizes chosen so no DDP bucket is a multiple of the group size) is trained
for --steps steps with plain DDP, then again from the same initial parameters and data with
DDP and each plan's communication hook (synth.torch.HierarchicalReducer.ddp_hook). The
parameters after training are compared with plain DDP's; step times are timed after a barrier
(slowest rank). With --check-reduce the reducer is first held against dist.all_reduce on
tensors of awkward sizes in float32, bfloat16 and float16, sum and avg, several in flight.

Output (--json-out, rank 0): {"plain": {...}, "hooks": [{"plan": path, "max_abs_diff": ...,
"step_times": [...], "bucket_elements": [...], "summary": [...]}], "reduce_checks": [...]}.
Exit code 1 when a comparison fails.
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from synth.torch import HierarchicalReducer, load_plan

LAYERS = (37, 611, 449, 7)  # DDP buckets of 301156 elements (first step), then 3150, 274788, 611 and 22607
# (2 KiB cap): none a multiple of 8


def model_of(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers = []
    for fan_in, fan_out in zip(LAYERS, LAYERS[1:]):
        layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def batch(rank: int, step: int, size: int):
    generator = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(size, LAYERS[0], generator=generator)
    return x, torch.randn(size, LAYERS[-1], generator=generator)


def ddp_group(groups):
    """DDP's process group: this rank's reduction group (every rank creates every group), or
    the world when there is one group."""
    if len(groups) == 1:
        return None
    mine = None
    for group in groups:
        created = dist.new_group(ranks=list(group))
        if dist.get_rank() in group:
            mine = created
    return mine


def train(args, rank: int, hook=None, record=None, group=None):
    model = DistributedDataParallel(model_of(args.seed), bucket_cap_mb=args.bucket_cap_kb / 1024, process_group=group)
    if hook is not None:
        def recording_hook(state, bucket):
            record.append(bucket.buffer().numel())
            return hook(state, bucket)
        model.register_comm_hook(None, recording_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    times = []
    for step in range(args.warmup + args.steps):
        x, y = batch(rank, step, args.batch)
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if step >= args.warmup:
            times.append(float(elapsed))
    return [p.detach().clone() for p in model.module.parameters()], times


def fsdp_check(args, rank: int) -> dict:
    """FSDP2 sharding over the inner mesh dimension with the reducer's program as the
    all-reduce across replicas (`set_all_reduce_hook`), against native HSDP on the 2-D mesh
    (replicate, shard): the parameters after training must agree."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    names, sizes = zip(*(item.split("=") for item in args.fsdp_mesh.split(",")))
    mesh = init_device_mesh("cpu", tuple(map(int, sizes)), mesh_dim_names=names)
    reducer = HierarchicalReducer(load_plan(args.fsdp_plan), op="avg", mesh=mesh)

    def train_fsdp(custom: bool):
        torch.manual_seed(args.seed)
        model = torch.nn.Sequential(torch.nn.Linear(LAYERS[0], 61), torch.nn.Tanh(), torch.nn.Linear(61, LAYERS[-1]))
        if custom:
            fully_shard(model, mesh=mesh[names[1]])
            reducer.attach(model)
        else:
            fully_shard(model, mesh=mesh)  # native HSDP: replicate over names[0], shard over names[1]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for step in range(args.steps):
            x, y = batch(rank, step, args.batch)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        return [p.full_tensor().detach().clone() for p in model.parameters()]

    native, custom = train_fsdp(False), train_fsdp(True)
    diff = torch.tensor([max(float((a - b).abs().max()) for a, b in zip(native, custom))], dtype=torch.float64)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    summary = reducer.summary()
    reducer.close()
    return {"plan": os.path.basename(args.fsdp_plan), "max_abs_diff": float(diff), "ok": float(diff) <= args.atol,
            "summary": summary}


def reduce_checks(reducer: HierarchicalReducer, rank: int) -> list[dict]:
    """The reducer against dist.all_reduce: small integers (multiples of 1/8 after avg) make
    every partial sum exact in all three types, so the results must be equal."""
    n = reducer.group_size
    group = reducer.reduction_group
    sizes = (1, 7, n - 1, n, n + 3, 1000, 4099)
    results = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for op in ("sum", "avg"):
            reducer.op = op
            pending = []
            for size in sizes:  # expected values first, while the reducer's thread is idle
                generator = torch.Generator().manual_seed(rank * 7919 + size)
                tensor = torch.randint(-8, 9, (size,), generator=generator).to(dtype)
                expected = tensor.clone()
                if op == "avg":
                    expected.div_(n)
                dist.all_reduce(expected, group=group)
                pending.append([size, tensor, expected])
            for entry in pending:  # then all in flight at once
                entry.append(reducer.reduce_async(entry[1]))
            for size, tensor, expected, future in pending:
                value = future.wait()
                results.append({"dtype": str(dtype).removeprefix("torch."), "op": op, "size": size,
                                "same_storage": value.data_ptr() == tensor.data_ptr(),
                                "wrong": int((tensor != expected).sum())})
    reducer.op = "avg"
    return results


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--plans", nargs="+", required=True, help="ReductionPlan JSON files (ReductionPlan.save)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (trained, not timed)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--bucket-cap-kb", type=float, default=2.0, help="DDP bucket_cap_mb, in KiB")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mesh", help="NAME=SIZE,... : a DeviceMesh whose groups the reducer may reuse")
    parser.add_argument("--check-reduce", action="store_true")
    parser.add_argument("--fsdp-plan", help="a plan over the replicate axis: FSDP2 + set_all_reduce_hook vs HSDP")
    parser.add_argument("--fsdp-mesh", default="rep=4,shard=2", help="REPLICATE=SIZE,SHARD=SIZE")
    parser.add_argument("--atol", type=float, default=1e-5)
    parser.add_argument("--json-out")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = None
    if args.mesh:
        from torch.distributed.device_mesh import init_device_mesh

        names, sizes = zip(*(item.split("=") for item in args.mesh.split(",")))
        mesh = init_device_mesh("cpu", tuple(map(int, sizes)), mesh_dim_names=names)
    loaded = [load_plan(path) for path in args.plans]
    if len({plan.reduction_groups for plan in loaded}) != 1:
        parser.error("the plans must reduce over the same groups (one DDP process group)")
    group = ddp_group(loaded[0].reduction_groups)
    reducers = [HierarchicalReducer(plan, op="avg", mesh=mesh) for plan in loaded]
    report = {"world_size": dist.get_world_size(), "torch": torch.__version__, "steps": args.steps,
              "bucket_cap_kb": args.bucket_cap_kb, "threads": torch.get_num_threads()}
    failed = False
    if args.check_reduce:
        report["reduce_checks"] = checks = [dict(c, plan=path) for reducer, path in zip(reducers, args.plans)
                                            for c in reduce_checks(reducer, rank)]
        failed |= any(c["wrong"] or not c["same_storage"] for c in checks)
    if args.fsdp_plan:
        report["fsdp"] = fsdp_check(args, rank)
        failed |= not report["fsdp"]["ok"]
    plain, plain_times = train(args, rank, group=group)
    report["plain"] = {"step_times": plain_times, "median_step_s": statistics.median(plain_times)}
    report["hooks"] = []
    for reducer, path in zip(reducers, args.plans):
        buckets: list[int] = []
        params, times = train(args, rank, reducer.ddp_hook, buckets, group)
        diff = max(float((a - b).abs().max()) for a, b in zip(plain, params))
        # Every rank's parameters must also agree with rank 0's (DDP keeps replicas equal).
        spread = torch.tensor([diff], dtype=torch.float64)
        dist.all_reduce(spread, op=dist.ReduceOp.MAX)
        ok = float(spread) <= args.atol
        failed |= not ok
        report["hooks"].append({"plan": os.path.basename(path), "max_abs_diff": float(spread), "ok": ok,
                                "step_times": times, "median_step_s": statistics.median(times),
                                "bucket_elements": buckets, "summary": reducer.summary()})
        reducer.close()
    if rank == 0 and args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
