"""Exports: programs and placements in the forms clusters and frameworks run.

`plan` maps a lowered program to per-rank calls once; `torch_script`, `nccl_c` and
`json_plan` render that plan, `mesh` renders a placement, `provenance` stamps every file
with the command and version that made it, and `launch` runs torch scripts with torchrun.
"""
