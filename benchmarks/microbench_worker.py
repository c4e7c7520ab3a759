"""One process of the collective microbenchmarks (run as a script, one per device, with the
interpreter synth is installed in).

Every case is one group running alone: all ranks create its communicator (new_group must be
called by every rank), its members time the collective while the others wait at a world
barrier, so the time is the group's own, as calibration models it. The calls are the ones
the exported scripts make (synth/export/torch_runtime.py): in place on a float32 buffer of B
bytes, ReduceScatter's input and AllGather's output being the whole buffer, roots at member 0
(the calls themselves are torch_runtime.call_collective).

Output (--json-out, rank 0): {"cases": [{..case.., "times": {bytes: [seconds per rep]}}]},
each rep the slowest member's mean over --iters calls.
"""

import argparse
import json
import time

import torch
import torch.distributed as dist

from synth.export.torch_runtime import call_collective

def run_case(case, rank, world, iters, warmup, reps):
    ranks = case["ranks"]
    group = dist.new_group(ranks=ranks)
    size = len(ranks)
    times = {}
    for nbytes in case["sizes"]:
        count = max(size, -(-nbytes // (4 * size)) * size)
        elapsed = torch.zeros(reps, dtype=torch.float64)
        if rank in ranks:
            key = ranks.index(rank)
            buffer = torch.ones(count, dtype=torch.float32)
            for _ in range(warmup):
                call_collective(case["collective"], buffer, group, size, key, 0)
            for rep in range(reps):
                dist.barrier(group=group)
                start = time.perf_counter()
                for _ in range(iters):
                    call_collective(case["collective"], buffer, group, size, key, 0)
                elapsed[rep] = (time.perf_counter() - start) / iters
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # over the world: idle ranks give 0
        times[str(count * 4)] = elapsed.tolist()
    return dict(case, times=times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", required=True, help="JSON file: a list of cases")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json-out")
    args = parser.parse_args()
    with open(args.cases, encoding="utf-8") as handle:
        cases = json.load(handle)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = []
    for case in cases:
        results.append(run_case(case, rank, world, args.iters, args.warmup, args.reps))
        if rank == 0:
            print(f"{case['collective']} {case['level']} {case['ranks']}: done", flush=True)
    if rank == 0 and args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as handle:
            json.dump({"torch": torch.__version__, "world_size": world, "iters": args.iters, "warmup": args.warmup,
                       "reps": args.reps, "cases": results}, handle, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
