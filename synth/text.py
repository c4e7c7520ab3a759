"""User text made safe for each place it is written to: one escaper per sink, side by side.

Names and file names come from users and their files and may hold anything but NUL and '/':
an escape sequence, a new line, a quote, a backslash. Each sink below has its own rule because
each breaks on different characters (a terminal obeys control codes, a comment ends at a line
break, a C literal at a quote, a C comment line continues after a backslash). Each escaper
leaves no control character and no line break in what it returns, except `printable`, which
keeps the new lines and tabs that terminal layout uses (whole messages and tables pass it). No imports beyond
the standard library, so the exports and the topology writer can use this as well as commands.
"""

from __future__ import annotations

import json
import re

# C0 and C1 control characters and DEL, except the newline and tab that layout uses.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_PLAIN_ASCII = re.compile(r"[ -~]*\Z")
_C_SAFE_CHARS = re.compile(r"[A-Za-z0-9 _().;,=:\[\]{}+\-]")


def _escape(char: str) -> str:
    return repr(char)[1:-1]


def printable(text: str) -> str:
    """Terminal: only what a terminal would obey (C0/C1 controls, DEL) as escapes; new lines
    and tabs are layout and other Unicode shows as itself, so tables and names read as written."""
    return _CONTROL.sub(lambda match: _escape(match.group()), text)


def escaped(text: str, keep: str = "") -> str:
    """One line of text: every character Python calls unprintable (controls, line and format
    separators) as its escape, except those in `keep`; for notes and titles and TOML comments."""
    return "".join(c if c.isprintable() or c in keep else _escape(c) for c in text)


def is_plain_ascii(text: str) -> bool:
    """Printable ASCII and no backslash: text any comment or shell line shows as it is."""
    return bool(_PLAIN_ASCII.match(text)) and "\\" not in text


def python_comment(text: str) -> str:
    """A `#` line: plain ASCII as it is, else JSON-escaped (a Python comment ends only at a
    line break, so JSON's escapes keep it one line)."""
    if not is_plain_ascii(text):
        text = json.dumps(text, ensure_ascii=True)
    return f"# {text}".rstrip()


def c_comment(text: str) -> str:
    """A `//` line: printable ASCII not ending in a backslash and without '??' (either could
    splice the next line into the comment), else JSON-escaped with '?' as \\u003f."""
    if not _PLAIN_ASCII.match(text) or text.endswith("\\") or "??" in text:
        text = json.dumps(text, ensure_ascii=True).replace("?", "\\u003f")
    return f"// {text}".rstrip()


def c_string(text: str) -> str:
    """A C string literal: safe characters as they are, every other byte as an octal escape of
    three digits (a quote or backslash would end or change the literal; three digits so a
    following digit cannot extend the escape)."""
    parts = []
    for char in text:
        if _C_SAFE_CHARS.match(char):
            parts.append(char)
        else:
            parts.extend(f"\\{byte:03o}" for byte in char.encode("utf-8"))
    return '"' + "".join(parts) + '"'
