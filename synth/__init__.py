"""Synthesis of hierarchical collective reduction programs.

Data flows one way: topology + axes -> placements -> reduction groups -> synthesis
hierarchy -> programs (enumerated, pruned, proven) -> simulated cost -> ranking -> export.
"""

__version__ = "0.1.0"
