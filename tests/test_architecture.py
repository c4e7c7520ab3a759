"""The package's shape, as docs/architecture.md declares it: every import (module level,
inside a function, for type checking alike) goes down or sideways in the layer table, none
goes in a circle, every module belongs to one unit the table names, and library messages
name no command-line flag (only synth/commands/ and synth/cli.py know them)."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "synth"
DOC = ROOT / "docs" / "architecture.md"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _layers() -> dict[str, int]:
    """unit -> layer number, from the table under '## Layers' in docs/architecture.md."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    units: dict[str, int] = {}
    for line in section.splitlines():
        row = re.match(r"\|\s*(\d+)\s[^|]*\|([^|]*)\|", line)
        if row:
            for unit in re.findall(r"`([\w.]+)`", row.group(2)):
                assert unit not in units, f"{unit} is listed twice in docs/architecture.md"
                units[unit] = int(row.group(1))
    assert units, "docs/architecture.md has no layer table"
    return units


LAYERS = _layers()


def _unit(module: str) -> str:
    """The table's unit a module belongs to: itself or its nearest listed package."""
    name = module
    while name not in LAYERS:
        if "." not in name:
            raise AssertionError(f"{module} belongs to no unit of docs/architecture.md's layer table")
        name = name.rpartition(".")[0]
    return name


def _imported(module: str, path: Path) -> set[str]:
    """The synth modules `module` imports anywhere in its text (an import of a name resolves to
    the module defining it when that is a module, else to the package that exports it)."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
    return found


GRAPH = {module: _imported(module, path) for module, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_unit_in_the_table_exists_and_every_module_belongs_to_one():
    missing = sorted(unit for unit in LAYERS if unit not in MODULES)
    assert not missing, f"docs/architecture.md names units that do not exist: {missing}"
    for module in MODULES:
        _unit(module)


def test_every_package_and_top_level_module_is_listed():
    """Each top-level module and subpackage of synth/ is a row's unit (none hides inside another)."""
    top = {name for name in MODULES if name.count(".") == 1}
    assert sorted(top - set(LAYERS)) == []


def test_every_path_the_map_names_exists():
    """Each file or folder docs/architecture.md points at (synth/..., tests/..., docs/...) is there;
    a bare file name in a table cell beside one is that one's neighbour."""
    text = DOC.read_text(encoding="utf-8")
    missing = []
    for line in text.splitlines():
        folder = None
        for path in re.findall(r"(?<![\w/.])((?:synth|tests|docs|grammar)/[\w/.]*|[\w]+\.py)\b", line):
            if "/" in path:
                folder = str(Path(path).parent) if path.endswith((".py", ".md")) else path.rstrip("/")
            elif folder is not None:
                path = f"{folder}/{path}"
            else:
                continue
            if not (ROOT / path).exists():
                missing.append(path)
    assert missing == []


def test_no_module_imports_in_a_circle():
    assert _cycles(GRAPH) == []


def test_no_unit_imports_in_a_circle():
    units: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        units.setdefault(_unit(module), set()).update(_unit(t) for t in targets if _unit(t) != _unit(module))
    assert _cycles(units) == []


def test_no_import_goes_up_a_layer():
    upward = sorted(f"{module} (layer {LAYERS[_unit(module)]}) imports {target} (layer {LAYERS[_unit(target)]})"
                    for module, targets in GRAPH.items() for target in targets
                    if LAYERS[_unit(target)] > LAYERS[_unit(module)])
    assert upward == []


def test_the_circle_finder_finds_circles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# --- flags ----------------------------------------------------------------------------------

# Modules whose strings are another program's command line, not synth's: the exported torch
# script's runtime parses its own options (-b/-e/-f/--iters ..., as nccl-tests names them).
# Megatron-LM's launch arguments are Megatron's (--sequence-parallel is one of both).
OTHER_PROGRAMS = {"synth.export.torch_runtime", "synth.plan.launch"}
COMMAND_LAYER = ("synth.commands", "synth.cli", "synth.__main__")


def _synth_flags() -> set[str]:
    from synth.cli import build_parser

    flags: set[str] = set()

    def collect(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            flags.update(option for option in action.option_strings if option.startswith("--"))
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    collect(sub)

    collect(build_parser(every_command=True))
    return flags


def _strings(tree: ast.AST):
    """Every string constant but docstrings (which may cite a flag to explain a default)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node


def test_only_the_command_layer_names_flags():
    flags = _synth_flags()
    assert "--topology" in flags and "--collective" in flags  # the parser was read
    pattern = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
    named = []
    for module, path in MODULES.items():
        if module.startswith(COMMAND_LAYER) or module in OTHER_PROGRAMS:
            continue
        for node in _strings(ast.parse(path.read_text(encoding="utf-8"))):
            named += [f"{path.relative_to(ROOT)}:{node.lineno} {flag}"
                      for flag in pattern.findall(node.value) if flag in flags]
    assert sorted(set(named)) == []


# A goal is an object that carries its facts (synth/goals.py): its name is parsed where it
# enters (a flag, a file) and nothing else asks "is this the reduce-scatter?" by its name.
GOAL_EDGES = COMMAND_LAYER + ("synth.goals",)


def _goal_name_branches(tree: ast.AST, names: set[str]):
    """Lines that compare a goal's name as a string literal (==, !=, is, a match case, `in` a
    literal tuple, list or set) or list two names in one literal tuple, list or set."""
    def named(node) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, operands, operands[1:]):
                if isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)) and (named(left) or named(right)):
                    yield node.lineno
                elif isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)) \
                        and any(named(element) for element in right.elts):
                    yield node.lineno
        elif isinstance(node, ast.MatchValue) and named(node.value):
            yield node.lineno
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and sum(map(named, node.elts)) >= 2:
            yield node.lineno


def test_no_module_branches_on_a_goal_name():
    from synth.goals import GOALS, ROUTED_GOALS

    names = {*GOALS, *ROUTED_GOALS}
    found = [f"{path.relative_to(ROOT)}:{line}" for module, path in MODULES.items() if not module.startswith(GOAL_EDGES)
             for line in _goal_name_branches(ast.parse(path.read_text(encoding="utf-8")), names)]
    assert sorted(set(found)) == [], "read the Goal's facts (synth/goals.py) instead of comparing its name"


def test_the_goal_name_finder_finds_branches():
    source = ('if goal == "allgather": pass\n'
              'if "reduce" != name: pass\n'
              'if goal in ("broadcast", x): pass\n'
              'NAMES = ["dispatch", "combine"]\n'
              'match goal:\n    case "alltoall": pass\n'
              'if "reduce" in document: pass\n'  # a key of a mapping, not a name compared
              'CALLS = {"reduce": f, "broadcast": g}\n'  # a table keyed by torch's call names
              'x = ("--type", "alltoall")\n')
    names = {"allgather", "reduce", "broadcast", "dispatch", "combine", "alltoall"}
    assert sorted(set(_goal_name_branches(ast.parse(source), names))) == [1, 2, 3, 4, 6]


def test_every_package_is_installed():
    """pyproject.toml lists the packages a wheel carries by name: a subpackage left out installs
    a synth that fails on import (synth.plan.terms once did, found only by a fresh install)."""
    import tomllib

    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    packages = {".".join(path.parent.relative_to(ROOT).parts) for path in PACKAGE.rglob("__init__.py")}
    assert sorted(packages - declared) == []
