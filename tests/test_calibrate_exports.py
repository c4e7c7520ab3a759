"""Every measurement synth prints reads back into `synth calibrate`: the exported torch script's
table and JSON (run for real on gloo) and the NCCL C program's table (its printf formats,
taken from synth/export/nccl_runtime.c, filled with timings: no GPU here)."""

from __future__ import annotations

import ast
import json
import re
from importlib import resources

import pytest

from synth.calibrate import read_measurements

EXPORT = ("export", "-t", "emu-2x2", "--axes", "data=2,model=2", "--reduce", "data", "--placement", "[[2,1],[1,2]]")


def fits(run_cli, *args) -> dict:
    code, stdout, stderr = run_cli("calibrate", *args, "--json")
    assert code == 0, stderr
    return json.loads(stdout)


@pytest.mark.torchrun
def test_the_torch_scripts_table_and_json_calibrate(run_cli, tmp_path):
    pytest.importorskip("torch")
    from synth.execute.launch import torchrun

    script = tmp_path / "script.py"
    code, _, stderr = run_cli(*EXPORT, "--top", "3", "--max-len", "3", "--format", "torch", "--batch", "-o", str(script))
    assert code == 0, stderr
    result = torchrun(script, 4, ["--backend", "gloo", "--iters", "2", "--warmup", "1", "-b", "256K", "-e", "16M", "-f", "8"],
                      timeout=300)
    assert result.returncode == 0, result.log[-3000:]
    table = tmp_path / "table.txt"
    table.write_text(result.log[result.log.index("# command:"):])
    document = tmp_path / "results.json"
    document.write_text(json.dumps(result.report))
    one_step = sum(1 for program in result.report["programs"] if program["text"] == "AllReduce(InsideGroup(node))")
    expected = 3 * (1 + one_step)  # 3 sizes of the baseline and of each one-step program
    for path, kind in ((table, "exported program output"), (document, "exported script JSON")):
        found_kind, measurements = read_measurements(str(path))
        assert found_kind == kind and len(measurements) == expected
        assert {(m.collective, m.span.level, m.span.size, m.backend) for m in measurements} == {
            ("AllReduce", "node", 2, "gloo")}
        result_fits = fits(run_cli, str(path))  # the topology comes from the '# command:' line
        assert result_fits["backend"] == "gloo" and result_fits["fits"][0]["points"] == expected


def c_program_output(c_source: str, times_us: dict[int, tuple[float, float, float]]) -> str:
    """What the C program prints on rank 0, with its own printf formats and the exported constants."""
    runtime = resources.files("synth.export").joinpath("nccl_runtime.c").read_text(encoding="utf-8")
    for line in ('printf("# command: %s\\n", COMMAND);', 'printf("# reduction groups: %s\\n", REDUCTION_GROUPS);',
                 'printf("#\\n# the program (in place)\\n");',
                 'printf("#\\n# baseline: one %s over each reduction group\\n", OP_NCCL_NAMES[GOAL_OP]);'):
        assert line in runtime, line

    def constant(name: str) -> str:
        literal = re.search(rf"static const char {name}\[\] = (\".*\");", c_source).group(1)
        return ast.literal_eval("b" + literal).decode("utf-8")

    chunks = int(re.search(r"#define CHUNKS (\d+)", c_source).group(1))
    header_body = runtime[runtime.index("static void print_header(void) {"):]
    header_formats = re.findall(r'printf\("(#%[^"]*)\\n"', header_body[:header_body.index("}")])
    header_arguments = [("", "out-of-place        ", "in-place           "),
                        ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
                         "busbw", "#wrong"),
                        ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "")]
    header = [form % arguments for form, arguments in zip(header_formats, header_arguments)]

    def row(nbytes: int, out_us: float | None, in_us: float) -> str:
        factor = 2 * (chunks - 1) / chunks
        text = "%12d %12d %8s %6s %6d " % (nbytes, nbytes // 4, "float", "sum", -1)
        if out_us is None:
            text += "%8s %7s %7s %6s " % ("N/A", "N/A", "N/A", "N/A")
        else:
            text += "%8.2f %7.2f %7.2f %6s " % (out_us, nbytes / out_us / 1e3, nbytes / out_us / 1e3 * factor, "N/A")
        return text + "%8.2f %7.2f %7.2f %6s" % (in_us, nbytes / in_us / 1e3, nbytes / in_us / 1e3 * factor, "0")

    lines = [f"# command: {constant('COMMAND')}", f"# program: {constant('PROGRAM_TEXT')}",
             f"# 4 ranks, reduction groups of n = {chunks}, type float, 20 iteration(s) after 5 warm-up run(s) (-n 20 -w 5)",
             f"# reduction groups: {constant('REDUCTION_GROUPS')}", "#", "# the program (in place)", *header]
    lines += [row(size, None, program) for size, (program, _, _) in times_us.items()]
    lines += ["# Avg bus bandwidth    : 1 ", "#", "# baseline: one ncclAllReduce over each reduction group", *header]
    lines += [row(size, out, inplace) for size, (_, inplace, out) in times_us.items()]
    lines += ["# Avg bus bandwidth    : 1 ", "# check passed"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("prefix", ["", "[default0]:", "0: "])  # as printed, through torchrun --tee, srun --label
@pytest.mark.parametrize("program, rows_per_size", [("AllReduce(InsideGroup(node))", 2),
                                                    ("ReduceScatter(InsideGroup(node)); AllGather(InsideGroup(node))", 1)])
def test_the_nccl_c_programs_table_calibrates(run_cli, tmp_path, program, rows_per_size, prefix):
    source = tmp_path / "program.c"
    code, _, stderr = run_cli(*EXPORT, "--program", program, "--format", "nccl", "-o", str(source))
    assert code == 0, stderr
    times = {2**k: (10 + 2**k / 1e4, 9 + 2**k / 1e4, 11 + 2**k / 1e4) for k in range(10, 24, 2)}
    output = tmp_path / "output.txt"
    output.write_text("".join(prefix + line + "\n" for line in c_program_output(source.read_text(), times).splitlines()))
    kind, measurements = read_measurements(str(output))
    assert kind == "exported program output" and len(measurements) == rows_per_size * len(times)
    baseline = [m for m in measurements if abs(m.time_s * 1e6 - times[m.bytes][1]) < 0.006]  # printed %.2f
    assert len(baseline) == len(times)  # in-place times of the baseline, as nccl-tests text is read
    assert {(m.span.level, m.span.size, m.backend) for m in measurements} == {("node", 2, "nccl")}
    code, stdout, stderr = run_cli("calibrate", str(output), "-o", str(tmp_path / "calibrated.toml"))
    assert code == 0 and "wrote" in stderr + stdout, stderr


def test_another_goals_baseline_in_the_c_table_is_read_as_that_goal(run_cli, tmp_path):
    """A reduce-scatter program's C table times ncclReduceScatter as its baseline: a
    ReduceScatter measurement, never an all-reduce one."""
    source = tmp_path / "program.c"
    code, _, stderr = run_cli(*EXPORT, "--program", "AllReduce(InsideGroup(node))", "--format", "nccl", "-o", str(source))
    assert code == 0, stderr
    times = {2**k: (10 + 2**k / 1e4, 9 + 2**k / 1e4, 11 + 2**k / 1e4) for k in range(10, 24, 2)}
    text = c_program_output(source.read_text(), times).replace("baseline: one ncclAllReduce", "baseline: one ncclReduceScatter")
    output = tmp_path / "output.txt"
    output.write_text(text)
    _, measurements = read_measurements(str(output))
    program = [m for m in measurements if m.collective == "AllReduce"]
    baseline = [m for m in measurements if m.collective == "ReduceScatter"]
    assert len(program) == len(baseline) == len(times) == len(measurements) // 2
    assert all(abs(m.time_s * 1e6 - times[m.bytes][0]) < 0.006 for m in program)


def test_an_older_output_and_json_are_refused_with_the_fix(run_cli, tmp_path):
    old = tmp_path / "old.txt"
    old.write_text("# 1 program(s) on 4 ranks, backend gloo, type float, 1 iteration(s)\n#\n# program 0: X\n"
                   "#       size        count     type  redop   root     time\n        1024 256 float sum -1 12.0\n")
    code, _, stderr = run_cli("calibrate", str(old))
    assert code == 2 and "export it again" in stderr and len(stderr.strip().splitlines()) == 1
    document = tmp_path / "old.json"
    document.write_text(json.dumps({"backend": "gloo", "results": [], "baselines": []}))
    code, _, stderr = run_cli("calibrate", str(document))
    assert code == 2 and "export it again" in stderr and len(stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("change", [{"baselines": 3}, {"results": True}, {"programs": [7]},
                                    {"programs": [{"text": "x", "reduction_groups": [[0]]}]},
                                    {"baselines": [{"programs": "0", "bytes": 1024, "time_us": 5.0}]},
                                    {"baselines": [{"programs": [0], "bytes": "\u0661", "time_us": 5.0}]},
                                    {"baselines": [{"programs": [0], "bytes": 1024, "time_us": "nan"}]}])
def test_a_damaged_json_is_one_error(run_cli, tmp_path, change):
    document = {"format": "synth-export-results", "command": "synth export -t emu-2x2 --axes data=4 --format torch",
                "backend": "gloo", "programs": [{"label": "", "text": "AllReduce(InsideGroup(node))",
                                                 "reduction_groups": [[0, 2], [1, 3]]}],
                "results": [], "baselines": [{"programs": [0], "bytes": 1024, "time_us": 5.0}]}
    document.update(change)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document))
    code, _, stderr = run_cli("calibrate", str(path))
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr
