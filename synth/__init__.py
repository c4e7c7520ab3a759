"""Synthesis of hierarchical collective reduction programs.

Data flows one way: topology + axes -> placements -> reduction groups -> synthesis
hierarchy -> programs (enumerated, pruned, proven) -> simulated cost -> ranking -> export.

The names below are the Python API; each is imported on first use, so `import synth` costs
nothing until then. For example (docs: README.md, "Python API"):

    from synth import build_hierarchy, cost_context, enumerate_placements, parse_axes, rank_programs, two_level

    topology = two_level(nodes=4, gpus=8)                 # or load_topology("dgx-a100-x4")
    for placement in enumerate_placements(topology, parse_axes("data=8,model=4")):
        hierarchy = build_hierarchy(placement, ("data",))
        context = cost_context(hierarchy, topology)       # backend "nccl" by default
        best = rank_programs(context, 256 * 2**20, max_len=4, top=1)[0]
        print(placement.to_text(), best.program, f"{best.speedup:.2f}x")
"""

import sys as _sys

if _sys.argv[:1] == ["-m"]:  # `python -m synth` is loading: a Ctrl-C from here on is one line, exit 130
    from synth import _interrupt

    _interrupt.install()

from synth._lazy import lazy_exports  # noqa: E402

__version__ = "0.1.0"

_EXPORTS = {
    # systems
    "Topology": "synth.topology", "Level": "synth.topology", "Figure": "synth.topology", "Uplinks": "synth.topology",
    "topology_from_levels": "synth.topology", "uniform_topology": "synth.topology", "two_level": "synth.topology",
    "three_level": "synth.topology",
    "load_topology": "synth.topology_file", "builtin_topology_names": "synth.topology_file",
    "render_topology": "synth.topology_file",
    # jobs and placements
    "Axis": "synth.placement", "Placement": "synth.placement", "Inside": "synth.placement", "Factor": "synth.placement",
    "parse_axes": "synth.placement", "make_placement": "synth.placement", "enumerate_placements": "synth.placement",
    "generate_placements": "synth.placement",
    # reduction groups and synthesis hierarchies
    "SynthesisHierarchy": "synth.hierarchy", "build_hierarchy": "synth.hierarchy", "HIERARCHY_KINDS": "synth.hierarchy",
    # programs: the language, their meaning, the search, lowering
    "Program": "synth.language", "Step": "synth.language", "parse_program": "synth.language",
    "Semantics": "synth.semantics",
    "Enumerator": "synth.search", "SearchOptions": "synth.search", "enumerate_programs": "synth.search",
    "semantics_for": "synth.search",
    "lower": "synth.lowering", "LoweredProgram": "synth.lowering",
    # costs and analyses
    "CostContext": "synth.model.context", "cost_context": "synth.model.context", "CostEngine": "synth.model.engine",
    "program_cost": "synth.model.cost", "simulate": "synth.model.cost", "lower_bound": "synth.model.bound",
    "LOCKSTEP": "synth.model.estimate", "PIPELINED": "synth.model.estimate", "DEFAULT_ESTIMATE": "synth.model.estimate",
    "Ranker": "synth.search.rank", "BestPrograms": "synth.search.best",
    "rank_programs": "synth.search.rank", "RankedProgram": "synth.search.rank",
    "explore_placements": "synth.analysis.explore",
    # errors
    "SynthError": "synth.errors", "UsageError": "synth.errors", "NoSolutionError": "synth.errors",
    "InvalidProgramError": "synth.errors", "ProgramSyntaxError": "synth.errors",
}

__all__ = ["__version__", *sorted(_EXPORTS)]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
