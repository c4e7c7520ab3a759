"""Export one program to a C source file on the NCCL API.

The file is a header of `//` comments, the runtime of synth/export/nccl_runtime.c, and the
plan as integer tables and C string literals in place of the runtime's SYNTH_PLAN marker.
Strings are escaped character by character (anything outside a small safe set becomes an
octal escape), so no user text can end a literal or a comment.

Build with the CUDA toolkit and NCCL installed (or from the PyPI wheels with WHEEL_BUILD, the
lines docs/export.md gives and the tests run as written):

    gcc -std=c11 -O2 program.c -I$CUDA_HOME/include -I$NCCL_HOME/include -L$CUDA_HOME/lib64 \\
        -L$NCCL_HOME/lib -lnccl -lcudart -o program

Run one process per GPU with RANK/WORLD_SIZE (or under mpirun/srun) and
SYNTH_NCCL_ID_FILE pointing at a new file on a shared file system; see docs/export.md.
"""

from __future__ import annotations

import json
from importlib import resources

from synth.collectives import RECORDS
from synth.export.plan import Plan
from synth.export.provenance import Provenance
from synth.text import c_comment, c_string

MARKER = "/* SYNTH_PLAN */"
# Building from the PyPI wheels nvidia-nccl-cu12, nvidia-cuda-runtime-cu12, nvidia-cuda-nvcc-cu12
# (crt/host_defines.h) and nvidia-cuda-cccl-cu12 (nv/target, which cuda_fp16.h includes): they
# ship only versioned libraries (libnccl.so.2, libcudart.so.12), hence -l: and the rpath.
WHEEL_BUILD = (
    "NV=$(python -c 'import nvidia; print(nvidia.__path__[0])')\n"
    "gcc -std=c11 -O2 allreduce.c -o allreduce \\\n"
    "    -I$NV/cuda_runtime/include -I$NV/cuda_nvcc/include -I$NV/cuda_cccl/include -I$NV/nccl/include \\\n"
    "    -L$NV/cuda_runtime/lib -L$NV/nccl/lib -l:libnccl.so.2 -l:libcudart.so.12 \\\n"
    "    -Wl,-rpath,$NV/nccl/lib:$NV/cuda_runtime/lib"
)
# The runtime's op enum, one per collective record (nccl_runtime.c lists them in this order).
OPS = {record.name: "OP_" + record.snake_name.upper() for record in RECORDS.values()} | {"Permute": "OP_PERMUTE"}


def _table(name: str, rows, width_names: str) -> str:
    body = ",\n".join("  {" + ", ".join(str(value) for value in row) + "}" for row in rows)
    return f"static const int {name}[{width_names}] = {{\n{body}\n}};"


def render(plan: Plan, provenance: Provenance) -> str:
    if len(plan.programs) != 1:
        raise ValueError("a C file holds one program")
    program = plan.programs[0]
    world = plan.world_size
    colors = [[-1 if c is None else c for c in comm.colors(world)] for comm in plan.communicators]
    keys = [[-1 if k is None else k for k in comm.keys(world)] for comm in plan.communicators]

    goal = program.goal
    final_places = list(program.final_places) if program.final_places is not None else [-1] * program.chunks
    for step in program.steps:
        if step.places is not None and len(step.places) != program.chunks:
            raise ValueError(f"a Permute step moves {len(step.places)} places, the buffer has {program.chunks} chunks")

    def per_rank(step, field):
        return [-1 if call is None or getattr(call, field) is None else getattr(call, field) for call in step.calls]

    data = [
        f"#define WORLD_SIZE {world}",
        f"#define CHUNKS {program.chunks}",
        f"#define NUM_COMMS {len(plan.communicators)}",
        f"#define NUM_STEPS {len(program.steps)}",
        f"#define REDUCTION_COMM {program.reduction}",
        f"#define GOAL_OP {OPS[goal.collective]}",
        f"static const char GOAL_NAME[] = {c_string(goal.name)};",
        "// Reduce-scatter, all-gather, all-to-all: the place where block b ends (-1: no layout given).",
        "static const int FINAL_PLACES[CHUNKS] = {" + ", ".join(str(place) for place in final_places) + "};",
        f"static const char PROGRAM_TEXT[] = {c_string(program.text)};",
        f"static const char COMMAND[] = {c_string(provenance.command)};",
        "static const char REDUCTION_GROUPS[] = " + c_string(json.dumps(
            [list(group) for group in plan.communicators[program.reduction].groups], separators=(",", ":"))) + ";",
        "// Communicators: color (group index, -1 = NCCL_SPLIT_NOCOLOR) and key (rank inside) per global rank.",
        _table("COMM_COLOR", colors, "NUM_COMMS][WORLD_SIZE"),
        _table("COMM_KEY", keys, "NUM_COMMS][WORLD_SIZE"),
        "// Steps: collective, communicator, and per global rank the chunk range [lo, hi) of its call",
        "// (-1: idle) and the root's rank inside the communicator (-1: no root).",
        "static const int STEP_OP[NUM_STEPS] = {" + ", ".join(OPS[step.collective] for step in program.steps) + "};",
        "static const int STEP_COMM[NUM_STEPS] = {" + ", ".join(str(step.communicator) for step in program.steps) + "};",
        "static const char *const STEP_TEXT[NUM_STEPS] = {" + ", ".join(c_string(step.text) for step in program.steps) + "};",
        _table("STEP_LO", [per_rank(step, "lo") for step in program.steps], "NUM_STEPS][WORLD_SIZE"),
        _table("STEP_HI", [per_rank(step, "hi") for step in program.steps], "NUM_STEPS][WORLD_SIZE"),
        _table("STEP_ROOT", [per_rank(step, "root") for step in program.steps], "NUM_STEPS][WORLD_SIZE"),
        "// Permute steps: the place each chunk moves to (-1 in the other steps' rows).",
        _table("STEP_PLACES", [list(step.places) if step.places is not None else [-1] * program.chunks
                               for step in program.steps], "NUM_STEPS][CHUNKS"),
    ]
    runtime = resources.files("synth.export").joinpath("nccl_runtime.c").read_text(encoding="utf-8")
    if runtime.count(MARKER) != 1:
        raise RuntimeError(f"nccl_runtime.c must hold the marker {MARKER} once")
    header = [c_comment(line) for line in provenance.lines()]
    header.append(c_comment(f"Program: {program.text}"))
    header.append(c_comment(f"{world} ranks (one process per GPU, or several sharing one), reduction groups of "
                            f"{program.chunks}, {goal.name} of float, half or bfloat16 (-d)."))
    header.append(c_comment("Build: gcc -std=c11 -O2 THIS.c -I$CUDA_HOME/include -I$NCCL_HOME/include "
                            "-L$CUDA_HOME/lib64 -L$NCCL_HOME/lib -lnccl -lcudart -o program"))
    header.append(c_comment("  (from the PyPI wheels nvidia-nccl-cu12 nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12 "
                            "nvidia-cuda-cccl-cu12: see docs/export.md)"))
    header.append(c_comment(f"Run: RANK=r WORLD_SIZE={world} LOCAL_RANK=l SYNTH_NCCL_ID_FILE=/shared/new-path "
                            "./program --check [-b 8 -e 128M -f 2] [-n 20] [-w 5] [-d float]; or under mpirun/srun"))
    return "\n".join(header) + "\n\n" + runtime.replace(MARKER, "\n".join(data))
