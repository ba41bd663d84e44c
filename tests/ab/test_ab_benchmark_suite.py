"""A pytest-benchmark suite (examples/pytest-benchmark-suite) under ``perfbudget ab`` with no edit.

The sides time every benchmark with perfbudget's ``benchmark`` fixture (pytest-benchmark, where
installed, stands aside). Wide-margin promises only: an A/A run fails nothing, and 30 % more work in
one benchmarked function fails that benchmark alone.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from perfbudget.ab.run import ABConfig, ABRun, run_ab
from perfbudget.benchmark import BENCHMARK_METRIC
from perfbudget.report.comment import pr_comment

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pytest-benchmark-suite"
BENCHMARKS = {"benchmarks/test_search.py::test_normalize", "benchmarks/test_search.py::test_cosine_topk[10]",
              "benchmarks/test_search.py::test_tokenize", "benchmarks/test_signal.py::test_sort_inplace",
              "benchmarks/test_signal.py::test_smooth"}


def example() -> dict[str, str]:
    return {str(p.relative_to(EXAMPLE)): p.read_text() for p in EXAMPLE.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def ab(repo: Path, said: list[str], *, max_pairs: int = 3) -> ABRun:
    return run_ab(ABConfig(root=repo, base="HEAD", min_pairs=2, max_pairs=max_pairs, pytest_args=("-q",)),
                  say=said.append)


def test_an_a_a_run_compares_every_benchmark_with_the_base_and_fails_nothing(make_repo: Callable[..., Path]) -> None:
    said: list[str] = []
    result = ab(make_repo(example()), said)
    checks = {r.nodeid: r for r in result.results.records if r.metric == BENCHMARK_METRIC}
    assert set(checks) == BENCHMARKS, said
    assert all(r.vs_base is not None and r.outcome != "fail" for r in checks.values()), [
        (r.nodeid, r.outcome, r.reason) for r in checks.values()]
    assert result.exit_code == 0, said
    assert checks["benchmarks/test_search.py::test_cosine_topk[10]"].extra["benchmark"] == {
        "group": "search", "extra_info": {"corpus_rows": 2000}}


def test_thirty_percent_more_work_in_one_function_fails_that_benchmark_alone(make_repo: Callable[..., Path]) -> None:
    files = example()
    lib = "src/vecsearch/__init__.py"
    assert "SMOOTH_PASSES = 10\n" in files[lib]
    said: list[str] = []
    # Up to 6 pairs: later pairs re-run only what is undecided, so a noisy minute (a shared 2-core
    # machine) costs time, not the verdict; with at most 3, +30 % was once left undecided in CI.
    result = ab(make_repo(files, {lib: files[lib].replace("SMOOTH_PASSES = 10\n", "SMOOTH_PASSES = 13\n")}), said,
                max_pairs=6)
    failed = {r.nodeid for r in result.results.records if r.outcome == "fail"}
    assert failed == {"benchmarks/test_signal.py::test_smooth"}, [(r.nodeid, r.reason) for r in result.results.records]
    assert result.exit_code == 1
    comment = pr_comment(result.results)
    assert [line for line in comment.splitlines() if "smooth" in line and BENCHMARK_METRIC in line], comment
