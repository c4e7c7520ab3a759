"""`synth calibrate`'s files: odd names, oversized fields, launcher prefixes, and where -o writes."""

from __future__ import annotations

import re
import shutil
import stat
import sys
from pathlib import Path

import pytest

from synth.calibrate.nccl_text import strip_prefixes
from synth.units import parse_bytes
from synth.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPOSITORY = Path(__file__).resolve().parent.parent
GLOO_CSV = REPOSITORY / "results" / "accuracy" / "microbench-emu-2x4-calibration.csv"
NCCL_LOG = REPOSITORY / "docs" / "examples" / "all_reduce_perf-h100-ib-2x8.txt"


def one_line_error(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.parametrize("odd", ["a\x7fb", "tab\there", "esc\x1b[31m", "quote\"and\\back", "[bold]x[red]y"])
def test_a_file_name_of_any_characters_gives_valid_toml(tmp_path, run_cli, odd):
    measurements = tmp_path / f"{odd}.csv"
    shutil.copy(GLOO_CSV, measurements)
    out = tmp_path / "out.toml"
    code, _, stderr = run_cli("calibrate", str(measurements), "-t", "emu-2x4", "--backend", "gloo", "-o", str(out))
    assert code == 0, stderr
    assert "\x1b" not in stderr
    document = tomllib.loads(out.read_text(encoding="utf-8"))
    assert odd in document["levels"][0]["bandwidth"]["source"]


def test_a_csv_field_over_the_csv_limit_is_one_error(tmp_path, run_cli):
    path = tmp_path / "big.csv"
    path.write_text("collective,level,group_size,bytes,time_s\nAllReduce,node,2,\"" + "x" * 140_000 + "\",1\n")
    code, _, stderr = run_cli("calibrate", str(path), "-t", "emu-2x4", "--backend", "gloo")
    assert code == 2 and "field larger than field limit" in one_line_error(stderr)


@pytest.mark.parametrize("size", ["\u0661MiB", "\u0661\u0660\u0662\u0664", "1\u00b2"])
def test_sizes_in_other_scripts_digits_are_refused(tmp_path, run_cli, size):
    with pytest.raises(UsageError):
        parse_bytes(size)
    path = tmp_path / "bench.csv"
    path.write_text(f"collective,level,group_size,bytes,time_s\nAllReduce,node,2,{size},0.001\n", encoding="utf-8")
    code, _, stderr = run_cli("calibrate", str(path), "-t", "emu-2x4", "--backend", "gloo")
    assert code == 2 and "bytes" in one_line_error(stderr)


def test_launcher_labels_are_stripped_when_most_lines_carry_them():
    text = "0: # nThread 1\n0: #  Rank 0\n\n\n1: 1048576 x\nplain line"
    assert strip_prefixes(text).splitlines() == ["# nThread 1", "#  Rank 0", "", "", "1048576 x", "plain line"]
    assert strip_prefixes("[1,0]<stdout>:a\n[1,0]<stderr>:b\n0: c") == "a\n\n0: c"


def test_output_to_a_link_to_a_device_stays_a_link(tmp_path, run_cli):
    link = tmp_path / "out.toml"
    link.symlink_to("/dev/null")
    code, _, stderr = run_cli("calibrate", str(NCCL_LOG), "-t", "hgx-h100-ib-4x8", "-o", str(link))
    assert code == 0, stderr
    assert link.is_symlink() and stat.S_ISCHR(Path("/dev/null").stat().st_mode)


THIRD_PARTY = {"numpy": "numpy", "scipy": "scipy", "z3": "z3-solver", "networkx": "networkx", "lark": "lark",
               "rich": "rich", "tomli_w": "tomli-w", "tomli": "tomli", "torch": "torch", "matplotlib": "matplotlib",
               "jax": "jax", "hypothesis": "hypothesis"}


@pytest.mark.parametrize("argv", [
    ["calibrate", str(NCCL_LOG), "-t", "hgx-h100-ib-4x8", "-o", "nccl.toml"],
    ["calibrate", str(GLOO_CSV), "-t", "emu-2x4", "--backend", "gloo", "-o", "gloo.toml"],
])
def test_calibrate_needs_only_the_main_install(argv, tmp_path):
    """What `pip install .` installs is all calibrate imports (scipy and tomli-w are base
    dependencies), and it runs without torch."""
    from test_cli_startup import TORCH_BLOCKED, loaded

    code, modules = loaded(argv, TORCH_BLOCKED, cwd=tmp_path)
    assert code == 0 and (tmp_path / argv[argv.index("-o") + 1]).is_file()
    pyproject = tomllib.loads((REPOSITORY / "pyproject.toml").read_text(encoding="utf-8"))
    declared = {re.split(r"[<>=;\[ ]", requirement, maxsplit=1)[0] for requirement in pyproject["project"]["dependencies"]}
    used = {THIRD_PARTY[name] for name in modules - {"torch"} if name in THIRD_PARTY}  # torch: blocked, None
    assert used <= declared, used - declared
