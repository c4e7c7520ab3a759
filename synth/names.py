"""Names and `name=size` lists that users type: validated once, here, before anything uses them.

Names reach generated code (C, Python) and file names, so they are restricted to the
identifier pattern of docs/model.md section 1; nothing else gets through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from synth.errors import UsageError

NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Refuse what cannot finish rather than hang: 2**20 devices is far beyond any cluster.
MAX_DEVICES = 1 << 20


def check_name(name: str, what: str) -> str:
    """Return `name` if it is an identifier, else raise a UsageError naming it."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise UsageError(
            f"invalid {what} name {name!r}: use letters, digits and '_', not starting with a digit"
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
    if text is None or not str(text).strip():
        raise UsageError(f"empty {what} list: give e.g. {default_prefix}0=2,{default_prefix}1=4")
    items = []
    for index, part in enumerate(str(text).split(",")):
        part = part.strip()
        if "=" in part:
            name, _, size_text = part.partition("=")
            name = name.strip()
        else:
            name, size_text = f"{default_prefix}{index}", part
        check_name(name, what)
        try:
            size = int(size_text.strip())
        except ValueError:
            raise UsageError(
                f"invalid {what} size {size_text.strip()!r} for {name!r}: give a positive integer, e.g. {name}=4"
            ) from None
        if size < 1:
            raise UsageError(f"{what} {name!r} has size {size}: sizes must be positive integers")
        items.append(Sized(name, size))
    seen = set()
    for item in items:
        if item.name in seen:
            raise UsageError(f"{what} name {item.name!r} appears twice in {text!r}: names must be unique")
        seen.add(item.name)
    return tuple(items)


def product(values) -> int:
    result = 1
    for value in values:
        result *= value
    return result
