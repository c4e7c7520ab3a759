"""`--plot FILE` on rank, plan, calibrate and topologies: each picture renders (small cases) into a
valid, non-trivial PNG or SVG, and every way it cannot is one line and exit 2 before any work."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

REPOSITORY = Path(__file__).resolve().parent.parent
EXAMPLES = REPOSITORY / "docs" / "examples"
GLOO_CSV = REPOSITORY / "results" / "accuracy" / "microbench-emu-2x4-calibration.csv"
SVG = "{http://www.w3.org/2000/svg}"

RANK = ["rank", "--topology", "dgx-a100-x4", "--axes", "data=8,model=4", "--reduce", "data", "--placement",
        "[[4,2],[1,4]]", "-b", "64KiB", "-e", "64MiB", "-f", "8", "--top", "2", "--max-len", "3"]
PLAN = ["plan", "--topology", "dgx-a100", "--model", "gpt3-1.3b", "--top", "3"]


def assert_png(path: Path, min_bytes: int = 20_000) -> tuple[int, int]:
    """A PNG (signature, IHDR first) of some substance; its width and height in pixels."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", path
    assert len(data) >= min_bytes, (path, len(data))
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 600 and height >= 300
    return width, height


def assert_svg(path: Path, min_elements: int = 200) -> ElementTree.Element:
    """An SVG document that parses, with many drawn elements."""
    root = ElementTree.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    assert sum(1 for _ in root.iter()) >= min_elements
    return root


def test_rank_over_sizes_draws_time_and_busbw(run_cli, tmp_path):
    code, out, err = run_cli(*RANK, "--plot", str(tmp_path / "rank.png"))
    assert code == 0, err
    assert "placement [[4,2],[1,4]]" in out  # the table as before
    assert err.strip().endswith("rank.png")
    assert_png(tmp_path / "rank.png")
    code, out, err = run_cli(*RANK, "--plot", str(tmp_path / "rank.svg"), "--plot-metric", "busbw", "--json")
    assert code == 0, err
    json.loads(out)  # stdout stays JSON: the line about the picture is on stderr
    assert_svg(tmp_path / "rank.svg")
    text = (tmp_path / "rank.svg").read_text()
    assert "flat call" in text and "lower bound" in text and "GB/s" in text and "held-out error" in text


def test_rank_every_placement_and_a_goal(run_cli, tmp_path):
    """Several placements make several panels; a reduce-scatter has no held-out band, still a picture."""
    code, _, err = run_cli("rank", "--topology", "dgx-a100-x4", "--axes", "data=32", "--reduce", "data",
                           "--collective", "reducescatter", "-b", "64KiB", "-e", "1MiB", "-f", "4", "--max-len", "3",
                           "--top", "2", "--plot", str(tmp_path / "goal.svg"))
    assert code == 0, err
    text = (tmp_path / "goal.svg").read_text()
    assert "flat call" in text and "held-out" not in text
    code, _, err = run_cli("rank", "--topology", "dgx-a100-x4", "--axes", "data=8,model=4", "--reduce", "data",
                           "--bytes", "1MiB", "--top", "1", "--max-len", "3", "--plot", str(tmp_path / "all.png"))
    assert code == 0, err
    width, _ = assert_png(tmp_path / "all.png")
    assert width > 1500  # panels side by side


def test_plan_draws_the_pareto_set_and_where_the_step_goes(run_cli, tmp_path):
    code, out, err = run_cli(*PLAN, "--json", "--plot", str(tmp_path / "plan.svg"))
    assert code == 0, err
    assert json.loads(out)["pareto"]  # stdout stays JSON
    text = (tmp_path / "plan.svg").read_text()
    assert_svg(tmp_path / "plan.svg")
    assert "Pareto set" in text and "winner" in text and "compute" in text and "device memory" in text


def test_calibrate_draws_measured_against_predicted(run_cli, tmp_path):
    log = EXAMPLES / "all_reduce_perf-h100-ib-2x8.txt"
    code, out, err = run_cli("calibrate", str(log), "--topology", "hgx-h100-ib-4x8", "--json",
                             "--plot", str(tmp_path / "fit.png"))
    assert code == 0, err
    assert json.loads(out)["fits"]
    assert_png(tmp_path / "fit.png")


@pytest.mark.skipif(not GLOO_CSV.exists(), reason="the emulated cluster's gloo measurements are not in this checkout")
def test_calibrate_draws_the_link_model_fit_too(run_cli, tmp_path):
    code, _, err = run_cli("calibrate", str(GLOO_CSV), "--topology", "emu-2x4", "-o", str(tmp_path / "gloo.toml"),
                           "--plot", str(tmp_path / "gloo.svg"))
    assert code == 0, err
    text = (tmp_path / "gloo.svg").read_text()
    assert "gloo model" in text and "(AllGather)" in text


@pytest.mark.parametrize("name", ["dgx-a100-x4", "paper-fig3", "rtx5090-loopback", "gcp-a3-mega-2x8"])
def test_topology_draws_its_levels_links_and_figures(run_cli, tmp_path, name):
    code, out, err = run_cli("topologies", name, "--plot", str(tmp_path / "t.svg"))
    assert code == 0, err
    assert name in out and "sources" in out
    text = (tmp_path / "t.svg").read_text()
    assert_svg(tmp_path / "t.svg", min_elements=50)
    assert "system:" in text and "bandwidth" in text and "latency" in text


def test_topology_png_and_the_big_levels_are_cut(run_cli, tmp_path):
    code, _, err = run_cli("topologies", "selene", "--plot", str(tmp_path / "selene.PNG"))  # suffix in any case
    assert code == 0, err
    assert_png(tmp_path / "selene.PNG", min_bytes=10_000)
    code, _, _ = run_cli("topologies", "dgx-h100-2x8x8", "--plot", str(tmp_path / "big.svg"))
    assert code == 0 and "more" in (tmp_path / "big.svg").read_text()  # 8 units: the first three, "... 4 more", the last


def test_topology_json_is_the_files_tables(run_cli):
    from synth.topology_file import load_topology, topology_from_text

    code, out, _ = run_cli("topologies", "dgx-a100-x4", "--json")
    assert code == 0
    document = json.loads(out)
    assert document["devices"] == 32 and [level["name"] for level in document["levels"]] == ["node", "gpu"]
    assert document["levels"][0]["bandwidth"]["value"] == "25 GB/s" and document["levels"][0]["bandwidth"]["source"]
    import tomli_w

    del document["devices"]
    again, builtin = topology_from_text(tomli_w.dumps(document), "round trip"), load_topology("dgx-a100-x4")
    assert (again.levels, again.device, again.nccl) == (builtin.levels, builtin.device, builtin.nccl)


def test_topology_text_lists_every_source(run_cli):
    code, out, _ = run_cli("topologies", "dgx-a100-x4")
    assert code == 0
    assert "node uplinks" in out and "NVIDIA DGX A100 user guide" in out and "device peak bf16" in out


def test_a_topology_file_is_drawn_too(run_cli, tmp_path):
    source = (REPOSITORY / "topologies" / "emu-2x2x2-gloo.toml").read_text()
    lines = [line if not line.startswith("description") else 'description = "costs $x^{2$ [bold] \\\\"'
             for line in source.splitlines()]
    (tmp_path / "mine.toml").write_text("\n".join(lines) + "\n")
    code, _, err = run_cli("topologies", str(tmp_path / "mine.toml"), "--plot", str(tmp_path / "mine.png"))
    assert code == 0, err  # a `$` in a description is text, not a formula (an unclosed one would not parse)
    assert_png(tmp_path / "mine.png", min_bytes=10_000)


@pytest.mark.parametrize("argv, message", [
    (["topologies", "--plot", "t.png"], "name it"),
    (["topologies", "dgx-a100", "--plot", "t.jpg"], "'.jpg': give a .png or .svg file"),
    (["topologies", "dgx-a100", "--plot", "t"], "no suffix"),
    (["topologies", "dgx-a100", "--plot", ""], "no suffix"),
    (["topologies", "dgx-a100", "--plot", "missing/t.png"], "no directory 'missing'"),
    (RANK + ["--plot", "r.pdf"], "--plot: 'r.pdf'"),
    (PLAN + ["--plot", "p.gif"], "--plot: 'p.gif'"),
    (["calibrate", str(EXAMPLES / "all_reduce_perf-h100-ib-2x8.txt"), "--plot", "c.eps"], "--plot: 'c.eps'"),
])
def test_a_picture_that_cannot_be_written_is_refused_first(run_cli, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(*argv)
    assert code == 2 and out == "" and message in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_a_directory_is_refused(run_cli, tmp_path):
    (tmp_path / "picture.png").mkdir()
    code, _, err = run_cli("topologies", "dgx-a100", "--plot", str(tmp_path / "picture.png"))
    assert code == 2 and "is a directory" in err


MATPLOTLIB_BLOCKED = "import sys; sys.modules['matplotlib'] = None  # as where the plot extra is not installed"


@pytest.mark.parametrize("argv", [
    ["topologies", "dgx-a100", "--plot", "t.png"],
    RANK + ["--plot", "r.svg"],
])
def test_without_matplotlib_one_line_names_the_extra(tmp_path, argv):
    done = subprocess.run([sys.executable, "-c", f"{MATPLOTLIB_BLOCKED}\nfrom synth.cli import main\n"
                           f"raise SystemExit(main({argv!r}))"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert "pip install '.[plot]'" in done.stderr and done.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_no_plot_no_matplotlib(tmp_path):
    """A command that draws nothing never imports matplotlib (tests/test_cli_startup.py checks the others)."""
    code = "import sys\nfrom synth.cli import main\nmain(['topologies', 'dgx-a100'])\nassert 'matplotlib' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr


def test_the_same_picture_writes_the_same_svg(run_cli, tmp_path):
    for name in ("a.svg", "b.svg"):
        assert run_cli("topologies", "paper-fig3", "--plot", str(tmp_path / name))[0] == 0
    assert (tmp_path / "a.svg").read_bytes() == (tmp_path / "b.svg").read_bytes()
