"""The synthesis commands end to end, and every kind of bad input: one line, the right exit code."""

import json
import subprocess
import sys

import pytest

PAPER = ["--levels", "server=2,cpu=2,gpu=4", "--axes", "4,4", "--placement", "[[1,2,2],[2,1,2]]", "--reduce", "a0"]


def test_placements_json(run_cli):
    code, out, _ = run_cli("placements", "--levels", "2,2,4", "--axes", "4,4", "--json")
    assert code == 0
    rows = json.loads(out)
    assert len(rows) == 4
    assert rows[1]["matrix"] == [[1, 2, 2], [2, 1, 2]]
    assert rows[1]["groups"]["a0"][0] == [0, 2, 4, 6]
    assert sorted(r for g in rows[1]["groups"]["a1"] for r in g) == list(range(16))


def test_placements_on_a_builtin_topology_with_a_constraint(run_cli):
    code, out, _ = run_cli("placements", "--topology", "dgx-a100-x4", "--axes", "data=8,model=4",
                           "--inside", "model=node", "--json")
    assert code == 0 and [row["matrix"] for row in json.loads(out)] == [[[4, 2], [1, 4]]]


def test_placements_table(run_cli):
    code, out, _ = run_cli("placements", "--levels", "2,2,4", "--axes", "4,4")
    assert code == 0 and "4 placement(s)" in out and "[[1,2,2],[2,1,2]]" in out


def test_check_valid_program(run_cli):
    code, out, _ = run_cli("check", *PAPER, "Reduce(InsideGroup(gpu)); AllReduce(Master(cpu)); Broadcast(InsideGroup(gpu))")
    assert code == 0 and out.startswith("valid:")


@pytest.mark.parametrize("program, fragment", [
    ("AllReduce(Parallel(cpu))", "ends before the goal"),
    ("Reduce(InsideGroup(gpu)); AllReduce(Parallel(cpu))", "step 2"),
    ("AllReduce(InsideGroup(cpu)); AllReduce(InsideGroup(cpu))", "already reached"),
    ("AllGather(InsideGroup(cpu))", "step 1"),
])
def test_check_invalid_program_exits_1_and_names_the_step(run_cli, program, fragment):
    code, _, err = run_cli("check", *PAPER, program)
    assert code == 1 and fragment in err and err.count("\n") == 1


def test_check_syntax_error_exits_2_with_a_caret(run_cli):
    code, _, err = run_cli("check", *PAPER, "AllReduce(Parallel(cpu)")
    assert code == 2 and "line 1, column 24" in err and "^" in err


def test_check_unknown_level_exits_2(run_cli):
    code, _, err = run_cli("check", *PAPER, "AllReduce(InsideGroup(node))")
    assert code == 2 and "'node'" in err and "cpu, gpu" in err


def test_check_program_from_a_file(run_cli, tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("# hierarchical\nReduceScatter(InsideGroup(gpu))\nAllReduce(Parallel(cpu))\nAllGather(InsideGroup(gpu))\n")
    code, out, _ = run_cli("check", *PAPER, f"@{path}")
    assert code == 0


def test_programs_json_covers_every_placement(run_cli):
    code, out, _ = run_cli("programs", "--levels", "server=2,cpu=2,gpu=4", "--axes", "4,4", "--reduce", "a0",
                           "--max-len", "3", "--json")
    assert code == 0
    rows = json.loads(out)
    assert {tuple(map(tuple, row["matrix"])) for row in rows} == {
        ((1, 1, 4), (2, 2, 1)), ((1, 2, 2), (2, 1, 2)), ((2, 1, 2), (1, 2, 2)), ((2, 2, 1), (1, 1, 4))}
    assert {"program", "matrix"} <= set(rows[0])


def test_programs_reduce_two_axes(run_cli):
    code, out, _ = run_cli("programs", "--levels", "node=2,gpu=4", "--axes", "data=4,model=2", "--placement",
                           "[[2,2],[1,2]]", "--reduce", "data,model", "--max-len", "2", "--json")
    assert code == 0 and json.loads(out)[0]["program"] == "AllReduce(InsideGroup(node))"


def test_programs_count(run_cli):
    code, out, _ = run_cli("programs", *PAPER, "--count")
    assert code == 0 and "125 program(s)" in out


def test_length_one_is_the_single_all_reduce(run_cli):
    code, out, _ = run_cli("programs", "--levels", "2,2,2,2,2,2", "--axes", "64", "--reduce", "a0",
                           "--max-len", "1", "--hierarchy", "split", "--json")
    assert code == 0 and [row["program"] for row in json.loads(out)] == ["AllReduce(InsideGroup(l0.a0))"]


def test_nothing_to_reduce_exits_1(run_cli):
    code, _, err = run_cli("programs", "--levels", "2,2", "--axes", "a=1,b=4", "--reduce", "a")
    assert code == 1 and "nothing to reduce" in err


@pytest.mark.parametrize("args", [
    ["placements", "--levels", "2,2,4", "--axes", "4,5"],
    ["placements", "--levels", "2,x", "--axes", "4"],
    ["placements", "--levels", "a=2,a=2", "--axes", "4"],
    ["placements", "--levels", "1gpu=2", "--axes", "2"],
    ["placements", "--topology", "no-such-system", "--axes", "8"],
    ["placements", "--topology", "/nonexistent/file.toml", "--axes", "8"],
    ["placements", "--levels", "2,2", "--axes", "4", "--inside", "a0=nolevel"],
    ["placements", "--levels", "2,2", "--axes", "4", "--factor", "bad"],
    ["placements", "--levels", "2,2", "--topology", "dgx-a100", "--axes", "4"],
    ["placements", "--axes", "4"],
    ["placements", "--levels", "1048576,2", "--axes", "2097152"],
    ["programs", *PAPER[:-2], "--reduce", "pipe"],
    ["programs", "--levels", "2,2,4", "--axes", "4,4", "--placement", "[[1,2,2]]", "--reduce", "a0"],
    ["programs", "--levels", "2,2,4", "--axes", "4,4", "--placement", "not json", "--reduce", "a0"],
    ["programs", *PAPER, "--max-len", "100"],
    ["programs", *PAPER, "--max-len", "zero"],
    ["programs", *PAPER, "--hierarchy", "flat"],
    ["check", *PAPER, "AllReduce(Bogus(cpu))"],
    ["check", *PAPER, "@/nonexistent/program"],
    ["nosuchcommand"],
])
def test_bad_input_is_one_line_with_exit_2(run_cli, args):
    code, _, err = run_cli(*args)
    assert code == 2, err
    assert "Traceback" not in err
    if "syntax error" not in err:
        assert err.count("\n") == 1, err


def test_python_dash_m_and_the_console_script_agree():
    result = subprocess.run([sys.executable, "-m", "synth", "placements", "--levels", "2,2,4", "--axes", "4,4", "--json"],
                            capture_output=True, text=True, check=True)
    assert len(json.loads(result.stdout)) == 4
    bad = subprocess.run([sys.executable, "-m", "synth", "placements", "--levels", "2,2,4", "--axes", "4,5"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_hierarchies_too_deep_to_search_are_refused(run_cli):
    code, _, err = run_cli("programs", "--levels", "2,2,2,2,2,2,2,2,2", "--axes", "512", "--reduce", "a0")
    assert code == 2 and "9 levels" in err and "--hierarchy merged" in err


def test_ctrl_c_stops_a_long_search_without_a_traceback():
    import signal
    import time

    process = subprocess.Popen([sys.executable, "-m", "synth", "programs", "--levels", "2,2,2,2,2", "--axes", "32",
                                "--reduce", "a0", "--max-len", "6"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # even in a background run
    first = process.stdout.readline()
    process.stdout.readline()  # the listing has begun (a loaded machine takes seconds to get there)
    time.sleep(1)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130
    assert "interrupted after" in err and "Traceback" not in err
    assert first.startswith("# placement")


def test_ctrl_c_inside_a_native_call_still_reports_the_count(monkeypatch, capsys):
    """ctypes turns a Ctrl-C during a native (Z3) call into an ArgumentError naming it: the
    listing still says how many programs it had found (a loaded machine hit this path)."""
    import ctypes

    from synth.cli import main
    from synth.search import enumerator as enumeration

    def interrupted(self):
        yield from ()
        raise ctypes.ArgumentError("argument 1: KeyboardInterrupt: ")

    monkeypatch.setattr(enumeration.Enumerator, "programs", interrupted)
    assert main(["programs", "--levels", "2,2", "--axes", "4", "--reduce", "a0", "--max-len", "3"]) == 130
    assert "interrupted after 0 program(s)" in capsys.readouterr().err
