"""Runtime of exported torch scripts: copied verbatim into every script after its header,
followed by the plan as a JSON literal. It imports torch and the standard library only, so a
script runs on a cluster where synth is not installed.

    torchrun --nproc-per-node N SCRIPT [--backend nccl|gloo] [--bytes S ...] [-b MIN -e MAX -f F]
             [-n ITERS] [-w WARMUP] [-d float|half|bfloat16] [--check] [--json-out PATH]

Every rank creates every communicator of the plan once, in plan order (torch requires all
ranks to create all groups in one order), then runs each program in place on one buffer,
step by step: each rank makes the one call the plan gives it, with the plan's chunk range,
its block for ReduceScatter/AllGather, and the root as a rank inside the group; idle ranks
skip the step; a Permute step reorders the rank's buffer locally. With --check the result is
compared with the program's collective (a plain all_reduce, or torch's reduce_scatter_tensor,
all_gather_into_tensor, all_to_all_single, broadcast, reduce) on the same input over the
reduction groups; a mismatch makes the exit code 1. Output is nccl-tests' table (size, count,
type, redop, root, then time, algbw, busbw and #wrong out of place and in place, "Avg bus
bandwidth" last), algbw = S / t and busbw = algbw * 2(n-1)/n (the collective's own nccl-tests
factor for the other goals), n the reduction group size; t is the slowest rank's mean time per run. Programs and torch's
all_reduce run in place only, so their out-of-place columns read N/A.

Several ranks may share one GPU (NCCL): each then gets its own NCCL_HOSTID, so NCCL treats
them as separate hosts and connects them over sockets, as it refuses two ranks of one host on
one device otherwise; times are then those of that transport, useful to check, not to tune.
"""

import argparse
import inspect
import json
import os
import re
import sys
import time
from datetime import timedelta
from fractions import Fraction

import torch
import torch.distributed as dist

MAX_BYTES = 2**50
_NUMBER = re.compile(r"\s*([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*(.*?)\s*\Z", re.DOTALL)
_UNIT = re.compile(r"(?:([kKMGTP])(i?))?B\Z")
_FLAG_UNIT = re.compile(r"[kKmMgGtTpP]i?B?\Z")


def parse_flag_size(text):
    """-b/-e: a size as nccl-tests' own -b/-e read it ('1MB' is 2^20)."""
    return parse_size(text, nccl_tests=True)


def parse_size(text, nccl_tests=False):
    """Bytes, as synth's own --bytes reads them (synth/units.py, held equal by the tests):
    nccl-tests' '8M', '1G' (a bare K, M, G or T in either case: binary), '64KiB', '32MiB'
    (binary), '1MB' (decimal), '1048576'; a whole number of bytes from 1 to 1 PiB.
    `nccl_tests` (-b/-e, nccl-tests' flags): the letter decides, '1MB' is 2^20 as there."""
    match = _NUMBER.match(text)
    unit = match.group(2) if match else None
    if match and nccl_tests and _FLAG_UNIT.match(unit):
        scale = 2 ** (10 * ("kmgtp".index(unit[0].lower()) + 1))
    elif match and unit in tuple("kKmMgGtT"):
        scale = 2 ** (10 * ("kmgt".index(unit.lower()) + 1))
    elif match and unit == "":
        scale = 1
    elif match and _UNIT.match(unit):
        prefix, binary = _UNIT.match(unit).groups()
        power = 0 if prefix is None else "KMGTP".index(prefix.upper()) + 1
        scale = (1024 if binary else 1000) ** power
    else:
        raise argparse.ArgumentTypeError(f"invalid size {text[:40]!r}: give bytes, e.g. 1048576, 32M or 32MiB")
    number = float(match.group(1))
    if not 0 < number * scale <= MAX_BYTES:
        raise argparse.ArgumentTypeError(f"invalid size {text[:40]!r}: give from 1 byte to 1 PiB")
    value = Fraction(match.group(1)) * scale
    if value.denominator != 1:
        raise argparse.ArgumentTypeError(f"invalid size {text[:40]!r}: not a whole number of bytes")
    return int(value)


DTYPES = {"float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16}  # nccl-tests' -d names


def parse_args(argv):
    parser = argparse.ArgumentParser(description="Run synthesized collective programs (see the header).")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default=None,
                        help="default: nccl when CUDA is available, else gloo")
    parser.add_argument("--bytes", type=parse_size, action="append", default=[], metavar="S",
                        help="buffer size per device, e.g. 32M (binary, as nccl-tests), 32MiB or 33554432; "
                             "repeatable (default 32M)")
    parser.add_argument("-b", "--minbytes", type=parse_flag_size,
                        help="smallest size of a sweep (nccl-tests -b: 1M, 1MB and 1MiB are all 2^20)")
    parser.add_argument("-e", "--maxbytes", type=parse_flag_size, help="largest size of a sweep (nccl-tests -e)")
    parser.add_argument("-f", "--stepfactor", type=int, default=2, help="sweep factor (nccl-tests -f, default 2)")
    parser.add_argument("-n", "--iters", type=int, default=20, help="timed runs per size (nccl-tests -n, default 20)")
    parser.add_argument("-w", "--warmup", type=int, default=5,
                        help="untimed runs before timing (nccl-tests -w, default 5)")
    parser.add_argument("-d", "--dtype", choices=sorted(DTYPES), default="float",
                        help="element type (nccl-tests -d names; default float)")
    parser.add_argument("--check", action="store_true", help="compare with a plain all_reduce; exit 1 on mismatch")
    parser.add_argument("--json-out", metavar="PATH", help="rank 0 writes every row here as JSON")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="how long a collective waits for the other ranks before it fails, for the default "
                             "group and every group the script creates (default: the backend's, 10 or 30 minutes)")
    args = parser.parse_args(argv)
    if args.timeout is not None and not 0 < args.timeout < float("inf"):
        parser.error(f"--timeout {args.timeout} must be a positive number of seconds")
    if args.iters < 1 or args.warmup < 0 or args.stepfactor < 2:
        parser.error("-n/--iters must be >= 1, -w/--warmup >= 0 and -f >= 2")
    if (args.minbytes is None) != (args.maxbytes is None):
        parser.error("give -b and -e together")
    if args.minbytes is not None and args.bytes:
        parser.error("give either --bytes or -b/-e/-f")
    if args.minbytes is not None and args.minbytes > args.maxbytes:
        parser.error(f"-b {args.minbytes} is larger than -e {args.maxbytes}")
    return args


def sizes_of(args):
    if args.minbytes is not None:
        sizes, size = [], args.minbytes
        while size <= args.maxbytes:
            sizes.append(size)
            size *= args.stepfactor
        return sizes
    return args.bytes or [32 * 2**20]


def element_count(nbytes, chunks, itemsize=4):
    """The smallest multiple of `chunks` elements holding nbytes: chunks are whole elements."""
    per_chunk = max(1, -(-nbytes // (itemsize * chunks)))
    return per_chunk * chunks


_NEW_GROUP = inspect.signature(dist.new_group).parameters


def _named(description):
    """Keep the member order the plan gives (group rank = key) and name the group, where
    this torch version has those options."""
    options = {"group_desc": description} if "group_desc" in _NEW_GROUP else {}
    if "sort_ranks" in _NEW_GROUP:
        options["sort_ranks"] = False
    return options


class Communicators:
    """Every communicator set of the plan, created once by every rank in plan order; each
    rank keeps the one group it belongs to (None where it is idle). `existing` maps a set's
    index to this rank's group in it where the caller already has one (a DeviceMesh's group
    with the same members in the same order): nothing is created for those sets. `timeout`
    (a timedelta) is given to every group created; without it torch gives each the backend's
    default (30 minutes), not the timeout the job's default group was started with."""

    def __init__(self, plan, backend, rank, existing=None, timeout=None):
        self.rank = rank
        self.groups = []
        self.created = 0
        existing = existing or {}
        # split_group numbers each group by global rank; the check below guards that order.
        split = backend == "nccl" and hasattr(dist, "split_group")
        timed = {} if timeout is None else {"timeout": timeout}
        for index, comm in enumerate(plan["communicators"]):
            mine = existing.get(index)
            if index in existing:
                pass
            elif split:
                # NCCL: ncclCommSplit of the world communicator, one call per set.
                mine = dist.split_group(split_ranks=comm, group_desc=f"synth_comm{index}", **timed)
                self.created += 1
            else:
                for color, ranks in enumerate(comm):
                    group = dist.new_group(ranks=ranks, **timed, **_named(f"synth_comm{index}_{color}"))
                    self.created += 1
                    if rank in ranks:
                        mine = group
            if mine is not None:
                key = [ranks for ranks in comm if rank in ranks][0].index(rank)
                if dist.get_group_rank(mine, rank) != key:
                    raise RuntimeError(f"communicator {index}: rank {rank} got group rank "
                                       f"{dist.get_group_rank(mine, rank)}, the plan needs {key}")
            self.groups.append(mine)

    def __getitem__(self, index):
        return self.groups[index]


_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_GROUP_ROOTS = "group_dst" in inspect.signature(dist.reduce).parameters


def _all_reduce(span, group, block, key, root):
    dist.all_reduce(span, group=group)


def _reduce_scatter(span, group, block, key, root):
    _REDUCE_SCATTER(span[key * block:(key + 1) * block], span, group=group)


def _all_gather(span, group, block, key, root):
    _ALL_GATHER(span, span[key * block:(key + 1) * block], group=group)


def _reduce(span, group, block, key, root):
    if _GROUP_ROOTS:
        dist.reduce(span, group=group, group_dst=root)
    else:
        dist.reduce(span, dst=dist.get_global_rank(group, root), group=group)


def _broadcast(span, group, block, key, root):
    if _GROUP_ROOTS:
        dist.broadcast(span, group=group, group_src=root)
    else:
        dist.broadcast(span, src=dist.get_global_rank(group, root), group=group)


def _all_to_all(span, group, block, key, root):
    # all_to_all_single with equal splits: block j goes to member j, block i comes from member i;
    # it cannot work in place, so it receives into a copy and copies back.
    received = torch.empty_like(span)
    dist.all_to_all_single(received, span.clone(), group=group)
    span.copy_(received)


# One call per collective record of synth/collectives.py (a test keeps the two in step).
CALLS = {"AllReduce": _all_reduce, "ReduceScatter": _reduce_scatter, "AllGather": _all_gather,
         "Reduce": _reduce, "Broadcast": _broadcast, "AllToAll": _all_to_all}


def call_collective(collective, span, group, size, key, root):
    """One in-place call on `span`: this rank is member `key` of `size`, `root` the root's
    rank inside the group; ReduceScatter keeps, AllGather contributes, block `key`."""
    if collective not in CALLS:
        raise RuntimeError(f"unknown collective {collective!r}")
    CALLS[collective](span, group, span.numel() // size, key, root)


def permute(buffer, chunk, places):
    """A Permute step: the chunk at place p moves to place places[p] (a local copy at memory
    bandwidth). Chunks a rank does not hold move too: they carry nothing the program reads."""
    moved = torch.empty_like(buffer)
    moved.view(len(places), chunk)[torch.tensor(places, device=buffer.device)] = buffer.view(len(places), chunk)
    buffer.copy_(moved)


def run_step(step, buffer, chunk, comms, rank):
    if "places" in step:
        permute(buffer, chunk, step["places"])
        return
    call = step["calls"][rank]
    if call is None:
        return  # idle in this step (a Master step's non-masters)
    color, key, size, lo, hi, root = call
    call_collective(step["op"], buffer[lo * chunk:hi * chunk], comms[step["comm"]], size, key, root)


def run_program(program, buffer, chunk, comms, rank):
    for step in program["steps"]:
        run_step(step, buffer, chunk, comms, rank)


def fill(buffer, rank):
    """Small integers (exact in float32, float16 and bfloat16 sums of up to 16 ranks),
    different per rank and per element."""
    index = torch.arange(buffer.numel(), dtype=torch.int64)
    values = (index * 7 + rank * 13 + (index // 5) * rank) % 17 - 8
    buffer.copy_(values.to(buffer.dtype))


def _flat_reduce_scatter(buffer, group, block, key, root):
    _REDUCE_SCATTER(buffer[key * block:(key + 1) * block], buffer.clone(), group=group)


def _flat_all_gather(buffer, group, block, key, root):
    _ALL_GATHER(buffer, buffer[key * block:(key + 1) * block].clone(), group=group)


# Each goal's flat call, by the torch call the plan names for it (its "flat" facts, written
# from synth's goal objects): in place on the whole buffer, out of a copy where torch needs one.
FLAT_CALLS = {"all_reduce": _all_reduce, "reduce_scatter_tensor": _flat_reduce_scatter,
              "all_gather_into_tensor": _flat_all_gather, "all_to_all_single": _all_to_all,
              "broadcast": _broadcast, "reduce": _reduce}


def flat_call(flat, buffer, group, block):
    """The goal's own collective (`flat["call"]`), as torch runs it, in place on `buffer` (its
    `block` for reduce-scatter's output and all-gather's input), rooted at member 0: the
    baseline and the check's reference."""
    if flat["call"] not in FLAT_CALLS:
        raise RuntimeError(f"unknown torch call {flat['call']!r}")
    FLAT_CALLS[flat["call"]](buffer, group, block, dist.get_group_rank(group, dist.get_rank()), 0)


def wrong_elements(program, count, comms, rank, device, dtype=torch.float32):
    """Run the program once on fresh data and count elements differing from the goal's own
    collective over the reduction groups (torch's all_reduce, reduce_scatter_tensor,
    all_gather_into_tensor, all_to_all_single, broadcast or reduce) on the same input, where
    the program's "flat" facts say the input lies and the result is read."""
    flat = program["flat"]
    group = comms[program["reduction"]]
    n = program["chunks"]
    chunk = count // n
    key = dist.get_group_rank(group, rank)
    buffer = torch.empty(count, dtype=dtype, device=device)
    fill(buffer, rank)
    if flat["input"] == "own block":  # the input is this rank's block, at its place; the rest is output
        block = buffer[key * chunk:(key + 1) * chunk].clone()
        buffer.zero_()
        buffer[key * chunk:(key + 1) * chunk] = block
    expected = buffer.clone()
    flat_call(flat, expected, group, chunk)
    run_program(program, buffer, chunk, comms, rank)
    if flat["result"] == "own block":  # block `key` of the result, wherever the program's layout leaves it
        place = program["final_places"][key] if program.get("final_places") else key
        got, want = buffer[place * chunk:(place + 1) * chunk], expected[key * chunk:(key + 1) * chunk]
    elif flat["result"] == "root only" and key != 0:  # only the root's buffer is the result
        got = want = buffer[:0]
    else:
        got, want = buffer, expected
    wrong = torch.tensor([int((got != want).sum())], dtype=torch.int64, device=device)
    dist.all_reduce(wrong)  # over the world, so every rank returns the same verdict
    return int(wrong.item())


def timed(run, iters, warmup, device):
    """Mean seconds per run, of the slowest rank; every rank starts timing after a barrier."""
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        run()
    synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        run()
    synchronize()
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def row(nbytes, count, seconds, bus_factor, wrong, dtype="float"):
    """`bus_factor`: nccl-tests' busbw / algbw for the goal's collective over the reduction
    group (doc/PERFORMANCE.md), from the program's "flat" facts."""
    algbw = nbytes / seconds / 1e9
    busbw = algbw * bus_factor
    return {"bytes": nbytes, "count": count, "type": dtype, "time_us": seconds * 1e6, "algbw_gbs": algbw,
            "busbw_gbs": busbw, "wrong": wrong}


def format_row(values):
    """One nccl-tests row: out-of-place columns N/A (programs run in place), then in place."""
    wrong = "N/A" if values["wrong"] is None else str(values["wrong"])
    return (f"{values['bytes']:>12} {values['count']:>12} {values['type']:>8} {'sum':>6} {-1:>6} "
            f"{'N/A':>8} {'N/A':>7} {'N/A':>7} {'N/A':>6} "
            f"{values['time_us']:>8.2f} {values['algbw_gbs']:>7.2f} {values['busbw_gbs']:>7.2f} {wrong:>6}")


HEADER = (f"#{'':<47} {'out-of-place':^31} {'in-place':^31}\n"
          f"#{'size':>11} {'count':>12} {'type':>8} {'redop':>6} {'root':>6} "
          f"{'time':>8} {'algbw':>7} {'busbw':>7} {'#wrong':>6} {'time':>8} {'algbw':>7} {'busbw':>7} {'#wrong':>6}\n"
          f"#{'(B)':>11} {'(elements)':>12} {'':>8} {'':>6} {'':>6} "
          f"{'(us)':>8} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6} {'(us)':>8} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}")


def footer(rows):
    """nccl-tests' closing line: the mean bus bandwidth over the rows above."""
    return f"# Avg bus bandwidth    : {sum(r['busbw_gbs'] for r in rows) / max(1, len(rows)):.6g} "


def share_gpus(rank):
    """Ranks sharing a GPU: give each its own NCCL_HOSTID (before NCCL starts), which NCCL
    requires to put two ranks on one device, and which makes it use its socket transport."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    devices = torch.cuda.device_count()
    if devices and local_world > devices and "NCCL_HOSTID" not in os.environ:
        os.environ["NCCL_HOSTID"] = f"synth-rank-{rank}"
        return True
    return False


def main(plan, argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if "RANK" not in os.environ:
        print(f"run this script with torchrun --nproc-per-node {plan['world_size']} (one process per device)",
              file=sys.stderr)
        return 2
    dtype = DTYPES[args.dtype]
    itemsize = torch.empty((), dtype=dtype).element_size()
    shared = False
    waits = {} if args.timeout is None else {"timeout": timedelta(seconds=args.timeout)}
    if backend == "nccl":
        if not torch.cuda.is_available():
            print("--backend nccl needs a GPU (torch.cuda.is_available() is False): use --backend gloo", file=sys.stderr)
            return 2
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        shared = share_gpus(int(os.environ["RANK"]))
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, **waits)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", **waits)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != plan["world_size"]:
        if rank == 0:
            print(f"this script was generated for {plan['world_size']} devices but runs on {world}: "
                  f"use torchrun --nproc-per-node {plan['world_size']} (times the number of nodes)", file=sys.stderr)
        dist.destroy_process_group()
        return 2
    # --timeout holds for every group, not only the default one (new_group's own default is the
    # backend's, whatever the default group was given): a rank that disagrees fails in the job's time.
    comms = Communicators(plan, backend, rank, **waits)
    sizes = sizes_of(args)
    say = print if rank == 0 else (lambda *a, **k: None)
    if plan.get("command"):  # what exported it: `synth calibrate` reads the topology from it
        say(f"# command: {plan['command']}")
    say(f"# {len(plan['programs'])} program(s) on {world} ranks, backend {backend}, type {args.dtype}, "
        f"{args.iters} iteration(s) after {args.warmup} warm-up run(s) (-n {args.iters} -w {args.warmup})")
    if shared:
        say("# several ranks share a GPU: each has its own NCCL_HOSTID, so NCCL connects them over sockets")
    results, baselines, failed = [], {}, []
    for index, program in enumerate(plan["programs"]):
        n = program["chunks"]
        groups = plan["communicators"][program["reduction"]]
        say(f"#\n# program {index}{' (' + program['label'] + ')' if program['label'] else ''}: {program['text']}")
        say(f"# {len(groups)} reduction group(s) of n = {n} ranks; the buffer is cut into {n} chunks")
        say(f"# reduction groups: {json.dumps(groups, separators=(',', ':'))}")
        say(HEADER)
        rows = []
        for nbytes in sizes:
            count = element_count(nbytes, n, itemsize)
            if count * itemsize != nbytes:
                say(f"# {nbytes} B is not {n} chunks of whole {args.dtype} elements: rounded up to {count * itemsize} B")
            wrong = wrong_elements(program, count, comms, rank, device, dtype) if args.check else None
            if wrong:
                failed.append(index)
            buffer = torch.zeros(count, dtype=dtype, device=device)
            seconds = timed(lambda: run_program(program, buffer, count // n, comms, rank), args.iters, args.warmup, device)
            values = row(count * itemsize, count, seconds, program["flat"]["bus_factor"], wrong, args.dtype)
            rows.append(values)
            results.append(dict(values, program=index))
            say(format_row(values))
            baselines.setdefault((program["reduction"], count, program["goal"]), (n, program["flat"], []))[2].append(index)
        say(footer(rows))
    say("#\n# baseline: one call of each program's collective over each reduction group (all_reduce unless named)")
    say(HEADER)
    baseline_rows = []
    for (reduction, count, goal), (n, flat, programs) in sorted(baselines.items()):
        buffer = torch.zeros(count, dtype=dtype, device=device)
        group = comms[reduction]
        seconds = timed(lambda: flat_call(flat, buffer, group, count // n), args.iters, args.warmup, device)
        values = row(count * itemsize, count, seconds, flat["bus_factor"], None, args.dtype)
        baseline_rows.append(dict(values, programs=sorted(set(programs)), goal=goal))
        say(format_row(values) + f"   (programs {','.join(map(str, sorted(set(programs))))})")
    say(footer(baseline_rows))
    if failed:
        say(f"# CHECK FAILED for program(s) {','.join(map(str, sorted(set(failed))))}")
    elif args.check:
        say("# check passed: every program equals its collective (all_reduce unless named) over its reduction groups")
    if rank == 0 and args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as handle:
            programs = [{"label": program["label"], "text": program["text"],
                         "reduction_groups": plan["communicators"][program["reduction"]]} for program in plan["programs"]]
            json.dump({"format": "synth-export-results", "command": plan.get("command"), "programs": programs,
                       "backend": backend, "torch": torch.__version__, "world_size": world, "iters": args.iters,
                       "warmup": args.warmup, "dtype": args.dtype, "shared_gpus": shared, "checked": args.check,
                       "results": results, "baselines": baseline_rows}, handle, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failed else 0
