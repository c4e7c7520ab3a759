"""Every sink's escaper in synth/text.py leaves no control character and no line break in what
it writes, for names and file names built to break out of a terminal, a comment or a literal."""

import json
import unicodedata

import pytest

from synth import text

HOSTILE = [
    "\x1b[31mred\x1b[0m",
    "line\nbreak",
    "carriage\rreturn",
    "tab\there",
    "nul\x00byte",
    "bell\x07",
    "del\x7f",
    "c1\x85next-line\x9bcsi",
    "unicode\u2028line\u2029para",
    "bidi\u202eoverride",
    "ends in a backslash \\",
    "trigraph ??/",
    'quote " and \' and */ and \\" mixed',
    "[/x] markup [bold]",
    "ünïcødé 名前",
    "",
]

# Every escaper for one line of text, with the characters its sink may keep raw.
ONE_LINE = {
    "escaped": (text.escaped, ""),
    "escaped(keep=tab)": (lambda value: text.escaped(value, keep="\t"), "\t"),
    "python_comment": (text.python_comment, ""),
    "c_comment": (text.c_comment, ""),
    "c_string": (text.c_string, ""),
}


def _breaking(value: str, allowed: str) -> list[str]:
    """Control characters and line or paragraph separators left in `value`."""
    return [char for char in value if char not in allowed
            and (unicodedata.category(char) in ("Cc", "Zl", "Zp") or char in "\n\r\x85")]


@pytest.mark.parametrize("name", sorted(ONE_LINE))
@pytest.mark.parametrize("hostile", HOSTILE)
def test_no_control_character_or_line_break(name, hostile):
    escaper, allowed = ONE_LINE[name]
    written = escaper(hostile)
    assert not _breaking(written, allowed), (name, written)
    assert len(written.splitlines()) <= 1, (name, written)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_terminal_keeps_layout_but_no_control_codes(hostile):
    """The terminal's escaper keeps new lines and tabs (layout) and obeys nothing else."""
    written = text.printable(hostile)
    assert not [char for char in written if unicodedata.category(char) == "Cc" and char not in "\n\t"], written


@pytest.mark.parametrize("hostile", HOSTILE)
def test_comments_are_plain_ascii_and_can_be_read_back(hostile):
    for line, prefix in ((text.python_comment(hostile), "# "), (text.c_comment(hostile), "// ")):
        assert line.isascii() and line.isprintable()
        body = line[len(prefix):] if line != prefix.rstrip() else ""
        assert body == hostile.rstrip() or json.loads(body) == hostile


@pytest.mark.parametrize("hostile", HOSTILE)
def test_c_string_has_no_quote_or_backslash_but_its_escapes(hostile):
    inner = text.c_string(hostile)[1:-1]
    assert '"' not in inner and "??" not in inner
    assert all(part[:3].isdigit() for part in inner.split("\\")[1:])
