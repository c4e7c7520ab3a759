"""Every example of README.md and docs/*.md, shell and Python, runs as written, and none
litters the checkout. Python blocks run as scripts (on gloo ranks under torchrun where their
`<!-- run: torchrun --nproc-per-node N -->` marker says); a block marked `<!-- not-run:
REASON -->` is listed as skipped with its reason.

Each document's examples run in document order, in a fresh copy of the repository's tracked
files (made a git repository, so `git status` there sees what they wrote), with the installed
package and this interpreter's environment first on PATH. Each must exit 0 and may leave
files only where it was told to write (`-o PATH` and the like; benchmarks may rewrite
`results/`). What is run, what is skipped and why, and what counts as litter is decided by
tests/doc_examples.py, whose docstring is the convention for whoever writes a document:

* a trailing `# on a GPU cluster` comment: a placeholder or a command for real GPUs, not run
  (`torchrun`, `srun`, `mpirun`, `./PROGRAM` and `synth bench --backend nccl` are recognised
  without it);
* a trailing `# as root` comment (and every `synth emulate` and `--emulate`): run as root
  with iproute2 only;
* a trailing `# takes minutes` comment (and `pytest`, benchmarks, `--emulate` runs): slow,
  run with `pytest -m slow`;
* a trailing `# exits N` comment: an example of an error, expected to exit with status N;
* usage synopses (`[...]`, `(a | b)`, `...`) and `pip` lines are never run.

A `synth` command shown word for word in several examples (the README's `synth plan` lines
are docs/plan.md's) runs once per test run when it writes nothing, uses no shell syntax and
names no file an earlier example of its document wrote: only its exit code is checked, and
that depends on nothing else (`Workspace._repeat_key`).

Running a document's `pytest` example inside this suite would run this module again, so the
examples run with SYNTH_DOC_EXAMPLES=1 in the environment and this module skips there.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from doc_examples import Command, Example, all_examples, block_commands, code_blocks, documents

REPOSITORY = Path(__file__).resolve().parent.parent
INNER = "SYNTH_DOC_EXAMPLES"
EXAMPLE_TIMEOUT_S = 900
SLOW_EXAMPLE_TIMEOUT_S = 7200

pytestmark = pytest.mark.skipif(os.environ.get(INNER) == "1", reason="running inside a document's pytest example")


def _git(*args: str, cwd: Path) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return result.stdout


def _is_checkout(path: Path) -> bool:
    if shutil.which("git") is None:
        return False
    result = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=path, capture_output=True, text=True)
    return result.returncode == 0 and Path(result.stdout.strip()).resolve() == path


def _status(path: Path) -> dict[str, str]:
    """`git status` as {path: two-letter code}, untracked files listed one by one."""
    output = _git("status", "--porcelain=v1", "-z", "--untracked-files=all", cwd=path)
    entries, result = output.split("\0"), {}
    index = 0
    while index < len(entries):
        entry = entries[index]
        index += 1
        if not entry:
            continue
        code, name = entry[:2], entry[3:]
        if "R" in code or "C" in code:
            index += 1  # the source of a rename
        result[name] = code
    return result


def _fingerprint(path: Path, names) -> dict[str, tuple]:
    """Size and mtime of each named file, so a file rewritten twice is still seen as rewritten."""
    result = {}
    for name in names:
        try:
            stat = (path / name).stat()
            result[name] = (stat.st_size, stat.st_mtime_ns)
        except FileNotFoundError:
            result[name] = None
    return result


def _bin_path() -> str:
    """PATH with this interpreter's scripts first, so `synth`, `python` and `pytest` are the
    installed package's."""
    scripts = str(Path(sys.executable).parent)
    return os.pathsep.join([scripts, os.environ.get("PATH", "")])


# --- what the environment offers --------------------------------------------------------------


def _root_reason() -> str:
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"needs {' and '.join(missing)} (apt-get install iproute2)"
    return ""


# A gloo rank's C++ runtime aborting (SIGABRT, a std::thread destroyed while joinable): seen
# about once per two full runs of the suite under load, on different torchrun examples, never
# in 24 runs of the example alone, loaded or not; not our code (no thread of ours in them).
GLOO_EXIT_ABORT = "terminate called without an active exception"


def _aborted_at_exit(command: Command, result: subprocess.CompletedProcess) -> bool:
    """A torchrun example that failed only because a rank aborted that way: run once more."""
    return ("torch.distributed.run" in command.shell and result.returncode != command.expected_exit
            and GLOO_EXIT_ABORT in result.stderr and "exitcode: -6" in result.stderr)


def _torchrun_reason() -> str:
    if importlib.util.find_spec("torch") is None:
        return "needs torch (pip install '.[run]')"
    return ""


def _wheel_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(f"nvidia.{name}")
    except ModuleNotFoundError:
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


_TOOLKITS: dict[Path, dict[str, str] | str] = {}


def _link(link: Path, target: Path) -> None:
    """A symlink made once: every example of a document stages into the same scratch."""
    if not link.is_symlink() and not link.exists():
        link.symlink_to(target)


def _toolkit_env(scratch: Path) -> dict[str, str] | str:
    """CUDA_HOME and NCCL_HOME for a compile example, or why there are none (staged once per
    scratch folder)."""
    if scratch not in _TOOLKITS:
        _TOOLKITS[scratch] = _stage_toolkit(scratch)
    return _TOOLKITS[scratch]


def _stage_toolkit(scratch: Path) -> dict[str, str] | str:
    """From the environment, else the CUDA toolkit beside `nvcc` and the nvidia-* wheels
    (headers and libraries, no GPU needed), staged with the unversioned library names `-l`
    looks for. A half set (torch's CUDA build brings the runtime and NCCL wheels but not the
    `crt/` headers of nvcc or `<nv/target>` of cccl that `nccl.h` includes) counts as none."""
    env = {}
    cuda = os.environ.get("CUDA_HOME")
    candidates = [Path(shutil.which("nvcc")).resolve().parent.parent] if shutil.which("nvcc") else []
    for candidate in [*candidates, Path("/usr/local/cuda")]:
        if not cuda and (candidate / "include" / "cuda_runtime.h").exists() and (candidate / "lib64").is_dir():
            cuda = str(candidate)
    if not cuda:
        runtime, nvcc, cccl = (_wheel_dir(n) for n in ("cuda_runtime", "cuda_nvcc", "cuda_cccl"))
        if runtime and (runtime / "lib").is_dir():
            staged = scratch / "cuda"
            (staged / "include").mkdir(parents=True, exist_ok=True)
            (staged / "lib64").mkdir(exist_ok=True)
            for source in (runtime, nvcc, cccl):
                for header in sorted((source / "include").glob("*")) if source else ():
                    _link(staged / "include" / header.name, header)
            for library in sorted((runtime / "lib").glob("libcudart.so*")):
                _link(staged / "lib64" / library.name, library)
                _link(staged / "lib64" / "libcudart.so", library)
            cuda = str(staged)
    nccl = os.environ.get("NCCL_HOME")
    if not nccl:
        wheel = _wheel_dir("nccl")
        if wheel and (wheel / "include" / "nccl.h").exists():
            staged = scratch / "nccl"
            (staged / "lib").mkdir(parents=True, exist_ok=True)
            _link(staged / "include", wheel / "include")
            for library in sorted((wheel / "lib").glob("libnccl.so*")):
                _link(staged / "lib" / library.name, library)
                _link(staged / "lib" / "libnccl.so", library)
            nccl = str(staged)
    complete = cuda and all((Path(cuda) / "include" / header).exists()
                            for header in ("cuda_runtime.h", "crt/host_defines.h", "nv/target"))
    if not complete or not nccl:
        return ("needs the CUDA and NCCL headers and libraries: set CUDA_HOME and NCCL_HOME, or "
                "pip install nvidia-nccl-cu12 nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12 nvidia-cuda-cccl-cu12")
    env["CUDA_HOME"], env["NCCL_HOME"] = cuda, nccl
    return env


def skip_reason(command: Command, scratch: Path) -> str:
    """Why this environment cannot run the command ('' when it can)."""
    if command.not_run_reason:
        return command.not_run_reason
    if command.needs_root and _root_reason():
        return _root_reason()
    if command.needs_torchrun and _torchrun_reason():
        return _torchrun_reason()
    if command.needs_toolkit and isinstance(_toolkit_env(scratch), str):
        return _toolkit_env(scratch)
    return ""


# --- one document's workspace -------------------------------------------------------------------


@dataclass
class Outcome:
    failures: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    ran: int = 0


class Workspace:
    """A fresh copy of the repository for one document's examples, run in document order."""

    def __init__(self, root: Path, ledger: Path | None = None):
        self.root = root / "repository"
        self.scratch = root / "scratch"
        self.scratch.mkdir(parents=True)
        self.ran: set[int] = set()
        self.ledger = ledger  # this run's record of commands that passed (see `_repeat_key`)
        for name in _git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=REPOSITORY).split("\0"):
            source = REPOSITORY / name
            if name and source.is_file():
                target = self.root / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
        _git("init", "-q", cwd=self.root)
        _git("add", "-A", cwd=self.root)
        _git("-c", "user.name=docs", "-c", "user.email=docs@localhost", "commit", "-q", "--no-verify", "-m", "snapshot",
             cwd=self.root)

    def _fingerprint(self, status: dict[str, str]) -> dict[str, tuple]:
        """Every tracked and untracked file's size and mtime: a committed file rewritten with
        the same bytes leaves `git status` clean but was still written."""
        names = set(_git("ls-files", "-z", cwd=self.root).split("\0")) - {""}
        return _fingerprint(self.root, names | set(status))

    def environment(self, command: Command) -> dict[str, str]:
        env = dict(os.environ, PATH=_bin_path(), **{INNER: "1"})
        env.pop("PYTHONPATH", None)
        if command.needs_toolkit:
            env.update(_toolkit_env(self.scratch))
        return env

    def run(self, example: Example, slow: bool) -> Outcome:
        """Run the example's commands in order; stop at the first failure. Every file it
        adds, changes or removes that it was not told to write is a failure too."""
        outcome = Outcome()
        before = _status(self.root)
        before_files = self._fingerprint(before)
        checkout_before = _status(REPOSITORY) if _is_checkout(REPOSITORY) else None
        allowed: list[str] = []
        brought_up: list[Command] = []
        try:
            skipped_install = ""
            for command in self._commands(example):
                reason = example.not_run_reason or skip_reason(command, self.scratch) or skipped_install
                if reason.startswith("installs packages"):
                    # What follows an install uses what it installs (the nvidia-* wheels, ...).
                    skipped_install = f"follows an install not run here (line {command.line})"
                if reason:
                    outcome.skipped.append(f"line {command.line}: {reason}: {command.text}")
                    continue
                allowed += [os.path.normpath(path) for path in command.outputs()]
                if command.is_benchmark:
                    allowed.append("results")
                key = self._repeat_key(command)
                if key and (self.ledger / key).exists():
                    outcome.ran += 1  # passed, as written, in another example of this run
                    continue
                if not self._run_command(command, slow, outcome):
                    break
                if key:
                    (self.ledger / key).write_text(f"{example.id} line {command.line}\n", encoding="utf-8")
                if command.is_synth and command.synth_subcommand() == "emulate" and "up" in command.program_words[:4]:
                    brought_up.append(command)
        finally:
            self._bring_down(brought_up)
        self.ran.add(example.index)
        after = _status(self.root)
        changed = set(after) ^ set(before)
        changed |= {name for name in set(after) & set(before) if after[name] != before[name]}
        changed |= {name for name, mark in self._fingerprint(before).items() if mark != before_files[name]}
        litter = sorted(name for name in changed if not _under_any(name, allowed))
        if litter:
            outcome.failures.append(f"left files it was not told to write: {', '.join(litter)} "
                                    f"(generated output must go where the user says, and by default not into the checkout)")
        if checkout_before is not None:
            touched = sorted(set(_status(REPOSITORY).items()) - set(checkout_before.items()))
            if touched:
                outcome.failures.append(f"changed the real checkout {REPOSITORY}: {', '.join(name for name, _ in touched)}")
        return outcome

    def _commands(self, example: Example) -> tuple[Command, ...]:
        """The block's commands; a Python block written to a file outside the copy, run as its
        marker says (`python FILE`, or under torchrun on gloo ranks)."""
        if not example.is_python:
            return example.commands
        script = self.scratch / f"{re.sub(r'[^A-Za-z0-9]+', '-', example.document)}-{example.line}.py"
        script.write_text(example.source, encoding="utf-8")
        return (example.python_command(str(script)),)

    def _run_command(self, command: Command, slow: bool, outcome: Outcome) -> bool:
        timeout = SLOW_EXAMPLE_TIMEOUT_S if slow else EXAMPLE_TIMEOUT_S
        try:
            result = self._launch(command, timeout)
            if _aborted_at_exit(command, result):
                warnings.warn(f"line {command.line}: a rank aborted in torch's C++ runtime ('{GLOO_EXIT_ABORT}'); "
                              f"run again once")
                result = self._launch(command, timeout)
        except subprocess.TimeoutExpired:
            outcome.failures.append(f"line {command.line}: did not finish in {timeout} s: {command.text}")
            return False
        outcome.ran += 1
        if result.returncode != command.expected_exit:
            tail = (result.stdout[-1500:] + "\n" + _ends(result.stderr)).strip()
            outcome.failures.append(f"line {command.line}: exit code {result.returncode} (expected "
                                    f"{command.expected_exit}): {command.text}\n{tail}")
            return False
        return True

    def _launch(self, command: Command, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", command.shell], cwd=self.root, env=self.environment(command),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)

    def _repeat_key(self, command: Command) -> str:
        """Several documents show the same command (the README's `synth plan` lines are
        docs/plan.md's): run once per test run, since its exit code is all that is checked and
        it depends only on its words and the copy's files. Only a `synth` command that writes
        nothing, uses no shell syntax, needs nothing of the environment and names no file an
        earlier example wrote or changed here; '' for any other."""
        if self.ledger is None or not command.is_synth or command.outputs() or command.needs_root \
                or command.needs_torchrun or command.needs_toolkit or command.uses_shell:
            return ""
        changed = [os.path.normpath(name) for name in _status(self.root)]
        for word in command.words:
            for part in {word, word.partition("=")[2]} - {""}:
                part = os.path.normpath(part)
                if any(name == part or name.startswith(part + "/") for name in changed):
                    return ""
        text = f"{command.code}\0{command.expected_exit}"
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def _bring_down(self, brought_up: list[Command]) -> None:
        """An example that brought a cluster up and failed before its `down` still removes it."""
        for command in brought_up:
            words = command.program_words
            name = next((words[i + 1] for i, w in enumerate(words[:-1]) if w == "--name"), None)
            down = ["synth", "emulate", "down"] + (["--name", name] if name else [])
            subprocess.run(down, cwd=self.root, env=dict(os.environ, PATH=_bin_path()), capture_output=True, timeout=300)


def _under_any(name: str, prefixes: list[str]) -> bool:
    name = os.path.normpath(name)
    return any(name == prefix or name.startswith(prefix.rstrip("/") + "/") for prefix in prefixes)


EXAMPLES = all_examples(REPOSITORY)
_WORKSPACES: dict[tuple[str, bool], Workspace] = {}


def _workspace(example: Example, slow: bool, factory) -> Workspace:
    key = (example.document, slow)
    if key not in _WORKSPACES:
        if not _is_checkout(REPOSITORY):
            pytest.skip("needs git and a git checkout of the repository (the examples run in a copy of its tracked files)")
        _WORKSPACES[key] = Workspace(factory.mktemp(re.sub(r"\W", "-", example.document)), _ledger(factory))
    return _WORKSPACES[key]


def _ledger(factory) -> Path:
    """This run's record of the commands that passed, shared by its workers (the folder above
    each worker's under `pytest -n`), never by two runs."""
    base = factory.getbasetemp()
    ledger = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "doc-commands-passed"
    ledger.mkdir(exist_ok=True)
    return ledger


def _params():
    for example in EXAMPLES:
        marks = []
        if example.is_slow:
            marks.append(pytest.mark.slow)
        if example.needs_root:
            marks.append(pytest.mark.emulate)
        if example.needs_torchrun or example.needs_ranks:
            marks.append(pytest.mark.torchrun)
        yield pytest.param(example, id=example.id, marks=marks)


def _ends(text: str, keep: int = 2500) -> str:
    """The start and the end of a long output: a launcher (torchrun) prints the failing rank's own
    message first and its summary last."""
    return text if len(text) <= 2 * keep else f"{text[:keep]}\n[...]\n{text[-keep:]}"


@pytest.mark.parametrize("example", list(_params()))
def test_example_runs_as_written(example: Example, tmp_path_factory):
    if not example.runnable:
        reasons = sorted({example.not_run_reason} if example.not_run_reason
                         else {command.not_run_reason for command in example.commands})
        pytest.skip(f"not run here: {'; '.join(reasons)}")
    if example.needs_ranks and _torchrun_reason():
        pytest.skip(_torchrun_reason())
    slow = example.is_slow
    workspace = _workspace(example, slow, tmp_path_factory)
    # Earlier examples of the document first (files they write may be used here); a fast
    # example does not wait for slow ones.
    for earlier in EXAMPLES:
        if earlier.document == example.document and earlier.index < example.index and earlier.index not in workspace.ran \
                and earlier.runnable and (slow or not earlier.is_slow):
            workspace.run(earlier, slow)
    outcome = workspace.run(example, slow)
    assert not outcome.failures, f"{example.id}:\n" + "\n".join(outcome.failures)
    if not outcome.ran:
        pytest.skip("; ".join(outcome.skipped))


# --- the extraction itself ----------------------------------------------------------------------


def test_every_document_has_its_examples_found():
    """The extraction sees the commands a reader sees: the README's and every document's."""
    found = {example.document for example in EXAMPLES}
    assert "README.md" in found
    readme_commands = [c for e in EXAMPLES if e.document == "README.md" for c in e.commands]
    subcommands = {c.synth_subcommand() for c in readme_commands if c.is_synth}
    assert {"placements", "check", "programs", "rank", "explore", "export"} <= subcommands
    for document in documents(REPOSITORY):
        text = (REPOSITORY / document).read_text(encoding="utf-8")
        written = len(re.findall(r"^\s*(?:\$ )?synth [a-z]+ ", text, flags=re.MULTILINE))
        if written:
            assert document in found, f"{document} writes synth commands but none was extracted"


SAMPLE = """\
Intro text with `synth inline --not-a-block`.

    synth placements --levels 2,2 --axes 4 \\
        --json
    output line that is not a command

```
$ synth sweep -o out --topology t
189 configurations
synth: this output line is not run
```

```python
synth = 1
```

- a list item

      synth rank --topology t  # indented list code is still code

```sh
torchrun --nproc-per-node 8 x.py   # on a GPU cluster
synth export (--topology T | --levels L) [--json]
pip install . && synth topologies
synth emulate up emu-2x4
synth bench --topology t --backend nccl
python -m benchmarks.sweep
gcc x.c -o x
synth bench --topology t > log.txt  # as root
synth check --levels 2 --axes 2 --reduce a0 'Broadcast(InsideGroup(l0))'  # exits 1: no sum
```
"""


def test_extraction_follows_the_documented_conventions(tmp_path):
    (tmp_path / "README.md").write_text(SAMPLE)
    blocks = list(code_blocks(SAMPLE))
    commands = [command for start, _, lines in blocks for command in block_commands(start, lines)]
    texts = [command.text for command in commands]
    assert texts[0] == "synth placements --levels 2,2 --axes 4 --json"
    assert texts[1] == "synth sweep -o out --topology t"
    assert not any("output line" in text or text.startswith("synth =") for text in texts)
    assert "synth rank --topology t  # indented list code is still code" in texts
    by_text = {command.code: command for command in commands}
    assert by_text["synth sweep -o out --topology t"].outputs() == ["out"]
    assert by_text["torchrun --nproc-per-node 8 x.py"].not_run_reason == "marked to run on a GPU cluster"
    assert by_text["synth export (--topology T | --levels L) [--json]"].not_run_reason == "a usage synopsis"
    assert by_text["synth topologies"].text == "pip install . && synth topologies"
    assert not by_text["synth topologies"].not_run_reason
    assert Command("pip install '.[test]'", 1).not_run_reason.startswith("installs")
    assert by_text["synth emulate up emu-2x4"].needs_root
    assert "nccl" in by_text["synth bench --topology t --backend nccl"].not_run_reason
    assert by_text["python -m benchmarks.sweep"].is_benchmark and by_text["python -m benchmarks.sweep"].is_slow
    assert by_text["gcc x.c -o x"].needs_toolkit and by_text["gcc x.c -o x"].outputs() == ["x"]
    last = by_text["synth bench --topology t > log.txt"]
    assert last.needs_root and last.needs_torchrun is False and last.outputs() == ["log.txt"]
    assert by_text["synth check --levels 2 --axes 2 --reduce a0 'Broadcast(InsideGroup(l0))'"].expected_exit == 1
    assert last.expected_exit == 0
    assert not Command("synth placements --placement '[[1,2],[2,1]]' --json", 1).is_synopsis
    assert [e.id for e in all_examples(tmp_path)] == ["README.md:3", "README.md:8", "README.md:14", "README.md:19",
                                                      "README.md:22"]  # README.md:14: the ```python block


def test_a_command_two_documents_show_runs_once_per_run(tmp_path):
    """Identical `synth` commands that write nothing run once per run: the second workspace
    counts the first's pass. One that writes, uses the shell, or names a file an example wrote
    in its copy runs every time."""
    if not _is_checkout(REPOSITORY):
        pytest.skip("needs git and a git checkout of the repository")
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    first, second = Workspace(tmp_path / "a", ledger), Workspace(tmp_path / "b", ledger)
    shown = Command("synth topologies dgx-a100-x4 --json", 1)
    key = first._repeat_key(shown)
    assert key and first.run(Example("README.md", 1, 0, (shown,)), slow=False).ran == 1
    assert (ledger / key).read_text().startswith("README.md:1")
    (ledger / key).write_text("a pass recorded by hand: the second workspace must not run it\n")
    outcome = second.run(Example("docs/x.md", 1, 0, (shown,)), slow=False)
    assert outcome.ran == 1 and outcome.failures == []
    assert "by hand" in (ledger / key).read_text()  # a run would have recorded docs/x.md:1
    assert not first._repeat_key(Command("synth topologies --json > t.json", 1))
    assert not first._repeat_key(Command("synth topologies --json | head", 1))
    assert not first._repeat_key(Command("synth plan --topology selene --model gpt3-2.7b --plot plan.png", 1))
    (first.root / "mine.toml").write_text("written by an earlier example\n")
    assert not first._repeat_key(Command("synth rank --topology mine.toml --axes data=8 --reduce data", 1))
    assert first._repeat_key(Command("synth rank --topology dgx-a100-x4 --axes data=8 --reduce data", 1))
    assert not Workspace(tmp_path / "c")._repeat_key(shown)  # no ledger: every command runs


def test_the_runner_skips_installs_allows_named_outputs_and_catches_litter(tmp_path):
    """On a real copy: the install step before `&&` is not run, a file the command was told to
    write is fine, and a file it was not told to write fails the example."""
    if not _is_checkout(REPOSITORY):
        pytest.skip("needs git and a git checkout of the repository")
    workspace = Workspace(tmp_path)
    told = Example("README.md", 1, 0, (Command("pip install ./no-such-directory && synth topologies --json > topologies.json", 1),))
    outcome = workspace.run(told, slow=False)
    assert outcome.failures == [] and outcome.ran == 1
    assert (workspace.root / "topologies.json").read_text().startswith("[")
    stray = Example("README.md", 2, 1, (Command("python -c \"open('results/stray.csv', 'w').write('x')\"", 2),))
    outcome = workspace.run(stray, slow=False)
    assert len(outcome.failures) == 1 and "results/stray.csv" in outcome.failures[0]
    failing = Example("README.md", 3, 2, (Command("synth placements --levels 2 --axes 3", 3),
                                            Command("synth topologies", 4)))
    outcome = workspace.run(failing, slow=False)
    assert outcome.ran == 1 and "exit code 2 (expected 0)" in outcome.failures[0]


PYTHON_SAMPLE = """\
Text.

<!-- run: torchrun --nproc-per-node 4 -->

    # train.py
    import torch.distributed as dist
    dist.init_process_group("gloo")

```python
print("fenced")
```

<!-- not-run: a fragment of the cluster's job -->

```python
reducer.attach(model)
```

    rank = ((c_0 * n_1 + c_1) * n_2 + c_2)

```toml
name = "x"
```
"""


def test_python_blocks_and_their_markers_are_extracted(tmp_path):
    """Python blocks (fenced, or unfenced starting with an import) become examples with the
    marker before them; formulas and TOML are not code to run."""
    (tmp_path / "README.md").write_text(PYTHON_SAMPLE)
    examples = all_examples(tmp_path)
    assert [(e.id, e.is_python) for e in examples] == [("README.md:5", True), ("README.md:10", True),
                                                      ("README.md:16", True)]
    ranked, plain, marked = examples
    assert ranked.ranks == 4 and ranked.needs_ranks and ranked.source.startswith("# train.py\nimport torch")
    assert ranked.python_command("x.py").code == "python -m torch.distributed.run --standalone --nproc-per-node 4 x.py"
    assert plain.ranks == 0 and plain.python_command("x.py").code == "python x.py" and plain.runnable
    assert marked.not_run_reason == "a fragment of the cluster's job" and not marked.runnable


def test_every_python_block_of_the_documents_runs_or_says_why():
    """No Python block is left out silently: each runs, or its marker gives the reason."""
    blocks = [example for example in EXAMPLES if example.is_python]
    assert {"README.md", "docs/training.md"} <= {example.document for example in blocks}
    for example in blocks:
        assert example.runnable or example.not_run_reason, example.id
    not_run = {example.id: example.not_run_reason for example in EXAMPLES if example.not_run_reason}
    print("not run:", not_run)
    assert all(reason.strip() for reason in not_run.values())


def test_only_a_torchrun_rank_aborted_in_the_runtime_is_run_again(tmp_path):
    """The one retry: a torchrun example whose rank died of the C++ runtime's abort, nothing else."""
    (tmp_path / "README.md").write_text(PYTHON_SAMPLE)
    ranked, plain, _ = all_examples(tmp_path)
    aborted = subprocess.CompletedProcess([], 1, "", f"{GLOO_EXIT_ABORT}\nfailed (exitcode: -6) local_rank: 2")
    failed = subprocess.CompletedProcess([], 1, "", "AssertionError\nfailed (exitcode: 1) local_rank: 0")
    assert _aborted_at_exit(ranked.python_command("x.py"), aborted)
    assert not _aborted_at_exit(ranked.python_command("x.py"), failed)
    assert not _aborted_at_exit(plain.python_command("x.py"), aborted)
