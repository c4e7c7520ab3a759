"""The training-step planner: degrees, placement, settings and programs of a whole step, chosen
together (docs/plan.md).

Data flows one way: a model and a topology -> degree choices (degrees.py) -> placements of
their axes -> every collective costed through one door to the cost model (costs.py, each on
its smallest equivalent system, equivalent.py) -> one step predicted per candidate (step.py)
-> ranked (search.py). The names below are the planner's Python API, typed values in and
out; option names and text live in the command (synth/commands/plan.py). Each is imported on
first use. For example:

    from synth.plan import PRESETS, PlanRequest, compute_of, estimate, plan
    from synth.topology_file import load_topology

    topology, model = load_topology("selene"), PRESETS["gpt3-2.7b"]
    request = PlanRequest(model, topology, compute_of(topology.device, model.precision))
    print(estimate(request).estimated_s)       # refused before starting when over budget
    best = plan(request).ranked[0]
    print(best.degrees.text, best.placement.to_text(), best.settings.text, best.step_s)
"""

from synth._lazy import lazy_exports

_EXPORTS = {
    # the question
    "Transformer": "synth.plan.model", "PRESETS": "synth.plan.model", "load_model": "synth.plan.model",
    "Compute": "synth.plan.step", "compute_of": "synth.plan.step",
    "DegreeLimits": "synth.plan.degrees", "Degrees": "synth.plan.degrees", "enumerate_degrees": "synth.plan.degrees",
    "SearchSpace": "synth.plan.search", "PlanRequest": "synth.plan.search",
    # the search, its estimate and its refusals
    "plan": "synth.plan.search", "estimate": "synth.plan.search", "check_size": "synth.plan.search",
    "PlanResult": "synth.plan.search", "SearchSize": "synth.plan.search",
    "SearchBudgetError": "synth.plan.search", "BudgetValueError": "synth.plan.search",
    # one candidate
    "Settings": "synth.plan.step", "Prediction": "synth.plan.step", "predict": "synth.plan.step",
    "CommunicationCosts": "synth.plan.costs",
    # launching the winner
    "launch_document": "synth.plan.launch", "megatron_arguments": "synth.plan.launch",
    "megatron_order": "synth.plan.launch",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
