"""The NCCL C export compiles and links against the real nccl.h, libnccl and the CUDA runtime
from their PyPI wheels (no GPU needed), and the calls it would make, printed by its GPU-free
--dry-run for every rank, are exactly the JSON plan's.

Wheels: pip install nvidia-nccl-cu12 nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12 nvidia-cuda-cccl-cu12
(nccl.h includes cuda_runtime.h, whose crt/ headers ship in the nvcc wheel and whose
<nv/target> ships in the cccl wheel).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from export_cases import CASES
from synth.export import json_plan, nccl_c
from synth.export.plan import PlanEntry, build_plan
from synth.export.provenance import Provenance, hierarchy_metadata, placement_metadata
from synth.language import parse_program
from synth.topology import topology_from_levels

PIP_LINE = "pip install nvidia-nccl-cu12 nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12 nvidia-cuda-cccl-cu12"
NEEDED = {  # wheel (module under nvidia/) -> a file it must provide
    "nccl": ("include/nccl.h", "lib/libnccl.so.2"),
    "cuda_runtime": ("include/cuda_runtime_api.h", "lib/libcudart.so.12"),
    "cuda_nvcc": ("include/crt/host_defines.h",),
    "cuda_cccl": ("include/nv/target",),
}


def _wheel_dirs() -> dict[str, Path] | str:
    """The installed wheels' directories, or why they cannot be used."""
    found, missing = {}, []
    for name, files in NEEDED.items():
        try:
            spec = importlib.util.find_spec(f"nvidia.{name}")
        except ModuleNotFoundError:
            spec = None
        locations = list(spec.submodule_search_locations or []) if spec else []
        directory = next((Path(p) for p in locations if all((Path(p) / f).exists() for f in files)), None)
        if directory is None:
            missing.append(f"nvidia-{name.replace('_', '-')}-cu12")
        else:
            found[name] = directory
    if missing:
        return f"NCCL/CUDA wheels missing ({', '.join(missing)}): {PIP_LINE}"
    return found


WHEELS = _wheel_dirs()
GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc is not installed")
needs_wheels = pytest.mark.skipif(isinstance(WHEELS, str) or GCC is None,
                                  reason=WHEELS if isinstance(WHEELS, str) else "gcc is not installed")


def compile_c(source: Path, output: Path, cxx: bool = False) -> None:
    """gcc as C11, or (cxx) g++ as C++17: the file is both, so nvcc can build it too."""
    wheels = WHEELS
    language = ["-x", "c++", "-std=c++17"] if cxx else ["-std=c11"]
    command = [GCC, *language, "-O1", "-Wall", "-Wextra", "-Werror", str(source), "-o", str(output)]
    for name in ("cuda_runtime", "cuda_nvcc", "cuda_cccl", "nccl"):
        command += ["-isystem", str(wheels[name] / "include")]
    for name in ("nccl", "cuda_runtime"):
        command += ["-L", str(wheels[name] / "lib"), f"-Wl,-rpath,{wheels[name] / 'lib'}"]
    command += ["-l:libnccl.so.2", "-l:libcudart.so.12"] + (["-lstdc++"] if cxx else [])
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@needs_gcc
def test_c_strings_and_comments_survive_hostile_text(tmp_path):
    texts = ['plain', 'quote " and \\ backslash', 'new\nline */ // ??/', "tab\t\u00e9\u2028", "ends with \\"]
    lines = [nccl_c.c_comment(text) for text in texts]
    lines += ["#include <stdio.h>", "int main(void) {"]
    lines += [f"  puts({nccl_c.c_string(text)});" for text in texts]
    lines += ["  return 0;", "}"]
    source = tmp_path / "strings.c"
    source.write_text("\n".join(lines) + "\n")
    result = subprocess.run([GCC, "-std=c11", "-Wall", "-Werror", "-Wno-trigraphs", str(source), "-o", str(tmp_path / "s")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    output = subprocess.run([str(tmp_path / "s")], capture_output=True).stdout.decode("utf-8")
    assert output == "".join(text + "\n" for text in texts)


PROGRAMS = [  # (case name, program): Master with idle ranks, a scatter/gather pipeline, split, two axes
    ("2x4", "Reduce(InsideGroup(gpu)); AllReduce(Master(node)); Broadcast(InsideGroup(gpu))"),
    ("2x2x2", "ReduceScatter(InsideGroup(sock)); AllReduce(Parallel(node)); AllGather(InsideGroup(sock))"),
    ("two-axes-split", "ReduceScatter(Parallel(gpu.model)); ReduceScatter(Parallel(gpu.data)); "
                       "AllReduce(Parallel(node.data)); AllGather(Parallel(gpu.data)); AllGather(Parallel(gpu.model))"),
]


def _dry_run_lines(document: dict, rank: int) -> list[str]:
    """What the binary must print for `rank`, from the JSON plan."""
    lines = [f"rank {rank} world {document['world_size']} chunks {document['buffer']['chunks']} count {document['buffer']['count']}"]
    for step in document["programs"][0]["steps"]:
        entry = step["ranks"][rank]
        if entry["idle"]:
            lines.append(f"step {step['index']} {step['collective']} idle  # {step['text']}")
            continue
        root = -1 if entry["root"] is None else entry["root"]
        lines.append(
            f"step {step['index']} {step['collective']} comm {step['communicator']} color {entry['color']} "
            f"key {entry['key']} size {len(entry['members'])} offset {entry['offset']} count {entry['count']} "
            f"send {entry['send_offset']} {entry['send_count']} recv {entry['recv_offset']} {entry['recv_count']} "
            f"root {root}  # {step['text']}")
    return lines


@needs_wheels
@pytest.mark.parametrize("case_name,text", PROGRAMS, ids=[name for name, _ in PROGRAMS])
def test_c_export_compiles_links_and_dry_runs_the_json_plan(tmp_path, case_name, text):
    case = next(case for case in CASES if case.name == case_name)
    program = parse_program(text)
    plan = build_plan([PlanEntry(case.built, program)])
    provenance = Provenance(("synth", "export", "test"))
    source = tmp_path / "program.c"
    source.write_text(nccl_c.render(plan, provenance))
    binary = tmp_path / "program"
    compile_c(source, binary)
    if case_name == "2x4":
        compile_c(source, tmp_path / "program_cxx", cxx=True)
    metadata = placement_metadata(topology_from_levels(case.levels), case.built.placement)
    metadata.update(hierarchy_metadata(case.built))
    nbytes = 3000  # not whole chunks: both sides must round up the same way
    document = json_plan.plan_document(plan, provenance, metadata, nbytes)
    for rank in range(plan.world_size):
        environment = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(plan.world_size))
        result = subprocess.run([str(binary), "--dry-run", "--bytes", str(nbytes)], capture_output=True, text=True,
                                env=environment, timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == _dry_run_lines(document, rank)
    # Without RANK/WORLD_SIZE, or with the wrong world size, it refuses in one line.
    for environment in ({}, {"RANK": "0", "WORLD_SIZE": "3"}):
        clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
        result = subprocess.run([str(binary)], capture_output=True, text=True, env=dict(clean, **environment), timeout=60)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
