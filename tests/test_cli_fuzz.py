"""Random arguments and random files thrown at every command (issue 12's property test).

For every command: options drawn from its own parser (so the inputs get past argparse and into
the code), each given a value from a pool of hostile ones (huge, negative, Unicode digits,
NaN, nesting, control characters, paths to random files) or of valid ones (so deeper code
runs too). The property: exit code 0, 1 or 2; no exception escapes; an error ends stderr in one
line that starts with `synth` (a program syntax error adds the program line and a caret); and
every run ends within its time bound. Nothing touches the machine: torchrun and the emulated
cluster's host calls are replaced by stubs that fail as they would without torch or root.

The default suite runs a few examples per command; `pytest -m slow tests/test_cli_fuzz.py`
runs many more.
"""

from __future__ import annotations

import _thread
import argparse
import io
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from synth.cli import COMMANDS, build_parser, main
from synth.errors import UsageError

TIME_BOUND_S = 60.0  # per run; a run past it is interrupted and fails the property

HOSTILE = ["", " ", "-", "--", "0", "-1", "-5", "1", "2", "3", "99", "4294967297", "9" * 40, "9" * 400, "1e308",
           "1e-308", "1e-300", "nan", "inf", "-inf", "\u0663", "\uff18", "\u00bd", "1/0", "1/3", "0x10", "1_000", "x", "None",
           "a" * 300, "a=1," * 40, ",", "data,", "data,,model", "[[", "[" * 3000 + "]" * 3000,
           "[[" + "9" * 5000 + "]]", "[[1,2],[2,1]]", "[[true]]", "{}", "null", "\x00", "a\nb", "\x1b[31m",
           "../../etc/passwd", "/dev/zero", "/dev/null", "/", "@/dev/null", "@/", "@missing", "1e308PiB", "-1GiB",
           "1.5B", "8M", "1G", "64KiB", "1 GB/s", "inf GB/s", "model.gpu=" + "9" * 31, "model=node", "data=gpu",
           "x.y=2", "data:1GiB", "data:1GiBx" + "9" * 30, "model:64MiBx96", "AllReduce(InsideGroup(gpu))",
           "AllReduce(Inside(gpu))", "AllReduce(InsideGroup(gpu)); AllReduce(Parallel(node))", "#", "; ;"]
VALID = {
    "--topology": ["emu-2x4", "paper-fig3", "dgx-a100-x4", "selene", "no-such-topology"],
    "--axes": ["data=8", "data=4,model=2", "8", "4,2", "data=2,model=2,pipe=2"],
    "--reduce": ["data", "data,model", "a0", "model"],
    "--placement": ["[[2,4]]", "[[2,2],[1,2]]", "[[1,4],[2,1]]"],
    "--inside": ["model=node", "data=node", "model=gpu"],
    "--factor": ["model.gpu=2", "data.node=2", "model.gpu=3"],
    "--bytes": ["64KiB", "1MiB", "8M", "1e308PiB"], "-b": ["1KiB", "8K", "1e308PiB"], "-e": ["4KiB", "1M", "1e308PiB"],
    "--max-len": ["1", "2", "3"], "--top": ["1", "2"], "--format": ["torch", "nccl", "json", "mesh"],
    "--hierarchy": ["merged", "split", "system"], "--backend": ["nccl", "gloo"], "--program": ["AllReduce(InsideGroup(gpu))"],
    "--reduction": ["data:1MiB", "data+model:8MiBx2"], "--tensors": ["4MiB,16MiB", "1KiB"],
    "--compute-rate": ["30GB/s", "inf"], "--output": ["out", "out/file.py", "out.toml", "-x"],
    "--model": ["gpt3-1.3b", "llama2-7b", "no-such-model"], "--micro-batch": ["1,2", "\u00b2"],
    "--resize": ["node=4", ""], "--collective": ["allreduce", "reducescatter", "alltoall", "", " "],
    "--export": ["launch.json", ""], "--efficiency": ["45%", "1e-300"],
    "--levels": ["node=2,gpu=4", "2,2", "rack=2,node=2,gpu=2", "a=64,b=64,c=64", "node=1024,gpu=1024"],
}
MODEL = {"name": "m", "layers": 24, "hidden": 2048, "heads": 16, "ffn": 8192, "seq_len": 2048, "vocab": 50257,
         "micro_batch": 1, "global_batch": 512}


def _device_table(name: str, efficiency: str, peak: str) -> bytes:
    """A two-level topology with a [device] table whose name, efficiency and peak are given."""
    return (b'name = "dev"\n[[levels]]\nname = "node"\nsize = 2\nbandwidth = { value = "25 GB/s", source = "x" }\n'
            b'latency = { value = "5 us", source = "x" }\n[[levels]]\nname = "gpu"\nsize = 8\n'
            b'bandwidth = { value = "300 GB/s", source = "x" }\nlatency = { value = "1 us", source = "x" }\n'
            + f'[device]\n{name}\nmemory = {{ value = "80 GiB", source = "x" }}\n'
              f'matmul_efficiency = {{ value = {efficiency}, source = "x" }}\n'
              f'[device.peak]\nbf16 = {{ value = {peak}, source = "x" }}\n'.encode())
def _nccl_log(time: str, share: int = 1, redop: str = "sum") -> str:
    """An 8-rank nccl-tests table with every time `time` (us) and counts divided by `share`."""
    return ("# nThread 1 nGpus 8 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20\n"
            + "".join(f"#  Rank {r} Group 0 Pid 1 on h device {r} [0x0] GPU\n" for r in range(8))
            + "#       size         count      type   redop    root     time   algbw   busbw #wrong     time"
              "   algbw   busbw #wrong\n"
            + "".join(f"{1 << k:12d} {(1 << k) // 4 // share:12d}     float    {redop}      -1    {time}    0.00    0.00"
                      f"      0    {time}    0.00    0.00      0\n" for k in range(3, 11))
            + "# Avg bus bandwidth    : 0.0 \n")


SHORT = {"-t": "--topology", "-a": "--axes", "-r": "--reduce", "-p": "--placement", "-B": "--bytes", "-L": "--max-len",
         "-k": "--top", "-F": "--format", "-o": "--output", "-R": "--reduction", "-f": "-f"}
SLOW_OPTIONS = {"--exact"}  # legitimately slow, not bad input: left out


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser(every_command=True)
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(subparsers.choices)


PARSERS = command_parsers()


def _file_pool(directory: Path) -> list[str]:
    """Random and hostile files: binary noise, bad UTF-8, TOML nested deep, a topology whose
    figures overflow, a valid topology, a directory."""
    files = {
        "noise.bin": os.urandom(2048),
        "latin1.txt": "caf\xe9 AllReduce(InsideGroup(gpu))".encode("latin-1"),
        "nested.toml": ("a = " + "[" * 2000 + "]" * 2000 + "\n").encode(),
        "inf.toml": b'name = "inf"\n[[levels]]\nname = "node"\nsize = 2\nbandwidth = { value = "1 GB/s", source = "x" }\n'
                    b'latency = { value = "1e308 s", source = "x" }\n',
        "ok.toml": b'name = "ok"\n[[levels]]\nname = "node"\nsize = 2\nbandwidth = { value = "1 GB/s", source = "x" }\n'
                   b'latency = { value = "5 us", source = "x" }\n[[levels]]\nname = "gpu"\nsize = 4\n'
                   b'bandwidth = { value = "10 GB/s", source = "x" }\nlatency = { value = "1 us", source = "x" }\n',
        "program.txt": b"AllReduce(InsideGroup(gpu))\nAllReduce(Parallel(node))\n",
        "sizes.txt": b"4MiB\n# comment\n16MiB\n",
        "bench.csv": b"collective,level,group_size,bytes,time_s\nAllReduce,gpu,4,65536,0.001\nAllReduce,gpu,4,131072,0.002\n",
        "empty": b"",
        # the newer commands' inputs: model files, device tables, nccl-tests logs
        "model.json": json.dumps(MODEL).encode(),
        "model.toml": "".join(f"{key} = {json.dumps(value)}\n" for key, value in MODEL.items()).encode(),
        "model-huge.json": json.dumps(dict(MODEL, hidden=10**160)).encode(),
        "model-digits.json": json.dumps(MODEL).replace('"layers": 24', '"layers": ' + "9" * 5000).encode(),
        "model-deep.json": ("[" * 50_000 + "]" * 50_000).encode(),
        "model-markup.json": json.dumps(dict(MODEL, name="m[/x][bold]\x1b[2J")).encode(),
        "device.toml": _device_table('name = "GPU [/x]\\u001b[31m"', '"1e-300"', '"312 TFLOP/s"'),
        "device-peak.toml": _device_table('name = "GPU"', '"46%"', '"1e-300 TFLOP/s"'),
        # issue 22: figures past what a file can mean
        "model-capacity.toml": ("".join(f"{key} = {json.dumps(value)}\n" for key, value in MODEL.items())
                                + "experts = 8\ntop_k = 2\ncapacity_factor = 1e308\n").encode(),
        "model-4400.toml": ("".join(f"{key} = {json.dumps(value)}\n" for key, value in MODEL.items() if key != "vocab")
                            + "vocab = " + "9" * 4400 + "\n").encode(),
        "topology-4400.toml": b'name = "x"\n[[levels]]\nname = "node"\nsize = ' + b"9" * 4400 + b"\n",
        "all_reduce_perf-1e-300.log": _nccl_log("1e-300").encode(),
        "alltoall_perf-1e300.log": _nccl_log("1e300", share=8, redop="none").encode(),
        "reduce_scatter_perf-as-all_reduce_perf.log": _nccl_log("40.12", share=8).encode(),
        "nccl.log": ("# nThread 1 nGpus 8 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20\n"
                     "#       size         count      type   redop    root     time   algbw   busbw #wrong     time"
                     "   algbw   busbw #wrong\n"
                     + "".join(f"{1 << k:12d} {1 << (k - 2):12d}     float     sum      -1    40.12    0.00    0.00"
                               f"      0    38.85    0.00    0.00      0\n" for k in range(3, 11))
                     + "# Avg bus bandwidth    : 0.0 \n").encode(),
    }
    for name, data in files.items():
        (directory / name).write_bytes(data)
    (directory / "a-directory").mkdir(exist_ok=True)
    return [str(directory / name) for name in files] + [str(directory / "a-directory")]


@st.composite
def arguments(draw, command: str, files: list[str]) -> list[str]:
    parser = PARSERS[command]
    argv = [command]
    if command == "emulate":
        argv.append(draw(st.sampled_from(["up", "down", "status", "sideways"])))
        parser = dict(next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices).get(
            argv[-1], parser)
    actions = [a for a in parser._actions if a.option_strings and a.dest != "help" and not set(a.option_strings) & SLOW_OPTIONS]
    positionals = [a for a in parser._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction)]
    # The options a run needs (required ones, and the system) mostly valid, so that most runs get
    # past argparse into the code; a few others, any value.
    needed = [a for a in actions if a.required or {"--topology", "--levels"} & set(a.option_strings)]
    if any("--topology" in a.option_strings for a in needed) and any("--levels" in a.option_strings for a in needed):
        needed = [a for a in needed if "--levels" not in a.option_strings or draw(st.booleans())]
        needed = [a for a in needed if "--topology" not in a.option_strings or
                  not any("--levels" in b.option_strings for b in needed)]
    extra = draw(st.lists(st.sampled_from(actions), max_size=min(6, len(actions)), unique_by=id)) if actions else []
    for action in needed + [a for a in extra if a not in needed]:
        spelling = draw(st.sampled_from(action.option_strings))
        argv.append(spelling)
        if action.nargs == 0:
            continue
        canonical = SHORT.get(spelling, spelling)
        pool = list(VALID.get(canonical, [])) + list(action.choices or [])
        anything = st.one_of(st.sampled_from(HOSTILE), st.sampled_from(files),
                             st.text(max_size=40).filter(lambda text: "\x00" not in text))
        if pool:
            value = draw(st.one_of(st.sampled_from(pool), st.sampled_from(pool), st.sampled_from(pool), anything))
        else:
            value = draw(anything)
        argv.append(value)
    for action in positionals:
        count = 1 if action.nargs in (None, "?") else draw(st.integers(1, 2))
        for _ in range(count):
            argv.append(draw(st.one_of(st.sampled_from(HOSTILE), st.sampled_from(files),
                                       st.sampled_from(["@" + path for path in files]),
                                       st.sampled_from(VALID["--topology"] + VALID["--program"]))))
    return argv


@pytest.fixture
def sandbox(monkeypatch):
    """A scratch working directory and temp directory, and stubs for what would touch the machine."""
    from synth.emulate import host
    from synth.execute import launch
    from synth.execute.launch import LaunchResult

    def no_root():
        raise UsageError("synth emulate needs root (stubbed in this test)")

    def no_torchrun(script, nproc, script_args, timeout=1800.0):
        return LaunchResult(1, "torchrun stubbed in this test", None)

    def no_commands(argv):
        raise AssertionError(f"ran {argv}")

    monkeypatch.setattr(host, "require_host", no_root)
    monkeypatch.setattr(host, "run", no_commands)
    monkeypatch.setattr(launch, "torchrun", no_torchrun)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"AllReduce(InsideGroup(gpu))\n\xff\n")))
    with tempfile.TemporaryDirectory(prefix="synth-fuzz-") as scratch:
        root = Path(scratch)
        (root / "cwd").mkdir()
        (root / "tmp").mkdir()
        (root / "files").mkdir()
        monkeypatch.chdir(root / "cwd")
        monkeypatch.setattr(tempfile, "tempdir", str(root / "tmp"))
        yield _file_pool(root / "files")


def run_bounded(argv: list[str], capsys) -> tuple[int, str, str, float]:
    """main(argv) in this process, interrupted (and so failing) if it runs past TIME_BOUND_S."""
    finished = threading.Event()

    def watchdog():
        if not finished.wait(TIME_BOUND_S):
            _thread.interrupt_main()

    threading.Thread(target=watchdog, daemon=True).start()
    started = time.perf_counter()
    try:
        try:
            code = main(argv)
        except SystemExit as exit:  # --help, --version
            code = exit.code
    finally:
        finished.set()
    elapsed = time.perf_counter() - started
    captured = capsys.readouterr()
    return code, captured.out, captured.err, elapsed


def check(argv: list[str], capsys) -> None:
    code, out, err, elapsed = run_bounded(argv, capsys)
    shown = repr(argv)[:500]
    assert elapsed < TIME_BOUND_S and code != 130, f"{shown} ran {elapsed:.1f} s"
    assert code in (0, 1, 2), (shown, code, err[-500:])
    assert "Traceback" not in err, (shown, err[-2000:])
    if code != 0 and not (code == 2 and err.startswith("usage:")):  # bare `synth emulate`: help on stderr
        lines = err.splitlines()
        errors = [index for index, line in enumerate(lines) if line.startswith("synth")]
        assert errors, (shown, err[-500:])
        first = errors[-1]
        tail = lines[first:]
        assert len(tail) == 1 or (": syntax error at line" in tail[0] and len(tail) == 3), (shown, err[-800:])
        assert len(tail[0]) <= 700, shown


def property_for(command: str, examples: int):
    @settings(max_examples=examples, deadline=None, derandomize=examples < 50,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.data_too_large])
    @given(data=st.data())
    def run(sandbox, capsys, data):
        check(data.draw(arguments(command, sandbox)), capsys)

    return run


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_random_arguments_and_files(command, sandbox, capsys):
    property_for(command, 8)(sandbox, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_random_arguments_and_files_at_length(command, sandbox, capsys):
    property_for(command, 300)(sandbox, capsys)


def test_the_property_catches_a_traceback(sandbox, capsys, monkeypatch):
    """The check is not vacuous: a command that raises past main fails it."""
    from synth.commands import synthesis

    monkeypatch.setattr(synthesis, "run_topologies", lambda args: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        check(["topologies"], capsys)
