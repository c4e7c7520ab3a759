"""Issue 12's bad inputs, one test each: one line on stderr naming the value (and, where the
library found it, the option), exit 2 for usage and input, 1 for "no answer", never a
traceback or a hang. The inputs that A (search limits) and E (sizes) own are in their tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from synth.cli import main

LEVELS = ("--levels", "node=2,gpu=4")
PROGRAM = "AllReduce(InsideGroup(gpu)); AllReduce(Parallel(node))"
LONG = "x" * 300


def one_line(err: str, *fragments: str) -> None:
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err and len(err) < 700, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def refused(run_cli, *args, code=2, fragments=()):
    got, out, err = run_cli(*args)
    assert got == code, err
    one_line(err, *fragments)
    return out, err


# --- names and files ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [LONG, LONG + ".toml", "x/" * 3000, "bad\0name"])
def test_a_topology_name_no_file_system_takes(run_cli, name):
    refused(run_cli, "rank", "--topology", name, "--axes", "data=8", "--reduce", "data", "--bytes", "1MiB",
            fragments=("synth rank: --topology: ", "characters" if len(name) > 60 else "topology"))


def test_an_output_name_no_file_system_takes(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # restored after: later tests run `python -c` from the checkout
    refused(run_cli, "export", *LEVELS, "--axes", "8", "--reduce", "a0", "--placement", "[[2,4]]", "--program", PROGRAM,
            "--format", "torch", "-o", LONG, fragments=("-o ", "(300 characters)", "File name too long"))
    refused(run_cli, "sweep", "--topology", "emu-2x4", "--axes", "data=8", "-b", "1K", "-e", "2K", "-o", LONG,
            fragments=("-o ", "File name too long"))
    refused(run_cli, "bench", *LEVELS, "--axes", "8", "--reduce", "a0", "--program", PROGRAM, "--backend", "gloo",
            "-o", LONG, fragments=("-o ", "File name too long"))
    assert list(tmp_path.iterdir()) == []


def test_a_toml_file_nested_thousands_deep(run_cli, tmp_path):
    path = tmp_path / "nested.toml"
    path.write_text("a = " + "[" * 3000 + "]" * 3000 + "\n")
    refused(run_cli, "placements", "--topology", str(path), "--axes", "8", fragments=("nested too deeply",))
    path.write_text('name = "x"\n' + "[a]\n" + "".join(f"[a{'.b' * i}]\n" for i in range(1, 400)))
    refused(run_cli, "placements", "--topology", str(path), "--axes", "8")


def test_a_program_file_that_is_not_text(run_cli, tmp_path):
    path = tmp_path / "program.bin"
    path.write_bytes(b"\xff\xfe\x00AllReduce")
    refused(run_cli, "check", *LEVELS, "--axes", "8", "--reduce", "a0", "--placement", "[[2,4]]", f"@{path}",
            fragments=("not UTF-8",))
    refused(run_cli, "check", *LEVELS, "--axes", "8", "--reduce", "a0", "--placement", "[[2,4]]", "@/dev/zero",
            fragments=("larger than",))
    refused(run_cli, "check", *LEVELS, "--axes", "8", "--reduce", "a0", "--placement", "[[2,4]]", f"@{tmp_path}",
            fragments=("cannot read program file",))


# --- numbers and lists -------------------------------------------------------------------------------


@pytest.mark.parametrize("matrix", ["[[" + "9" * 5000 + "]]", "[" * 5000 + "]" * 5000, "[[2,4]]" + " " * 5000])
def test_a_placement_of_5000_digits_or_5000_deep(run_cli, matrix):
    refused(run_cli, "check", *LEVELS, "--axes", "8", "--reduce", "a0", "--placement", matrix, PROGRAM,
            fragments=("--placement: ", "characters)", "not a placement matrix"))


def test_more_axes_or_levels_than_an_array_has_dimensions(run_cli):
    many = ",".join(["1"] * 70 + ["8"])
    refused(run_cli, "placements", *LEVELS, "--axes", many, fragments=("--axes: ", "at most 32"))
    refused(run_cli, "placements", "--levels", many, "--axes", "8", fragments=("--levels: ", "at most 32"))


def test_a_workload_count_of_400_digits(run_cli):
    refused(run_cli, "workload", "--topology", "emu-2x4", "--axes", "data=4,model=2",
            "--reduction", "data:1MiBx" + "9" * 400, fragments=("--reduction",))
    refused(run_cli, "workload", "--topology", "emu-2x4", "--axes", "data=4,model=2",
            "--reduction", "data:1MiBx" + "9" * 40, fragments=("count",))


@pytest.mark.parametrize("args, fragment", [
    (("placements", *LEVELS, "--axes", "data=\u0664,model=2"), "--axes"),
    (("placements", "--levels", "node=\u0662,gpu=4", "--axes", "8"), "--levels"),
    (("placements", *LEVELS, "--axes", "data=\uff14,model=2"), "--axes"),
    (("placements", *LEVELS, "--axes", "data=4,model=2", "--factor", "model.gpu=\u0662"), "--factor"),
    (("rank", "--topology", "emu-2x4", "--axes", "data=8", "--reduce", "data", "--bytes", "1MiB", "--top", "\u0663"),
     "--top"),
    (("explore", "--topology", "emu-2x4", "--axes", "data=8", "--reduce", "data", "--bytes", "1MiB", "-L", "\u0663"),
     "--max-len"),
    (("bench", *LEVELS, "--axes", "8", "--reduce", "a0", "--program", PROGRAM, "--iters", "\u0663"), "--iters"),
    (("check", *LEVELS, "--axes", "8", "--reduce", "a0", "--placement", "[[\u0662,4]]", PROGRAM), "--placement"),
])
def test_unicode_digits_are_not_numbers(run_cli, args, fragment):
    refused(run_cli, *args, fragments=(fragment,))


def test_a_reduce_list_with_an_empty_name(run_cli):
    for text in ("data,", ",data", "data,,model", ","):
        refused(run_cli, "programs", *LEVELS, "--axes", "data=4,model=2", "--reduce", text, "--count",
                fragments=("--reduce: ",))


@pytest.mark.parametrize("args", [
    ("placements", *LEVELS, "--axes", "d" * 100_000 + "=8"),
    ("programs", *LEVELS, "--axes", "data=8", "--reduce", "x" * 100_000),
    ("check", *LEVELS, "--axes", "8", "--reduce", "a0", "--placement", "[[2,4]]", "AllReduce(InsideGroup(" + "g" * 100_000 + "))"),
    ("rank", "--topology", "emu-2x4", "--axes", "data=8", "--reduce", "data", "--bytes", "9" * 100_000),
    ("placements", *LEVELS, "--axes", "data=4,model=2", "--inside", "m" * 100_000),
    ("emulate", "status", "--name", "x" * 100_000),
])
def test_huge_inputs_are_not_echoed_whole(run_cli, args):
    refused(run_cli, *args)


def test_a_31_digit_factor_is_refused_before_any_factoring(run_cli):
    started = time.perf_counter()
    refused(run_cli, "placements", *LEVELS, "--axes", "data=4,model=2", "--factor", "model.gpu=" + "9" * 31,
            fragments=("--factor: ",))
    got, _, err = run_cli("placements", *LEVELS, "--axes", "data=4,model=2", "--factor", "model.gpu=999999937")
    assert got == 1 and "does not divide" in err
    assert time.perf_counter() - started < 30  # trial division of 10**30 would not end


# --- the order of checks ---------------------------------------------------------------------------


@pytest.mark.parametrize("command, rest", [
    ("rank", ("--reduce", "data", "--bytes", "1MiB")),
    ("explore", ("--reduce", "data", "--bytes", "1MiB")),
    ("workload", ("--reduction", "data:1MiB")),
    ("sweep", ("-b", "1KiB", "-e", "4KiB")),
    ("fusion", ("--reduce", "data", "--placement", "[[" + ",".join(["2"] * 20) + "]]", "--tensors", "1MiB")),
    ("export", ("--reduce", "data", "--placement", "[[" + ",".join(["2"] * 20) + "]]", "--top", "1",
                "--format", "json", "-o", "x.json")),
])
def test_a_20_level_topology_is_refused_before_anything_is_costed(run_cli, tmp_path, command, rest, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "deep.toml"
    lines = ['name = "deep20"']
    for index in range(20):
        lines += ["[[levels]]", f'name = "l{index}"', "size = 2", 'bandwidth = { value = "10 GB/s", source = "test" }',
                  'latency = { value = "1 us", source = "test" }']
    path.write_text("\n".join(lines) + "\n")
    started = time.perf_counter()
    refused(run_cli, command, "--topology", str(path), "--axes", "data=1048576", *rest, fragments=("20 levels",))
    assert time.perf_counter() - started < 60


def test_rank_on_a_20_level_topology_is_refused_before_anything_is_costed(run_cli, tmp_path):
    path = tmp_path / "deep.toml"
    lines = ['name = "deep20"']
    for index in range(20):
        lines += ["[[levels]]", f'name = "l{index}"', "size = 2", 'bandwidth = { value = "10 GB/s", source = "test" }',
                  'latency = { value = "1 us", source = "test" }']
    path.write_text("\n".join(lines) + "\n")
    started = time.perf_counter()
    refused(run_cli, "rank", "--topology", str(path), "--axes", "data=1048576", "--reduce", "data", "--bytes", "1MiB",
            fragments=("20 levels",))
    assert time.perf_counter() - started < 60


def test_placements_of_262144_devices_are_listed_without_every_group_in_memory():
    """Three axes of 64 on 262,144 devices: 406 placements. Each one's groups are shown by
    their first ranks, computed digit by digit; the run stays small."""
    # VmHWM is this process's own peak; ru_maxrss would also count the parent it was forked
    # from (Linux keeps the old image's peak across exec), i.e. however large pytest has grown
    code = ("import re, sys; from synth.cli import main; c = main(['placements', '--levels', '64,64,64', "
            "'--axes', '64,64,64']); print(re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read())[1], "
            "file=sys.stderr); sys.exit(c)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "406 placement(s)" in done.stdout
    assert int(done.stderr.split()[-1]) < 400_000  # kilobytes: under 400 MB (it used 3 GB)


def test_more_placements_than_can_be_listed_are_refused_with_the_fix(run_cli):
    started = time.perf_counter()
    refused(run_cli, "placements", "--levels", "2,2,2,2,2,2,2,2,2,2", "--axes", "4,4,4,4,4",
            fragments=("more than 2000 placements", "narrow"))
    assert time.perf_counter() - started < 60


def test_check_without_a_placement_is_a_usage_error(run_cli):
    refused(run_cli, "check", *LEVELS, "--axes", "data=4,model=2", "--reduce", "data", PROGRAM,
            fragments=("give --placement",))


# --- times and rates --------------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", ["nan", "inf", "-5", "0", "1e400", "\u0665"])
def test_bench_timeout_must_be_a_positive_finite_number(run_cli, timeout, tmp_path):
    refused(run_cli, "bench", *LEVELS, "--axes", "8", "--reduce", "a0", "--program", PROGRAM, "--backend", "gloo",
            "--timeout", timeout, "-o", str(tmp_path), fragments=("--timeout",))
    assert list(tmp_path.iterdir()) == []


def test_bench_output_pointing_at_a_file(run_cli, tmp_path):
    path = tmp_path / "a-file"
    path.write_text("keep me")
    refused(run_cli, "bench", *LEVELS, "--axes", "8", "--reduce", "a0", "--program", PROGRAM, "--backend", "gloo",
            "-o", str(path), fragments=("is a file",))
    assert path.read_text() == "keep me"


@pytest.mark.parametrize("scale", ["1e30", "1e-30", "nan", "inf", "-1", "1/0", "\u0661/64"])
def test_emulate_up_refuses_a_scale_tc_cannot_shape_before_touching_anything(run_cli, scale, monkeypatch):
    from synth.emulate import host

    monkeypatch.setattr(host, "require_host", lambda: None)
    monkeypatch.setattr(host, "run", lambda argv: pytest.fail(f"ran {argv}"))
    refused(run_cli, "emulate", "up", "emu-2x4", "--scale", scale, "--name", "never")


@pytest.mark.parametrize("field, value", [("latency", "1e308 s"), ("latency", "1 ms"), ("bandwidth", "1e-300 B/s"),
                                          ("bandwidth", "1e300 TB/s")])
def test_topology_figures_that_make_times_infinite_are_refused_at_load(run_cli, tmp_path, field, value):
    figures = {"bandwidth": "1 GB/s", "latency": "1 us", field: value}
    path = tmp_path / "t.toml"
    path.write_text('name = "t"\n[[levels]]\nname = "node"\nsize = 2\n'
                    f'bandwidth = {{ value = "{figures["bandwidth"]}", source = "x" }}\n'
                    f'latency = {{ value = "{figures["latency"]}", source = "x" }}\n')
    got, out, err = run_cli("rank", "--topology", str(path), "--axes", "2", "--reduce", "a0", "--bytes", "1MiB")
    if value == "1 ms":
        assert got == 0 and "inf" not in out and "nan" not in out
    else:
        # refused by the unit parser (beyond any link) or by the topology's range check
        assert got == 2 and len(err.splitlines()) == 1 and "levels[0]" in err and field in err
        assert "outside the range a link has" in err or "than any" in err


# --- interruptions ----------------------------------------------------------------------------------


def _terminal_sigint() -> None:
    """In the child: SIGINT as a terminal delivers it, even when the tests run as a background
    job (whose children start with SIGINT ignored, which synth, like Python, keeps)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt_after(args: list[str], seconds: float, cwd) -> subprocess.CompletedProcess:
    process = subprocess.Popen([sys.executable, "-m", "synth", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=cwd, preexec_fn=_terminal_sigint)
    time.sleep(seconds)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(args, process.returncode, out, err)


def test_ctrl_c_of_programs_json_keeps_what_was_found_as_json(run_cli, monkeypatch):
    """Ctrl-C after the search found five programs (made deterministic by raising it there):
    standard output is still one JSON document with those five."""
    from synth import search

    real = search.Enumerator.programs

    def interrupted_after_five(self):
        for index, program in enumerate(real(self)):
            if index == 5:
                raise KeyboardInterrupt
            yield program

    monkeypatch.setattr(search.Enumerator, "programs", interrupted_after_five)
    code, out, err = run_cli("programs", "--levels", "rack=2,node=2,gpu=2", "--axes", "data=8", "--reduce", "data",
                             "--max-len", "4", "--json")
    assert code == 130
    one_line(err, "synth programs: interrupted after 5 program(s)", "the JSON holds them")
    rows = json.loads(out)
    assert len(rows) == 5 and all("program" in row for row in rows)


def test_ctrl_c_of_sweep_writes_the_placements_done_and_says_so(run_cli, tmp_path, monkeypatch):
    """Ctrl-C arrives while the third placement is swept (made deterministic by raising it
    there): the files hold the two placements done, and say the sweep was interrupted."""
    from synth.analysis import sweep

    real, calls = sweep.run_sweep, []

    def interrupted_on_the_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep, "run_sweep", interrupted_on_the_third)
    code, out, err = run_cli("sweep", "--topology", "emu-2x4", "--axes", "data=2,model=2,pipe=2", "-b", "1KiB",
                             "-e", "4KiB", "-L", "3", "-o", str(tmp_path / "out"))
    assert code == 130 and "Traceback" not in err
    assert err.splitlines()[-1].startswith("synth sweep: interrupted after 2 of ")
    (csv_path,) = (tmp_path / "out").glob("*.csv")
    (json_path,) = (tmp_path / "out").glob("*.json")
    written = json.loads(json_path.read_text())
    assert written["interrupted"] is True and written["placements"] == 2
    assert {row["matrix"] for row in written["rows"]} and len({row["matrix"] for row in written["rows"]}) == 2
    assert len(csv_path.read_text().splitlines()) == 1 + len(written["rows"])
    assert str(csv_path) in out


@pytest.mark.slow
def test_ctrl_c_during_z3_calls_is_never_lost(tmp_path):
    """The search's pruning is a loop of Z3 calls; an interrupt at any moment of it ends the
    run with 130 (Z3 used to catch SIGINT itself and answer 'unknown', which a loop takes for
    an answer, and the run then exited 0)."""
    args = ["programs", "--levels", "2,2,2,2", "--axes", "16", "--reduce", "a0", "--max-len", "4", "--count"]  # seconds
    for delay in (0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0):
        done = _interrupt_after(args, delay, tmp_path)
        assert done.returncode == 130, (delay, done.returncode, done.stderr[-300:])


# --- issue 15: user strings shown as text; plan's inputs; sizes of work refused before it starts ----------

SMALL_PLAN = ("--max-len", "1", "--top", "1", "--tp", "8", "--pp", "1", "--recompute", "none", "--zero1", "off",
              "--sequence-parallel", "off")
MODEL = {"layers": 24, "hidden": 2048, "heads": 16, "ffn": 8192, "seq_len": 2048, "vocab": 50257, "micro_batch": 1,
         "global_batch": 512}


def test_a_rich_console_shows_markup_and_escape_codes_as_text():
    import io

    from synth.commands.terminal import console, printable

    out = console(width=80)
    out.file = io.StringIO()
    out.print("name [/x] [bold]b[/bold] \x1b[31mred\x07 :smile:")
    text = out.file.getvalue()
    assert "[/x] [bold]b[/bold] \\x1b[31mred\\x07 :smile:" in text and "\x1b" not in text
    assert printable("a\tb\nc\x9b") == "a\tb\nc\\x9b"


def test_names_holding_markup_and_escape_codes_are_shown_not_obeyed(run_cli, tmp_path):
    model = tmp_path / "model.json"
    model.write_text(json.dumps(dict(MODEL, name="bad[/x]name\x1b[31m")))
    topology = tmp_path / "gpu.toml"
    import synth.topology_file as topology_file

    source = (topology_file._builtin_dir() / "selene.toml").read_text()
    topology.write_text(source.replace('name = "NVIDIA A100-SXM4-80GB"', 'name = "A100[/x]\\u001b[2J"'))
    # a device no built-in description names: priced with one matmul efficiency
    code, out, err = run_cli("plan", "--topology", str(topology), "--model", str(model), "--efficiency", "50%",
                             *SMALL_PLAN)
    assert code == 0, err
    assert "bad[/x]name\\x1b[31m" in out and "A100[/x]\\x1b[2J" in out and "\x1b" not in out


def test_an_escape_code_in_an_error_is_shown_as_text(run_cli, tmp_path):
    program = tmp_path / "program.txt"
    program.write_text("AllReduce(InsideGroup(gpu\x1b[31m))")
    code, _, err = run_cli("check", *LEVELS, "--axes", "8", "--reduce", "a0", "--placement", "[[2,4]]", "@" + str(program))
    assert code == 2 and "gpu\\x1b[31m))" in err and "\x1b" not in err and "Traceback" not in err


@pytest.mark.parametrize("args, fragment", [
    (("--micro-batch", "\u00b2"), "--micro-batch: '\u00b2' is not a whole number"),
    (("--micro-batch", "9" * 5000), "--micro-batch: "),
    (("--virtual-stages", "1,\u0663"), "--virtual-stages: "),
    (("--resize", ""), "--resize: "),
    (("--export", ""), "--export '': give the file"),
    (("--efficiency", "1e-300"), "--efficiency = 1e-300 is outside"),
    (("--efficiency", "\u0660.\u0665"), "--efficiency: "),
    (("--memory-headroom", "\uff110%"), "--memory-headroom: "),
])
def test_plan_options_that_are_not_what_they_say(run_cli, args, fragment):
    refused(run_cli, "plan", "--topology", "selene", "--model", "gpt3-1.3b", *args, fragments=(fragment,))


@pytest.mark.parametrize("write, fragment", [
    (lambda path: path.write_text(json.dumps(dict(MODEL, name="m", hidden=10**160))), "hidden = a 161-digit number"),
    (lambda path: path.write_text(json.dumps(dict(MODEL, name="m")).replace('"layers": 24', '"layers": ' + "9" * 5000)),
     "too many digits"),
    (lambda path: path.write_text("[" * 100_000 + "]" * 100_000), "nested too deeply"),
])
def test_plan_model_files_no_model_has(run_cli, tmp_path, write, fragment):
    path = tmp_path / "model.json"
    write(path)
    refused(run_cli, "plan", "--topology", "selene", "--model", str(path), fragments=(fragment,))


def test_plan_model_name_no_file_system_takes(run_cli):
    refused(run_cli, "plan", "--topology", "selene", "--model", "m" * 300 + ".json",
            fragments=("--model ", "not a file name this system takes"))


@pytest.mark.parametrize("old, new, fragment", [
    ('name = "NVIDIA A100-SXM4-80GB"\n',  # another device, priced by its stated matmul efficiency
     'name = "Other GPU"\n\n[device.matmul_efficiency]\nvalue = "1e-300"\nsource = "test"\n',
     "[device] matmul_efficiency = 1e-300 is outside"),
    ('fp16 = { value = "312 TFLOP/s"', 'fp16 = { value = "1e-300 TFLOP/s"', "[device] peak.fp16 = 1e-288 FLOP/s"),
    ('fp16 = { value = "312 TFLOP/s"', 'fp16 = { value = "0 TFLOP/s"', "not a positive compute rate"),
    ('value = "2039 GB/s"', 'value = "1 B/s"', "[device] memory_bandwidth"),
])
def test_plan_device_figures_no_device_has(run_cli, tmp_path, old, new, fragment):
    import synth.topology_file as topology_file

    source = (topology_file._builtin_dir() / "selene.toml").read_text()
    assert old in source
    path = tmp_path / "device.toml"
    path.write_text(source.replace(old, new))
    refused(run_cli, "plan", "--topology", str(path), "--model", "gpt3-1.3b", fragments=(fragment,))


def test_sizes_take_ascii_digits_only(run_cli):
    refused(run_cli, "rank", "--topology", "dgx-a100-x4", "--axes", "data=32", "--reduce", "data", "--bytes",
            "\u0661MiB", fragments=("--bytes", "is not a byte size"))


def test_a_program_of_half_a_million_steps_is_refused_before_parsing(run_cli, tmp_path):
    path = tmp_path / "program.txt"
    path.write_text("AllReduce(InsideGroup(gpu));\n" * 578_514)
    started = time.perf_counter()
    refused(run_cli, "check", *LEVELS, "--axes", "8", "--reduce", "a0", "--placement", "[[2,4]]", "@" + str(path),
            fragments=("578,514 steps", "at most 4,096"))
    assert time.perf_counter() - started < 30  # it took 126 s and 2 GB


def test_a_json_plan_too_large_to_write_is_refused_before_any_per_rank_work(run_cli, tmp_path):
    started = time.perf_counter()
    refused(run_cli, "export", "--levels", "node=1024,gpu=1024", "--axes", "data=1048576", "--reduce", "data",
            "--placement", "[[1024,1024]]", "--program", PROGRAM, "--format", "json", "-o", str(tmp_path / "plan.json"),
            fragments=("the JSON plan would be about", "--format torch or nccl"))
    assert time.perf_counter() - started < 120 and not (tmp_path / "plan.json").exists()


def test_the_json_plan_estimate_is_near_the_file(tmp_path):
    from synth.export.json_plan import estimated_bytes
    from synth.hierarchy import build_hierarchy
    from synth.language import parse_program
    from synth.placement import make_placement, parse_axes
    from synth.topology import topology_from_levels

    path = tmp_path / "plan.json"
    assert main(["export", "--levels", "node=16,gpu=8", "--axes", "data=128", "--reduce", "data", "--placement",
                 "[[16,8]]", "--program", PROGRAM, "--format", "json", "-o", str(path)]) == 0
    placement = make_placement(topology_from_levels("node=16,gpu=8"), parse_axes("data=128"), [[16, 8]])
    estimate = estimated_bytes(build_hierarchy(placement, ("data",), "merged"), [parse_program(PROGRAM)])
    assert 0.7 < estimate / path.stat().st_size < 1.5


def test_bench_launches_its_script_by_a_path_no_launcher_reads_as_an_option(run_cli, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from synth.execute import launch
    from synth.execute.launch import LaunchResult

    seen = []

    def fake_torchrun(script, nproc, script_args, timeout=1800.0):
        seen.append(str(script))
        return LaunchResult(1, "stubbed", None)

    monkeypatch.setattr(launch, "torchrun", fake_torchrun)
    monkeypatch.chdir(tmp_path)
    code, _, _ = run_cli("bench", *LEVELS, "--axes", "8", "--reduce", "a0", "--placement", "[[2,4]]", "--program",
                         PROGRAM, "--backend", "gloo", "--bytes", "4KiB", "--output=-x")
    assert code != 0 and seen and not seen[0].startswith("-") and os.path.isabs(seen[0])


def _interrupt_on_call(monkeypatch, owner, name: str, at: int) -> None:
    """Ctrl-C while the `at`-th call of owner.name runs (deterministic: raised there)."""
    real, calls = getattr(owner, name), []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == at:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, interrupted)


@pytest.mark.parametrize("command, rest", [
    ("explore", ("--reduce", "data", "--bytes", "1MiB")),
    ("workload", ("--reduction", "data:1MiB")),
])
def test_ctrl_c_of_explore_and_workload_shows_the_placements_done(run_cli, monkeypatch, command, rest):
    from synth.search import BestPrograms

    _interrupt_on_call(monkeypatch, BestPrograms, "best_row" if command == "explore" else "best", 3)
    code, out, err = run_cli(command, "--topology", "emu-2x4", "--axes", "data=2,model=2,pipe=2", "-L", "3", *rest,
                             "--json")
    assert code == 130 and "Traceback" not in err
    assert err.splitlines()[-1].startswith(f"synth {command}: interrupted after 2 of ")
    assert len(json.loads(out)) == 2


def test_ctrl_c_of_rank_top_shows_the_placements_ranked(run_cli, monkeypatch):
    from synth.search.rank import Ranker

    _interrupt_on_call(monkeypatch, Ranker, "top", 3)
    code, out, err = run_cli("rank", "--topology", "emu-2x4", "--axes", "data=2,model=2,pipe=2", "--reduce", "data",
                             "--bytes", "1MiB", "--top", "2", "-L", "3", "--json")
    assert code == 130 and "Traceback" not in err
    assert err.splitlines()[-1].startswith("synth rank: interrupted after 2 of ")
    assert len({json.dumps(row["matrix"]) for row in json.loads(out)}) == 2


def test_ctrl_c_while_synth_loads_is_one_line_and_130():
    """The handler is in place before the command line is imported (`python -m synth` reads
    argv[0] as '-m' while the package loads), and a Ctrl-C there leaves at once."""
    code = ("import os, signal, sys\nsys.argv[:1] = ['-m']\nimport synth\nfrom synth import _interrupt\n"
            "assert signal.getsignal(signal.SIGINT) is _interrupt._interrupted_early\n"
            "os.kill(os.getpid(), signal.SIGINT)\nimport time\ntime.sleep(30)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          preexec_fn=_terminal_sigint)
    assert done.returncode == 130 and done.stderr == "synth: interrupted\n", done.stderr


def test_objects_a_ctrl_c_left_half_built_are_collected_quietly(run_cli, monkeypatch):
    """A Ctrl-C inside a constructor leaves an object whose `__del__` fails (Z3's Context and
    Solver did, printing tracebacks after the one-line message): not printed."""
    import gc

    from synth.commands import synthesis

    class HalfBuilt:
        def __init__(self):
            self.cycle = self
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # interrupted here
            self.handle = 1

        def __del__(self):
            self.handle  # noqa: B018 (AttributeError: the constructor never got here)

    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # restored after the test
    monkeypatch.setattr(synthesis, "run_topologies", lambda args: HalfBuilt())
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal, even in a background run
    try:
        code, _, err = run_cli("topologies")
    finally:
        signal.signal(signal.SIGINT, previous)
    gc.collect()
    assert code == 130 and err == "synth topologies: interrupted\n" and "Exception ignored" not in err


def test_ctrl_c_of_plan_ranks_the_candidates_found(run_cli, monkeypatch):
    from synth.plan import search

    _interrupt_on_call(monkeypatch, search, "predict", 40)
    code, out, err = run_cli("plan", "--topology", "selene", "--model", "gpt3-1.3b", "--top", "3", "--json")
    assert code == 130 and "Traceback" not in err
    assert err.splitlines()[-1].startswith("synth plan: interrupted after ")
    assert 1 <= len(json.loads(out)["ranked"]) <= 3


EXPORT_TOP_4 = ("export", "--topology", "emu-2x4", "--axes", "data=8", "--reduce", "data", "--top", "4",
                "--format", "torch")


def test_ctrl_c_of_export_writes_the_files_rendered(run_cli, tmp_path, monkeypatch):
    """Ctrl-C while the third of four scripts is rendered: the two done are written, whole."""
    from synth.export import torch_script

    _interrupt_on_call(monkeypatch, torch_script, "render", 3)
    code, out, err = run_cli(*EXPORT_TOP_4, "-o", str(tmp_path / "out"))
    assert code == 130 and "Traceback" not in err
    one_line(err, "synth export: interrupted after writing 2 of 4 file(s)")
    written = sorted(path.name for path in (tmp_path / "out").iterdir())
    assert written == ["program_1.py", "program_2.py"]  # no temporary file left beside them
    assert out.splitlines() == [f"wrote {tmp_path / 'out' / name}" for name in written]
    for name in written:
        compile((tmp_path / "out" / name).read_text(), name, "exec")  # a whole script


def test_ctrl_c_while_export_writes_keeps_the_files_written(run_cli, tmp_path, monkeypatch):
    from synth.commands import export

    _interrupt_on_call(monkeypatch, export, "write_text", 2)
    code, _, err = run_cli(*EXPORT_TOP_4, "-o", str(tmp_path / "out"))
    assert code == 130 and "Traceback" not in err
    one_line(err, "synth export: interrupted after writing 1 of 4 file(s)")
    assert [path.name for path in (tmp_path / "out").iterdir()] == ["program_1.py"]


def test_ctrl_c_of_export_before_a_file_is_rendered_writes_nothing(run_cli, tmp_path, monkeypatch):
    from synth.export import torch_script

    _interrupt_on_call(monkeypatch, torch_script, "render", 1)
    code, out, err = run_cli(*EXPORT_TOP_4, "--batch", "-o", str(tmp_path / "all.py"))
    assert code == 130 and out == ""
    one_line(err, "synth export: interrupted before a file was complete: nothing written")
    assert not (tmp_path / "all.py").exists()


def test_ctrl_c_of_fusion_says_there_is_no_partial_plan(run_cli, monkeypatch):
    """The buckets come from one optimization over all the tensors: nothing partial to print."""
    from synth.analysis import fusion

    _interrupt_on_call(monkeypatch, fusion, "optimal_ranges", 1)
    code, out, err = run_cli("fusion", "--topology", "emu-2x4", "--axes", "data=8", "--reduce", "data",
                             "--tensors", "1MiB,4MiB", "-L", "3")
    assert code == 130 and out == ""
    one_line(err, "synth fusion: interrupted before the plan was complete", "nothing to show")


def test_a_real_ctrl_c_of_fusion_is_one_line_and_130():
    """SIGINT as a terminal sends it, a few seconds into a planning run of tens of seconds
    (run from the checkout, so that the checkout's synth is the one run)."""
    tensors = ",".join(["1MiB", "3MiB", "7KiB"] * 600)
    done = _interrupt_after(["fusion", "--topology", "dgx-a100-x4", "--axes", "data=8,model=4", "--reduce", "data",
                             "--placement", "[[4,2],[1,4]]", "--tensors", tensors, "--exact"], 4,
                            Path(__file__).resolve().parents[1])
    assert done.returncode == 130 and "Traceback" not in done.stderr and done.stdout == "", done.stderr
    assert len(done.stderr.splitlines()) == 1 and "interrupted" in done.stderr  # while loading: "synth: interrupted"


# --- issue 22 section 5: extreme figures in files, sizes of work, names of collectives -------------------


def nccl_tests_log(times: str = "40.12", count_share: int = 1, redop: str = "sum", ranks: int = 8) -> str:
    """A one-host nccl-tests table of sizes 8 B to 1 KiB (bandwidths too small to print, so
    only the count column tells a per-rank collective); `count_share` divides the count."""
    lines = ["# nThread 1 nGpus 8 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20", "# Using devices"]
    lines += [f"#  Rank {r:2d} Group  0 Pid   1000 on      host0 device {r:2d} [0x{r:02x}] NVIDIA H100 80GB HBM3"
              for r in range(ranks)]
    lines.append("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw"
                 "   busbw #wrong")
    for k in range(3, 11):
        lines.append(f"{1 << k:12d} {(1 << k) // 4 // count_share:12d}     float    {redop:>4}      -1    {times}    0.00"
                     f"    0.00      0    {times}    0.00    0.00      0")
    return "\n".join(lines + ["# Avg bus bandwidth    : 0.0 "]) + "\n"


@pytest.mark.parametrize("test, time", [("all_reduce", "1e-300"), ("all_reduce", "1e300"), ("alltoall", "1e-300"),
                                        ("alltoall", "1e300"), ("all_reduce", "inf"), ("alltoall", "nan")])
def test_calibrate_refuses_times_no_call_takes(run_cli, tmp_path, test, time):
    path = tmp_path / f"{test}_perf.txt"
    path.write_text(nccl_tests_log(time, 8 if test == "alltoall" else 1, "none" if test == "alltoall" else "sum"))
    refused(run_cli, "calibrate", str(path), fragments=(f"{path}:", repr(time) if time[0] == "1" else time))


def test_calibrate_refuses_rates_no_hardware_has(run_cli, tmp_path):
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text(nccl_tests_log("0.001"))  # 1 KiB in 1 ns: 10^12 B/s is fine; 16 MiB would not be
    path.write_text(nccl_tests_log("0.001").replace("        1024          256", "    16777216      4194304"))
    refused(run_cli, "calibrate", str(path), fragments=("16,777,216 bytes in 1e-09 s", "faster than any link"))
    path.write_text(nccl_tests_log("90000000"))  # 8 bytes in 90 s
    refused(run_cli, "calibrate", str(path), fragments=("8 bytes in 90 s", "slower than any network"))
    csv = tmp_path / "bench.csv"
    csv.write_text("collective,level,group_size,bytes,time_s\nAllReduce,gpu,4,65536,1e-300\n")
    refused(run_cli, "calibrate", str(csv), "--topology", "emu-2x4", fragments=("'1e-300' (s)", "1 ns to 1 day"))


@pytest.mark.parametrize("named, share, redop", [("all_reduce", 8, "sum"), ("reduce_scatter", 1, "sum"),
                                                 ("all_reduce", 8, "none"), ("all_gather", 1, "none")])
def test_a_table_under_another_collectives_name_is_refused(run_cli, tmp_path, named, share, redop):
    """nccl-tests prints `count` as one rank's share for reduce_scatter, all_gather and alltoall:
    a table whose count says otherwise than its name is refused, even where busbw is 0.00."""
    path = tmp_path / f"{named}_perf.txt"
    path.write_text(nccl_tests_log(count_share=share, redop=redop))
    refused(run_cli, "calibrate", str(path), fragments=(f"named {named}_perf but its table", "count"))


def test_an_unnamed_table_is_told_by_its_count(tmp_path):
    from synth.calibrate.readers import read_measurements

    path = tmp_path / "run.txt"
    for share, redop, collective in ((8, "sum", "ReduceScatter"), (1, "sum", "AllReduce")):
        path.write_text(nccl_tests_log(count_share=share, redop=redop))
        assert {m.collective for m in read_measurements(str(path))[1]} == {collective}


@pytest.mark.parametrize("line, fragments", [
    ("capacity_factor = 1e308", ("capacity_factor = 1e+308", "experts / top_k = 4")),
    ("capacity_factor = 5.0", ("capacity_factor = 5", "give 1 to 4")),
    ("vocab = " + "9" * 4400, ("4,400 digits", "write it shorter")),
])
def test_a_model_file_with_figures_out_of_range(run_cli, tmp_path, line, fragments):
    path = tmp_path / "moe.toml"
    keys = dict(name='"moe"', layers=8, hidden=1024, heads=16, ffn=4096, seq_len=2048, vocab=32000, micro_batch=1,
                global_batch=64, experts=8, top_k=2)
    key = line.split(" = ")[0]
    path.write_text("".join(f"{k} = {v}\n" for k, v in keys.items() if k != key) + line + "\n")
    refused(run_cli, "plan", "--topology", "dgx-a100-x4", "--model", str(path), fragments=fragments)


def test_a_topology_file_with_an_integer_of_4400_digits(run_cli, tmp_path):
    path = tmp_path / "big.toml"
    path.write_text('name = "big"\n[[levels]]\nname = "node"\nsize = ' + "9" * 4400 + "\n")
    refused(run_cli, "placements", "--topology", str(path), "--axes", "8", fragments=("4,400 digits",))


@pytest.mark.parametrize("name", ["", " ", "\u200b"])
def test_an_empty_collective_name_is_refused(run_cli, name):
    refused(run_cli, "export", *LEVELS, "--axes", "8", "--reduce", "a0", "--placement", "[[2,4]]", "--program",
            "AllReduce(InsideGroup(gpu))", "--format", "json", "-o", "x.json", "--collective", name,
            fragments=("--collective", "unknown collective"))


@pytest.mark.parametrize("form", ["torch", "nccl"])
def test_an_export_of_a_million_devices_is_refused_before_it_starts(run_cli, tmp_path, form):
    started = time.perf_counter()
    refused(run_cli, "export", "--levels", "node=1024,gpu=1024", "--axes", "data=1048576", "--reduce", "data",
            "--placement", "[[1024,1024]]", "--program", PROGRAM, "--format", form, "-o", str(tmp_path / "out"),
            fragments=("1,048,576 devices", "2,097,152 rank-steps", "at most 262,144"))
    topology = tmp_path / "million.toml"
    topology.write_text("".join(f'[[levels]]\nname = "{name}"\nsize = 1024\nbandwidth = {{ value = "25 GB/s", source = "x" }}\n'
                                f'latency = {{ value = "5 us", source = "x" }}\n' for name in ("node", "gpu")))
    topology.write_text('name = "million"\n' + topology.read_text())
    refused(run_cli, "export", "--topology", str(topology), "--axes", "data=1048576", "--reduce", "data", "--top", "1",
            "--format", form, "-o", str(tmp_path / "out"), fragments=("at least 1 step(s)", "1,048,576 rank-steps"))
    assert time.perf_counter() - started < 30 and not (tmp_path / "out").exists()


def test_placements_of_three_levels_of_64_finish_and_json_of_gigabytes_is_refused(run_cli):
    started = time.perf_counter()
    code, out, err = run_cli("placements", "--levels", "a=64,b=64,c=64", "--axes", "a=64,b=64,c=64")
    assert code == 0 and "406 placement(s)" in out, err
    refused(run_cli, "placements", "--levels", "a=64,b=64,c=64", "--axes", "a=64,b=64,c=64", "--json",
            fragments=("406 placement(s) of 262,144 devices", "drop --json"))
    assert time.perf_counter() - started < 60


@pytest.mark.parametrize("digits", [400, 5000])
def test_calibrate_refuses_sizes_and_rank_numbers_of_thousands_of_digits(run_cli, tmp_path, digits):
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text(nccl_tests_log().replace("           8            2", f"{'9' * digits} {'9' * digits}"))
    refused(run_cli, "calibrate", str(path), fragments=("size", "more digits than any count"))
    path.write_text(nccl_tests_log().replace("Rank  7", "Rank " + "7" * digits))
    refused(run_cli, "calibrate", str(path), fragments=(str(path),))


@pytest.mark.parametrize("matrix", ["", " "])
def test_an_empty_placement_is_refused_not_taken_for_every_placement(run_cli, matrix):
    refused(run_cli, "rank", "--topology", "emu-2x4", "--axes", "data=8", "--reduce", "data", "--bytes", "1MiB",
            "--placement", matrix, fragments=("--placement", "not a placement matrix"))
