"""The documents stay true: each test SECURITY.md names behind a promise exists (the trust
model cannot point at a test renamed or removed), and the README's links lead somewhere."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `tests/test_x.py::name` or, after one in the same cell, `::name`; a parameter id may follow.
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)?::(\w+)(?:\[[^\]]*\])?`")


def named_tests() -> list[tuple[str, str]]:
    found = []
    for line in (ROOT / "SECURITY.md").read_text().splitlines():
        module = None
        for match in REFERENCE.finditer(line):
            module = match.group(1) or module
            assert module is not None, f"SECURITY.md: {match.group(0)} names no module: {line}"
            found.append((module, match.group(2)))
    return found


def functions_in(module: str) -> set[str]:
    tree = ast.parse((ROOT / module).read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def test_every_test_security_md_names_exists() -> None:
    named = named_tests()
    missing = [f"{m}::{n}" for m, n in named if n not in functions_in(m)]
    assert missing == []
    assert len(named) > 40  # the whole file was read


def test_the_readmes_links_lead_to_files_that_exist() -> None:
    """The README is the front page and not part of the manual's build (mkdocs checks the
    manual's links): each of its relative links names a file of the checkout."""
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
    assert len(targets) > 10
    assert [target for target in targets if not (ROOT / target).exists()] == []
