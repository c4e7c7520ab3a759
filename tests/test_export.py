"""Exports without launching anything: JSON plans replayed by an independent numpy
interpreter, meshes, torch scripts read back, name validation and the CLI's refusals."""

from __future__ import annotations

import ast
import itertools
import json

import numpy as np
import pytest

from export_cases import CASES, entries, programs_of
from synth.errors import UsageError
from synth.export import json_plan, mesh
from synth.export.plan import PlanEntry, build_plan, buffer_count
from synth.export.provenance import Provenance, hierarchy_metadata, placement_metadata
from synth.export.torch_script import script_data
from synth.export import torch_script
from synth.hierarchy import build_hierarchy
from synth.language import parse_program
from synth.placement import Placement, enumerate_placements, make_placement, parse_axes
from synth.topology import topology_from_levels

PROVENANCE = Provenance(("synth", "export", "test"))
LEVELS_2X4 = ("--levels", "node=2,gpu=4", "--axes", "data=8", "--reduce", "data", "--placement", "[[2,4]]")
PROGRAM = "ReduceScatter(InsideGroup(gpu)); AllReduce(Parallel(node)); AllGather(InsideGroup(gpu))"


# --- an independent interpreter of JSON plans ---------------------------------------------------


def replay(document: dict, program_index: int, rng) -> None:
    """Run one program of a plan on real arrays, one per rank, straight from the plan's
    offsets and counts; undefined data (non-roots after Reduce) is NaN. Checks the result is
    the direct sum over each reduction group."""
    world, count = document["world_size"], document["buffer"]["count"]
    start = rng.integers(-1000, 1000, size=(world, count)).astype(np.float64)
    buffers = start.copy()
    for step in document["programs"][program_index]["steps"]:
        busy = [entry for entry in step["ranks"] if not entry["idle"]]
        groups: dict[int, list[dict]] = {}
        for entry in busy:
            groups.setdefault(entry["color"], []).append(entry)
        for color, members in groups.items():
            members.sort(key=lambda entry: entry["key"])
            ranks = [entry["rank"] for entry in members]
            assert [entry["key"] for entry in members] == list(range(len(members)))
            assert all(entry["members"] == ranks for entry in members), "a group's ranks disagree on its members"
            assert len({(e["send_count"], e["recv_count"]) for e in members}) == 1, "counts differ inside a group"
            _apply(step["collective"], members, buffers)
    sums = {}
    for group in document["reduction_groups"]:
        total = start[group].sum(axis=0)
        for rank in group:
            sums[rank] = total
    expected = np.stack([sums[rank] for rank in range(world)])
    assert np.array_equal(buffers, expected), f"program {document['programs'][program_index]['text']} missed the sum"


def _apply(collective: str, members: list[dict], buffers: np.ndarray) -> None:
    def view(entry, which):
        offset, count = entry[f"{which}_offset"], entry[f"{which}_count"]
        return buffers[entry["rank"], offset:offset + count]

    sends = [view(entry, "send").copy() for entry in members]
    if collective in ("AllReduce", "ReduceScatter", "Reduce"):
        total = np.sum(sends, axis=0)
    if collective == "AllReduce":
        for entry in members:
            view(entry, "recv")[:] = total
    elif collective == "ReduceScatter":
        block = members[0]["recv_count"]
        for entry in members:
            assert entry["recv_offset"] == entry["send_offset"] + entry["key"] * block
            view(entry, "recv")[:] = total[entry["key"] * block:(entry["key"] + 1) * block]
    elif collective == "AllGather":
        joined = np.concatenate(sends)
        for entry in members:
            assert entry["send_offset"] == entry["recv_offset"] + entry["key"] * entry["send_count"]
            view(entry, "recv")[:] = joined
    elif collective == "Reduce":
        for entry in members:
            view(entry, "recv")[:] = total if entry["key"] == entry["root"] else np.nan
    elif collective == "Broadcast":
        root = next(entry for entry in members if entry["key"] == entry["root"])
        data = view(root, "send").copy()
        for entry in members:
            view(entry, "recv")[:] = data
    else:
        raise AssertionError(f"unknown collective {collective}")


def document_for(case, programs, nbytes=1000) -> dict:
    plan = build_plan(PlanEntry(case.built, program) for program in programs)
    metadata = placement_metadata(topology_from_levels(case.levels), case.built.placement)
    metadata.update(hierarchy_metadata(case.built))
    return json_plan.plan_document(plan, PROVENANCE, metadata, nbytes)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_every_program_replays_from_its_json_plan(case):
    programs = programs_of(case, 4)
    document = document_for(case, programs)
    rng = np.random.default_rng(0)
    for index in range(len(programs)):
        replay(document, index, rng)
    assert document["buffer"]["count"] % document["buffer"]["chunks"] == 0


def test_a_corrupted_plan_fails_the_replay():
    case = CASES[0]
    document = document_for(case, [parse_program(PROGRAM)])
    allreduce = document["programs"][0]["steps"][1]
    for entry in allreduce["ranks"]:
        shift = entry["count"]
        for field in ("offset", "send_offset", "recv_offset"):
            entry[field] = (entry[field] + shift) % document["buffer"]["count"]
    with pytest.raises(AssertionError, match="missed the sum"):
        replay(document, 0, np.random.default_rng(1))


def test_plan_covers_every_collective_form_and_idle_ranks():
    plan = build_plan(entries(3))
    steps = [step for program in plan.programs for step in program.steps]
    texts = [step.text for step in steps]
    for collective in ("AllReduce", "ReduceScatter", "AllGather", "Reduce", "Broadcast"):
        assert any(text.startswith(collective + "(") for text in texts), collective
    for form in ("InsideGroup", "Parallel", "Master"):
        assert any(f"({form}(" in text for text in texts), form
    assert any(None in step.calls for step in steps), "no Master step leaves a rank idle"
    assert any("." in text for text in texts), "no split-hierarchy program"


def test_communicator_members_are_in_global_rank_order():
    """torch numbers a group by global rank; the plan's keys must agree (the scripts check it too)."""
    plan = build_plan(entries(3))
    for comm in plan.communicators:
        for group in comm.groups:
            assert list(group) == sorted(group)


def test_buffer_rounds_up_to_whole_chunks():
    assert buffer_count(1024, 8) == 256
    assert buffer_count(1000, 8) == 256
    assert buffer_count(1, 8) == 8
    assert buffer_count(4 * 8 * 3 + 1, 8) == 32


def test_torch_runtime_rounds_like_the_plan():
    torch_runtime = pytest.importorskip("synth.export.torch_runtime")
    for nbytes in (1, 7, 1000, 1024, 12345, 2**20 + 3):
        for chunks in (2, 4, 8, 6, 16):
            assert torch_runtime.element_count(nbytes, chunks) == buffer_count(nbytes, chunks)
    assert torch_runtime.parse_size("32MiB") == 32 * 2**20
    assert torch_runtime.parse_size("1kB") == 1000


def test_torch_runtime_timeout_flag():
    torch_runtime = pytest.importorskip("synth.export.torch_runtime")
    assert torch_runtime.parse_args([]).timeout is None  # torch's default for every group
    assert torch_runtime.parse_args(["--timeout", "90"]).timeout == 90.0
    for bad in ("0", "-5", "inf", "nan"):
        with pytest.raises(SystemExit):
            torch_runtime.parse_args(["--timeout", bad])


# --- torch scripts ----------------------------------------------------------------------------------


def test_torch_script_is_standalone_and_embeds_the_plan():
    plan = build_plan(entries(2))
    text = torch_script.render(plan, PROVENANCE)
    tree = ast.parse(text)
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"argparse", "datetime", "fractions", "inspect", "json", "os", "re", "sys", "time", "torch"}, imported
    assign = next(node for node in tree.body if isinstance(node, ast.Assign) and node.targets[0].id == "PLAN")
    embedded = json.loads(ast.literal_eval(assign.value.args[0]))
    assert embedded == json.loads(json.dumps(dict(script_data(plan), command=PROVENANCE.command)))
    assert text == torch_script.render(plan, PROVENANCE), "rendering is not deterministic"
    assert "Generated by synth" in text and "Command: synth export test" in text


# --- meshes -----------------------------------------------------------------------------------------


def _placements():
    yield from enumerate_placements(topology_from_levels("a=2,b=2,c=2"), parse_axes("data=4,model=2"))
    yield from enumerate_placements(topology_from_levels("node=2,gpu=4"), parse_axes("dp=2,tp=4"))
    yield from enumerate_placements(topology_from_levels("node=2,gpu=4"), parse_axes("dp=2,pp=2,tp=2"))
    yield from enumerate_placements(topology_from_levels("node=3,gpu=4"), parse_axes("dp=6,tp=2"))
    yield from enumerate_placements(topology_from_levels("node=2,gpu=4"), parse_axes("dp=8,pp=1"))


@pytest.mark.parametrize("placement", list(_placements()), ids=lambda p: f"{p.axis_names}{p.to_text()}")
def test_mesh_array_and_order_string(placement):
    array = mesh.device_mesh_array(placement)
    for rank in range(placement.device_count):
        assert array[tuple(placement.axis_coordinates[rank])] == rank
    devices = np.array([f"dev{rank}" for rank in range(placement.device_count)])
    jax_mesh = devices[mesh.jax_permutation(placement)].reshape(placement.axis_sizes)
    assert (jax_mesh == np.vectorize(lambda rank: f"dev{rank}")(array)).all()
    # Independent oracle: some order of whole axes numbers the ranks exactly when one is reported.
    orders = []
    for order in itertools.permutations(range(len(placement.axis_sizes))):
        rank, stride = np.zeros(placement.device_count, dtype=np.int64), 1
        for a in order:
            rank += placement.axis_coordinates[:, a] * stride
            stride *= placement.axis_sizes[a]
        if np.array_equal(rank, np.arange(placement.device_count)):
            orders.append(tuple(placement.axis_names[a] for a in order))
    found = mesh.axis_order(placement)
    if orders:
        assert found.order in orders
    else:
        assert found.order is None and "not a permutation of whole axes" in found.statement


def test_megatron_order_examples():
    topology = topology_from_levels("node=2,gpu=4")
    axes = parse_axes("dp=2,tp=4")
    assert mesh.axis_order(make_placement(topology, axes, [[2, 1], [1, 4]])).order == ("tp", "dp")
    axes = parse_axes("tp=4,dp=2")
    assert mesh.axis_order(make_placement(topology, axes, [[1, 4], [2, 1]])).order == ("tp", "dp")
    axes = parse_axes("dp=2,tp=4")
    statement = mesh.axis_order(make_placement(topology, axes, [[1, 2], [2, 2]])).statement
    assert "tp spans levels node and gpu" in statement and "dp" in statement


def test_identity_placement_matches_init_device_mesh_numbering():
    torch = pytest.importorskip("torch")
    placement = make_placement(topology_from_levels("node=2,sock=2,gpu=2"), parse_axes("pp=2,dp=2,tp=2"),
                               [[2, 1, 1], [1, 2, 1], [1, 1, 2]])
    array = mesh.device_mesh_array(placement)
    assert np.array_equal(array, torch.arange(8).view(2, 2, 2).numpy())  # what init_device_mesh builds
    assert mesh.axis_order(placement).order == ("tp", "dp", "pp")


def test_device_mesh_groups_equal_the_placement_axis_groups():
    """A real DeviceMesh built from the exported array (on a fake 8-rank world, one process)
    gives every rank the groups the placement says."""
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    from torch.distributed.device_mesh import DeviceMesh

    placement = make_placement(topology_from_levels("node=2,gpu=4"), parse_axes("dp=2,tp=4"), [[1, 2], [2, 2]])
    document = mesh.mesh_document(placement, PROVENANCE, {})
    spec = document["torch_device_mesh"]
    for rank in range(placement.device_count):
        dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=rank, world_size=placement.device_count)
        try:
            device_mesh = DeviceMesh("cpu", torch.tensor(spec["mesh"]), mesh_dim_names=tuple(spec["mesh_dim_names"]))
            for name in placement.axis_names:
                mine = next(group for group in placement.axis_groups(name) if rank in group)
                assert dist.get_process_group_ranks(device_mesh.get_group(name)) == mine
        finally:
            dist.destroy_process_group()


# --- names, CLI -----------------------------------------------------------------------------------------


def test_plan_refuses_names_that_are_not_identifiers():
    placement = Placement(("node", "gpu);import os"), (2, 4), ("data",), (8,), ((2, 4),))
    hierarchy = build_hierarchy(placement, ("data",))
    with pytest.raises(UsageError, match="invalid level name"):
        build_plan([PlanEntry(hierarchy, parse_program("AllReduce(InsideGroup(node))"))])
    bad_axis = Placement(("node", "gpu"), (2, 4), ("data\nimport os",), (8,), ((2, 4),))
    with pytest.raises(UsageError, match="invalid axis name"):
        build_plan([PlanEntry(build_hierarchy(bad_axis, ("data\nimport os",)), parse_program("AllReduce(InsideGroup(node))"))])


@pytest.mark.parametrize("fmt", ["torch", "nccl", "json", "mesh"])
@pytest.mark.parametrize("bad", [
    ("--levels", "node=2,gpu);import os=4", "--axes", "data=8"),
    ("--levels", "node=2,gpu=4", "--axes", "data);import os=8"),
    ("--levels", "node=2,gpu=4", "--axes", "data=8", "--program", "AllReduce(InsideGroup(gpu));import os"),
])
def test_injected_names_are_refused_before_any_file_is_written(run_cli, tmp_path, fmt, bad):
    out = tmp_path / "out"
    options = dict(zip(bad[::2], bad[1::2]))
    axis = options["--axes"].split("=")[0]
    args = ["export", "--levels", options["--levels"], "--axes", options["--axes"], "--reduce", axis,
            "--placement", "[[2,4]]", "--format", fmt, "-o", str(out)]
    if fmt != "mesh":
        args += ["--program", options.get("--program", "AllReduce(InsideGroup(node))")]
    elif "--program" in options:
        args += ["--program", options["--program"]]
    code, stdout, stderr = run_cli(*args)
    assert code == 2, stderr
    assert stderr.startswith("synth export: ")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_comments_in_program_text_never_reach_a_file(run_cli, tmp_path):
    out = tmp_path / "p.py"
    program = "ReduceScatter(InsideGroup(gpu))  # __import__('shutil').rmtree('/')\nAllReduce(Parallel(node))\nAllGather(InsideGroup(gpu))"
    code, _, stderr = run_cli("export", *LEVELS_2X4, "--program", program, "--format", "torch", "-o", str(out))
    assert code == 0, stderr
    text = out.read_text()
    assert "rmtree" not in text and "__import__" not in text
    assert f"--program '{PROGRAM}'" in text  # the canonical form, in the header's command


@pytest.mark.parametrize("fmt,suffix", [("torch", ".py"), ("nccl", ".c"), ("json", ".json"), ("mesh", ".json")])
def test_export_is_deterministic_and_stamped(run_cli, tmp_path, fmt, suffix):
    texts = []
    for attempt in range(2):
        out = tmp_path / f"out{suffix}"
        args = ["export", *LEVELS_2X4, "--format", fmt, "-o", str(out)]
        if fmt != "mesh":
            args += ["--program", "ReduceScatter(InsideGroup(gpu));AllReduce(Parallel(node));AllGather(InsideGroup(gpu))"]
        code, stdout, stderr = run_cli(*args)
        assert code == 0, stderr
        assert f"wrote {out}" in stdout
        texts.append(out.read_text())
    assert texts[0] == texts[1]
    assert "synth 0.1.0" in texts[0] and "synth export --levels node=2,gpu=4" in texts[0]
    if suffix == ".json":
        document = json.loads(texts[0])
        assert document["format"] in ("synth-plan", "synth-mesh") and document["placement"] == [[2, 4]]


def test_several_programs_go_to_a_directory_or_one_batch(run_cli, tmp_path):
    programs = ["--program", PROGRAM, "--program", "AllReduce(InsideGroup(node))"]
    code, stdout, _ = run_cli("export", *LEVELS_2X4, *programs, "--format", "torch", "-o", str(tmp_path / "dir"))
    assert code == 0 and sorted(p.name for p in (tmp_path / "dir").iterdir()) == ["program_1.py", "program_2.py"]
    code, _, _ = run_cli("export", *LEVELS_2X4, *programs, "--format", "torch", "--batch", "-o", str(tmp_path / "b.py"))
    assert code == 0 and "AllReduce(InsideGroup(node))" in (tmp_path / "b.py").read_text()
    code, _, _ = run_cli("export", *LEVELS_2X4, *programs, "--format", "nccl", "-o", str(tmp_path / "c"))
    assert code == 0 and len(list((tmp_path / "c").iterdir())) == 2


def test_export_top_k_takes_the_simulator_ranking(run_cli, tmp_path):
    from synth.search.rank import rank_programs
    from synth.model import cost_context
    from synth.topology_file import load_topology

    out = tmp_path / "top.json"
    args = ("--topology", "emu-2x4", "--axes", "data=8", "--reduce", "data", "--placement", "[[2,4]]")
    code, _, stderr = run_cli("export", *args, "--top", "3", "--max-len", "3", "--bytes", "1MiB",
                              "--backend", "gloo", "--format", "json", "-o", str(out))
    assert code == 0, stderr
    document = json.loads(out.read_text())
    hierarchy = build_hierarchy(make_placement(load_topology("emu-2x4"), parse_axes("data=8"), [[2, 4]]), ("data",))
    ranked = rank_programs(cost_context(hierarchy, load_topology("emu-2x4"), "gloo"), 2**20, max_len=3, top=3)
    assert [program["text"] for program in document["programs"]] == [str(row.program) for row in ranked[:3]]
    assert "--top 3 --max-len 3 --backend gloo" in document["command"]


def test_export_refusals(run_cli, tmp_path):
    out = str(tmp_path / "x")
    code, _, stderr = run_cli("export", *LEVELS_2X4, "--top", "3", "--format", "torch", "-o", out)
    assert code == 2 and "no link figures" in stderr
    code, _, stderr = run_cli("export", *LEVELS_2X4, "--top", "3", "--program", PROGRAM, "--format", "torch", "-o", out)
    assert code == 2 and "either --program or --top" in stderr
    code, _, stderr = run_cli("export", *LEVELS_2X4, "--format", "torch", "-o", out)
    assert code == 2 and "--program" in stderr
    code, _, stderr = run_cli("export", *LEVELS_2X4, "--program", "AllReduce(InsideGroup(gpu))", "--format", "json", "-o", out)
    assert code == 1 and "AllReduce(InsideGroup(gpu))" in stderr and "\n" not in stderr.strip()
    code, _, stderr = run_cli("export", *LEVELS_2X4, "--program", PROGRAM, "--format", "mesh", "-o", out)
    assert code == 2 and "mesh" in stderr
    assert list(tmp_path.iterdir()) == []


def test_bench_refusals_run_nothing(run_cli, tmp_path):
    common = ("--program", "AllReduce(InsideGroup(node))", "-o", str(tmp_path))
    code, _, stderr = run_cli("bench", *LEVELS_2X4, *common, "--nproc", "4")
    assert code == 2 and "--nproc 8" in stderr
    code, _, stderr = run_cli("bench", "--levels", "node=4,gpu=8", "--axes", "data=32", "--reduce", "data", *common)
    assert code == 2 and "16 local processes" in stderr
    code, _, stderr = run_cli("bench", *LEVELS_2X4, *common, "--bytes", "1MiB", "-b", "1KiB", "-e", "4KiB")
    assert code == 2
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        code, _, stderr = run_cli("bench", *LEVELS_2X4, *common, "--backend", "nccl")
        assert code == 2 and "needs a GPU" in stderr
    assert list(tmp_path.iterdir()) == []


def test_scripts_and_bench_print_the_same_nccl_tests_rows():
    torch_runtime = pytest.importorskip("synth.export.torch_runtime")
    from synth.execute import nccl_tests

    rows = [{"bytes": 1024, "count": 256, "type": "float", "time_us": 12.5, "algbw_gbs": 0.08, "busbw_gbs": 0.14,
             "wrong": 0}, {"bytes": 2048, "count": 1024, "type": "bfloat16", "time_us": 1e4, "algbw_gbs": 1e-4,
                           "busbw_gbs": 2e-4, "wrong": None}]
    assert torch_runtime.HEADER == nccl_tests.HEADER
    assert [torch_runtime.format_row(r) for r in rows] == [nccl_tests.format_row(r) for r in rows]
    assert torch_runtime.footer(rows) == nccl_tests.footer(rows)
    assert nccl_tests.footer(rows).startswith("# Avg bus bandwidth    : ")
    header = nccl_tests.HEADER.splitlines()[1].split()
    assert header == ["#", "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                      "time", "algbw", "busbw", "#wrong"]


SIZE_TEXTS = ["1", "8", "1000", "8M", "8m", "1G", "1g", "1.5K", "3 k", "64KiB", "1MiB", "1MB", "1kB", "2T", "1e6",
              "1PiB", " 16 MiB ", "1.25MiB", "0", "-8M", "1e308PiB", "2PiB", "1.5", "0.1KiB", "8 parsecs", "4Gb",
              "M", "", "1e999", "9" * 400, "nan", "inf", "1 KB", "2 KiB", "+4K", ".5K", "5e-1K"]


@pytest.mark.parametrize("text", SIZE_TEXTS)
def test_exported_scripts_read_sizes_as_synth_does(text):
    """One size grammar: synth's --bytes (synth/units.py) and the scripts' copy agree on every
    value, nccl-tests' bare letters binary, and refuse the same texts."""
    import argparse

    from synth.units import parse_bytes

    torch_runtime = pytest.importorskip("synth.export.torch_runtime")
    try:
        expected = parse_bytes(text)
    except UsageError:
        expected = None
    try:
        got = torch_runtime.parse_size(text)
    except argparse.ArgumentTypeError:
        got = None
    assert got == expected
    if text in ("8M", "8m"):
        assert got == 8 * 2**20


def test_size_property_scripts_equal_synth():
    import argparse

    from hypothesis import given, settings, strategies as strategies_

    from synth.units import parse_bytes

    torch_runtime = pytest.importorskip("synth.export.torch_runtime")
    units = ["", "B", "K", "k", "M", "m", "G", "g", "T", "t", "KiB", "MiB", "GiB", "TiB", "PiB", "kB", "KB", "MB",
             "GB", "TB", "PB", "b", "Kb", "x"]

    @settings(max_examples=300, deadline=None)
    @given(strategies_.one_of(strategies_.integers(-5, 10**7).map(str),
                              strategies_.decimals(0, 10**5, places=3).map(str)),
           strategies_.sampled_from(units), strategies_.sampled_from(["", " "]))
    def check(number, unit, space):
        text = number + space + unit
        try:
            expected = parse_bytes(text)
        except UsageError:
            expected = None
        try:
            got = torch_runtime.parse_size(text)
        except argparse.ArgumentTypeError:
            got = None
        assert got == expected, text

    check()


def test_bytes_follow_nccl_tests_in_the_cli_and_huge_sizes_are_one_line(run_cli, tmp_path):
    out = tmp_path / "plan.json"
    code, _, stderr = run_cli("export", *LEVELS_2X4, "--program", PROGRAM, "--format", "json", "--bytes", "256M",
                              "-o", str(out))
    assert code == 0, stderr
    assert json.loads(out.read_text())["buffer"]["bytes"] == 256 * 2**20
    for args in (("rank", "--topology", "emu-2x4", "--axes", "data=8", "--reduce", "data", "--bytes", "1e308PiB"),
                 ("rank", "--topology", "emu-2x4", "--axes", "data=8", "--reduce", "data", "-b", "1", "-e", "1e308PiB"),
                 ("export", *LEVELS_2X4, "--program", PROGRAM, "--format", "json", "--bytes", "1e308PiB", "-o", str(out)),
                 ("workload", "--topology", "emu-2x4", "--axes", "data=8", "--reduction", "data:1e308PiB"),
                 ("rank", "--topology", "emu-2x4", "--axes", "data=8", "--reduce", "data", "--bytes", "9" * 5000 + "M")):
        code, _, stderr = run_cli(*args)
        assert code == 2 and len(stderr.strip().splitlines()) == 1 and len(stderr) < 300, (args[:1], stderr[:300])
        assert "Traceback" not in stderr
