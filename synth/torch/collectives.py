"""Synthesized reduce-scatter, all-gather and all-to-all inside torch training: the calls
torch's own `reduce_scatter_tensor`, `all_gather_into_tensor` and `all_to_all_single` make,
run by a plan's program instead (docs/training.md).

    plan = synth.torch.plan_reduction("dgx-a100-x4", "data=32", "data", [[4, 8]],
                                      collective="reducescatter")
    scatter = HierarchicalReduceScatter(plan, mesh=mesh)     # after init_process_group
    for module in sharded_modules:                            # every fully_shard module
        module.set_custom_reduce_scatter(scatter)             # FSDP2's own hook (torch >= 2.9)
    scatter.reduce_scatter_tensor(output, input, op="sum")   # or called directly

    exchange = HierarchicalAllToAll(all_to_all_plan)
    exchange.all_to_all_single(output, input)                 # MoE dispatch / combine, equal splits

A call takes the same tensors as torch's and leaves the same values: the input's N equal
pieces (N the group size) in group-rank order, as torch and NCCL lay them out, piece r of
the sum on rank r (reduce-scatter); every rank's piece joined in rank order (all-gather);
rank i's piece j at rank j as its piece i (all-to-all with equal splits). The program runs in
place on a flat buffer of the input's elements, step by step (synth.export.torch_runtime, the
runtime the exported scripts run), and the result is copied out from where the program's
layout leaves it (a reduce-scatter whose Permute steps leave rank r's piece at another place).

Where the result could differ from torch's, the call raises instead: a process group whose
ranks (in group-rank order) are not this rank's reduction group of the plan in member order
(the pieces would be numbered otherwise); unequal split sizes; a size that is not N pieces of
whole elements; an op other than sum, average and FSDP's pre-multiplied sum; a plan of
another collective. Ranks compare (plan, program, type, size, op) the first time they meet it
and fail together with RankDisagreementError rather than hang (synth.torch.agreement).

The calls are synchronous (on CUDA, ordered on the current stream, as NCCL's own); with
`async_op=True` the returned work is already complete.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from synth.export.torch_runtime import run_program
from synth.goals import ALL_GATHER, ALL_TO_ALL, REDUCE_SCATTER, Goal
from synth.torch import agreement
from synth.torch.errors import ReducerSetupError
from synth.torch.plan import ReductionPlan
from synth.torch.reducer import PlanRun, describe_summary

try:  # FSDP2's interfaces for a custom reduce-scatter / all-gather (torch >= 2.9)
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _FSDPAllGather
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _FSDPReduceScatter
except ImportError:  # older torch: the classes below are still reduce_scatter_tensor-compatible callables
    _FSDPAllGather = _FSDPReduceScatter = object

SUM, AVG, PREMUL_SUM = dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PREMUL_SUM


def _scale(op, group_size: int) -> tuple[float | None, int]:
    """(the factor to multiply the input by first, or None; the op's code for the agreement)."""
    if isinstance(op, str):
        if op not in ("sum", "avg"):
            raise ValueError(f"op {op!r}: choose 'sum' or 'avg' (or a torch.distributed.ReduceOp)")
        return (None, 0) if op == "sum" else (1.0 / group_size, 1)
    kind = getattr(op, "op", op)
    if kind == SUM:
        return None, 0
    if kind == AVG:
        return 1.0 / group_size, 1
    if kind == PREMUL_SUM:
        factor = op.factor
        return float(factor.item() if isinstance(factor, torch.Tensor) else factor), 2
    raise ReducerSetupError(f"reduce op {kind}: a synthesized reduce-scatter sums (SUM, AVG, PREMUL_SUM); use torch's "
                            "own reduce_scatter_tensor for other ops")


class _WorkDone:
    """What an `async_op=True` call returns: the call already ran (it is stream-ordered)."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(None)
        return future


class PlanCollective:
    """Runs one plan's programs (its goal: `GOAL`) as the calls of torch's collective."""

    GOAL: Goal  # the goal its plans compute; TORCH_CALL, the torch call it stands for, is the goal's
    TORCH_CALL = ""

    def __init__(self, plan: ReductionPlan, mesh=None, backend: str | None = None, timeout: timedelta | None = None):
        if not dist.is_initialized():
            raise RuntimeError(f"{type(self).__name__} needs torch.distributed: call init_process_group first")
        if plan.goal != self.GOAL:
            raise ReducerSetupError(f"the plan's programs compute collective {plan.collective}, "
                                    f"{type(self).__name__} runs {self.GOAL}: plan it with collective={self.GOAL.name!r}")
        self.plan = plan
        self.setup = PlanRun.open(plan, "sum", mesh, backend, timeout)
        self.rank, self.data, self.reused = self.setup.rank, self.setup.data, self.setup.reused
        self.plan_digest, self.timeout, self.comms = self.setup.digest, self.setup.timeout, self.setup.comms
        self.group = self.comms[plan.reduction_communicator]
        self.group_size = plan.group_size
        self.members = next(tuple(g) for g in plan.reduction_groups if self.rank in g)
        self.key = self.members.index(self.rank)  # this rank's piece
        self._programs = self.data["programs"]
        self._checked_groups: set[int] = set()
        self.agreed: set[tuple[int, int, int, int, int]] = set()
        self.calls: dict[int, int] = {}  # program index -> calls it ran (for reports)

    # --- what torch's call would do, checked --------------------------------------------------

    def check_group(self, group) -> None:
        """The caller's group must be this rank's reduction group with its members in the plan's
        order: torch numbers the pieces by group rank."""
        if group is None:
            self._check_ranks(tuple(range(dist.get_world_size())), "the world")
            return
        if id(group) in self._checked_groups:
            return
        self._check_ranks(tuple(dist.get_process_group_ranks(group)), "the process group")
        self._checked_groups.add(id(group))

    def _check_ranks(self, ranks: tuple[int, ...], what: str) -> None:
        if ranks == self.members:
            return
        if sorted(ranks) == sorted(self.members):
            raise ReducerSetupError(
                f"{what} orders its ranks {list(ranks)[:16]}, the plan's group {list(self.members)[:16]}: torch would "
                f"number the pieces in the first order, the program in the second, so piece r would land on another "
                "rank. Plan the group in the framework's order (members by global rank)")
        raise ReducerSetupError(
            f"{what} has ranks {list(ranks)[:16]}, the plan's group for rank {self.rank} is {list(self.members)[:16]}: "
            f"a {self.TORCH_CALL} over other ranks than the plan's; plan the group the framework calls it over")

    def _program(self, flat: torch.Tensor, op_code: int) -> int:
        index = self.plan.program_for(flat.numel() * flat.element_size())
        signature = (self.plan_digest, index, agreement.dtype_code(flat.dtype), flat.numel(), op_code)
        if signature not in self.agreed:
            agreement.agree_on_tensor(signature, self.group, flat.device, self._describe)
            self.agreed.add(signature)
        self.calls[index] = self.calls.get(index, 0) + 1
        return index

    def _describe(self, index: int, dtype: str, elements: int, op: str) -> str:
        return f"{self.TORCH_CALL} of {elements} {dtype} elements, program {index}"

    def _run(self, index: int, flat: torch.Tensor) -> None:
        run_program(self._programs[index], flat, flat.numel() // self.group_size, self.comms, self.rank)

    def _pieces(self, whole: int, piece: int, what: str) -> None:
        if whole != piece * self.group_size:
            raise ValueError(f"{what}: {whole} elements are not {self.group_size} pieces of {piece} (the group size "
                             f"{self.group_size}): pad the tensor to a multiple of {self.group_size} elements")

    def summary(self) -> dict:
        """As HierarchicalReducer.summary: a dict for loggers."""
        return self.setup.summary(self.calls, "call(s)")

    def describe(self) -> str:
        """The summary as lines a person reads."""
        return describe_summary(self.summary())


def _flat(tensor: torch.Tensor, what: str) -> torch.Tensor:
    if not tensor.is_contiguous():
        raise ValueError(f"{what} must be contiguous (as torch's collectives require)")
    return tensor.view(-1)


class HierarchicalReduceScatter(PlanCollective, _FSDPReduceScatter):
    """`reduce_scatter_tensor` by a plan's reduce-scatter program; an FSDP2 `ReduceScatter`
    comm for `module.set_custom_reduce_scatter(...)` (FSDP passes SUM, AVG or PREMUL_SUM)."""

    GOAL = REDUCE_SCATTER
    TORCH_CALL = GOAL.torch_call

    def __init__(self, plan: ReductionPlan, mesh=None, backend: str | None = None, timeout: timedelta | None = None,
                 reuse_input: bool = False):
        super().__init__(plan, mesh, backend, timeout)
        self.reuse_input = reuse_input  # the input is scratch: the program may run in it (FSDP's is)

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """FSDP2 asks its comm for its buffers: plain memory (its default comm's)."""
        return torch.empty(*size, dtype=dtype, device=device)

    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor, op=SUM, group=None,
                              async_op: bool = False):
        """torch.distributed.reduce_scatter_tensor(output, input, op, group): rank r of the group
        gets piece r of the sum (divided by N for AVG, the input multiplied by the factor first
        for PREMUL_SUM). The input is left as it was (unless built with reuse_input=True)."""
        self._reduce_scatter(output, input, op, group, self.reuse_input)
        return _WorkDone() if async_op else None

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op=SUM, async_op: bool = False):
        """FSDP2's call: its input is a scratch copy of the gradients, which the program runs in."""
        self._reduce_scatter(output_tensor, input_tensor, op, group, True)
        return _WorkDone() if async_op else None

    def _reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op, group, reuse: bool) -> None:
        self.check_group(group)
        out, flat_in = _flat(output, "the output"), _flat(input, "the input")
        self._pieces(flat_in.numel(), out.numel(), "reduce-scatter input")
        if out.dtype != flat_in.dtype:
            raise TypeError(f"output {out.dtype} and input {flat_in.dtype}: reduce_scatter_tensor takes one type")
        factor, code = _scale(op, self.group_size)
        index = self._program(flat_in, code)
        buffer = flat_in if reuse else flat_in.clone()
        if factor is not None:
            buffer.mul_(factor)
        self._run(index, buffer)
        places = self._programs[index].get("final_places")
        place = places[self.key] if places else self.key
        piece = out.numel()
        out.copy_(buffer[place * piece:(place + 1) * piece])


class HierarchicalAllGather(PlanCollective, _FSDPAllGather):
    """`all_gather_into_tensor` by a plan's all-gather program; an FSDP2 `AllGather` comm for
    `module.set_custom_all_gather(...)`."""

    GOAL = ALL_GATHER
    TORCH_CALL = GOAL.torch_call

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False):
        """torch.distributed.all_gather_into_tensor(output, input, group): every rank's input
        joined in group-rank order. The input may be output's own piece (FSDP's in-place call)."""
        self.check_group(group)
        out, flat_in = _flat(output, "the output"), _flat(input, "the input")
        self._pieces(out.numel(), flat_in.numel(), "all-gather output")
        if out.dtype != flat_in.dtype:
            raise TypeError(f"output {out.dtype} and input {flat_in.dtype}: all_gather_into_tensor takes one type")
        index = self._program(out, 0)
        piece = flat_in.numel()
        mine = out[self.key * piece:(self.key + 1) * piece]
        if mine.data_ptr() != flat_in.data_ptr():
            mine.copy_(flat_in)
        self._run(index, out)
        return _WorkDone() if async_op else None

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, async_op: bool = False):
        return self.all_gather_into_tensor(output_tensor, input_tensor, group, async_op)


class HierarchicalAllToAll(PlanCollective):
    """`all_to_all_single` with equal splits by a plan's all-to-all program (an MoE layer's
    token dispatch and combine: `exchange(output, input)` in place of torch's call)."""

    GOAL = ALL_TO_ALL
    TORCH_CALL = GOAL.torch_call

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes=None,
                          input_split_sizes=None, group=None, async_op: bool = False):
        """torch.distributed.all_to_all_single(output, input, ...) with equal splits: rank i's
        piece j (of N along dimension 0) lands on rank j as its piece i. Split sizes are
        refused unless all equal (a capacity-factor MoE pads its dispatch to equal splits)."""
        self.check_group(group)
        for name, splits in (("input_split_sizes", input_split_sizes), ("output_split_sizes", output_split_sizes)):
            tensor = input if name.startswith("input") else output
            if splits is not None and (len(splits) != self.group_size
                                       or any(int(s) * self.group_size != tensor.shape[0] for s in splits)):
                raise ValueError(f"{name}={list(splits)[:16]}: a synthesized all-to-all sends equal pieces "
                                 f"({tensor.shape[0]} // {self.group_size} rows each); pad the pieces to one size "
                                 "(a capacity factor does) or call torch's all_to_all_single for ragged splits")
        out, flat_in = _flat(output, "the output"), _flat(input, "the input")
        if out.numel() != flat_in.numel() or out.dtype != flat_in.dtype:
            raise ValueError(f"output ({out.numel()} {out.dtype}) and input ({flat_in.numel()} {flat_in.dtype}) must "
                             "have as many elements of one type (equal splits)")
        if input.dim() and input.shape[0] % self.group_size:
            raise ValueError(f"the input's first dimension ({input.shape[0]}) is not {self.group_size} equal pieces: "
                             f"pad it to a multiple of {self.group_size}")
        self._pieces(flat_in.numel(), flat_in.numel() // self.group_size, "all-to-all input")
        index = self._program(flat_in, 0)
        if out.data_ptr() != flat_in.data_ptr():
            out.copy_(flat_in)
        self._run(index, out)
        return _WorkDone() if async_op else None

    __call__ = all_to_all_single
