"""One convention per option across commands, help with an example everywhere, output where
the user says (by default a new temporary directory, never the current one), placements and
programs numbered from 1, and the emulated topologies' calibrations shipped and named."""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from pathlib import Path

import pytest

from synth.cli import COMMANDS, build_parser
from synth.commands.common import BACKEND_NAMES, DEFAULT_BACKEND, HIERARCHY_KINDS
from synth.commands.examples import EXAMPLES


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser(every_command=True)
    (subparsers,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return dict(subparsers.choices)


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: action for action in parser._actions for option in action.option_strings}


PARSERS = command_parsers()


def test_the_command_table_lists_every_registered_command_with_its_own_help():
    parser = build_parser(every_command=True)
    (subparsers,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help for choice in subparsers._choices_actions}
    assert set(helps) == set(COMMANDS)
    for name, (_, summary) in COMMANDS.items():
        assert helps[name] == summary, name


def test_constants_kept_here_for_a_fast_help_match_the_library():
    from synth.hierarchy import HIERARCHY_KINDS as LIBRARY_KINDS
    from synth.model.backends import BACKENDS

    assert HIERARCHY_KINDS == LIBRARY_KINDS and BACKEND_NAMES == tuple(sorted(BACKENDS))
    from synth.analysis.fusion import DDP_BUCKET_CAP, DDP_FIRST_BUCKET_CAP
    from synth.search.rank import ESTIMATES
    from synth.commands import exploration, simulation

    assert exploration.DDP_BUCKET_CAP_TEXT == f"{DDP_BUCKET_CAP // 2**20}MiB"
    assert exploration.DDP_FIRST_BUCKET_CAP_TEXT == f"{DDP_FIRST_BUCKET_CAP // 2**20}MiB"
    assert simulation.ESTIMATES == tuple(ESTIMATES)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_one_spelling_per_option(command):
    found = options(PARSERS[command])
    pairs = {"--bytes": "-B", "--top": "-k", "--output": "-o", "--max-len": "-L", "--topology": "-t", "--axes": "-a",
             "--reduce": "-r", "--placement": "-p"}
    for long, short in pairs.items():
        if long in found:
            assert found[long] is found.get(short), f"{command}: {long} without {short}"
    assert "--results" not in found
    if "--backend" in found:
        action = found["--backend"]
        assert tuple(action.choices) == BACKEND_NAMES
        assert action.default in (DEFAULT_BACKEND, None) and DEFAULT_BACKEND in action.help


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_help_carries_an_example_that_names_its_command(command, run_cli):
    assert EXAMPLES[command]
    with pytest.raises(SystemExit):
        run_cli(command, "--help")


def test_help_texts(capsys):
    from synth.cli import main

    for argv, fragments in ((["--help"], ("README.md", "examples:", "exit codes")),
                            (["rank", "--help"], ("example:\n  synth rank --topology",)),
                            (["bench", "--help"], ("examples:\n  synth bench",))):
        with pytest.raises(SystemExit):
            main(argv)
        out = capsys.readouterr().out
        for fragment in fragments:
            assert fragment in out, (argv, fragment)
    for command, lines in EXAMPLES.items():
        assert all(line.startswith(f"synth {command}") for line in lines), command


QUICK_EXAMPLES = ("topologies", "placements", "check", "programs", "rank", "explore", "fusion", "export")


@pytest.mark.parametrize("command", QUICK_EXAMPLES)
def test_the_quick_examples_run_as_written(command, run_cli, tmp_path, monkeypatch):
    import shlex

    monkeypatch.chdir(tmp_path)
    (line,) = EXAMPLES[command]
    argv = shlex.split(line.split("#")[0])[1:]
    code, out, err = run_cli(*argv)
    assert code == 0, err


# --- where output goes ----------------------------------------------------------------------------


def test_sweep_without_o_writes_to_a_new_temporary_directory_and_says_where(run_cli, tmp_path, monkeypatch):
    work, scratch = tmp_path / "work", tmp_path / "tmp"
    work.mkdir()
    scratch.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    code, out, err = run_cli("sweep", "--topology", "emu-2x4", "--axes", "data=4,model=2", "-b", "1KiB", "-e", "4KiB",
                             "-L", "3")
    assert code == 0, err
    paths = [Path(line) for line in out.splitlines() if line.endswith((".csv", ".json"))]
    assert len(paths) == 2 and all(path.exists() and path.parent.parent == scratch for path in paths)
    assert paths[0].parent.name.startswith("synth-sweep-")
    assert list(work.iterdir()) == []
    code, out2, _ = run_cli("sweep", "--topology", "emu-2x4", "--axes", "data=4,model=2", "-b", "1KiB", "-e", "4KiB",
                            "-L", "3")
    assert code == 0 and out2.splitlines()[-1] != out.splitlines()[-1]  # a second run never overwrites the first
    code, out, _ = run_cli("sweep", "--topology", "emu-2x4", "--axes", "data=4,model=2", "-b", "1KiB", "-e", "4KiB",
                           "-L", "3", "-o", "mine")
    assert code == 0 and (work / "mine").is_dir() and len(list((work / "mine").iterdir())) == 2


def test_no_default_writes_into_the_repository_results():
    for command in ("sweep", "bench"):
        action = options(PARSERS[command])["--output"]
        assert action.default is None and "temporary directory" in action.help


# --- numbering and the mesh export -----------------------------------------------------------------


def test_placements_are_numbered_from_1_everywhere(run_cli):
    code, out, _ = run_cli("placements", "--levels", "node=2,gpu=4", "--axes", "data=4,model=2")
    rows = [line for line in out.splitlines() if re.match(r"[│|]\s*\d+\s*[│|]", line)]
    assert code == 0 and re.match(r"[│|]\s*1\s*[│|]", rows[0]) and len(rows) == 2
    code, out, _ = run_cli("explore", "--topology", "emu-2x4", "--axes", "data=4,model=2", "--reduce", "data",
                           "--bytes", "1MiB", "-L", "3")
    rows = [line for line in out.splitlines() if re.match(r"[│|]\s*\d+\s*[│|]", line)]
    assert code == 0 and re.match(r"[│|]\s*1\s*[│|]", rows[0])


def test_export_mesh_takes_constraints_and_needs_no_reduction(run_cli, tmp_path):
    out = tmp_path / "mesh.json"
    code, _, err = run_cli("export", "--topology", "dgx-a100-x4", "--axes", "data=8,model=4", "--inside", "model=node",
                           "--format", "mesh", "-o", str(out))
    assert code == 0, err
    mesh = json.loads(out.read_text())
    assert "[[4,2],[1,4]]" in json.dumps(mesh, separators=(",", ":"))
    code, _, err = run_cli("export", "--topology", "dgx-a100-x4", "--axes", "data=8,model=4", "--format", "mesh",
                           "-o", str(tmp_path / "m2.json"))
    assert code == 2 and "several fit" in err and err.count("\n") == 1
    code, _, err = run_cli("export", "--topology", "dgx-a100-x4", "--axes", "data=8,model=4", "--inside", "model=node",
                           "--format", "torch", "--top", "1", "-o", str(tmp_path / "p.py"))
    assert code == 2 and "--reduce" in err


# --- calibrated emulated topologies -----------------------------------------------------------------


@pytest.mark.parametrize("name, scale", [("emu-2x4", "1/256"), ("emu-2x2x2", "1/128")])
def test_calibrations_of_the_emulated_topologies_ship_with_their_sources(name, scale):
    from synth.commands.export import calibrated_hint, placeholder_figures
    from synth.topology_file import load_topology

    calibrated, base = load_topology(f"{name}-gloo"), load_topology(name)
    assert calibrated.name == f"{name}-gloo" and calibrated.sizes == base.sizes
    # The rack level of emu-2x2x2 cannot be identified from its microbenchmarks (docs/accuracy.md):
    # it keeps the emulated rate and the placeholder latency, and the bench says so.
    assert placeholder_figures(base) and set(placeholder_figures(calibrated)) <= {"rack.latency"}
    sources = [figure.source for level in calibrated.levels for figure in (level.bandwidth, level.latency)]
    for source in sources:
        match = re.search(r"from (results/accuracy/\S+\.csv)", source)
        if match:
            assert (Path(__file__).resolve().parent.parent / match[1]).exists()
    assert any("fitted by synth calibrate" in source for source in sources)
    assert f"--scale {scale} -t {name}-gloo" in calibrated_hint(name)


@pytest.mark.torchrun
def test_bench_on_placeholder_figures_says_so(run_cli, tmp_path):
    pytest.importorskip("torch")
    code, out, err = run_cli("bench", "--topology", "emu-2x2", "--axes", "data=4", "--reduce", "data", "--backend",
                             "gloo", "--program", "AllReduce(InsideGroup(gpu)); AllReduce(Parallel(node))",
                             "--bytes", "4KiB", "--iters", "1", "--warmup", "0", "-o", str(tmp_path))
    assert code == 0, err
    assert "note: predicted from placeholder figures of emu-2x2" in out
    (path,) = tmp_path.glob("bench-*.csv")
    assert "CAUTION: emu-2x2 has placeholder figures" in path.read_text()
