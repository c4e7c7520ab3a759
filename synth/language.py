"""The program language of docs/model.md section 6: parse text into frozen dataclasses, print the
canonical form, and read the instruction alphabet from the grammar."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
import re
from pathlib import Path
from typing import TYPE_CHECKING

from synth.errors import ProgramSyntaxError

if TYPE_CHECKING:
    import lark

GRAMMAR_FILE = "program.lark"


PERMUTE = "Permute"


@dataclass(frozen=True)
class Step:
    """One step: `collective` applied to every group of `form` at hierarchy level `level`; or
    the local step `Permute(l1,l2,...)` (collective PERMUTE, no form, `level` the level order
    joined by commas), which every member runs on its own buffer."""

    collective: str
    form: str
    level: str

    def __str__(self) -> str:
        if self.collective == PERMUTE:
            return f"{PERMUTE}({self.level})"
        return f"{self.collective}({self.form}({self.level}))"

    @property
    def is_permute(self) -> bool:
        return self.collective == PERMUTE

    @property
    def order(self) -> tuple[str, ...]:
        """The level order a Permute step names."""
        return tuple(self.level.split(","))


def permute_step(order) -> Step:
    """The Permute step into a level order (level names, outermost first)."""
    return Step(PERMUTE, "", ",".join(order))


@dataclass(frozen=True)
class Program:
    steps: tuple[Step, ...]

    def __str__(self) -> str:
        return "; ".join(str(step) for step in self.steps)

    def __len__(self) -> int:
        return len(self.steps)


def grammar_text() -> str:
    """The grammar file, from the installed package data or, in a source tree, `grammar/`."""
    try:
        return resources.files("synth.grammar").joinpath(GRAMMAR_FILE).read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError):
        return (Path(__file__).resolve().parent.parent / "grammar" / GRAMMAR_FILE).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    """Built on first use, so importing the language costs nothing (lark is imported here too)."""
    import lark

    return lark.Lark(grammar_text(), parser="lalr", lexer="contextual", propagate_positions=True)


def _terminals_of(rule_name: str) -> tuple[str, ...]:
    """The terminal names a grammar rule offers, in grammar order (for syntax errors' hints)."""
    return tuple(symbol.name for rule in _parser().rules if rule.origin.name == rule_name for symbol in rule.expansion)


@lru_cache(maxsize=8)
def _alternatives(rule_name: str) -> tuple[str, ...]:
    """The literal names a grammar rule offers, in grammar order, read from the grammar text:
    the rule is one line of terminals (`collective: ALL_REDUCE | ...`), each terminal one
    string literal (`ALL_REDUCE: "AllReduce"`). Not through Lark: loading a grammar builds
    Lark's own parser of grammars, which cost every search more than its alphabet
    (tests/test_language.py checks this reading against Lark's)."""
    text = grammar_text()
    rule = re.search(rf"^{re.escape(rule_name)}\s*:(.*)$", text, re.MULTILINE)
    if rule is None:
        raise RuntimeError(f"grammar has no rule {rule_name}")
    names = []
    for terminal in (part.strip() for part in rule.group(1).split("|")):
        literal = re.search(rf"^{re.escape(terminal)}\s*:\s*\"([^\"]*)\"\s*$", text, re.MULTILINE)
        if literal is None:
            raise RuntimeError(f"grammar rule {rule_name} must list terminals of one string literal, found {terminal}")
        names.append(literal.group(1))
    return tuple(names)


def collective_names() -> tuple[str, ...]:
    """The collectives of the language, in grammar order."""
    return _alternatives("collective")


def form_names() -> tuple[str, ...]:
    """The forms of the language, in grammar order."""
    return _alternatives("form")


def parse_program(text: str) -> Program:
    """Parse program text; a syntax error names line and column and shows a caret."""
    import lark

    try:
        tree = _parser().parse(text)
    except lark.exceptions.UnexpectedInput as error:
        raise ProgramSyntaxError(_describe_syntax_error(text, error)) from None
    steps = []
    for step_tree in tree.children:
        if step_tree.data == "permute":
            steps.append(permute_step(str(token) for token in step_tree.children[1:]))
            continue
        collective_tree, form_tree, level_token = step_tree.children
        steps.append(Step(str(collective_tree.children[0]), str(form_tree.children[0]), str(level_token)))
    return Program(tuple(steps))


def format_program(program: Program) -> str:
    """The canonical text: steps joined by '; ', no other spaces."""
    return str(program)


def _describe_syntax_error(text: str, error: lark.exceptions.UnexpectedInput) -> str:
    import lark

    line, column = error.line, error.column
    if line is None or line < 1:
        lines = text.splitlines() or [""]
        line, column = len(lines), len(lines[-1]) + 1
    token = getattr(error, "token", None)
    if isinstance(error, lark.exceptions.UnexpectedEOF) or getattr(token, "type", None) == "$END":
        lines = text.splitlines() or [""]
        line, column = len(lines), len(lines[-1]) + 1
        what = "unexpected end of program"
        expected = sorted(getattr(error, "expected", []) or [])
    elif isinstance(error, lark.exceptions.UnexpectedCharacters):
        what = f"unexpected character {text[error.pos_in_stream]!r}"
        expected = sorted(error.allowed or [])
    else:
        what = f"unexpected {str(error.token)!r}"
        expected = sorted(error.expected or [])
    hint = _expected_hint(expected)
    source_line = (text.splitlines() or [""])[line - 1]
    caret = " " * (max(column, 1) - 1) + "^"
    return f"syntax error at line {line}, column {column}: {what}{hint}\n  {source_line}\n  {caret}"


def _expected_hint(expected: list[str]) -> str:
    if not expected:
        return ""
    readable = {"LPAR": "'('", "RPAR": "')'", "LEVEL": "a level name", "SEMICOLON": "';'", "_NL": "a new line"}
    groups = {"a collective": set(_terminals_of("collective")) | {"PERMUTE"}, "a form": set(_terminals_of("form"))}
    names, rest = [], set(expected)
    for label, members in groups.items():
        if members & rest:
            names.append(f"{label} ({', '.join(sorted(_literal(m) for m in members & rest))})")
            rest -= members
    names += sorted(readable.get(name, name) for name in rest)
    return "; expected " + " or ".join(names)


def _literal(terminal_name: str) -> str:
    for terminal in _parser().terminals:
        if terminal.name == terminal_name:
            return terminal.pattern.value
    return terminal_name
