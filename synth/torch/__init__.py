"""Synthesized reductions inside torch training: a plan built once, a reducer that runs it on
any tensor, and the hooks DDP and FSDP2 take (docs/training.md).

    import synth.torch
    plan = synth.torch.plan_reduction("dgx-a100-x4", "data=8,model=4", "data", [[4, 2], [1, 4]])
    reducer = synth.torch.HierarchicalReducer(plan, op="avg", mesh=mesh)
    reducer.attach(model)    # every fully_shard module of the model (each layer, the root), or its DDP

Plans of the other collectives (`plan_reduction(..., collective="reducescatter")`) run in
HierarchicalReduceScatter, HierarchicalAllGather (FSDP2's custom comms) and
HierarchicalAllToAll (MoE), in place of torch's own calls (synth.torch.collectives). An MoE
layer's dispatch and combine with uneven splits, flat or in two stages over the nodes, run in
TokenDispatcher over an ExpertLayout (synth.torch.moe), built by hand or from the JSON plan of
`synth export --collective dispatch|combine` (`TokenDispatcher.from_plan(load_dispatch_plan(path))`).

The plans (synth.torch.plan) need no torch; the reducer and hooks need torch, an optional
extra of synth (`pip install 'hierarchical-collectives-synth[run]'`), loaded on first use.
"""

from synth.torch.errors import (HandSetHookError, MissingReductionError, NoRuntimeFormError, RankDisagreementError,
                                ReducerSetupError, RoutingError)
from synth.torch.moe_layout import ExpertLayout
from synth.torch.moe_plan import DispatchPlan, load_dispatch_plan, read_dispatch_plan
from synth.errors import PlanFileError
from synth.torch.plan import (ReductionPlan, SizeRange, best_by_size, load_plan, plan_programs, plan_reduction,
                              size_thresholds)

_TORCH_NAMES = {"HierarchicalReducer": "synth.torch.reducer", "mesh_matches": "synth.torch.reducer",
                "HierarchicalReduceScatter": "synth.torch.collectives", "HierarchicalAllGather": "synth.torch.collectives",
                "HierarchicalAllToAll": "synth.torch.collectives", "TokenDispatcher": "synth.torch.moe"}

__all__ = ["DispatchPlan", "ExpertLayout", "HandSetHookError", "MissingReductionError", "NoRuntimeFormError",
           "load_dispatch_plan", "read_dispatch_plan", "RoutingError", "PlanFileError", "RankDisagreementError", "ReducerSetupError", "ReductionPlan", "SizeRange",
           "best_by_size", "load_plan", "plan_programs", "plan_reduction", "size_thresholds", *_TORCH_NAMES]


def __getattr__(name):
    if name in _TORCH_NAMES:
        import importlib

        try:
            module = importlib.import_module(_TORCH_NAMES[name])
        except ImportError as error:
            if error.name != "torch" and not str(error.name or "").startswith("torch."):
                raise
            raise ImportError(f"synth.torch.{name} needs torch: pip install torch (the CPU or the CUDA build, "
                              "see the README), or pip install 'hierarchical-collectives-synth[run]'") from None
        return getattr(module, name)
    raise AttributeError(f"module 'synth.torch' has no attribute {name!r}")
