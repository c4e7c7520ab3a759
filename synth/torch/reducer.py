"""Reduce tensors over a job's reduction groups by synthesized programs, inside training.

    reducer = HierarchicalReducer(plan, op="avg", mesh=mesh)   # after init_process_group
    reducer.attach(model)                  # every fully_shard module of the model, or its DDP
    reducer.reduce(tensor)                 # in place, any size, float32/bfloat16/float16
    future = reducer.reduce_async(tensor)  # torch.futures.Future holding the tensor

A tensor of E elements is cut as the program expects, into N chunks of E // N elements (N the
reduction group size), and the program runs on those N * (E // N) elements in place, step by
step, each rank making the one call its plan gives; the remaining E mod N elements (fewer than
N) go through one all_reduce over the reduction group. No copy, no padding. `op="avg"`
divides by N first, as torch's own DDP hook does (no overflow in float16).

Which program runs is the plan's choice for the tensor's size in bytes (synth.torch.plan).
Communicators are made once, when the reducer is built, in one order on every rank: a
DeviceMesh's group is reused where a communicator of the plan has exactly the groups of one
of its dimensions (a mesh whose dimensions are the reduced axis split per level, e.g.
("node", "gpu"), gives the programs' level groups); the others are created (`new_group`, or
`split_group` on NCCL), with the timeout the default group was started with
(`init_process_group(timeout=...)`) or the one given, not the backend's 30 minutes.

Agreement. Ranks that would run different programs (different plans, or tensors of different
type or size: one rank in float32, the others in bfloat16) fail with RankDisagreementError
naming each side, instead of waiting on each other: the plan is compared across the world
when the reducer is built, and each (program, type, size, op) the first time this rank reduces
it (synth.torch.agreement).

Asynchrony. On CUDA tensors (NCCL) the calls are issued at once: each waits on the previous
one on the GPU, not on the CPU, and the future carries CUDA events, so backward goes on while
the program runs. gloo's calls block the calling thread, so on CPU tensors the program runs
on one background thread per reducer, which issues every call of every reduction in the order
they were asked for (the same on every rank: DDP asks for its buckets in bucket order); the
groups the reducer uses must then not be used by other code while a reduction is in flight
(the world group, which DDP itself uses, never is).
"""

from __future__ import annotations

import queue
import threading
import weakref
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from synth.export.torch_runtime import Communicators, run_program
from synth.goals import ALL_GATHER, ALL_TO_ALL, REDUCE_SCATTER
from synth.torch import agreement
from synth.torch.attach import called_by_fsdp, guard_fsdp_hooks, hand_set_hook_error
from synth.torch.errors import ReducerSetupError
from synth.torch.plan import ReductionPlan

OPS = ("sum", "avg")
# The class of synth.torch.collectives that runs a plan of each goal other than all-reduce.
RUNS = {REDUCE_SCATTER: "HierarchicalReduceScatter", ALL_GATHER: "HierarchicalAllGather",
        ALL_TO_ALL: "HierarchicalAllToAll"}


def _stop_worker(work: queue.Queue, worker: threading.Thread, timeout: timedelta | None) -> None:
    """Let a reducer's background thread finish what it was asked and return (at exit). A thread
    stuck in a collective whose peers are gone is left after the groups' timeout."""
    work.put(None)
    worker.join(timeout.total_seconds() if timeout is not None else None)


def mesh_matches(mesh, communicators) -> dict[int, tuple[str | int, object]]:
    """{communicator set index: (mesh dimension, this rank's group)} for every set of the plan
    whose groups are exactly one dimension's groups, members in the same order. Decided from
    the mesh's rank array alone, so every rank decides the same."""
    array = mesh.mesh
    if array.numel() != dist.get_world_size() or sorted(array.flatten().tolist()) != list(range(array.numel())):
        return {}
    names = mesh.mesh_dim_names or tuple(range(array.dim()))
    matches = {}
    for dim, name in enumerate(names):
        groups = sorted(tuple(group) for group in array.movedim(dim, -1).reshape(-1, array.shape[dim]).tolist())
        for index, comm in enumerate(communicators):
            if index not in matches and sorted(tuple(group) for group in comm) == groups:
                # torch numbers a group's members by global rank: the plan's order must be that one.
                if all(list(group) == sorted(group) for group in comm):
                    matches[index] = (name, mesh.get_group(name if mesh.mesh_dim_names else dim))
    return matches


@dataclass(frozen=True)
class PlanRun:
    """What every rank sets up, the same way, to run a plan's programs: the plan as a document,
    the mesh groups it reuses, its digest (agreed before any group is made), the timeout and
    the communicators. One setup for the all-reduce reducer and the goal collectives."""

    rank: int
    data: dict
    reused: dict
    digest: str
    timeout: timedelta
    comms: Communicators

    @classmethod
    def open(cls, plan: ReductionPlan, op: str, mesh, backend: str | None, timeout: timedelta | None) -> "PlanRun":
        if timeout is not None and not (isinstance(timeout, timedelta) and timeout > timedelta(0)):
            raise ReducerSetupError(f"timeout {timeout!r}: give a positive datetime.timedelta (or None: the "
                                    "default process group's timeout)")
        rank, world = dist.get_rank(), dist.get_world_size()
        if world != plan.world_size:
            raise ValueError(f"the plan is for {plan.world_size} ranks, this job has {world}: plan the job's own "
                             "placement (every rank of the world takes part, one process per device)")
        from synth.export.plan_proof import prove_plan

        prove_plan(plan.plan, plan.reduction_groups)  # however the plan was made: a wrong one raises here
        data = plan.to_document()
        reused = mesh_matches(mesh, data["communicators"]) if mesh is not None else {}
        backend = backend or str(dist.get_backend())
        kind = "nccl" if "nccl" in backend else "gloo"
        device = torch.device("cuda", torch.cuda.current_device()) if kind == "nccl" else torch.device("cpu")
        digest = agreement.digest({k: v for k, v in data.items() if k != "description"})
        agreement.agree_on_plan(digest, op, device)  # before any group is made
        timeout = timeout or agreement.default_timeout()
        comms = Communicators(data, kind, rank, {i: group for i, (_, group) in reused.items()}, timeout=timeout)
        return cls(rank, data, reused, digest, timeout, comms)

    def summary(self, calls: dict[int, int], noun: str) -> dict:
        """What was created and reused, and which program ran how often (`noun`: what `count`
        counts), as plain values a logger takes (`describe` reads them back as lines)."""
        return {"reused_from_mesh": [{"communicator": i, "dimension": name} for i, (name, _) in sorted(self.reused.items())],
                "groups_created": self.comms.created,
                "timeout_s": self.timeout.total_seconds() if self.timeout is not None else None,
                "counted": noun,
                "programs": [{"program": index, "text": self.data["programs"][index]["text"], "count": count}
                             for index, count in sorted(calls.items())]}


def describe_summary(summary: dict) -> str:
    """A summary (PlanRun.summary) as the lines a person reads."""
    from datetime import timedelta

    reused = ", ".join(f"communicator {entry['communicator']} = dimension {entry['dimension']}"
                       for entry in summary["reused_from_mesh"])
    timeout = summary["timeout_s"]
    lines = [f"reused from the mesh: {reused or 'none'}",
             f"groups created: {summary['groups_created']}, timeout "
             f"{timedelta(seconds=timeout) if timeout is not None else 'torch default'}"]
    lines += [f"{entry['count']} {summary['counted']} by program {entry['program']}: {entry['text']}"
              for entry in summary["programs"]]
    return "\n".join(lines)


class HierarchicalReducer:
    """Runs a ReductionPlan's programs on tensors of this rank (see the module docstring)."""

    FSDP_HOOK_THROUGH_ATTACH = True  # FSDP2's set_all_reduce_hook refuses it by hand (synth.torch.attach)

    def __init__(self, plan: ReductionPlan, op: str = "avg", mesh=None, backend: str | None = None,
                 timeout: timedelta | None = None):
        if not dist.is_initialized():
            raise RuntimeError("HierarchicalReducer needs torch.distributed: call init_process_group first")
        if op not in OPS:
            raise ValueError(f"op {op!r}: choose one of {', '.join(OPS)}")
        if not plan.goal.is_all_reduce:
            use = RUNS.get(plan.goal)
            raise ReducerSetupError(f"the plan's programs compute collective {plan.collective}, not an all-reduce: "
                                    + (f"run it with synth.torch.{use}" if use else "plan an all-reduce"))
        self.plan = plan
        self.op = op
        self.setup = PlanRun.open(plan, op, mesh, backend, timeout)
        self.rank, self.data, self.reused = self.setup.rank, self.setup.data, self.setup.reused
        self.plan_digest, self.timeout, self.comms = self.setup.digest, self.setup.timeout, self.setup.comms
        self.reduction_group = self.comms[plan.reduction_communicator]
        self.group_size = plan.group_size
        self._programs = self.data["programs"]
        self._queue: queue.Queue | None = None
        self._worker: threading.Thread | None = None
        self.calls: dict[int, int] = {}  # program index -> how many tensors it reduced (for reports)
        self.agreed: set[tuple[int, int, int, int, int]] = set()  # signatures the group agreed on
        self.reduced_modules: list[int] = []  # ids of the FSDP modules reduced in this backward (attach)
        self._ddp_group: tuple | None = None  # (DDP's process group,) once made
        guard_fsdp_hooks()

    # --- the reduction -------------------------------------------------------------------------

    def _reduce_now(self, tensor: torch.Tensor) -> torch.Tensor:
        """Reduce `tensor` in place, calls issued from this thread."""
        flat = tensor.view(-1)
        if self.op == "avg" and not flat.is_floating_point():
            raise TypeError(f"op='avg' needs a floating-point tensor, got {flat.dtype}")
        index = self.plan.program_for(flat.numel() * flat.element_size())
        signature = (self.plan_digest, index, agreement.dtype_code(flat.dtype), flat.numel(), OPS.index(self.op))
        if signature not in self.agreed:
            agreement.agree_on_tensor(signature, self.reduction_group, flat.device, self._describe)
            self.agreed.add(signature)
        if self.op == "avg":
            flat.div_(self.group_size)
        n = self.group_size
        chunk = flat.numel() // n
        self.calls[index] = self.calls.get(index, 0) + 1
        if chunk:
            run_program(self._programs[index], flat[:chunk * n], chunk, self.comms, self.rank)
        if chunk * n < flat.numel():  # the ragged tail, fewer than N elements
            dist.all_reduce(flat[chunk * n:], group=self.reduction_group)
        return tensor

    def _describe(self, index: int, dtype: str, elements: int, op: str) -> str:
        return f"{elements} {dtype} elements, op {op}, program {index}"

    def _contiguous(self, tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.is_contiguous():
            raise ValueError("reduce a contiguous tensor (DDP buckets and FSDP gradients are); "
                             "for a view, reduce tensor.contiguous() and copy it back")
        return tensor

    def reduce_async(self, tensor: torch.Tensor) -> torch.futures.Future:
        """Start reducing `tensor` in place; the future's value is the tensor, reduced."""
        if called_by_fsdp():  # set by hand as an FSDP2 all-reduce hook, not through attach
            raise hand_set_hook_error("the reducer")
        return self._reduce_async(tensor)

    def _reduce_async(self, tensor: torch.Tensor) -> torch.futures.Future:
        tensor = self._contiguous(tensor)
        if tensor.device.type == "cpu":
            future: torch.futures.Future = torch.futures.Future()
            self._submit(tensor, future)
            return future
        self._reduce_now(tensor)  # stream-ordered: the CPU does not wait
        future = torch.futures.Future(devices=[tensor.device])
        future.set_result(tensor)  # records an event on the current stream, after the calls
        return future

    def reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Reduce `tensor` in place and return it (on CUDA, ordered on the current stream)."""
        if called_by_fsdp():
            raise hand_set_hook_error("the reducer")
        return self._reduce_async(tensor).wait()

    __call__ = reduce

    # --- the background thread for CPU tensors ------------------------------------------------

    def _submit(self, tensor: torch.Tensor, future: torch.futures.Future) -> None:
        if self._worker is None:
            self._queue = queue.Queue()
            self._worker = threading.Thread(target=self._serve, name="synth-reducer", daemon=True)
            self._worker.start()
            # Stopped at interpreter exit, before Python abandons daemon threads: one abandoned
            # while it holds torch's C++ frames aborts the process ("terminate called without an
            # active exception", seen on about one run in four of a 4-rank DDP script).
            self._stopper = weakref.finalize(self, _stop_worker, self._queue, self._worker, self.timeout)
        self._queue.put((tensor, future))

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            tensor, future = item
            try:
                self._reduce_now(tensor)
            except BaseException as error:  # handed to whoever waits on the future
                future.set_exception(error)
            else:
                future.set_result(tensor)

    def close(self) -> None:
        """Stop the background thread (after the reductions already asked for)."""
        if self._worker is not None:
            self._stopper.detach()
            self._queue.put(None)
            self._worker.join()
            self._worker = None

    # --- framework hooks -----------------------------------------------------------------------

    def ddp_hook(self, state, bucket):  # no annotations: DDP compares them to its own types
        """A DDP communication hook: `ddp_model.register_comm_hook(None, reducer.ddp_hook)`.
        Reduces the bucket's flat buffer in place (averaged with op="avg", as DDP's default)
        and returns the torch.futures.Future[torch.Tensor] DDP waits on."""
        return self._reduce_async(bucket.buffer())

    @property
    def fsdp_all_reduce_hook(self):
        """Gone: a hook set by hand on FSDP2 modules could leave some unreduced without a word
        (FSDP drops a hook set on a module that owns no parameter, and calls a module's own
        hook only); `attach(model)` is the one way in, and checks every backward."""
        raise hand_set_hook_error("reducer.fsdp_all_reduce_hook")

    def ddp_process_group(self):
        """The process group to give DistributedDataParallel: this rank's reduction group's ranks
        in a group of their own (DDP's own collectives, e.g. its unused-parameter map, must not
        share a group with the reducer's background thread), with the reducer's timeout; None
        (the world) when the reduction group is the world. Every rank must call it, in the same
        order as other group creations: it creates one group per reduction group, once."""
        if self._ddp_group is None:
            groups = self.plan.reduction_groups
            if len(groups) == 1 and len(groups[0]) == dist.get_world_size():
                self._ddp_group = (None,)
            else:
                timed = {} if self.timeout is None else {"timeout": self.timeout}
                created = [dist.new_group(ranks=sorted(group), **timed) for group in groups]
                self._ddp_group = (next(g for g, ranks in zip(created, groups) if self.rank in ranks),)
        return self._ddp_group[0]

    def attach(self, model):
        """Reduce `model`'s gradients by this reducer: on every `fully_shard` module of the model
        (per-layer sharding: each layer and the root) or through its DistributedDataParallel's
        communication hook; after each backward, MissingReductionError if a sharded module was
        left without this reducer's hook. Call it after the last fully_shard (or DDP wrap).
        Returns a synth.torch.attach.Attachment (which modules were hooked)."""
        from synth.torch.attach import attach

        return attach(self, model)

    def summary(self) -> dict:
        """What was created and reused, and which program ran how often, as a dict for loggers
        (reused_from_mesh, groups_created, timeout_s, counted, programs); `describe()` reads it."""
        return self.setup.summary(self.calls, "tensor(s)")

    def describe(self) -> str:
        """The summary as lines a person reads."""
        return describe_summary(self.summary())
