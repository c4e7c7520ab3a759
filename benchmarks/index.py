"""results/README.md: every file under results/ with the command that regenerates it.

    python -m benchmarks.index [-o results]

Nothing is listed by hand. Each file's command is read from the file itself (a markdown
`Command:` line, a `# command:` comment at the top of a CSV, log or script, or a JSON
`"command"` key); a file that carries none (a figure, a data file) takes the command of the
markdown file that links to it, of a file with the same stem that has one, or of the
markdown report named after its directory (results/x.md for the files under results/x/).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from benchmarks.record import header, results_dir

COMMAND = "python -m benchmarks.index"
INDEX = "README.md"
_MARKDOWN_COMMAND = re.compile(r"^Command: `([^`]+)`", re.MULTILINE)
_COMMENT_COMMAND = re.compile(r"^#\s*command:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_TITLE = re.compile(r"^# (.+)$", re.MULTILINE)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
HEAD_CHARS = 4000  # commands and titles sit at the top


def _head(path: Path) -> str:
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            return handle.read(HEAD_CHARS)
    except OSError:
        return ""


def own_command(path: Path) -> str | None:
    """The command a file records about itself, if any."""
    text = _head(path)
    if path.suffix == ".md":
        match = _MARKDOWN_COMMAND.search(text)
        return match[1] if match else None
    if path.suffix == ".json":
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        command = value.get("command") if isinstance(value, dict) else None
        return command if isinstance(command, str) else None
    match = _COMMENT_COMMAND.search(text)
    return match[1] if match else None


def describe(directory: Path) -> list[tuple[str, str, str]]:
    """(path under the directory, what it is, command) for every file but the index, sorted."""
    files = sorted(p for p in directory.rglob("*")
                   if p.is_file() and p != directory / INDEX and not any(part.startswith(".") for part in
                                                                          p.relative_to(directory).parts))
    name = {path: path.relative_to(directory).as_posix() for path in files}
    commands = {path: own_command(path) for path in files}
    titles, linked_from = {}, {}
    for path in files:
        if path.suffix != ".md":
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        title = _TITLE.search(text)
        titles[path] = title[1].strip() if title else ""
        for target in _LINK.findall(text):
            linked_from.setdefault((path.parent / target).resolve(), path)
    rows = []
    for path in files:
        command, what = commands[path], titles.get(path, "")
        parent = linked_from.get(path.resolve())
        if parent is not None:
            command = command or commands[parent]
            what = what or f"{'figure' if path.suffix == '.png' else 'data'} of [{name[parent]}]({name[parent]})"
        sibling = next((other for other in files if other.parent == path.parent and other.stem == path.stem
                        and other != path and commands[other]), None)
        if sibling is not None:
            command = command or commands[sibling]
            if not what and sibling.suffix == ".md":
                what = f"data of [{name[sibling]}]({name[sibling]})"
        report = _directory_report(path, directory, commands)
        if report is not None and not command:
            command = commands[report]
            what = what or f"data of [{name[report]}]({name[report]})"
        if not what and command:
            what = "written by `" + " ".join(_program_words(command)) + "`"
        rows.append((name[path], what, command or "(no command recorded)"))
    return rows


def _directory_report(path: Path, root: Path, commands: dict) -> Path | None:
    """The markdown report named after a directory the file sits in (results/x.md for results/x/...)."""
    for folder in path.relative_to(root).parents:
        if folder == Path("."):
            break
        report = root / folder.parent / f"{folder.name}.md"
        if commands.get(report):
            return report
    return None


def _program_words(command: str) -> list[str]:
    """The words of a command before its first option: `synth sweep`, `python -m benchmarks.x`."""
    words = []
    for word in command.split():
        if word.startswith("-") and words and words[-1] != "python":
            break
        words.append(word)
    return words


def render(rows) -> str:
    lines = ["# Results", "", header(COMMAND), "",
             "Every file here, what it is and the command that regenerates it (run from the repository root; "
             "each file names its own machine and date at its top, or in the markdown file that shows it).", "",
             "| file | what | command |", "|---|---|---|"]
    for name, what, command in rows:
        lines.append(f"| [{name}]({name}) | {what} | `{command}` |")
    return "\n".join(lines) + "\n"


def write_index(directory: str | Path = "results") -> Path:
    directory = results_dir(directory)
    path = directory / INDEX
    path.write_text(render(describe(directory)), encoding="utf-8")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="results", help="the results directory (default results/)")
    args = parser.parse_args(argv)
    print(f"wrote {write_index(args.output)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
