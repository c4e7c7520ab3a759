"""The topology simulator and the ranking of programs by predicted time (issue 3).

network: the topology as a graph of devices, switches and links; link loads of flows.
collectives: how a backend (NCCL, gloo) runs each collective, as phases of flows.
cost: the time of a lowered program for every reduction group at once (docs/model.md section 8).
bound: a lower bound on any correct all-reduce's time, for the ratio to it.
rank: programs ranked by predicted time, the top K by a cost-guided search, Pareto filter.
"""

from synth.model.bound import LowerBound, lower_bound
from synth.model.algorithms import BACKENDS, Backend, resolve_backend
from synth.model.cost import ProgramCost, Simulator, StepCost, baseline_cost, baseline_program, simulate
from synth.model.network import Network, check_costable, network_for

__all__ = [
    "BACKENDS", "Backend", "LowerBound", "Network", "ProgramCost", "Simulator", "StepCost", "baseline_cost",
    "baseline_program", "check_costable", "lower_bound", "network_for", "resolve_backend", "simulate",
]
