"""One rank of the synth.torch collective checks (tests/test_torch_collectives.py runs it under
torchrun with gloo on 8 CPU processes).

--case programs: for every 8-device export case and each goal (reduce-scatter, all-gather,
all-to-all), one plan holding every valid program of up to --max-len steps, program i chosen by
size (chunks of i + 1 elements); each program's call against torch's own reduce_scatter_tensor /
all_gather_into_tensor / all_to_all_single over the same group, on integer-valued floats, so
equality is exact. Then what must raise: unequal splits, a group in another order.
--case fsdp: FSDP2 sharded per layer on the 8 ranks, trained with the hierarchical
reduce-scatter (and all-gather) set by `set_custom_reduce_scatter` (`set_custom_all_gather`),
against FSDP2's own collectives.
Both cases (`--case programs fsdp`) run one after the other in one launch: starting 8 ranks
costs more than either check.

Rank 0 writes a JSON report to --json-out.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
try:
    import synth  # noqa: F401  (installed)
except ImportError:  # run from a checkout: the repository root
    sys.path.insert(0, str(HERE.parent))

from export_cases import CASES  # noqa: E402
from synth.search import Enumerator, SearchOptions, semantics_for  # noqa: E402
from synth.torch import HierarchicalReducer, ReducerSetupError, plan_programs  # noqa: E402
from synth.torch.collectives import HierarchicalAllGather, HierarchicalAllToAll, HierarchicalReduceScatter  # noqa: E402
from synth.torch.plan import SizeRange  # noqa: E402
from worker_report import finish  # noqa: E402

REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # torch's own
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
CLASSES = {"reducescatter": HierarchicalReduceScatter, "allgather": HierarchicalAllGather,
           "alltoall": HierarchicalAllToAll}


def values(count: int, rank: int, salt: int, columns: int = 1) -> torch.Tensor:
    """Small integers as float32 (count rows of `columns`): sums of 8 are exact in any order."""
    index = torch.arange(count * columns, dtype=torch.int64)
    data = ((index * 7 + rank * 13 + salt * 5 + (index // 3) * rank) % 23 - 11).to(torch.float32)
    return data.view(count, columns) if columns > 1 else data


def by_size_plan(hierarchy, goal: str, max_len: int):
    """Every program of the goal; program i runs for chunks of i + 1 float32 elements."""
    programs = list(Enumerator(semantics_for(hierarchy, goal=goal), SearchOptions(max_len=max_len)).programs())
    n = hierarchy.group_size
    ranges = (SizeRange(0, 0),) + tuple(SizeRange(4 * n * (i + 1), i) for i in range(1, len(programs)))
    return plan_programs(hierarchy, programs, ranges, collective=goal), [str(p) for p in programs]


def check_programs(rank: int, max_len: int) -> dict:
    results = []
    for case in CASES:
        hierarchy = case.built
        n = hierarchy.group_size
        for goal, cls in CLASSES.items():
            plan, texts = by_size_plan(hierarchy, goal, max_len)
            runner = cls(plan)
            group = runner.group
            for i, text in enumerate(texts):
                chunk = i + 1
                columns = 3 if goal == "alltoall" and i % 2 else 1  # tokens x hidden, for some
                if goal == "reducescatter":
                    data = values(n * chunk, rank, i)
                    want, got = torch.empty(chunk), torch.empty(chunk)
                    REDUCE_SCATTER(want, data.clone(), group=group)
                    before = data.clone()
                    runner.reduce_scatter_tensor(got, data, group=group)
                    untouched = bool(torch.equal(before, data))
                elif goal == "allgather":
                    data = values(chunk, rank, i)
                    want, got = torch.empty(n * chunk), torch.empty(n * chunk)
                    ALL_GATHER(want, data, group=group)
                    runner.all_gather_into_tensor(got, data, group=group)
                    untouched = True
                else:
                    data = values(n * chunk, rank, i, columns)
                    want, got = torch.empty_like(data), torch.empty_like(data)
                    dist.all_to_all_single(want, data, group=group)
                    runner.all_to_all_single(got, data, group=group)
                    untouched = True
                wrong = int((want != got).sum())
                results.append({"case": case.name, "goal": goal, "program": text, "wrong": wrong,
                                "untouched": untouched})
    return {"results": results}


def check_refusals(rank: int) -> dict:
    hierarchy = CASES[0].built  # node=2, gpu=4 over the world
    report = {}
    exchange = HierarchicalAllToAll(plan_programs(hierarchy, [
        "AllToAll(Parallel(node)); Permute(gpu,node); AllToAll(InsideGroup(gpu)); Permute(node,gpu)"],
        collective="alltoall"))
    data = values(16, rank, 0)
    try:
        exchange.all_to_all_single(torch.empty(16), data, [3, 1, 2, 2, 2, 2, 2, 2], [3, 1, 2, 2, 2, 2, 2, 2])
    except ValueError as error:
        report["ragged"] = str(error)
    got, want = torch.empty(16), torch.empty(16)
    exchange.all_to_all_single(got, data, [2] * 8, [2] * 8)
    dist.all_to_all_single(want, data)
    report["equal_splits_wrong"] = int((got != want).sum())
    work = exchange.all_to_all_single(got, data, async_op=True)
    report["async_completed"] = bool(work.wait()) and work.is_completed()
    scatter = HierarchicalReduceScatter(plan_programs(hierarchy, [
        "Permute(gpu,node); ReduceScatter(InsideGroup(gpu)); ReduceScatter(Parallel(node))"],
        collective="reducescatter"))
    average, want = torch.empty(2), torch.empty(2)
    scatter.reduce_scatter_tensor(average, values(16, rank, 1), op=dist.ReduceOp.AVG)
    REDUCE_SCATTER(want, values(16, rank, 1))
    report["avg_diff"] = float((average - want / 8).abs().max())
    premul = torch.empty(2)
    scatter.reduce_scatter_tensor(premul, values(16, rank, 1), op=dist.ReduceOp.PREMUL_SUM(0.25))
    report["premul_diff"] = float((premul - want / 4).abs().max())
    try:
        scatter.reduce_scatter_tensor(premul, values(16, rank, 1), op=dist.ReduceOp.MAX)
    except ReducerSetupError as error:
        report["max_refused"] = str(error)
    other = dist.new_group(ranks=[0, 1, 2, 3])
    if rank < 4:
        try:
            scatter.reduce_scatter_tensor(torch.empty(4), values(16, rank, 1), group=other)
        except ReducerSetupError as error:
            report["other_group"] = str(error)
    try:
        HierarchicalAllToAll(scatter.plan)
    except ReducerSetupError as error:
        report["wrong_goal"] = str(error)
    try:
        HierarchicalReducer(scatter.plan)
    except ReducerSetupError as error:
        report["not_an_all_reduce"] = str(error)
    report.update(check_changed_plan(scatter.plan))
    return report


def check_changed_plan(plan) -> dict:
    """The issue's reduce-scatter with its Permute's places set to [0]*8: loading it raises, and
    so does running it when the changed plan is built in code instead of loaded."""
    from dataclasses import replace

    from synth.errors import PlanFileError
    from synth.torch.plan import ReductionPlan

    document = plan.to_document()
    document["programs"][0]["steps"][0]["places"] = [0] * 8
    report = {}
    try:
        ReductionPlan.from_document(document)
    except PlanFileError as error:
        report["changed_load"] = str(error)
    program = plan.plan.programs[0]
    steps = (replace(program.steps[0], places=(0,) * 8),) + program.steps[1:]
    changed = ReductionPlan(replace(plan.plan, programs=(replace(program, steps=steps),)), plan.reduction_groups,
                            plan.ranges)
    try:
        HierarchicalReduceScatter(changed)
    except PlanFileError as error:
        report["changed_run"] = str(error)
    return report


# --- FSDP2 -------------------------------------------------------------------------------------

WIDTHS = (37, 61, 29, 7)  # odd sizes: FSDP pads each shard
STEPS = 3


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(WIDTHS, WIDTHS[1:]))

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            x = layer(x)
            if index + 1 < len(self.layers):
                x = torch.tanh(x)
        return x


def train_fsdp(rank: int, mesh, scatter=None, gather=None) -> tuple[list[torch.Tensor], int]:
    from torch.distributed.fsdp import fully_shard

    model = Net()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    modules = [model, *model.layers]
    for module in modules:
        if scatter is not None:
            module.set_custom_reduce_scatter(scatter)
        if gather is not None:
            module.set_custom_all_gather(gather)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        generator = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(8, WIDTHS[0], generator=generator), torch.randn(8, WIDTHS[-1], generator=generator)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return [p.full_tensor().detach().clone() for p in model.parameters()], len(modules)


def check_fsdp(rank: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (8,), mesh_dim_names=("shard",))
    hierarchy = CASES[0].built
    scatter = HierarchicalReduceScatter(plan_programs(hierarchy, [
        "Permute(gpu,node); ReduceScatter(InsideGroup(gpu)); ReduceScatter(Parallel(node))"],
        collective="reducescatter"), mesh=mesh)
    gather = HierarchicalAllGather(plan_programs(hierarchy, [
        "Permute(gpu,node); AllGather(Parallel(node)); AllGather(InsideGroup(gpu)); Permute(node,gpu)"],
        collective="allgather"), mesh=mesh)
    native, _ = train_fsdp(rank, mesh)
    scattered, modules = train_fsdp(rank, mesh, scatter)
    both, _ = train_fsdp(rank, mesh, scatter, gather)
    start = [p.detach() for p in Net().parameters()]
    return {"modules": modules,
            "rs_diff": max(float((a - b).abs().max()) for a, b in zip(native, scattered)),
            "rs_ag_diff": max(float((a - b).abs().max()) for a, b in zip(native, both)),
            "moved": min(float((a - b).abs().max()) for a, b in zip(native, start)),
            "scatter_calls": sum(scatter.calls.values()), "gather_calls": sum(gather.calls.values()),
            "scatter_summary": scatter.summary()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=("programs", "fsdp"), nargs="+", required=True)
    parser.add_argument("--max-len", type=int, default=4)
    parser.add_argument("--json-out")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    report = {}
    if "programs" in args.case:
        report.update(check_programs(rank, args.max_len))
        report["refusals"] = check_refusals(rank)
    if "fsdp" in args.case:
        report.update(check_fsdp(rank))
    return finish(report, args.json_out)


if __name__ == "__main__":
    sys.exit(main())
