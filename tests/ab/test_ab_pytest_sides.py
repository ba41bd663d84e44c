"""``perfbudget ab`` with real pytest sides: the plugin's --perf-collect, its timers taking turns, this instrument on both sides."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from perfbudget.ab.run import ABConfig, run_ab

LIB = """\
FACTOR = {factor}


def step():
    x = 0
    for i in range(int(4000 * FACTOR)):
        x += i
    return x
"""

TEST = """\
import pytest

import mylib


@pytest.mark.budget("my-step")
def test_step(perf):
    perf.time("step_ms", mylib.step, warmup_ms=20, min_samples=20, max_ms=300)
"""

BUDGETS = """\
schema: 1
device:
  type: cpu
budgets:
  my-step:
    step_ms:
      value: 1.0
      tolerance: 0.3
      ab_tolerance: 0.1
"""


def test_a_planted_slowdown_in_the_library_fails_through_real_pytest_sides(make_repo: Callable[..., Path]) -> None:
    repo = make_repo({"src/mylib/__init__.py": LIB.format(factor=1.0), "perf/test_step.py": TEST,
                      "budgets/cpu.yaml": BUDGETS},
                     {"src/mylib/__init__.py": LIB.format(factor=2.0)})
    result = run_ab(ABConfig(root=repo, base="HEAD", min_pairs=2, max_pairs=3, burst_ms=30,
                             pytest_args=("perf", "-q")), say=lambda line: None)
    logs = "\n".join(p for p in result.problems)
    (step,) = [r for r in result.results.records if r.metric == "step_ms"]
    assert step.outcome == "fail" and step.base is not None, (step.reason, logs)
    assert step.base.ratio is not None and step.base.ratio > 1.3 and step.base.pairs >= 2, (result.stopped, logs)
    assert "[tolerance from" in step.reason and "cpu.yaml:6]" in step.reason
    assert result.exit_code == 1
    # The timers took turns: each side was granted the machine several times per pair.
    for pair in result.pairs:
        assert pair.turns.grants("base") >= 3 and pair.turns.grants("head") >= 3, pair.turns.as_dict()
        assert pair.sides["base"].returncode == 0 and pair.sides["head"].returncode == 0
