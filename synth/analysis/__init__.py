"""Analyses that ask the cost model questions: sweeps, placement exploration, workloads,
gradient-bucket fusion and goal rankings (ranking programs and the best program per size are
the search's: synth.search.Ranker, synth.search.BestPrograms). Names resolve on first use,
so importing one analysis does not import the others."""

from synth._lazy import lazy_exports

_EXPORTS = {
    "ExploreResult": "synth.analysis.explore", "explore_placements": "synth.analysis.explore",
    "Sweep": "synth.analysis.sweep", "run_sweep": "synth.analysis.sweep",
    "Reduction": "synth.analysis.workload", "parse_reduction": "synth.analysis.workload",
    "evaluate_workload": "synth.analysis.workload",
    "FusionPlan": "synth.analysis.fusion", "plan_fusion": "synth.analysis.fusion",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
