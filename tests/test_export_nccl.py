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
GOAL_PROGRAMS = [  # (case name, goal, program): every other goal, Permute steps where its programs have them
    ("2x4", "reducescatter", "Permute(gpu,node); ReduceScatter(InsideGroup(gpu)); ReduceScatter(Parallel(node))"),
    ("2x4", "allgather", "Permute(gpu,node); AllGather(Parallel(node)); AllGather(InsideGroup(gpu)); Permute(node,gpu)"),
    ("2x4", "alltoall", "AllToAll(Parallel(node)); Permute(gpu,node); AllToAll(InsideGroup(gpu)); Permute(node,gpu)"),
    ("2x4", "broadcast", "Broadcast(Master(node)); Broadcast(InsideGroup(node))"),
    ("2x2x2", "reduce", "Reduce(InsideGroup(sock)); Reduce(Master(node))"),
]


def _dry_run_lines(document: dict, rank: int) -> list[str]:
    """What the binary must print for `rank`, from the JSON plan."""
    (program,) = document["programs"]
    lines = [f"rank {rank} world {document['world_size']} chunks {document['buffer']['chunks']} count {document['buffer']['count']}",
             " ".join(["collective", program.get("collective", "allreduce"), "final_places",
                       *map(str, program.get("final_places") or [])])]
    for step in program["steps"]:
        if step["collective"] == "Permute":
            lines.append(f"step {step['index']} Permute places {' '.join(map(str, step['places']))}  # {step['text']}")
            continue
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


CASES_TO_COMPILE = [(case, "allreduce", text) for case, text in PROGRAMS] + GOAL_PROGRAMS


@needs_wheels
@pytest.mark.parametrize("case_name,goal,text", CASES_TO_COMPILE,
                         ids=[f"{name}-{goal}" for name, goal, _ in CASES_TO_COMPILE])
def test_c_export_compiles_links_and_dry_runs_the_json_plan(tmp_path, case_name, goal, text):
    case = next(case for case in CASES if case.name == case_name)
    program = parse_program(text)
    plan = build_plan([PlanEntry(case.built, program, goal=goal)])
    provenance = Provenance(("synth", "export", "test"))
    source = tmp_path / "program.c"
    source.write_text(nccl_c.render(plan, provenance))
    binary = tmp_path / "program"
    compile_c(source, binary)
    if case_name == "2x4" and goal in ("allreduce", "alltoall"):
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


# --- the build line of the docs, sizes, and NCCL for real where there is a GPU -------------------

DOCS = Path(__file__).resolve().parent.parent / "docs" / "export.md"


def test_the_docs_give_the_wheel_build_line_verbatim():
    assert "\n".join("    " + line for line in nccl_c.WHEEL_BUILD.splitlines()) in DOCS.read_text(encoding="utf-8")
    assert PIP_LINE in DOCS.read_text(encoding="utf-8")


def _exported(tmp_path: Path, text: str = PROGRAMS[0][1], case_name: str = "2x4") -> Path:
    case = next(case for case in CASES if case.name == case_name)
    source = tmp_path / "allreduce.c"
    source.write_text(nccl_c.render(build_plan([PlanEntry(case.built, parse_program(text))]), Provenance(("t",))))
    return source


@needs_wheels
def test_the_docs_build_line_works_as_written(tmp_path):
    """The shell lines of docs/export.md, run as they are in the directory of allreduce.c,
    with the python that has the wheels first on PATH."""
    _exported(tmp_path)
    environment = dict(os.environ, PATH=f"{Path(os.sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    result = subprocess.run(["bash", "-ec", nccl_c.WHEEL_BUILD], cwd=tmp_path, capture_output=True, text=True,
                            env=environment, timeout=300)
    assert result.returncode == 0, result.stderr
    dry = subprocess.run([str(tmp_path / "allreduce"), "--dry-run"], capture_output=True, text=True, timeout=60,
                         env=dict(environment, RANK="0", WORLD_SIZE="8"))
    assert dry.returncode == 0 and dry.stdout.startswith("rank 0 world 8"), dry.stderr


SIZES = ["8", "1000", "8M", "8m", "1G", "1.5K", "64KiB", "1MiB", "1MB", "1kB", "3 K", "2T", "1e6", "1PiB"]
BAD_SIZES = ["0", "-8M", "1e308PiB", "2PiB", "1.5", "0.1KiB", "8 parsecs", "4Gb", "M"]


@needs_wheels
def test_the_c_file_reads_sizes_as_synth_does(tmp_path):
    from synth.errors import UsageError
    from synth.export.plan import buffer_count
    from synth.units import parse_bytes

    source = _exported(tmp_path)
    binary = tmp_path / "program"
    compile_c(source, binary)
    environment = dict(os.environ, RANK="0", WORLD_SIZE="8")
    for text in SIZES:
        result = subprocess.run([str(binary), "--dry-run", "--bytes", text], capture_output=True, text=True,
                                env=environment, timeout=60)
        assert result.returncode == 0, (text, result.stderr)
        count = int(result.stdout.split()[7])
        assert count == buffer_count(parse_bytes(text), 8), text
    for text in BAD_SIZES:
        with pytest.raises(UsageError):
            parse_bytes(text)
        result = subprocess.run([str(binary), "--dry-run", "--bytes", text], capture_output=True, text=True,
                                env=environment, timeout=60)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, (text, result.stderr)


def _gpu() -> str | None:
    """Why NCCL cannot run for real here, or None."""
    if shutil.which("nvidia-smi") is None:
        return "no GPU here (nvidia-smi not found): NCCL runs only on a machine with one"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


needs_gpu = pytest.mark.skipif(_gpu() is not None, reason=_gpu() or "")


@needs_wheels
@needs_gpu
@pytest.mark.parametrize("dtype", ["float", "half", "bfloat16"])
def test_the_c_export_runs_on_nccl_with_8_ranks_sharing_the_gpus(tmp_path, dtype):
    """Every rank its own process; with fewer GPUs than ranks, each rank its own NCCL_HOSTID
    (the file sets it), so one GPU checks the program on the real NCCL library."""
    source = _exported(tmp_path)
    binary = tmp_path / "program"
    compile_c(source, binary)
    id_file = tmp_path / "nccl.id"
    processes = []
    for rank in range(8):
        environment = dict(os.environ, RANK=str(rank), WORLD_SIZE="8", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="8",
                           SYNTH_NCCL_ID_FILE=str(id_file), SYNTH_NCCL_TIMEOUT="120")
        processes.append(subprocess.Popen([str(binary), "--check", "-b", "1K", "-e", "64K", "-f", "8", "-n", "2", "-w", "1",
                                           "-d", dtype], env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
    outputs = [process.communicate(timeout=600)[0] for process in processes]
    assert all(process.returncode == 0 for process in processes), outputs
    assert "# check passed" in outputs[0] and "Avg bus bandwidth" in outputs[0] and dtype in outputs[0]


@needs_wheels
@needs_gpu
@pytest.mark.parametrize("case_name,goal,text", GOAL_PROGRAMS, ids=[goal for _, goal, _ in GOAL_PROGRAMS])
def test_the_c_export_of_every_goal_equals_nccls_own_collective(tmp_path, case_name, goal, text):
    """Permute steps and the per-goal check on the real NCCL library: the program's result
    equals ncclReduceScatter/ncclAllGather/grouped send-recv/ncclBroadcast/ncclReduce's."""
    case = next(case for case in CASES if case.name == case_name)
    source = tmp_path / "program.c"
    source.write_text(nccl_c.render(build_plan([PlanEntry(case.built, parse_program(text), goal=goal)]),
                                    Provenance(("t",))))
    binary = tmp_path / "program"
    compile_c(source, binary)
    processes = []
    for rank in range(8):
        environment = dict(os.environ, RANK=str(rank), WORLD_SIZE="8", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="8",
                           SYNTH_NCCL_ID_FILE=str(tmp_path / "nccl.id"), SYNTH_NCCL_TIMEOUT="120")
        processes.append(subprocess.Popen([str(binary), "--check", "-b", "1K", "-e", "64K", "-f", "64", "-n", "2",
                                           "-w", "1"], env=environment, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
    outputs = [process.communicate(timeout=600)[0] for process in processes]
    assert all(process.returncode == 0 for process in processes), outputs
    assert "# check passed" in outputs[0] and f"collective {goal}" in outputs[0]


@needs_wheels
@needs_gpu
def test_a_failing_rank_makes_the_others_abort_instead_of_hanging(tmp_path):
    """Rank 7 is killed after start-up: the others see NCCL's error (or the timeout), abort
    their communicators and exit 1, well before the test's own limit."""
    import signal
    import time

    source = _exported(tmp_path)
    binary = tmp_path / "program"
    compile_c(source, binary)
    id_file = tmp_path / "nccl.id"
    processes = []
    for rank in range(8):
        environment = dict(os.environ, RANK=str(rank), WORLD_SIZE="8", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="8",
                           SYNTH_NCCL_ID_FILE=str(id_file), SYNTH_NCCL_TIMEOUT="60")
        processes.append(subprocess.Popen([str(binary), "--bytes", "64M", "-n", "1000", "-w", "1"], env=environment,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    time.sleep(20)
    processes[7].send_signal(signal.SIGKILL)
    codes = [process.wait(timeout=300) for process in processes[:7]]
    assert all(code == 1 for code in codes), codes
