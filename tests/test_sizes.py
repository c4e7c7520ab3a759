"""The size rule (synth/units.py, docs/model.md section 8): `1MB` is 10^6 bytes where synth reads
a size (`--bytes`, files) and 2^20 in the flags that mirror nccl-tests' (-b/-e), as
`all_reduce_perf -b 1MB` reads it; synth's commands, the exported torch script and the C
program agree on both, and all refuse digits of other scripts."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from importlib import resources

import pytest

from synth.commands.common import resolve_sizes
from synth.errors import UsageError
from synth.units import parse_bytes

CASES = [  # text, --bytes, -b/-e (None: refused)
    ("1MB", 10**6, 2**20), ("1M", 2**20, 2**20), ("1m", 2**20, 2**20), ("1MiB", 2**20, 2**20),
    ("1kB", 1000, 1024), ("1KB", 1000, 1024), ("2GB", 2 * 10**9, 2 * 2**30), ("1TB", 10**12, 2**40),
    ("1gib", None, None), ("1048576", 2**20, 2**20), ("8B", 8, 8), ("1.5MB", 1_500_000, 3 * 2**19),
    ("1Mb", None, None), ("1PB", 10**15, 2**50), ("2PB", None, None), ("1x", None, None), ("\u0661MB", None, None),
    ("\u0661\u0660\u0662\u0664", None, None), ("0.1KB", 100, None),
]


def parsed(parse, text):
    try:
        return parse(text)
    except (UsageError, argparse.ArgumentTypeError):
        return None


@pytest.mark.parametrize("text, as_bytes, as_flag", CASES)
def test_the_rule(text, as_bytes, as_flag):
    assert parsed(parse_bytes, text) == as_bytes
    assert parsed(lambda t: parse_bytes(t, nccl_tests=True), text) == as_flag


@pytest.mark.parametrize("text, as_bytes, as_flag", CASES)
def test_synths_options_follow_it(text, as_bytes, as_flag):
    def sizes(**options):
        namespace = argparse.Namespace(**dict(dict(bytes=None, minbytes=None, maxbytes=None, stepfactor=None),
                                              **options))
        return parsed(lambda _: resolve_sizes(namespace), None)

    assert sizes(bytes=text) == (None if as_bytes is None else [as_bytes])
    assert sizes(minbytes=text, maxbytes=text) == (None if as_flag is None else [as_flag])


@pytest.mark.parametrize("text, as_bytes, as_flag", CASES)
def test_the_exported_torch_script_follows_it(text, as_bytes, as_flag):
    torch_runtime = pytest.importorskip("synth.export.torch_runtime")
    assert parsed(torch_runtime.parse_size, text) == as_bytes
    assert parsed(torch_runtime.parse_flag_size, text) == as_flag


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler (gcc) to build the C program's size parser")
def test_the_c_programs_parser_follows_it(tmp_path):
    """The C program's parse_size, compiled alone (no NCCL or CUDA needed for it)."""
    runtime = resources.files("synth.export").joinpath("nccl_runtime.c").read_text(encoding="utf-8")
    start = runtime.index("#define MAX_BYTES")
    body = runtime[runtime.index("static long long parse_size(", start):]
    end = re.search(r"\n}\n", body).end()
    harness = tmp_path / "sizes.c"
    harness.write_text("#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n"
                       + runtime[start:runtime.index("static long long parse_size(", start)] + body[:end]
                       + "int main(int argc, char **argv) {\n  for (int i = 1; i < argc; i++)\n"
                         "    printf(\"%lld %lld\\n\", parse_size(argv[i], 0), parse_size(argv[i], 1));\n  return 0;\n}\n")
    binary = tmp_path / "sizes"
    subprocess.run(["gcc", "-std=c11", "-O1", "-o", str(binary), str(harness), "-lm"], check=True,
                   capture_output=True, timeout=120)
    texts = [text for text, _, _ in CASES]
    lines = subprocess.run([str(binary), *texts], capture_output=True, text=True, check=True, timeout=60).stdout.split("\n")
    for (text, as_bytes, as_flag), line in zip(CASES, lines):
        got = [None if int(value) < 0 else int(value) for value in line.split()]
        assert got == [as_bytes, as_flag], text
