"""``perfbudget ab`` refuses a head that measures with other settings than its base: real pytest sides."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from perfbudget.ab.run import ABConfig, run_ab

LIB = """\
def step():
    return sum(range(4000))
"""

TEST = """\
import pytest

import mylib


@pytest.mark.budget("my-step")
def test_step(perf):
    perf.time("step_ms", mylib.step, warmup_ms=20, min_samples=20, max_ms=200)
"""


@pytest.mark.integration
def test_a_pull_request_that_changes_the_threads_is_refused_as_not_comparable(make_repo: Callable[..., Path]) -> None:
    repo = make_repo({"src/mylib/__init__.py": LIB, "perf/test_step.py": TEST,
                      "pytest.ini": "[pytest]\nperfbudget_threads = 1\n"},
                     {"pytest.ini": "[pytest]\nperfbudget_threads = 2\n"})
    result = run_ab(ABConfig(root=repo, base="HEAD", min_pairs=2, max_pairs=3, burst_ms=30,
                             pytest_args=("perf", "-q")), say=lambda line: None)
    (step,) = [r for r in result.results.records if r.metric == "step_ms"]
    assert step.outcome == "error" and step.reason.startswith("not comparable: threads 1 vs 2"), \
        (step.reason, result.problems)
    assert step.base is not None and step.base.not_comparable == "threads 1 vs 2"
    assert result.exit_code == 1 and len(result.pairs) == 1  # no pair spent on what no pair can compare
