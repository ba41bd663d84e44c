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


def _perfbudget_imports(rel: str) -> set[str]:
    """perfbudget submodules (first level) that a file or folder of ``src/perfbudget`` imports."""
    root = SRC / "perfbudget"
    paths = sorted((root / rel).rglob("*.py")) if (root / rel).is_dir() else [root / f"{rel}.py"]
    out: set[str] = set()
    for path in paths:
        pkg = path.relative_to(SRC).with_suffix("").parts[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = [*pkg[: len(pkg) - node.level + 1], *(node.module or "").split(".")]
                else:
                    parts = (node.module or "").split(".")
                if len(parts) > 1 and parts[0] == "perfbudget" and parts[1]:
                    out.add(parts[1])
            elif isinstance(node, ast.Import):
                out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("perfbudget.")}
    return out


#: measure <- budgets <- judge <- recorder <- plugin/cli; reports read records only.
FLOORS = {
    "measure": {"budgets", "judge", "recorder", "plugin", "session", "xdist", "report", "cli", "ab", "results"},
    "budgets": {"judge", "recorder", "plugin", "session", "xdist", "report", "cli", "ab", "results"},
    "judge": {"recorder", "plugin", "session", "xdist", "report", "cli", "ab"},
    "recorder": {"plugin", "session", "xdist", "report", "cli", "ab", "outcome"},
    "report": {"judge", "recorder", "plugin", "session", "xdist", "cli", "ab", "budgets"},
}


@pytest.mark.parametrize("floor", sorted(FLOORS))
def test_no_module_imports_one_above_it(floor: str) -> None:
    above = _perfbudget_imports(floor) & FLOORS[floor]
    assert not above, f"perfbudget/{floor} imports {sorted(above)}, which sit above it"
