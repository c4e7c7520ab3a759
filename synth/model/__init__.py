"""The cost model: what one run of a program by every reduction group costs (docs/model.md section 8).

network: the topology as a graph of devices, switches and links; link loads of flows.
algorithms: how a backend (NCCL, gloo) runs each collective, as phases of flows.
backends: the backends by name (the registry).
backend: the seam a backend implements (its plans and its own estimate of a call alone), and the
  vocabulary of plans (layouts, phases, flows) backends and algorithms speak.
context: the checked (hierarchy, topology, backend) every cost is relative to.
engine: step costs for any steps and sizes, batched; programs as tables of steps.
estimate: lockstep and pipelined, the two ways step costs become a program's time.
bound: a lower bound on any correct all-reduce's time, for the ratio to it.
cost: one program's cost in detail.
"""

from synth._lazy import lazy_exports

# resolved on first use (synth/_lazy.py): importing a light module of this package (nccl.names,
# the topology reader's vocabulary) does not load the cost engine and numpy
_EXPORTS = {
    'BACKENDS': 'synth.model.backends',
    'Backend': 'synth.model.algorithms',
    'resolve_backend': 'synth.model.backends',
    'CallModel': 'synth.model.backend',
    'CallSite': 'synth.model.backend',
    'BoundLine': 'synth.model.bound',
    'LowerBound': 'synth.model.bound',
    'bound_line': 'synth.model.bound',
    'lower_bound': 'synth.model.bound',
    'CostContext': 'synth.model.context',
    'cost_context': 'synth.model.context',
    'ProgramCost': 'synth.model.cost',
    'StepCost': 'synth.model.cost',
    'baseline_cost': 'synth.model.cost',
    'baseline_program': 'synth.model.cost',
    'bus_factor': 'synth.model.cost',
    'program_cost': 'synth.model.cost',
    'simulate': 'synth.model.cost',
    'CostEngine': 'synth.model.engine',
    'ProgramTable': 'synth.model.engine',
    'StepCalls': 'synth.model.engine',
    'engine_for': 'synth.model.engine',
    'step_calls': 'synth.model.engine',
    'steps_of': 'synth.model.engine',
    'DEFAULT_ESTIMATE': 'synth.model.estimate',
    'ESTIMATES': 'synth.model.estimate',
    'LOCKSTEP': 'synth.model.estimate',
    'PIPELINED': 'synth.model.estimate',
    'Estimate': 'synth.model.estimate',
    'resolve_estimate': 'synth.model.estimate',
    'Network': 'synth.model.network',
    'check_costable': 'synth.model.network',
    'network_for': 'synth.model.network',
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

__all__ = [
    "BACKENDS", "Backend", "BoundLine", "CallModel", "CallSite", "CostContext", "CostEngine", "DEFAULT_ESTIMATE",
    "ESTIMATES", "Estimate", "LOCKSTEP", "LowerBound", "Network", "PIPELINED", "ProgramCost", "ProgramTable",
    "StepCalls", "StepCost", "baseline_cost", "baseline_program", "bound_line", "bus_factor", "check_costable",
    "cost_context", "engine_for", "lower_bound", "network_for", "program_cost", "resolve_backend",
    "resolve_estimate", "simulate", "step_calls", "steps_of",
]
