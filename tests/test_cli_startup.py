"""What each command loads before it does anything, and that the main job runs without torch.

Start-up time itself is measured by benchmarks/startup.py (results/startup/README.md); these tests
check its cause, which does not depend on the machine's load: the modules a command imports.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from synth.cli import COMMANDS, main

HEAVY = ("numpy", "z3", "networkx", "lark", "torch", "matplotlib", "scipy")
CHECK = ["check", "--levels", "server=2,cpu=2,gpu=4", "--axes", "4,4", "--placement", "[[1,2,2],[2,1,2]]",
         "--reduce", "a0", "Reduce(InsideGroup(gpu)); AllReduce(Master(cpu)); Broadcast(InsideGroup(gpu))"]

PROBE = """
import json, sys
{prelude}
from synth.cli import main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as exit:
    code = exit.code
sys.stdout.flush()
print("\\n@@" + json.dumps({{"code": code, "modules": sorted(sys.modules)}}))
"""


def loaded(argv: list[str], prelude: str = "", cwd=None) -> tuple[int, set[str]]:
    """Run `synth ARGV` in a fresh interpreter; its exit code and every module it imported."""
    done = subprocess.run([sys.executable, "-c", PROBE.format(prelude=prelude), json.dumps(argv)], capture_output=True,
                          text=True, cwd=cwd, timeout=300)
    assert "@@" in done.stdout, done.stderr
    result = json.loads(done.stdout.rsplit("@@", 1)[1])
    return result["code"], set(result["modules"])


def heavy(modules: set[str]) -> list[str]:
    return sorted(name for name in HEAVY if name in modules)


def test_help_and_topologies_load_nothing_heavy():
    for argv in (["--help"], ["topologies"], ["topologies", "--json"], []):
        code, modules = loaded(argv)
        # Topology files with per-collective figures check the names against the grammar (lark),
        # until the collectives have a table of their own (issue 8).
        allowed = {"lark"} if argv and argv[0] == "topologies" else set()
        assert code in (0, 2) and set(heavy(modules)) <= allowed, (argv, heavy(modules))
        assert not any(name.startswith("synth.commands.") and name not in (
            "synth.commands.synthesis", "synth.commands.common", "synth.commands.examples",
            "synth.commands.terminal") for name in modules)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_commands_help_loads_nothing_heavy(command):
    code, modules = loaded([command, "--help"])
    assert code == 0 and heavy(modules) == [] and "rich" not in modules


def test_a_command_loads_its_own_module_only():
    code, modules = loaded(CHECK)
    assert code == 0
    assert {"synth.commands.synthesis", "numpy", "lark"} <= modules
    assert not {"z3", "networkx", "torch", "synth.commands.export", "synth.commands.simulation", "synth.model.network"} & modules


TORCH_BLOCKED = "sys.modules['torch'] = None  # as on a machine without torch: `import torch` fails"


@pytest.mark.parametrize("argv", [
    CHECK,
    ["rank", "--topology", "dgx-a100-x4", "--axes", "data=8,model=4", "--reduce", "data", "--placement", "[[4,2],[1,4]]",
     "--bytes", "64MiB", "--top", "2", "--max-len", "3"],
    ["explore", "--topology", "emu-2x4", "--axes", "data=4,model=2", "--reduce", "data", "--bytes", "1MiB", "-L", "3"],
    ["export", "--topology", "dgx-a100-x4", "--axes", "data=8,model=4", "--reduce", "data", "--placement", "[[4,2],[1,4]]",
     "--top", "1", "--max-len", "3", "--format", "torch", "-o", "p.py"],
    ["export", "--topology", "dgx-a100-x4", "--axes", "data=8,model=4", "--inside", "model=node", "--format", "mesh",
     "-o", "m.json"],
    ["export", "--levels", "node=2,gpu=4", "--axes", "data=8", "--reduce", "data", "--placement", "[[2,4]]",
     "--program", "AllReduce(InsideGroup(gpu)); AllReduce(Parallel(node))", "--format", "nccl", "-o", "p.c"],
])
def test_the_main_job_runs_without_torch(argv, tmp_path):
    code, modules = loaded(argv, TORCH_BLOCKED, cwd=tmp_path)
    assert code == 0
    assert "matplotlib" not in modules and "scipy" not in modules


def test_bench_without_torch_says_how_to_install_it(tmp_path):
    code, _ = loaded(["bench", "--levels", "node=2,gpu=2", "--axes", "data=4", "--reduce", "data", "--backend", "nccl",
                      "--program", "AllReduce(InsideGroup(node))", "-o", str(tmp_path)], TORCH_BLOCKED, cwd=tmp_path)
    assert code == 2


def test_ctrl_c_while_modules_import_is_an_interrupt_not_a_traceback(monkeypatch, capsys):
    import importlib

    real = importlib.import_module

    def interrupted(name, *args):
        if name.startswith("synth.commands."):
            raise KeyboardInterrupt
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", interrupted)
    code = main(["rank", "--help"])
    captured = capsys.readouterr()
    assert code == 130 and captured.err == "synth rank: interrupted\n"


def test_the_console_script_starts_without_importing_every_command():
    """`synth` (the installed entry point) goes through synth.cli.main like `python -m synth`."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "synth", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "synth.commands.export" not in done.stderr and "numpy" not in done.stderr
