"""Every code example of the README and the docs, run as a user would: each Python example names
the file it is (``# tests/perf/test_quickstart.py``), is written there in a scratch repository and
run by pytest (the hooks page's ``conftest.py``: ``tests/test_plugin_hooks.py``); each budget file
example is parsed by the budgets loader."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from perfbudget.budgets.loader import parse_text

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Subprocess runs: torch.compile's registrations do not survive an in-process module restore.
ARGS = ("-p", "no:cacheprovider", "-o", "perfbudget_max_load=1e9", "-o", "perfbudget_html=false")


def _blocks(lang: str) -> list[tuple[Path, str]]:
    """``(page, code)`` of every fenced block in ``lang``, the indentation of a list item removed."""
    out = []
    for page in PAGES:
        for indent, code in re.findall(rf"^( *)```{lang}\n(.*?)^\1```", page.read_text(encoding="utf-8"), flags=re.S | re.M):
            out.append((page, "\n".join(line.removeprefix(indent) for line in code.splitlines()) + "\n"))
    return out


def docs_text() -> str:
    """The README and every docs page, one text: what tests of documented behaviour search."""
    return "\n".join(page.read_text(encoding="utf-8") for page in PAGES)


def example(name: str) -> list[str]:
    """The Python examples that are the file ``name``."""
    return [code for _, code in _blocks("python") if code.split("\n", 1)[0].split()[1:2] == [name]]


def test_every_python_example_names_the_file_it_is() -> None:
    blocks = _blocks("python")
    assert len(blocks) >= 4, [str(p) for p, _ in blocks]
    for page, code in blocks:
        first = code.split("\n", 1)[0]
        assert re.match(r"# [\w./-]+\.py\b", first), f"{page.name}: a Python example starts '# path/to/file.py': {first!r}"


@pytest.mark.integration  # two whole sessions
def test_the_quickstart_writes_its_budgets_then_passes(pytester: pytest.Pytester) -> None:
    readme, *docs = example("tests/perf/test_quickstart.py")
    assert docs == [readme], "README.md and docs/getting-started.md show the same quickstart"
    pytester.makepyfile(**{"tests/perf/test_quickstart": readme})
    first = pytester.runpytest_subprocess(*ARGS, "tests/perf", "--update-budgets")
    first.assert_outcomes(passed=2)
    assert {p.name for p in (pytester.path / "budgets").glob("*.yaml")} >= {"cpu.yaml"}
    second = pytester.runpytest_subprocess(*ARGS, "tests/perf")
    records = json.loads((pytester.path / ".perfbudget" / "results.json").read_text())["records"]
    outcomes = {r["metric"]: r["outcome"] for r in records if r["key"] == "quickstart-train"}
    assert outcomes["flops"] == "pass" and outcomes["peak_allocated_mib[optimizer]"] == "pass", outcomes
    assert "step_ms" in outcomes
    assert second.ret in (0, 1)  # timing may read stale or fail on a loaded 2-core machine


@pytest.mark.integration  # two whole sessions with torch.compile: more than a minute
def test_the_full_example_writes_its_budgets_then_passes(pytester: pytest.Pytester) -> None:
    [code] = example("tests/perf/test_my_model.py")
    pytester.makepyfile(test_my_model=code)
    first = pytester.runpytest_subprocess(*ARGS, "--update-budgets")
    first.assert_outcomes(passed=5)
    files = sorted(p.name for p in (pytester.path / "budgets").glob("*.yaml"))
    assert "cpu.yaml" in files and any(f.startswith("cpu-") for f in files), files
    second = pytester.runpytest_subprocess(*ARGS)
    records = json.loads((pytester.path / ".perfbudget" / "results.json").read_text())["records"]
    by_metric = {(r["key"], r["metric"]): r["outcome"] for r in records}
    for key, metric in [("my-model-train", "flops"), ("my-model-train", "peak_allocated_mib[forward]"),
                        ("my-model-train", "nonfinite_grads"), ("my-model-train", "loss_drift"),
                        ("my-model-compiled", "graph_breaks"), ("my-model-compiled", "recompiles")]:
        assert by_metric[(key, metric)] == "pass", (key, metric, by_metric)
    assert {("my-model-train", "step_ms"), ("my-model-compiled", "step_ms")} <= set(by_metric)
    assert second.ret in (0, 1)


def test_every_budget_file_example_parses() -> None:
    blocks = [(page, code) for page, code in _blocks("yaml") if code.startswith("schema:")]
    assert blocks, "the docs show a budget file"
    for page, code in blocks:
        parsed = parse_text(code, f"{page.name} example")
        assert parsed.errors == [] and parsed.entries, (page.name, parsed.errors)
