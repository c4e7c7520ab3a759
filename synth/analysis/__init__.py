"""Analyses that ask the cost model questions: rank programs, sweeps, placement exploration,
workloads and gradient-bucket fusion (the best program per size is the search's:
synth.search.BestPrograms). Names resolve on first use, so importing one analysis does not
import the others."""

from synth._lazy import lazy_exports

_EXPORTS = {
    "RankedProgram": "synth.analysis.rank", "rank_programs": "synth.analysis.rank", "Ranker": "synth.analysis.rank",
    "pareto_front": "synth.analysis.rank",
    "ProgramSet": "synth.analysis.programs", "ProgramSets": "synth.analysis.programs",
    "ExploreResult": "synth.analysis.explore", "explore_placements": "synth.analysis.explore",
    "Sweep": "synth.analysis.sweep", "run_sweep": "synth.analysis.sweep",
    "Reduction": "synth.analysis.workload", "parse_reduction": "synth.analysis.workload",
    "evaluate_workload": "synth.analysis.workload",
    "FusionPlan": "synth.analysis.fusion", "plan_fusion": "synth.analysis.fusion",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
