"""Device memory a training job holds besides its weights, gradients, optimizer states and
activations, kept out of what the planner lets a candidate use.

A candidate's memory (formulas.py) counts what the model needs; a real job also holds:

* **the CUDA context and the kernels' code** (`CUDA_CONTEXT_BYTES`): PyTorch measured
  666,632,192 bytes on the device for a context with every module loaded and 287,047,680 with
  lazy module loading (pytorch/pytorch pull request 86509, which made lazy loading PyTorch's
  default). Lazily loaded kernels accumulate as a training step runs them; the planner
  reserves the fully loaded figure, an upper bound of that (cuBLAS and cuDNN workspaces, taken
  through the caching allocator, are left to the fragmentation headroom);
* **NCCL's buffers** (`nccl_bytes`): for every communicator a rank runs collectives on, per
  channel and per peer it receives from, one buffer per protocol, sized by NCCL's defaults
  (src/init.cc): Simple `NCCL_BUFFSIZE` = 4 MiB, LL128 120 x 640 x 8 x 8 = 4,915,200 bytes,
  LL 8 x 512 x 8 x 16 = 524,288 bytes. With NCCL's 32 channels (MAXCHANNELS) and the ring's
  one receiving connection per channel that is 32 x 9,633,792 bytes (294 MiB) per
  communicator; a job with tensor, context and data parallelism runs collectives on three.
  NCCL makes one communicator per process group a rank belongs to (each group's
  ncclCommInitRank or ncclCommSplit, buffers not shared across communicators unless
  NCCL_COMM_SPLIT_SHARE_RESOURCES is set), so a MoE job with folded expert layers
  (synth/plan/folding.py) holds, beside the dense groups' and the expert-parallel one, the
  expert tensor-parallel and expert data-parallel groups' communicators that Megatron-core
  builds for them (`etp`, `edp` of size > 1; counted even where one has the same ranks as a
  dense group, being a communicator of its own). Layouts without folding keep the count of
  the `tp, cp, ep, dp` groups;
  Tree, NVLS and CollNet connections add more when NCCL picks them; pipeline send/receive
  uses small peer-to-peer buffers and is not counted;
* **cuBLAS's workspace** (`CUBLAS_WORKSPACE_BYTES`): PyTorch gives each cuBLAS handle and stream a
  workspace of 32 MiB on Hopper and later, 4 MiB on large Ampere parts (aten/src/ATen/cuda/CUDABlas.cpp,
  pytorch/pytorch#120925, after the cuBLAS guide's cublasSetWorkspace recommendation); the
  planner reserves the larger for one compute stream;
* **the caching allocator's fragmentation** (`FRAGMENTATION`): freed blocks that are too
  small or split for the next request. GMLake (Guo et al., ASPLOS 2024, arXiv:2401.08156)
  measured PyTorch's caching allocator losing 15% on average (up to 33%) to fragmentation over
  eight LLM training setups on 80 GB A100s (recomputation, ZeRO, offloading, LoRA); ZeRO
  (Rajbhandari et al. 2020, section 3.2) reports out-of-memory errors with over 30% still free;
  PyTorch's expandable segments (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`) remove much
  of it, and Megatron-LM's contiguous parameter and gradient buffers do not fragment. It depends
  on the job, so it does not drop a layout: one that fits beside the reserve but not beside
  the reserve and the measured average fragmentation is *tight*, shown with its margin.

Each figure is overridable per device (a topology's `[device.reserve]` table, each figure with
its source) and on the command line.
"""

from __future__ import annotations

from dataclasses import dataclass

from synth.plan.degrees import Degrees
from synth.topology import Figure

CUDA_CONTEXT_BYTES = 666_632_192
CUBLAS_WORKSPACE_BYTES = 32 << 20
NCCL_PROTOCOL_BUFFER_BYTES = (4 << 20) + 120 * 640 * 8 * 8 + 8 * 512 * 8 * 16  # Simple + LL128 + LL, per connection
NCCL_CHANNELS = 32
NCCL_RING_PEERS = 1  # receiving connections per channel in a ring
NCCL_COMMUNICATOR_BYTES = NCCL_CHANNELS * NCCL_RING_PEERS * NCCL_PROTOCOL_BUFFER_BYTES
FRAGMENTATION = 0.15

# The named figures, each with its source (module docstring); a topology's [device.reserve] overrides them.
FIGURES = {
    "cuda_context": Figure(CUDA_CONTEXT_BYTES, "pytorch/pytorch#86509: a CUDA context with every module loaded "
                                               "measured 666,632,192 B on the device (287,047,680 B lazily)"),
    "cublas_workspace": Figure(CUBLAS_WORKSPACE_BYTES, "aten/src/ATen/cuda/CUDABlas.cpp (pytorch/pytorch#120925): "
                                                       "32 MiB per handle and stream on Hopper and later, 4 MiB before"),
    "nccl_communicator": Figure(NCCL_COMMUNICATOR_BYTES, "NCCL src/init.cc defaults: 32 channels x one ring receive "
                                                         "connection x (4 MiB Simple NCCL_BUFFSIZE + 4,915,200 B LL128 "
                                                         "+ 524,288 B LL)"),
    "fragmentation": Figure(FRAGMENTATION, "GMLake (Guo et al., ASPLOS 2024, arXiv:2401.08156): PyTorch's caching "
                                           "allocator lost 15% on average (up to 33%) to fragmentation over eight "
                                           "LLM training setups on 80 GB A100s"),
}
BYTE_FIGURES = ("cuda_context", "cublas_workspace", "nccl_communicator")
COLLECTIVE_ROLES = ("tp", "cp", "ep", "dp")  # the groups a rank runs collectives on (pp only sends and receives)
FOLDED_EXPERT_ROLES = ("etp", "edp")  # a folded layout's expert groups beside them (module docstring)


@dataclass(frozen=True)
class MemoryReserve:
    """Bytes per device kept free: a fixed part (the CUDA context and cuBLAS's workspace, or a
    size the user gives) and a part per communicator (NCCL's buffers)."""

    fixed_bytes: float
    per_communicator_bytes: float
    source: str

    def communicators(self, degrees: Degrees) -> int:
        """NCCL communicators a rank runs collectives on: one per group of size > 1 (module docstring)."""
        count = sum(degrees.of(role) > 1 for role in COLLECTIVE_ROLES)
        if degrees.folded:
            count += (degrees.expert_tp > 1) + (degrees.expert_dp > 1)
        return count

    def bytes_for(self, degrees: Degrees) -> float:
        return self.fixed_bytes + self.per_communicator_bytes * self.communicators(degrees)

    def to_json(self) -> dict:
        return {"fixed_bytes": self.fixed_bytes, "per_communicator_bytes": self.per_communicator_bytes,
                "communicator_roles": list(COLLECTIVE_ROLES), "folded_communicator_roles": list(FOLDED_EXPERT_ROLES),
                "source": self.source}


def reserve_from(figures: dict[str, Figure]) -> MemoryReserve:
    """The reserve these figures (FIGURES, some overridden) make: the context and cuBLAS's
    workspace once, NCCL's buffers per communicator."""
    context, workspace, nccl = (figures[name] for name in BYTE_FIGURES)
    return MemoryReserve(context.value + workspace.value, nccl.value,
                         f"CUDA context ({context.source}), cuBLAS workspace ({workspace.source}) and NCCL's buffers "
                         f"per TP, CP, EP and DP communicator, and folded experts' ETP and EDP ({nccl.source})")


def device_figures(overrides: tuple[tuple[str, Figure], ...] = ()) -> dict[str, Figure]:
    """FIGURES with a device's own (a topology's [device.reserve]) in their place."""
    return FIGURES | dict(overrides)


DEFAULT_RESERVE = reserve_from(FIGURES)


def fixed_reserve(size_bytes: int, source: str = "the user's own figure") -> MemoryReserve:
    """The user's own reserve (`--memory-reserve SIZE`), the same for every candidate."""
    return MemoryReserve(float(size_bytes), 0.0, source)
