"""Names and `name=size` lists that users type: validated once, here, before anything uses them.

Names reach generated code (C, Python) and file names, so they are restricted to the
identifier pattern of docs/model.md section 1; nothing else gets through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from synth.errors import UsageError

NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
SIZE_PATTERN = re.compile(r"[0-9]+\Z")  # ASCII digits only: int() would also take '٣' or '３'
# Refuse what cannot finish rather than hang: 2**20 devices is far beyond any cluster.
MAX_DEVICES = 1 << 20
# Levels or axes in one list: numpy's arrays have at most 64 dimensions, and a placement
# of more than this many axes or levels is a typo, not a cluster.
MAX_NAMES = 32
MAX_NAME_CHARS = 64
ECHO_CHARS = 80


def echo(value, limit: int = ECHO_CHARS) -> str:
    """`repr(value)` for an error message, cut in the middle to about `limit` characters with
    the length said, so a megabyte of input is never echoed back whole (the end, where a file
    name is, is kept)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    head = limit // 3
    return f"{text[:head]}...{text[-(limit - head - 3):]} ({len(str(value))} characters)"


def check_name(name: str, what: str) -> str:
    """Return `name` if it is an identifier, else raise a UsageError naming it."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name) or len(name) > MAX_NAME_CHARS:
        raise UsageError(
            f"invalid {what} name {echo(name)}: use up to {MAX_NAME_CHARS} letters, digits and '_', "
            f"not starting with a digit"
        )
    return name


@dataclass(frozen=True)
class Sized:
    """A named size: a system level (`gpu=8`) or a parallelism axis (`data=8`)."""

    name: str
    size: int


def parse_sized_list(text: str, what: str, default_prefix: str) -> tuple[Sized, ...]:
    """Parse `a=2,b=4` (or bare `2,4`, named `<prefix>0, <prefix>1`) into named sizes.

    Sizes are positive integers, names unique identifiers.
    """
    example = f"{default_prefix}0=2,{default_prefix}1=4"
    if text is None or not str(text).strip():
        raise UsageError(f"empty {what} list: give e.g. {example}")
    parts = str(text).split(",")
    if len(parts) > MAX_NAMES:
        raise UsageError(f"{len(parts)} {what} names in {echo(text)}: at most {MAX_NAMES} are handled")
    items = []
    for index, part in enumerate(parts):
        part = part.strip()
        if not part:
            raise UsageError(f"{what} {index + 1} of {echo(text)} is empty: write e.g. {example}")
        if "=" in part:
            name, _, size_text = part.partition("=")
            name = name.strip()
        else:
            name, size_text = f"{default_prefix}{index}", part
        check_name(name, what)
        size_text = size_text.strip()
        if not SIZE_PATTERN.match(size_text) or len(size_text) > 9:
            raise UsageError(
                f"invalid {what} size {echo(size_text)} for {name!r}: give a positive integer in digits 0-9, "
                f"e.g. {name}=4"
            )
        size = int(size_text)
        if size < 1:
            raise UsageError(f"{what} {name!r} has size {size}: sizes must be positive integers")
        items.append(Sized(name, size))
    seen = set()
    for item in items:
        if item.name in seen:
            raise UsageError(f"{what} name {item.name!r} appears twice in {echo(text)}: names must be unique")
        seen.add(item.name)
    return tuple(items)


def product(values) -> int:
    result = 1
    for value in values:
        result *= value
    return result
