"""The instrument's layering: every module on a floor, imports only run down, no cycle, no pytest below the
recorder; the instrument never imports the library it measures, nor the library the instrument."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
ROOT = "perfbudget"

#: Each first-level module or package of ``src/perfbudget`` and its floor: it imports only from
#: lower floors (rule <- measure <- budgets <- judge <- results <- recorder <- plugin/cli, reports reading
#: records). The verdict package's modules have floors of their own (``verdict.<module>``): the
#: rule sits below every measurement and the decision text above the report.
#: ``perfbudget`` is the package root, which re-exports the public API and so sits on top.
FLOORS: dict[str, int] = {
    "device": 0, "metrics": 0, "fileio": 0, "exitcodes": 0, "vocabulary": 0,  # data and files, nothing of ours below
    "settings": 0,  # command line, environment, ini file and run spec, read once: every floor reads it
    "lease": 0,  # the GPU check's lease plan: data, stdlib only
    "verdict": 0,  # the package's __init__: a docstring, importing nothing
    "verdict.rule": 1,  # the one decision rule: metrics and numbers only
    "measure": 2,
    "budgets": 3, "artifacts": 3, "extras": 3, "pinning": 3, "preflight": 3,
    "verdict.judge": 4, "verdict.ratio": 4,  # a check's verdict, the run's way of judging, the test's outcome
    "results": 5,
    "report": 6, "instructions_run": 6,
    "recorder": 7, "verdict.text": 7, "show": 7, "ab": 7,
    "session": 8, "history": 8,  # history reads results and the A/B run's statistics
    "xdist": 9, "cli": 9, "hookspec": 9,
    "benchmark": 9,  # pytest-benchmark's fixture and markers over the recorder, registered by the plugin
    "github": 9,  # the pull-request comment and job summary on GitHub Actions (action.yml)
    "plugin": 10,
    ROOT: 11,
}

#: Lower modules a module still may not use: reports read records, they never judge.
NEVER: dict[str, set[str]] = {"report": {"budgets", "verdict.judge", "recorder"}}

#: Floors up to this one are the instrument proper, callable from a notebook: they never import pytest.
PYTEST_FREE_UP_TO = FLOORS["verdict.judge"]


def _modules(package: str) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package ``__init__``) for every module under ``src/<package>``."""
    out = {}
    for path in sorted((SRC / package).rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def imports_of(source: str, importer: str, *, is_pkg: bool, known: set[str] | frozenset[str]) -> set[str]:
    """Dotted names of what ``source`` (the module ``importer``) imports, anywhere in it (functions too).

    ``from X import y`` counts as ``X.y`` when that is a module in ``known``, else as ``X``;
    relative imports are resolved against ``importer``.
    """
    here = importer.split(".") if is_pkg else importer.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for a in node.names:
                sub = f"{module}.{a.name}"
                out.add(sub if sub in known else module)
    return out


MODULES = _modules(ROOT)
GRAPH: dict[str, set[str]] = {
    name: imports_of(path.read_text(encoding="utf-8"), name, is_pkg=is_pkg, known=frozenset(MODULES))
    for name, (path, is_pkg) in MODULES.items()
}


def _floor_of(dotted: str) -> str:
    parts = dotted.split(".")
    if len(parts) > 2 and f"{parts[1]}.{parts[2]}" in FLOORS:
        return f"{parts[1]}.{parts[2]}"
    return parts[1] if len(parts) > 1 else ROOT


def test_the_import_scanner_sees_every_form() -> None:
    known = {"perfbudget.results", "perfbudget.metrics", "perfbudget.device", "perfbudget.fileio",
             "perfbudget.measure.nvml", "perfbudget.measure.stats"}
    top = """
from . import results
from perfbudget import device, Record
import perfbudget.fileio
def later():
    from .measure import nvml
"""
    assert imports_of(top, "perfbudget.session", is_pkg=False, known=known) == {
        "perfbudget.results", "perfbudget.device", "perfbudget", "perfbudget.fileio", "perfbudget.measure.nvml"}
    inner = "from .. import metrics\nfrom . import stats\nfrom ..measure.nvml import gpu_count\n"
    assert imports_of(inner, "perfbudget.measure.timing", is_pkg=False, known=known) == {
        "perfbudget.metrics", "perfbudget.measure.stats", "perfbudget.measure.nvml"}
    assert imports_of("from . import stats", "perfbudget.measure", is_pkg=True, known=known) == {
        "perfbudget.measure.stats"}


def test_every_module_has_a_floor() -> None:
    present = {_floor_of(m) for m in MODULES}
    assert present - set(FLOORS) == set(), "give these modules a floor in FLOORS"
    assert set(FLOORS) - present == set(), "these FLOORS entries name no module"


@pytest.mark.parametrize("floor", sorted(FLOORS))
def test_no_module_imports_one_on_its_floor_or_above(floor: str) -> None:
    bad = sorted(
        f"{name} imports {target}"
        for name, targets in GRAPH.items() if _floor_of(name) == floor
        for target in targets if target.split(".")[0] == ROOT and (other := _floor_of(target)) != floor
        and other in FLOORS and (FLOORS[other] >= FLOORS[floor] or other in NEVER.get(floor, set()))
    )
    assert not bad, f"perfbudget/{floor} (floor {FLOORS[floor]}) reaches up or sideways: {bad}"


def test_no_import_cycle_between_modules() -> None:
    # Importing ``a.b.c`` first runs the packages ``a`` and ``a.b``, so an import depends on the
    # target's parent packages too (unless the importer is inside them, already running).
    deps: dict[str, set[str]] = {}
    for name, targets in GRAPH.items():
        deps[name] = set()
        for target in targets:
            if target not in MODULES:
                continue
            parts = target.split(".")
            parents = {".".join(parts[:i]) for i in range(1, len(parts))}
            deps[name] |= {target} | {p for p in parents if p in MODULES and not f"{name}.".startswith(f"{p}.")}
        deps[name].discard(name)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(deps[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(deps):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def _top_levels(package: str) -> dict[str, set[str]]:
    """Top-level names each module of ``src/<package>`` imports (absolute imports, functions too)."""
    mods = _modules(package)
    return {name: {t.split(".")[0] for t in imports_of(path.read_text(encoding="utf-8"), name, is_pkg=is_pkg,
                                                         known=frozenset(mods))}
            for name, (path, is_pkg) in mods.items()}


@pytest.mark.parametrize(("package", "forbidden"), [
    ("perfbudget", "torchlevers"),
    ("torchlevers", "perfbudget"),
    ("torchlevers", "pytest"),
    ("torchlevers", "_pytest"),
])
def test_package_does_not_import(package: str, forbidden: str) -> None:
    offenders = [m for m, names in _top_levels(package).items() if forbidden in names]
    assert not offenders, f"{package} must not import {forbidden}: {offenders}"


def test_the_instrument_below_the_recorder_never_imports_pytest() -> None:
    offenders = sorted(m for m, names in _top_levels(ROOT).items()
                       if FLOORS[_floor_of(m)] <= PYTEST_FREE_UP_TO and names & {"pytest", "_pytest"})
    assert not offenders, f"measure, budgets, judge and the modules below the recorder import pytest: {offenders}"
    assert {"measure", "budgets", "verdict.judge"} <= {f for f, n in FLOORS.items() if n <= PYTEST_FREE_UP_TO}


def test_the_history_never_imports_pytest() -> None:
    """``perfbudget.history`` runs in a CI job and from a notebook, never inside pytest."""
    offenders = sorted(m for m, names in _top_levels(ROOT).items()
                       if _floor_of(m) == "history" and names & {"pytest", "_pytest"})
    assert not offenders and any(_floor_of(m) == "history" for m in MODULES), offenders


def test_importing_the_instrument_loads_no_pytest() -> None:
    """The static check above reads each module's own imports; the package's ``__init__`` runs first on any
    import, so it must not load pytest either (a notebook, the history job, the A/B driver's turn client)."""
    code = ("import sys, perfbudget.measure.turns, perfbudget.measure.timing, perfbudget.budgets, perfbudget.verdict.judge, "
            "perfbudget.results, perfbudget.history; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pytest', '_pytest')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout


#: The longest a function of the instrument may be, docstring included: one decision or one step of a procedure.
MAX_FUNCTION_LINES = 80


def test_no_function_of_the_instrument_is_longer_than_one_step() -> None:
    long = [f"{path.relative_to(SRC)}::{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in sorted((SRC / ROOT).rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"split by meaning: {long}"
