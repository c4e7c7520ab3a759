"""Analyses that ask the cost model questions: rank programs, the best program per size,
sweeps, placement exploration, workloads and gradient-bucket fusion."""
