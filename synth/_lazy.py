"""Public names of a package resolved on first use (PEP 562), so `import synth` and every
command stay fast: a package lists what it offers and from where, and nothing is imported
until a name is asked for."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, table: dict[str, str], namespace: dict) -> tuple[Callable, Callable]:
    """(__getattr__, __dir__) for a package whose public names live in the modules `table`
    names (name -> module); a resolved name is cached in the package's namespace."""

    def __getattr__(name: str):
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__
