"""JSON for files people read: objects indented, arrays of scalars kept on one line, so a
plan's rank lists and offsets read as rows instead of one number per line."""

from __future__ import annotations

import json


def dumps(value, indent: int = 1, _level: int = 0) -> str:
    pad, inner = " " * (indent * _level), " " * (indent * (_level + 1))
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{inner}{json.dumps(str(key))}: {dumps(item, indent, _level + 1)}" for key, item in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, (list, tuple)):
        if all(not isinstance(item, (dict, list, tuple)) for item in value):
            return json.dumps(list(value), ensure_ascii=True)
        items = [f"{inner}{dumps(item, indent, _level + 1)}" for item in value]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(value, ensure_ascii=True)
