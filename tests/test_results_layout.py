"""The layout of results/ and of the topologies the studies use (issue 8): one folder per study
with its report as README.md naming its command, an index that lists them all, calibrated
topologies among the topologies (the compared variants not listed as built-ins), and no
generated copy of the runtime committed."""

import json
import re
import subprocess
from pathlib import Path

import pytest

from benchmarks import index
from synth.topology_file import builtin_topology_names, load_topology

REPOSITORY = Path(__file__).resolve().parent.parent
RESULTS = REPOSITORY / "results"


def test_the_index_lists_a_folder_per_study_and_a_report_still_at_the_top(tmp_path):
    study = tmp_path / "accuracy"
    (study / "raw" / "case").mkdir(parents=True)
    (study / "README.md").write_text("# The simulator against the emulated cluster\n\n"
                                     "Command: `python -m benchmarks.accuracy report`\n")
    (study / "summary.json").write_text(json.dumps({"cases": []}))
    (study / "raw" / "case" / "rep0.json").write_text("{}")
    (study / "raw" / "case" / "rep1.json").write_text("{}")
    (study / "microbench-emu-2x4.csv").write_text("level,bytes\n")
    (study / "microbench-emu-2x4.json").write_text(json.dumps({"command": "python -m benchmarks.microbench -o x.csv"}))
    (tmp_path / "rank-speed.md").write_text("# Ranking speed\n\nCommand: `python -m benchmarks.ranking`\n")
    (tmp_path / "rank-speed.json").write_text(json.dumps({"command": "python -m benchmarks.ranking"}))
    text = index.write_index(tmp_path).read_text()
    assert ("| [accuracy/](accuracy/README.md) | The simulator against the emulated cluster | "
            "`python -m benchmarks.accuracy report` | ") in text
    assert "[raw/ (2 files)](accuracy/raw/)" in text and "[summary.json](accuracy/summary.json)" in text
    assert "rep0.json" not in text  # a subfolder is one entry
    for name in ("microbench-emu-2x4.csv", "microbench-emu-2x4.json"):  # the CSV takes its JSON's command
        assert f"| [accuracy/{name}](accuracy/{name}) | `python -m benchmarks.microbench -o x.csv` |" in text
    assert ("| [rank-speed.md](rank-speed.md) | Ranking speed | `python -m benchmarks.ranking` | "
            "[rank-speed.json](rank-speed.json) |") in text
    (tmp_path / "rank-speed").mkdir()  # once moved into its folder, the same study
    for name in ("rank-speed.md", "rank-speed.json"):
        (tmp_path / name).rename(tmp_path / "rank-speed" / ("README.md" if name.endswith(".md") else name))
    text = index.write_index(tmp_path).read_text()
    assert ("| [rank-speed/](rank-speed/README.md) | Ranking speed | `python -m benchmarks.ranking` | "
            "[rank-speed.json](rank-speed/rank-speed.json) |") in text


def _table(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def test_every_study_has_its_report_and_the_index_is_current():
    for folder in (path for path in RESULTS.iterdir() if path.is_dir()):
        head = (folder / "README.md").read_text(encoding="utf-8")[:4000]
        assert re.search(r"^# \S", head, re.MULTILINE), f"{folder.name}/README.md has no title"
        assert re.search(r"^Command: `[^`]+`", head, re.MULTILINE), f"{folder.name}/README.md names no command"
    studies = index.describe(RESULTS)
    assert studies and all(study.command for study in studies)
    committed = (RESULTS / "README.md").read_text(encoding="utf-8")
    assert _table(committed) == _table(index.render(studies)), "results/README.md is stale: python -m benchmarks.index"


def test_only_the_chosen_calibrations_are_built_in_topologies():
    """The accuracy campaign's chosen calibrations ship as <topology>-gloo; the variants it
    compares them with sit in topologies/calibrated/, loadable by path, not listed."""
    names = builtin_topology_names()
    assert {"emu-2x4-gloo", "emu-2x2x2-gloo"} <= set(names)
    variants = sorted((REPOSITORY / "topologies" / "calibrated").glob("*.toml"))
    assert len(variants) == 8
    for path in variants:
        assert path.stem not in names
        base = "-".join(path.stem.split("-")[:2])  # emu-2x4-gloo-all: a calibration of emu-2x4
        assert base in names and load_topology(path).name in {base, f"{base}-calibrated"}
    assert not list(RESULTS.rglob("*.toml")), "calibrated topologies live under topologies/, not results/"


def _definitions(path: Path, pattern: str) -> set[str]:
    return set(re.findall(pattern, path.read_text(encoding="utf-8"), re.MULTILINE))


def test_no_generated_copy_of_a_runtime_is_committed():
    """A file holding most of a runtime's definitions is a generated script (or a copy)."""
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=REPOSITORY, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    export = REPOSITORY / "synth" / "export"
    runtimes = {"synth/export/torch_runtime.py": _definitions(export / "torch_runtime.py", r"^def \w+\("),
                "synth/export/nccl_runtime.c": _definitions(export / "nccl_runtime.c", r"^static \w+ \*?\w+\(")}
    assert all(len(definitions) >= 5 for definitions in runtimes.values())
    copies = []
    for name in listed.stdout.splitlines():
        path = REPOSITORY / name
        if name in runtimes or path.suffix in {".png", ".json", ".csv"} or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for definitions in runtimes.values():
            if sum(definition in text for definition in definitions) > len(definitions) / 2:
                copies.append(name)
    assert not copies, f"generated copies of a runtime committed: {copies}"
    assert not [p for p in RESULTS.rglob("*") if p.suffix in {".py", ".c"}]
