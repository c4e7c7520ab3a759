"""results/README.md: every study under results/, what it is and the command that regenerates it.

    python -m benchmarks.index [-o results]

Nothing is listed by hand. A study is a folder under results/ whose README.md is its report;
its title and command are read from that report (the `# ` title and the `Command:` line), its
files are listed beside it (a subfolder as one entry with its file count). A file that records
a command of its own other than its study's (a `Command:` line, a `# command:` comment at the
top of a CSV, log or script, or a JSON `"command"` key, or one of a file with the same stem
beside it), such as the microbenchmarks a study was calibrated from, is listed with that
command too. A report still at the top level
(results/x.md) counts as the study x, with the files named x.* beside it.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path

from benchmarks.record import REPORT, header, results_dir
from synth.output_files import write_text

COMMAND = "python -m benchmarks.index"
INDEX = "README.md"  # the index at the top of the results directory
_MARKDOWN_COMMAND = re.compile(r"^Command: `([^`]+)`", re.MULTILINE)
_COMMENT_COMMAND = re.compile(r"^#\s*command:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_TITLE = re.compile(r"^# (.+)$", re.MULTILINE)
HEAD_CHARS = 4000  # commands and titles sit at the top


@dataclass(frozen=True)
class Study:
    """One study: its folder (or top-level report), title, command and files."""

    name: str
    report: str  # the report's path under the results directory
    title: str
    command: str
    files: tuple[tuple[str, str], ...]  # (link under the results directory, label) besides the report
    own_commands: tuple[tuple[str, str], ...]  # (file under the results directory, its own other command)


def _head(path: Path) -> str:
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            return handle.read(HEAD_CHARS)
    except OSError:
        return ""


def own_command(path: Path) -> str | None:
    """The command a file records about itself, if any."""
    if path.suffix == ".json":
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        command = value.get("command") if isinstance(value, dict) else None
        return command if isinstance(command, str) else None
    if path.suffix == ".png":
        return None
    text = _head(path)
    match = (_MARKDOWN_COMMAND if path.suffix == ".md" else _COMMENT_COMMAND).search(text)
    return match[1] if match else None


def title(path: Path) -> str:
    match = _TITLE.search(_head(path))
    return match[1].strip() if match else ""


def _visible(path: Path, root: Path) -> bool:
    return not any(part.startswith(".") for part in path.relative_to(root).parts)


def _files_under(folder: Path, root: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and _visible(p, root))


def _study(name: str, report: Path, members: list[Path], root: Path) -> Study:
    """A study from its report and the other files that belong to it."""
    command = own_command(report) or ""
    files, own = [], []
    folder = report.parent
    shown_folders = set()
    for path in members:
        relative = path.relative_to(root).as_posix()
        inner = path.relative_to(folder).parts
        if len(inner) > 1 and folder != root:  # inside a subfolder of the study: one entry for the subfolder
            sub = folder / inner[0]
            if sub not in shown_folders:
                shown_folders.add(sub)
                count = sum(1 for p in _files_under(sub, root))
                files.append((sub.relative_to(root).as_posix() + "/", f"{inner[0]}/ ({count} files)"))
        else:
            files.append((relative, path.name))
        other = own_command(path) or _sibling_command(path)
        if other and other != command:
            own.append((relative, other))
    return Study(name, report.relative_to(root).as_posix(), title(report), command, tuple(files), tuple(own))


def _sibling_command(path: Path) -> str | None:
    """The command of a file with the same stem beside it (a CSV's JSON provenance), if any."""
    for other in sorted(path.parent.glob(f"{path.stem}.*")):
        if other != path and other.suffix != ".md":
            command = own_command(other)
            if command:
                return command
    return None


def describe(directory: Path) -> list[Study]:
    """Every study under the results directory, sorted by name; loose files with no report
    each count as their own entry."""
    studies = []
    loose = sorted(p for p in directory.iterdir() if p.is_file() and p.name != INDEX and _visible(p, directory))
    for folder in sorted(p for p in directory.iterdir() if p.is_dir() and _visible(p, directory)):
        files = _files_under(folder, directory)
        report = folder / REPORT
        if not report.is_file():
            reports = [p for p in files if p.suffix == ".md" and p.parent == folder]
            if not reports:
                continue
            report = reports[0]
        studies.append(_study(folder.name, report, [p for p in files if p != report], directory))
    reports = [p for p in loose if p.suffix == ".md"]
    claimed = set(reports)
    for report in reports:
        members = [p for p in loose if p != report and p.stem.startswith(report.stem)]
        claimed.update(members)
        studies.append(_study(report.stem, report, members, directory))
    for path in loose:
        if path not in claimed:
            studies.append(Study(path.stem, path.name, "", own_command(path) or "", (), ()))
    return sorted(studies, key=lambda study: study.name)


def render(studies: list[Study]) -> str:
    lines = ["# Results", "", header(COMMAND), "",
             "One folder per study: its README.md is the report, with the command that regenerates it (run from "
             "the repository root), the machine, the load and the date at its top; its data files sit beside it. "
             "Calibrated topologies are topologies, not results: the ones the studies use are in topologies/ "
             "(the accuracy campaign's compared variants in topologies/calibrated/).", "",
             "| study | what | command | files |", "|---|---|---|---|"]
    for study in studies:
        what = study.title or ("written by `" + " ".join(_program_words(study.command)) + "`" if study.command else "")
        files = ", ".join(f"[{label}]({link})" for link, label in study.files)
        command = f"`{study.command}`" if study.command else "(no command recorded)"
        name = study.name + "/" if "/" in study.report else study.report
        lines.append(f"| [{name}]({study.report}) | {what} | {command} | {files} |")
    own = [(path, command) for study in studies for path, command in study.own_commands]
    if own:
        lines += ["", "Files written by another command than their study's:", "",
                  "| file | command |", "|---|---|"]
        lines += [f"| [{path}]({path}) | `{command}` |" for path, command in own]
    return "\n".join(lines) + "\n"


def _program_words(command: str) -> list[str]:
    """The words of a command before its first option: `synth sweep`, `python -m benchmarks.x`."""
    words = []
    for word in command.split():
        if word.startswith("-") and words and words[-1] != "python":
            break
        words.append(word)
    return words


def write_index(directory: str | Path = "results") -> Path:
    directory = results_dir(directory)
    path = directory / INDEX
    write_text(path, render(describe(directory)))
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="results", help="the results directory (default results/)")
    args = parser.parse_args(argv)
    print(f"wrote {write_index(args.output)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
