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
