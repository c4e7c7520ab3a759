"""The cost model: what one run of a program by every reduction group costs (docs/model.md section 8).

network: the topology as a graph of devices, switches and links; link loads of flows.
algorithms: how a backend (NCCL, gloo) runs each collective, as phases of flows.
backend: the seam a backend implements (its plans and its own estimate of a call alone).
context: the checked (hierarchy, topology, backend) every cost is relative to.
engine: step costs for any steps and sizes, batched; programs as tables of steps.
estimate: lockstep and pipelined, the two ways step costs become a program's time.
bound: a lower bound on any correct all-reduce's time, for the ratio to it.
cost: one program's cost in detail.
"""

from synth.model.algorithms import BACKENDS, Backend, resolve_backend
from synth.model.backend import CallModel, CallSite
from synth.model.bound import BoundLine, LowerBound, bound_line, lower_bound
from synth.model.context import CostContext, cost_context
from synth.model.cost import ProgramCost, StepCost, baseline_cost, baseline_program, bus_factor, program_cost, simulate
from synth.model.engine import CostEngine, ProgramTable, StepCalls, engine_for, step_calls, steps_of
from synth.model.estimate import DEFAULT_ESTIMATE, ESTIMATES, LOCKSTEP, PIPELINED, Estimate, resolve_estimate
from synth.model.network import Network, check_costable, network_for

__all__ = [
    "BACKENDS", "Backend", "BoundLine", "CallModel", "CallSite", "CostContext", "CostEngine", "DEFAULT_ESTIMATE",
    "ESTIMATES", "Estimate", "LOCKSTEP", "LowerBound", "Network", "PIPELINED", "ProgramCost", "ProgramTable",
    "StepCalls", "StepCost", "baseline_cost", "baseline_program", "bound_line", "bus_factor", "check_costable",
    "cost_context", "engine_for", "lower_bound", "network_for", "program_cost", "resolve_backend",
    "resolve_estimate", "simulate", "step_calls", "steps_of",
]
