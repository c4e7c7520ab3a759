"""Exports: programs and placements in the forms clusters and frameworks run.

`plan` maps a lowered program to per-rank calls once; `torch_script`, `nccl_c` and
`json_plan` render that plan, `mesh` renders a placement, `provenance` stamps every file
with the command and version that made it. Names resolve on first use; none imports torch.
"""

from synth._lazy import lazy_exports

_EXPORTS = {
    "Plan": "synth.export.plan", "PlanEntry": "synth.export.plan", "build_plan": "synth.export.plan",
    "Provenance": "synth.export.provenance",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
