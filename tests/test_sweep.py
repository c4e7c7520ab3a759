"""`synth sweep` and its library: shape of the output, agreement with `rank_programs`, files
that agree with each other and with themselves on a second run, and one-line refusals."""

from __future__ import annotations

import csv
import json

import pytest

from synth.hierarchy import build_hierarchy
from synth.placement import enumerate_placements, parse_axes
from synth.search import enumerate_programs
from synth.search.programs import ProgramSets
from synth.search.rank import rank_programs
from synth.analysis.sweep import FIELDS, reduction_requests, run_sweep
from synth.model import ESTIMATES, cost_context
from synth.topology_file import load_topology

KiB, MiB = 2**10, 2**20
SWEEP = ("sweep", "--topology", "dgx-a100-x4", "--axes", "data=8,model=4", "-b", "1KiB", "-e", "1MiB", "-f", "4")
STEM = "sweep-dgx-a100-x4-data8-model4-nccl"


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One CLI sweep shared by the tests that only read it: (directory, stdout)."""
    from synth.cli import main
    import contextlib
    import io

    directory = tmp_path_factory.mktemp("sweep")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main([*SWEEP, "-o", str(directory)])
    assert code == 0
    return directory, out.getvalue()


def read_csv(path):
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_row_count_is_placements_times_requests_times_sizes(swept):
    directory, out = swept
    placements = len(enumerate_placements(load_topology("dgx-a100-x4"), parse_axes("data=8,model=4")))
    sizes = [1 * KiB, 4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB]
    document = json.loads((directory / f"{STEM}.json").read_text())
    assert placements == 3 and document["sizes"] == sizes
    assert document["requests"] == ["data", "model", "data,model"]
    assert len(document["rows"]) == placements * 3 * len(sizes) == len(read_csv(directory / f"{STEM}.csv"))
    combos = {(row["matrix"], row["reduce"], row["bytes"]) for row in document["rows"]}
    assert len(combos) == len(document["rows"])
    assert f"{directory / STEM}.csv" in out and f"{directory / STEM}.json" in out
    assert "54 configurations (3 placements x 3 requests x 6 sizes)" in out


def test_csv_and_json_agree(swept):
    directory, _ = swept
    rows = json.loads((directory / f"{STEM}.json").read_text())["rows"]
    table = read_csv(directory / f"{STEM}.csv")
    assert list(table[0]) == list(FIELDS)
    for record, line in zip(rows, table):
        for name in FIELDS:
            value = record[name]
            assert type(value)(line[name]) == value, name


def test_best_never_slower_than_baseline_and_never_beats_the_bound(swept):
    directory, _ = swept
    for row in json.loads((directory / f"{STEM}.json").read_text())["rows"]:
        assert row["best_time_s"] <= row["baseline_time_s"]
        assert row["speedup"] >= 1 and row["bound_ratio"] >= 1
        assert row["baseline_bound_ratio"] >= row["bound_ratio"]
        assert row["programs"] >= 1 and 1 <= row["best_length"] <= 5
        assert row["best_algbw_GBps"] == pytest.approx(row["bytes"] / row["best_time_s"] / 1e9)


def test_deterministic_files(swept, tmp_path, run_cli):
    directory, _ = swept
    code, _, _ = run_cli(*SWEEP, "-o", str(tmp_path))
    assert code == 0
    for suffix in (".csv", ".json"):
        assert (tmp_path / f"{STEM}{suffix}").read_bytes() == (directory / f"{STEM}{suffix}").read_bytes()


@pytest.mark.parametrize("estimate", ESTIMATES)
@pytest.mark.parametrize("topology, axes, backend", [("dgx-a100-x4", "data=8,model=4", "nccl"),
                                                     ("emu-2x2x2", "a=2,b=4", "gloo")])
def test_rows_are_rank_programs_first_and_baseline(topology, axes, backend, estimate):
    """Row for row what `synth rank` puts on top: same program, same time, same count."""
    system, parsed = load_topology(topology), parse_axes(axes)
    placements = enumerate_placements(system, parsed)
    sizes = [KiB, 4 * MiB]
    sweep = run_sweep(system, placements, parsed, sizes, backend=backend, estimate=estimate)
    assert len(sweep.rows) == len(placements) * 3 * len(sizes) and sweep.estimate == estimate
    by_matrix = {placement.to_text(): placement for placement in placements}
    for row in sweep.rows:
        hierarchy = build_hierarchy(by_matrix[row.matrix], tuple(row.reduce.split(",")))
        ranked = rank_programs(cost_context(hierarchy, system, backend), row.bytes, estimate=estimate)
        baseline = next(r for r in ranked if r.baseline)
        assert (row.best_program, row.best_time_s, row.bound_ratio) == (str(ranked[0].program), ranked[0].time_s,
                                                                         ranked[0].bound_ratio)
        assert (row.baseline_program, row.baseline_time_s) == (str(baseline.program), baseline.time_s)
        assert row.programs == len(ranked)


def test_catalogue_shared_across_level_names_spells_programs_as_the_enumerator_does():
    """Hierarchies of one shape share one enumeration; renamed, it is the direct enumeration."""
    system, axes = load_topology("dgx-h100-2x8x8"), parse_axes("data=16,model=8")
    placements = enumerate_placements(system, axes)
    shaped = [build_hierarchy(p, ("data",)) for p in placements]
    shaped = [h for h in shaped if h.sizes == (2, 8)]
    names = {h.level_names for h in shaped}
    assert len(names) >= 2  # e.g. (rack, node) and (rack, gpu)
    program_sets = ProgramSets()
    for hierarchy in shaped:
        programs = program_sets.get(hierarchy, 4)
        assert set(programs.texts) == {str(p) for p in enumerate_programs(hierarchy, max_len=4)}
        assert programs.texts == tuple(str(p) for p in enumerate_programs(hierarchy, max_len=4))
        assert programs.programs == tuple(enumerate_programs(hierarchy, max_len=4))
    assert program_sets.shapes == 1


@pytest.mark.parametrize("kind", ["merged", "split", "system"])
def test_one_enumeration_per_quotient_shape_gives_every_hierarchy_its_own_programs(kind):
    """Shapes with the same quotient (every level of size >= 2 shrunk to 2) share one
    enumeration, filtered by walking on the real sizes: exactly the direct enumeration."""
    program_sets, direct = ProgramSets(), 0
    for name, axes in (("dgx-h100-2x8x8", "data=4,pipe=4,model=8"), ("paper-fig3", "data=4,model=4")):
        system, parsed = load_topology(name), parse_axes(axes)
        seen = set()
        for placement in enumerate_placements(system, parsed):
            for request in reduction_requests(parsed):
                hierarchy = build_hierarchy(placement, request, kind)
                if hierarchy.group_size == 1 or hierarchy.sizes in seen or len(hierarchy.sizes) > 4:
                    continue
                seen.add(hierarchy.sizes)
                direct += 1
                assert program_sets.get(hierarchy, 4).programs == tuple(enumerate_programs(hierarchy, max_len=4))
    assert program_sets.shapes < direct


def test_axes_of_size_one_leave_requests_out():
    system = load_topology("emu-2x4")
    axes = parse_axes("data=8,model=1")
    sweep = run_sweep(system, enumerate_placements(system, axes), axes, [MiB])
    assert sweep.requests == ("data", "data,model") and sweep.skipped == ("model",)
    assert reduction_requests(axes) == [("data",), ("model",), ("data", "model")]


NO_FIGURES = """name = "bare"
[[levels]]
name = "node"
size = 4
[[levels]]
name = "gpu"
size = 8
"""


@pytest.mark.parametrize("arguments", [
    ("--topology", "dgx-a100-x4", "-b", "1KiB", "-e", "1MiB", "-f", "1"),
    ("--topology", "dgx-a100-x4", "-b", "1MiB", "-e", "1KiB"),
    ("--topology", "no-such-cluster", "-b", "1KiB", "-e", "1MiB"),
    ("--levels", "node=4,gpu=8", "-b", "1KiB", "-e", "1MiB"),
    ("--topology", "{bare}", "-b", "1KiB", "-e", "1MiB"),
    ("--topology", "dgx-a100-x4", "-b", "1KiB", "-e", "1MiB", "--max-len", "0"),
    ("--topology", "dgx-a100-x4", "-b", "1KiB", "-e", "1MiB", "--max-len", "13"),
    ("--topology", "dgx-a100-x4", "-b", "1KiB", "-e", "1MiB", "--backend", "mpi"),
    ("--topology", "dgx-a100-x4", "-b", "1KiB"),
])
def test_bad_options_exit_2_with_one_line(arguments, tmp_path, run_cli):
    bare = tmp_path / "bare.toml"
    bare.write_text(NO_FIGURES)
    arguments = [part.format(bare=bare) for part in arguments]
    code, out, err = run_cli("sweep", "--axes", "data=8,model=4", *arguments, "-o", str(tmp_path / "out"))
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("synth sweep: ")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_results_on_one_small_system_write_figures_tables_and_index(tmp_path):
    """The Results command end to end on emu-2x4: one folder per study, its report README.md
    with its provenance at the top, and the index listing every study with its files."""
    from benchmarks import results

    assert results.main(["-o", str(tmp_path), "--topologies", "emu-2x4"]) == 0
    studies = ("placement-spread", "synthesis-wins", "time-vs-size")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["README.md", *studies]
    png = tmp_path / "time-vs-size" / "time-vs-size-emu-2x4.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    for report in [tmp_path / study / "README.md" for study in studies] + [tmp_path / "README.md"]:
        head = report.read_text().splitlines()[:8]
        assert any(line.startswith("Command: `python -m benchmarks.") for line in head), report
        assert any(line.startswith("Machine: ") for line in head) and any(line.startswith("Date: ") for line in head)
    spread = json.loads((tmp_path / "placement-spread" / "placement-spread.json").read_text())["spreads"]["emu-2x4"]
    assert {row["reduce"] for row in spread} == {"data", "model", "data,model"}
    assert all(row["best_spread"] >= 1 and row["worst_over_best"] >= row["baseline_spread"] for row in spread)
    variants = json.loads((tmp_path / "synthesis-wins" / "synthesis-wins.json").read_text())["variants"]
    assert set(variants) == {label for label, _, _ in results.VARIANTS}
    assert all(variant["overall"]["pairs"] == 2 * 2 * 3 * 4 for variant in variants.values())
    assert "![emu-2x4](time-vs-size-emu-2x4.png)" in (tmp_path / "time-vs-size" / "README.md").read_text()
    index = (tmp_path / "README.md").read_text()
    for study in studies:
        assert f"| [{study}/]({study}/README.md) | " in index
        for path in (tmp_path / study).iterdir():
            if path.name != "README.md":
                assert f"[{path.name}]({study}/{path.name})" in index
    assert "(no command recorded)" not in index
