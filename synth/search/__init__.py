"""The program search, one module per job:

* `enumerator`: every valid program up to a length, pruned, shortest first (a generator);
* `pruning`: the Z3 dead-prefix oracle over an abstract state;
* `budget`: what a search costs before it starts, so one that cannot finish is refused;
* `walker`: programs stepped over the quotient state graph, as the cost model sees them;
* `completion`: an admissible bound on what any completion of a state must still cost;
* `best_first`: the K cheapest programs by a best-first search keyed by that bound;
* `programs`: enumerated programs walked into the cost model's step tables, once per shape;
* `rank`: programs ranked by predicted time (`Ranker`: the full ranking, or the best-first K);
* `best`: the fastest program per buffer size of one cost context, memoized;
* `states`: search states written as people read them.

The enumerator's names are imported with the package (they cost nothing: no cost model, no
solver); the others resolve on first use.
"""

from synth._lazy import lazy_exports
from synth.search.enumerator import (
    MAX_PROGRAM_LENGTH,
    Enumerator,
    SearchOptions,
    SearchStats,
    brute_force_programs,
    check_search,
    enumerate_programs,
    semantics_for,
)

_EXPORTS = {
    "StateWalker": "synth.search.walker",
    "CompletionBound": "synth.search.completion", "StateAbstraction": "synth.search.completion",
    "UnknownStepKindError": "synth.search.completion",
    "cheapest_programs": "synth.search.best_first",
    "ProgramSet": "synth.search.programs", "ProgramSets": "synth.search.programs",
    "RankedProgram": "synth.search.rank", "rank_programs": "synth.search.rank", "Ranker": "synth.search.rank",
    "pareto_front": "synth.search.rank",
    "BestPrograms": "synth.search.best", "CandidateTimes": "synth.search.best", "Choice": "synth.search.best",
    "grid_sizes": "synth.search.best",
    "check_budget": "synth.search.budget", "SearchEstimate": "synth.search.budget",
    "DeadPrefixOracle": "synth.search.pruning",
    "format_state": "synth.search.states", "format_trace": "synth.search.states",
}

__all__ = sorted([*_EXPORTS, "MAX_PROGRAM_LENGTH", "Enumerator", "SearchOptions", "SearchStats",
                  "brute_force_programs", "check_search", "enumerate_programs", "semantics_for"])
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
