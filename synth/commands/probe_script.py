"""The probe script `synth probe` writes (its calls: synth/calibrate/probe.py), its torchrun
and srun launch lines, and the same calls as nccl-tests command lines."""

from __future__ import annotations

import json

from synth.calibrate.probe import FLAT_COLLECTIVES, PROBE_SIZES, devices_needed, launch_shape, probe_calls
from synth.errors import UsageError
from synth.topology import Topology

NCCL_TESTS = {"AllReduce": "all_reduce_perf", "ReduceScatter": "reduce_scatter_perf", "AllGather": "all_gather_perf",
              "Broadcast": "broadcast_perf", "AllToAll": "alltoall_perf"}


def launch_lines(topology: Topology, script: str, output: str) -> tuple[str, ...]:
    """torchrun and srun command lines for the script on the topology's system."""
    nodes, per_node = launch_shape(topology)
    return (
        f"torchrun --nnodes {nodes} --nproc-per-node {per_node} --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500 "
        f"{script} --out {output}",
        f"MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1) MASTER_PORT=29500 srun --nodes "
        f"{nodes} --ntasks-per-node {per_node} --gpus-per-node {per_node} python {script} --out {output}",
    )


def nccl_tests_lines(topology: Topology, sizes: tuple[int, ...] = PROBE_SIZES) -> tuple[str, ...]:
    """The same calls as nccl-tests runs under srun (one task per GPU): the flat calls, and the
    all-reduce of the node level (one task per node) and of one node."""
    nodes, per_node = launch_shape(topology)
    factor = round((sizes[-1] / sizes[0]) ** (1 / max(len(sizes) - 1, 1)))
    span = f"-b {sizes[0]} -e {sizes[-1]} -f {max(factor, 2)} -g 1"
    lines = [f"srun --nodes {nodes} --ntasks-per-node {per_node} ./build/{NCCL_TESTS[c]} {span}" for c in FLAT_COLLECTIVES]
    if nodes > 1:
        lines.append(f"srun --nodes {nodes} --ntasks-per-node 1 ./build/all_reduce_perf {span}")
    if per_node > 1:
        lines.append(f"srun --nodes 1 --ntasks-per-node {per_node} ./build/all_reduce_perf {span}")
    return tuple(lines)


def probe_script(topology: Topology, backend: str = "nccl", sizes: tuple[int, ...] = PROBE_SIZES,
                 script: str = "probe.py", output: str = "probe.csv") -> str:
    """The script's text: the calls as JSON, the launch lines in its docstring, and the runner."""
    if backend not in ("nccl", "gloo"):
        raise UsageError(f"backend {backend!r}: the probe runs nccl (GPUs) or gloo (CPUs)")
    if len(sizes) < 2 or any(size < 1 for size in sizes):
        raise UsageError(f"sizes {list(sizes)}: give at least two positive sizes (a floor and a bandwidth)")
    calls = [{"collective": c.collective, "level": c.level, "group_size": c.group_size,
              "ranks_per_unit": c.ranks_per_unit, "ranks": list(c.ranks)} for c in probe_calls(topology)]
    lines = "\n".join("    " + line for line in launch_lines(topology, script, output))
    tests = "\n".join("    " + line for line in nccl_tests_lines(topology, sizes))
    return _TEMPLATE.format(topology=topology.name, devices=devices_needed(topology), launch=lines, tests=tests,
                            calls=json.dumps(calls), sizes=json.dumps(list(sizes)), backend=backend)


_TEMPLATE = '''"""Probe of {topology} written by synth probe: times the calls that fix its unknowns and
writes them as CSV for `synth calibrate FILE --topology {topology}` ({devices} ranks).

Launch (rank r is device r of the topology, in its level order):
{launch}
With nccl-tests built, the same calls (calibrate reads their output too):
{tests}
"""
import argparse, csv, json, os, sys, time

import torch
import torch.distributed as dist

CALLS = {calls}
SIZES = {sizes}


def run(collective, group, nbytes, members, device):
    n = len(members)
    count = max(nbytes // (4 * n), 1) * n
    x = torch.ones(count, dtype=torch.float32, device=device)
    if collective == "AllReduce":
        return lambda: dist.all_reduce(x, group=group), count * 4
    if collective == "Broadcast":
        return lambda: dist.broadcast(x, src=members[0], group=group), count * 4
    part = torch.empty(count // n, dtype=torch.float32, device=device)
    if collective == "ReduceScatter":
        return lambda: dist.reduce_scatter_tensor(part, x, group=group), count * 4
    if collective == "AllGather":
        return lambda: dist.all_gather_into_tensor(x, part, group=group), count * 4
    y = torch.empty_like(x)
    return lambda: dist.all_to_all_single(y, x, group=group), count * 4


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="probe.csv")
    parser.add_argument("--backend", default="{backend}", choices=("nccl", "gloo"))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--sizes", help="comma-separated bytes (default: %(default)s)", default=",".join(map(str, SIZES)))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    env = os.environ
    rank = int(env.get("RANK", env.get("SLURM_PROCID", 0)))
    world = int(env.get("WORLD_SIZE", env.get("SLURM_NTASKS", 1)))
    local = int(env.get("LOCAL_RANK", env.get("SLURM_LOCALID", 0)))
    need = max(max(c["ranks"]) for c in CALLS) + 1
    if world < need:
        sys.exit(f"probe: {{world}} ranks launched, the topology needs {{need}}")
    env.setdefault("MASTER_PORT", "29500")
    dist.init_process_group(args.backend, rank=rank, world_size=world)
    device = torch.device("cuda", local) if args.backend == "nccl" else torch.device("cpu")
    if args.backend == "nccl":
        torch.cuda.set_device(device)
    sync = torch.cuda.synchronize if args.backend == "nccl" else (lambda: None)
    rows = []
    for call in CALLS:
        members = call["ranks"]
        group = dist.new_group(members)
        if rank not in members:
            continue
        for nbytes in sizes:
            step, used = run(call["collective"], group, nbytes, members, device)
            for _ in range(args.warmup):
                step()
            blocks = []  # the median of five blocks' means: a stall of the host does not make the figure
            for _ in range(5):
                sync()
                dist.barrier(group=group)
                start = time.perf_counter()
                for _ in range(max(args.iters // 5, 1)):
                    step()
                sync()
                blocks.append((time.perf_counter() - start) / max(args.iters // 5, 1))
            seconds = torch.tensor([sorted(blocks)[2]], dtype=torch.float64, device=device)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=group)
            rows.append([call["collective"], call["level"], call["group_size"], used, f"{{seconds.item():.9g}}",
                         args.backend, call["ranks_per_unit"]])
    if rank == 0:
        with open(args.out, "w", newline="") as f:
            f.write("# synth probe of {topology}: seconds per call, the slowest rank's median of five blocks of --iters / 5\\n")
            writer = csv.writer(f)
            writer.writerow(["collective", "level", "group_size", "bytes", "time_s", "backend", "ranks_per_unit"])
            writer.writerows(rows)
        print(f"probe: wrote {{len(rows)}} calls to {{args.out}}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''
