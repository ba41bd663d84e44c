"""The instrument never imports the library it measures; the library never imports the instrument."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"


def _imported_top_levels(package: str) -> dict[str, set[str]]:
    """Top-level module names each file of ``src/<package>`` imports (absolute imports only)."""
    out: dict[str, set[str]] = {}
    for path in sorted((SRC / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        out[str(path.relative_to(SRC))] = names
    return out


@pytest.mark.parametrize(("package", "forbidden"), [
    ("perfbudget", "torchlevers"),
    ("torchlevers", "perfbudget"),
    ("torchlevers", "pytest"),
])
def test_package_does_not_import(package: str, forbidden: str) -> None:
    offenders = [f for f, names in _imported_top_levels(package).items() if forbidden in names]
    assert not offenders, f"{package} must not import {forbidden}: {offenders}"
