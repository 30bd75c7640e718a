"""The limits the code's layout keeps (issue 26): the package's top holds few modules, and no
module or class grows past a size a reader takes in at once."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ocrd"
MOST_MODULE_LINES = 500
MOST_CLASS_LINES = 300
MOST_TOP_MODULES = 15


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_is_longer_than_500_lines() -> None:
    lengths = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in modules()}
    assert {name: n for name, n in lengths.items() if n > MOST_MODULE_LINES} == {}
    assert len(lengths) > 100  # the whole package was looked at


def test_no_class_is_longer_than_300_lines() -> None:
    long = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MOST_CLASS_LINES:
                    long[f"{path.relative_to(PACKAGE)}:{node.name}"] = lines
    assert long == {}


def test_the_package_top_holds_at_most_15_modules() -> None:
    top = [path.name for path in PACKAGE.glob("*.py")]
    assert len(top) <= MOST_TOP_MODULES, sorted(top)


MOST_PARAMETERS = 6


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """A function's positional and keyword parameters, `self` and `cls` left out."""
    arguments = function.args
    named = arguments.posonlyargs + arguments.args + arguments.kwonlyargs
    return [a.arg for a in named if a.arg not in ("self", "cls")]


def test_no_function_takes_more_than_6_parameters() -> None:
    """Beyond that a caller passes a context object (a document's or a page's) instead."""
    many = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                count = len(_parameters(node))
                if count > MOST_PARAMETERS:
                    many[f"{path.relative_to(PACKAGE)}:{node.lineno}:{node.name}"] = count
    assert many == {}


def test_no_two_classes_in_the_package_share_a_name() -> None:
    """A name says which class is meant, wherever it is read (logs, tracebacks, grep)."""
    where: dict[str, list[str]] = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(str(path.relative_to(PACKAGE)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
    assert len(where) > 100  # the whole package was looked at


def _only_re_exports(statement: ast.stmt) -> bool:
    """Imports, `__all__`, and the module's docstring."""
    if isinstance(statement, ast.Import | ast.ImportFrom):
        return True
    if isinstance(statement, ast.Assign | ast.AnnAssign):
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        return all(isinstance(t, ast.Name) and t.id == "__all__" for t in targets)
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)


def test_package_inits_only_re_export() -> None:
    """What a package does is in its modules, where its name says it is."""
    inits = sorted(PACKAGE.rglob("__init__.py"))
    holding = {
        str(path.relative_to(PACKAGE)): [
            f"line {s.lineno}" for s in ast.parse(path.read_text()).body if not _only_re_exports(s)
        ]
        for path in inits
    }
    assert {name: lines for name, lines in holding.items() if lines} == {}
    assert len(inits) > 5  # every package was looked at
