"""Examples of the project's Markdown documents, shell and Python, as a reader would copy them.

The extraction and the conventions live here; tests/test_docs_examples.py runs them. Every
code block is one of: a Python block (fenced ```python, or unfenced with an import as its
first statement), run as a script; shell commands (fenced with no language or a shell one, or
indented by four spaces; rules below); or text that is not code (output, formulas, file
formats: fenced ```text or ```toml, or an unfenced block with no command in it).

A comment on the last non-blank line before a block (a blank line between them) says how it runs:

* `<!-- not-run: REASON -->`: never run (a block that genuinely cannot run here, such as a
  fragment of a GPU cluster's job); the tests list it, skipped, with the reason;
* `<!-- run: torchrun --nproc-per-node N -->`: a Python block run on N torch.distributed ranks
  (`python -m torch.distributed.run --standalone`; the block picks gloo on CPUs);
* `<!-- run: as root -->`, `<!-- run: takes minutes -->`: as the trailing comments below.

A Python block without a marker runs as `python FILE`, FILE outside the checkout, in the
document's working directory. A shell example is a command in its block:

* In a block with `$ ` prompts, only the prompted lines are commands (the rest is output);
  otherwise every line whose first word is a command (below) is one. A line ending in `\\`
  continues on the next. Lines starting with `#` are comments.
* Command words: `synth`, `python`/`python3` (`-m` modules), `pytest`; also recognised so
  they can be classified: `pip`, `torchrun`, `srun`, `mpirun`, `gcc`/`g++`/`nvcc`, `./PROGRAM`,
  and any of them after `VAR=value` assignments.
* One code block is one example: its commands run in order, in one working directory shared
  by every example of the same document (an example may use a file an earlier one wrote).

What is not run, and why (each a `Command.reason`):

* a usage synopsis: optional parts in `[...]`, alternatives `(a | b)`, `...` outside quotes;
* `pip ...`: installing; the tests run against the installed package (in
  `pip install . && synth ...` the part after the install runs);
* a trailing `# on a GPU cluster` (or `# on the cluster`) comment marks a placeholder or a
  command for real GPUs; so do `torchrun`, `srun`, `mpirun`, `./PROGRAM` and
  `synth bench --backend nccl`: they run only on a GPU cluster;
* root: `synth emulate ...`, `--emulate`, or a trailing `# as root` comment: run only as
  root with `ip` and `tc` (iproute2), else skipped saying so;
* a compile line (`gcc`, `g++`, `nvcc`) runs when the CUDA and NCCL headers and libraries
  can be found (`$CUDA_HOME`, `$NCCL_HOME`, or the nvidia-* wheels), else it is skipped;
* `synth bench` without `--emulate` needs torch (the `run` extra) and torchrun.

A trailing `# exits N` comment says the command is expected to exit with status N (an
example of an error); every other command must exit 0.

Slow (`@pytest.mark.slow`, excluded by default): `pytest` itself, benchmarks
(`python -m benchmarks.NAME`), `--emulate` runs, and a trailing `# takes minutes` comment.

Outputs: a command may write where it is told (`-o PATH`, `--output`, `--out`,
`--results`, `--json-out`, `--export`, `--plot`, `> PATH`, or a trailing `# writes PATH` comment for
a command that names its output otherwise, e.g. `python -c "...save('plan.json')"`); a benchmark (`python -m benchmarks.NAME`) may also
rewrite `results/`, which is its purpose. Any other file it adds, changes or removes in the
checkout is litter, and the test fails naming it.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

COMMAND_WORDS = ("synth", "python", "python3", "pytest", "pip", "pip3", "torchrun", "srun", "mpirun", "gcc", "g++",
                 "nvcc", "sudo")
SHELL_LANGUAGES = ("", "sh", "bash", "shell", "console", "shell-session")
PYTHON_LANGUAGES = ("python", "py", "python3")
MARKER = re.compile(r"<!--\s*(not-run|run)\s*:\s*(.*?)\s*-->")
OUTPUT_OPTIONS = ("-o", "--output", "--out", "--output-dir", "--results", "--json-out", "--export", "--plot")
WRITES_MARKER = "# writes "

GPU_MARKERS = ("# on a gpu cluster", "# on the cluster", "# on a cluster", "# on gpus", "# on a gpu")
ROOT_MARKER = "# as root"
SLOW_MARKER = "# takes minutes"

_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=\S*\Z")
_QUOTED = re.compile(r"'[^']*'|\"(?:[^\"\\]|\\.)*\"")


@dataclass(frozen=True)
class Command:
    """One shell command of a document, as written (continuations joined)."""

    text: str  # as written, continuations joined, trailing comment included
    line: int  # 1-based line of the document where it starts

    @property
    def shell(self) -> str:
        """What the tests run: the text without leading `pip install ... &&` steps (the tests
        run against the installed package)."""
        segments = split_and(self.text)
        while len(segments) > 1 and _is_install(segments[0]):
            segments = segments[1:]
        return " && ".join(segments)

    @property
    def code(self) -> str:
        """The command run, without its trailing comment."""
        return strip_comment(self.shell)

    @property
    def comment(self) -> str:
        return self.shell[len(self.code):].strip().lower()

    @property
    def expected_exit(self) -> int:
        """0, or N for a trailing `# exits N` comment."""
        match = re.match(r"# exits (\d+)\b", self.comment)
        return int(match.group(1)) if match else 0

    @property
    def words(self) -> list[str]:
        try:
            return shlex.split(self.code)
        except ValueError:
            return self.code.split()

    @property
    def program_words(self) -> list[str]:
        """The words after any leading `VAR=value` assignments (and `sudo`)."""
        words = self.words
        while words and (_ASSIGNMENT.match(words[0]) or words[0] == "sudo"):
            words = words[1:]
        return words

    @property
    def program(self) -> str:
        words = self.program_words
        return words[0] if words else ""

    @property
    def is_synopsis(self) -> bool:
        unquoted = _QUOTED.sub("''", self.code)
        return bool(re.search(r"(?<![\w'])\[|\(-|\.\.\.", unquoted))

    @property
    def uses_shell(self) -> bool:
        """Redirections, pipes, variables, globs or more than one command: more than a program
        and its words."""
        return bool(re.search(r"[<>|;&$`(){}*?\[\]]", _QUOTED.sub("", self.code)))

    @property
    def is_benchmark(self) -> bool:
        words = self.program_words
        return self.program in ("python", "python3") and len(words) > 2 and words[1] == "-m" \
            and words[2].startswith("benchmarks.")

    @property
    def is_synth(self) -> bool:
        return self.program == "synth" or (self.program in ("python", "python3") and self.program_words[1:3] == ["-m", "synth"])

    def synth_subcommand(self) -> str:
        words = self.program_words
        rest = words[1:] if self.program == "synth" else words[3:]
        return next((word for word in rest if not word.startswith("-")), "")

    @property
    def not_run_reason(self) -> str:
        """Why this command is never run by the tests ('' when it is)."""
        if self.is_synopsis:
            return "a usage synopsis"
        if _is_install(self.code):
            return "installs packages (the tests run against the installed package)"
        if any(self.comment.startswith(marker) for marker in GPU_MARKERS):
            return "marked to run on a GPU cluster"
        if self.program in ("torchrun", "srun", "mpirun") or self.program.startswith("./"):
            return f"{self.program} runs on a GPU cluster"
        if self.is_synth and self.synth_subcommand() == "bench" and _option(self.words, "--backend") == "nccl":
            return "synth bench --backend nccl needs GPUs"
        return ""

    @property
    def needs_root(self) -> bool:
        return self.comment.startswith(ROOT_MARKER) or "--emulate" in self.words \
            or (self.is_synth and self.synth_subcommand() == "emulate")

    @property
    def needs_toolkit(self) -> bool:
        return self.program in ("gcc", "g++", "nvcc")

    @property
    def needs_torchrun(self) -> bool:
        return self.is_synth and self.synth_subcommand() == "bench" and not self.needs_root

    @property
    def is_slow(self) -> bool:
        return self.comment.startswith(SLOW_MARKER) or self.program == "pytest" \
            or self.program_words[1:3] == ["-m", "pytest"] or self.is_benchmark or "--emulate" in self.words

    def outputs(self) -> list[str]:
        """Paths the command is told to write to."""
        words, result = self.words, []
        if self.comment.startswith(WRITES_MARKER):
            result += self.comment[len(WRITES_MARKER):].split()
        for index, word in enumerate(words):
            name, equals, value = word.partition("=")
            if name in OUTPUT_OPTIONS and equals:
                result.append(value)
            elif word in OUTPUT_OPTIONS and index + 1 < len(words):
                result.append(words[index + 1])
            elif word in (">", ">>", "2>", "&>") and index + 1 < len(words):
                result.append(words[index + 1])
            elif re.match(r"(?:&|2)?>>?[^>&]", word):
                result.append(word.lstrip("&2>"))
        return result


@dataclass(frozen=True)
class Example:
    """One code block's commands, run in order."""

    document: str  # relative to the repository, e.g. docs/export.md
    line: int  # where the block starts
    index: int  # position among the document's examples
    commands: tuple[Command, ...] = field(default_factory=tuple)
    source: str = ""  # a Python block's code (then no commands: the runner writes it to a file)
    marker: str = ""  # the `<!-- not-run: ... -->` or `<!-- run: ... -->` comment before the block

    @property
    def id(self) -> str:
        return f"{self.document}:{self.line}"

    @property
    def is_python(self) -> bool:
        return bool(self.source)

    @property
    def not_run_reason(self) -> str:
        """The reason of a `<!-- not-run: REASON -->` marker ('' when not marked)."""
        found = MARKER.fullmatch(self.marker)
        return found.group(2) if found and found.group(1) == "not-run" else ""

    @property
    def run_marker(self) -> str:
        """What a `<!-- run: ... -->` marker says, lower case ('' when none)."""
        found = MARKER.fullmatch(self.marker)
        return found.group(2).lower() if found and found.group(1) == "run" else ""

    @property
    def ranks(self) -> int:
        """N of a `<!-- run: torchrun --nproc-per-node N -->` marker (0: a plain `python FILE`)."""
        found = re.search(r"torchrun\b.*--nproc[-_]per[-_]node[ =](\d+)", self.run_marker)
        return int(found.group(1)) if found else 0

    def python_command(self, script: str) -> Command:
        """The command that runs this Python block written to `script`, as its marker says."""
        if self.ranks:
            launcher = f"python -m torch.distributed.run --standalone --nproc-per-node {self.ranks}"
        else:
            launcher = "python"
        comment = f"  {ROOT_MARKER}" if ROOT_MARKER.removeprefix("# ") in self.run_marker else ""
        comment = comment or (f"  {SLOW_MARKER}" if SLOW_MARKER.removeprefix("# ") in self.run_marker else "")
        return Command(f"{launcher} {script}{comment}", self.line)

    @property
    def runnable(self) -> tuple[Command, ...]:
        if self.not_run_reason:
            return ()
        if self.is_python:
            return (self.python_command("example.py"),)
        return tuple(command for command in self.commands if not command.not_run_reason)

    @property
    def is_slow(self) -> bool:
        return any(command.is_slow for command in self.runnable)

    @property
    def needs_ranks(self) -> bool:
        """A Python block run on torch.distributed ranks (gloo) under torchrun."""
        return self.ranks > 0 and not self.not_run_reason

    @property
    def needs_root(self) -> bool:
        return any(command.needs_root for command in self.runnable)

    @property
    def needs_torchrun(self) -> bool:
        return any(command.needs_torchrun for command in self.runnable)


def _is_install(text: str) -> bool:
    words = text.split()
    while words and (_ASSIGNMENT.match(words[0]) or words[0] == "sudo"):
        words = words[1:]
    return words[:1] in (["pip"], ["pip3"]) or words[:3] in (["python", "-m", "pip"], ["python3", "-m", "pip"])


def split_and(text: str) -> list[str]:
    """`a && b` into ['a', 'b'], outside quotes."""
    parts, quote, start = [], None, 0
    index = 0
    while index < len(text):
        char = text[index]
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif text.startswith("&&", index):
            parts.append(text[start:index].strip())
            start = index + 2
            index += 1
        index += 1
    parts.append(text[start:].strip())
    return [part for part in parts if part]


def strip_comment(text: str) -> str:
    """`text` up to an unquoted ` #` (a shell comment), right-stripped."""
    quote = None
    for index, char in enumerate(text):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or text[index - 1].isspace()):
            return text[:index].rstrip()
    return text.rstrip()


def _option(words: list[str], name: str) -> str | None:
    for index, word in enumerate(words):
        if word == name and index + 1 < len(words):
            return words[index + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def every_block(text: str):
    """(first line number, language, lines, marker) of every fenced and indented block,
    indentation and fences removed; `marker` is the HTML comment on the last non-blank line
    before the block (`<!-- not-run: REASON -->`, `<!-- run: ... -->`), else ''."""
    lines = text.splitlines()
    index = 0
    previous_blank = True
    while index < len(lines):
        line = lines[index]
        fence = re.match(r"\s{0,3}(`{3,}|~{3,})\s*([\w+-]*)", line)
        if fence:
            marker, language = fence.group(1), fence.group(2).lower()
            comment = _marker_before(lines, index)
            indent = len(line) - len(line.lstrip())
            body, start = [], index + 2
            index += 1
            while index < len(lines) and not lines[index].strip().startswith(marker):
                text = lines[index]
                body.append(text if not indent else text[indent:] if text[:indent].isspace() else text.lstrip())
                index += 1
            yield start, language, textwrap.dedent("\n".join(body)).splitlines(), comment
            index += 1
            previous_blank = False
            continue
        if previous_blank and line.startswith("    ") and line.strip():
            comment = _marker_before(lines, index)
            body, start = [], index + 1
            while index < len(lines) and (lines[index].startswith("    ") or not lines[index].strip()):
                body.append(lines[index][4:])
                index += 1
            while body and not body[-1].strip():
                body.pop()
            yield start, "", textwrap.dedent("\n".join(body)).splitlines(), comment
            previous_blank = True
            continue
        previous_blank = not line.strip()
        index += 1


def _marker_before(lines: list[str], index: int) -> str:
    """The `<!-- ... -->` comment on the last non-blank line before lines[index] ('' if none)."""
    for line in reversed(lines[:index]):
        if line.strip():
            found = MARKER.fullmatch(line.strip())
            return found.group(0) if found else ""
    return ""


def code_blocks(text: str):
    """(first line number, language, lines) of every fenced block with a shell (or no)
    language and every indented block; indentation and fences removed."""
    for start, language, lines, _ in every_block(text):
        if language in SHELL_LANGUAGES:
            yield start, language, lines


def is_python(language: str, lines: list[str]) -> bool:
    """A ```python block, or an unfenced one whose first statement is an import."""
    if language in PYTHON_LANGUAGES:
        return True
    if language:
        return False
    first = next((line.strip() for line in lines if line.strip() and not line.strip().startswith("#")), "")
    return first.startswith("import ") or bool(re.match(r"from [\w.]+ import ", first))


def _is_command_line(line: str) -> bool:
    words = line.split()
    while words and _ASSIGNMENT.match(words[0]):
        words = words[1:]
    if not words:
        return False
    return words[0] in COMMAND_WORDS or (words[0].startswith("./") and len(words[0]) > 2)


def block_commands(start: int, lines: list[str]) -> list[Command]:
    """The commands of one block (see the module docstring for the rules)."""
    prompted = any(line.startswith("$ ") for line in lines)
    commands, index = [], 0
    while index < len(lines):
        line = lines[index]
        if prompted:
            if not line.startswith("$ "):
                index += 1
                continue
            line = line[2:]
        elif not _is_command_line(line.strip()) or line[:1].isspace():
            index += 1
            continue
        first, parts = index, [line.rstrip()]
        while parts[-1].endswith("\\") and index + 1 < len(lines):
            index += 1
            parts[-1] = parts[-1][:-1].rstrip()
            parts.append(lines[index].strip())
        commands.append(Command(" ".join(part for part in parts if part), start + first))
        index += 1
    return commands


def document_examples(repository: Path, relative: str) -> list[Example]:
    text = (repository / relative).read_text(encoding="utf-8")
    examples = []
    for start, language, lines, marker in every_block(text):
        if is_python(language, lines):
            examples.append(Example(relative, start, len(examples), source="\n".join(lines) + "\n", marker=marker))
            continue
        if language not in SHELL_LANGUAGES:
            continue
        commands = block_commands(start, lines)
        if commands:
            examples.append(Example(relative, start, len(examples), tuple(commands), marker=marker))
    return examples


def documents(repository: Path) -> list[str]:
    """README.md and every Markdown file under docs/, relative to the repository."""
    found = ["README.md"] if (repository / "README.md").exists() else []
    found += sorted(str(path.relative_to(repository)) for path in (repository / "docs").rglob("*.md"))
    return found


def all_examples(repository: Path) -> list[Example]:
    return [example for relative in documents(repository) for example in document_examples(repository, relative)]
