"""Program text (docs/model.md section 6): round trip, tolerated layout, syntax errors, the alphabet."""

from __future__ import annotations

import re
from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synth.errors import ProgramSyntaxError, UsageError
from synth.language import (
    GRAMMAR_FILE,
    Program,
    Step,
    collective_names,
    form_names,
    format_program,
    grammar_text,
    parse_program,
)

_FIRST = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_"
IDENTIFIER = st.builds(
    lambda first, rest: first + rest, st.sampled_from(_FIRST), st.text(alphabet=_FIRST + "0123456789", max_size=8)
)
LEVEL = st.one_of(IDENTIFIER, st.builds(lambda level, axis: f"{level}.{axis}", IDENTIFIER, IDENTIFIER))
STEP = st.builds(Step, st.sampled_from(collective_names()), st.sampled_from(form_names()), LEVEL)
PROGRAM = st.builds(lambda steps: Program(tuple(steps)), st.lists(STEP, min_size=0, max_size=8))

CLASSIC = "ReduceScatter(InsideGroup(gpu)); AllReduce(Parallel(node)); AllGather(InsideGroup(gpu))"


# --- round trip and canonical text --------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(PROGRAM)
def test_parse_inverts_print(program):
    assert parse_program(str(program)) == program


@settings(max_examples=200, deadline=None)
@given(PROGRAM)
def test_canonical_text_is_steps_joined_by_semicolon_space(program):
    text = format_program(program)
    assert text == "; ".join(f"{s.collective}({s.form}({s.level}))" for s in program.steps)
    assert " " not in text.replace("; ", "")


@settings(max_examples=200, deadline=None)
@given(
    PROGRAM.filter(lambda p: len(p) > 0),
    st.lists(st.sampled_from([";", "\n", "\n\n", " ;\n", "; # a comment\n", "\n# comment line\n\n", "\r\n"]), min_size=8, max_size=8),
    st.sampled_from(["", " ", "  ", "\t"]),
    st.sampled_from(["", ";", " ;", ";\n", "\n# end\n", "  # trailing comment"]),
    st.sampled_from(["", "\n", "# header\n", "\n\n  \n"]),
)
def test_layout_is_tolerated(program, separators, pad, trailer, header):
    """New lines, blank lines, comments, spaces inside a step and a trailing ';' all parse to
    the same program."""
    texts = []
    for step in program.steps:
        texts.append(f"{pad}{step.collective}{pad}({pad}{step.form}{pad}({pad}{step.level}{pad}){pad}){pad}")
    body = texts[0]
    for index, text in enumerate(texts[1:]):
        body += separators[index % len(separators)] + text
    assert parse_program(header + body + trailer) == program


def test_the_classic_program_prints_canonically():
    spaced = "\n  ReduceScatter( InsideGroup( gpu ) ) ;\n\n# comment\nAllReduce(Parallel(node))\nAllGather(InsideGroup(gpu));\n"
    assert str(parse_program(spaced)) == CLASSIC
    assert str(parse_program(CLASSIC)) == CLASSIC


@pytest.mark.parametrize("text", ["", "\n\n", "# nothing here\n", ";;", "  ; \n ;"])
def test_empty_programs_parse(text):
    assert parse_program(text) == Program(())


def test_level_names_may_look_like_keywords():
    program = Program((Step("Reduce", "Master", "Master"), Step("Broadcast", "Parallel", "AllReduce.Reduce")))
    assert parse_program(str(program)) == program


# --- syntax errors ------------------------------------------------------------------------------


def _caret_column(message: str) -> int:
    """The 1-based column the caret line points at (both quoted lines carry a 2-space indent)."""
    caret_line = message.splitlines()[-1]
    assert caret_line.strip() == "^", message
    return len(caret_line) - 2


@pytest.mark.parametrize(
    "text, line, column, words",
    [
        ("AllReduce(InsideGroup(gpu)", 1, 27, ("unexpected end", "')'")),
        ("AllReduce(InsideGroup(gpu));\nAllGather(Parallel(node)", 2, 25, ("unexpected end",)),
        ("AllReduce(InsideGroup(", 1, 23, ("unexpected end", "level name")),
        ("AllReduce(InsideGroup(gpu)) AllGather(Parallel(node))", 1, 29, ("AllGather", "';'")),
        ("# header\nAllReduce(InsideGroup(gpu))\n  Reduce(Master(gpu)) Broadcast(Master(gpu))", 3, 23, ("Broadcast",)),
        ("Allreduce(InsideGroup(gpu))", 1, 1, ("Allreduce", "a collective")),
        ("AllReduce(Inside(gpu))", 1, 11, ("Inside", "a form")),
        ("AllReduce(InsideGroup(1gpu))", 1, 23, ("'1'", "level name")),
        ("AllReduce(InsideGroup(gpu)); Scatter(Parallel(node))", 1, 30, ("Scatter", "a collective")),
        ("AllReduce InsideGroup(gpu))", 1, 11, ("InsideGroup", "'('")),
    ],
    ids=[
        "missing-parenthesis",
        "missing-parenthesis-line-2",
        "unexpected-end",
        "two-steps-without-separator",
        "two-steps-without-separator-line-3",
        "unknown-collective",
        "unknown-form",
        "level-starting-with-digit",
        "unknown-collective-after-separator",
        "missing-open-parenthesis",
    ],
)
def test_syntax_errors_name_line_column_and_show_a_caret(text, line, column, words):
    with pytest.raises(ProgramSyntaxError) as error:
        parse_program(text)
    message = str(error.value)
    assert f"line {line}, column {column}" in message, message
    assert _caret_column(message) == column, message
    source_line = text.splitlines()[line - 1]
    assert message.splitlines()[-2] == "  " + source_line, message
    for word in words:
        assert word in message, (word, message)


def test_syntax_errors_are_usage_errors():
    """The CLI maps UsageError to exit code 2; a bad program is malformed input."""
    assert issubclass(ProgramSyntaxError, UsageError)
    with pytest.raises(UsageError):
        parse_program("AllReduce(")


# --- the grammar and the alphabet ----------------------------------------------------------------


def test_grammar_is_package_data():
    resource = resources.files("synth.grammar").joinpath(GRAMMAR_FILE)
    assert resource.is_file()
    assert grammar_text() == resource.read_text(encoding="utf-8")
    assert "collective:" in grammar_text() and "form:" in grammar_text()


def test_alphabet_lists_the_six_collectives_and_three_forms_in_grammar_order():
    assert collective_names() == ("AllReduce", "ReduceScatter", "AllGather", "Reduce", "Broadcast", "AllToAll")
    assert form_names() == ("InsideGroup", "Parallel", "Master")
    # Grammar order: the order the literals appear in the grammar file.
    text = grammar_text()
    for names in (collective_names(), form_names()):
        positions = [re.search(rf'^[A-Z_]+: "{name}"$', text, re.MULTILINE).start() for name in names]
        assert positions == sorted(positions)


def test_permute_steps_parse_and_print_canonically():
    program = parse_program("Permute( gpu , node );AllToAll(Parallel(node))\n")
    assert str(program) == "Permute(gpu,node); AllToAll(Parallel(node))"
    assert program.steps[0].is_permute and program.steps[0].order == ("gpu", "node")
    assert parse_program(str(program)) == program


def test_the_alphabet_read_from_the_grammar_text_is_larks():
    """collective_names and form_names read the grammar's two rules as text; Lark's own
    reading of the grammar lists the same literals in the same order."""
    import lark

    from synth.language import collective_names, form_names, grammar_text

    grammar = lark.Lark(grammar_text(), parser=None, lexer="basic")
    terminals = {terminal.name: terminal.pattern for terminal in grammar.terminals}

    def alternatives(rule_name):
        return tuple(terminals[symbol.name].value for rule in grammar.rules if rule.origin.name == rule_name
                     for symbol in rule.expansion)

    assert collective_names() == alternatives("collective")
    assert form_names() == alternatives("form")
