"""``perfbudget ab`` with real pytest sides: the plugin's --perf-collect, its timers taking turns, this instrument on both sides."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from perfbudget.ab.run import ABConfig, run_ab
from perfbudget.results import load_results

# Real pytest sides: seconds each, timing for real.
pytestmark = pytest.mark.integration

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
    # +100 % against a tolerance of +10 %: a margin no load closes.
    assert step.outcome == "fail" and step.base is not None and step.base.pairs >= 2, (step.reason, logs)
    assert "[tolerance from" in step.reason and "cpu.yaml:6]" in step.reason
    assert result.exit_code == 1
    # The timers took turns: each side was granted the machine several times per pair.
    for pair in result.pairs:
        assert pair.turns.grants("base") >= 3 and pair.turns.grants("head") >= 3, pair.turns.as_dict()
        assert pair.sides["base"].returncode == 0 and pair.sides["head"].returncode == 0


# Samples fixed by construction, so that what the driver decides does not depend on the machine:
# the noisy steps' head reads 50 % slower in odd pairs and the base in even ones, so the pairs'
# ratios (1.5, then 1/1.5) cannot close at --max-pairs 3; the quiet step reads the same on both sides.
STEPS_LIB = """\
import re
import sys

from perfbudget.settings import run_spec


def _pair():
    args = sys.argv
    path = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--perf-json"), "")
    found = re.search(r"pair-([0-9]+)", path)
    return int(found.group(1)) if found else 0


SLOW = 1.5 if (run_spec().side == "head") == (_pair() % 2 == 1) else 1.0
NOISY_MS = [0.3 * SLOW + 0.001 * (i % 7) for i in range(20)]
QUIET_MS = [4.0 + 0.01 * (i % 5) for i in range(20)]
"""

# Written in this order: the head's order is the file's, not the alphabet's.
STEPS_TEST = """\
import pytest

import mylib


@pytest.mark.budget("noisy-step")
@pytest.mark.parametrize("batch", ["big batch"])
def test_noisy(perf, batch):
    perf.record("step_ms", mylib.NOISY_MS)


@pytest.mark.budget("counts")
def test_exact_only(perf):
    perf.record("flops", 1000.0)


@pytest.mark.budget("quiet-step")
def test_quiet(perf):
    perf.record("step_ms", mylib.QUIET_MS)


@pytest.mark.budget("noisy-step")
def test_also_noisy(perf):
    perf.record("step_ms", mylib.NOISY_MS)
"""

STEPS_BUDGETS = """\
schema: 1
device:
  type: cpu
budgets:
  noisy-step:
    step_ms:
      value: 1.0
      tolerance: 0.3
      ab_tolerance: 0.05
  quiet-step:
    step_ms:
      value: 1.0
      tolerance: 0.3
      ab_tolerance: 1.0
  counts:
    flops:
      value: 1000
      tolerance: 0.0
"""


def test_later_pairs_rerun_only_undecided_tests_and_an_unresolvable_check_is_inconclusive(
        make_repo: Callable[..., Path]) -> None:
    files = {"src/mylib/__init__.py": STEPS_LIB, "perf/test_steps.py": STEPS_TEST, "budgets/cpu.yaml": STEPS_BUDGETS}
    repo = make_repo(files, {"src/mylib/__init__.py": STEPS_LIB + "\n# the head's change\n"})
    result = run_ab(ABConfig(root=repo, base="HEAD", min_pairs=2, max_pairs=3, burst_ms=30,
                             pytest_args=("perf", "-q", "-p", "no:randomly")), say=lambda line: None)
    logs = "\n".join(result.problems)
    node = "perf/test_steps.py::"
    noisy_id, exact_id, quiet_id, also_id = (node + t for t in ("test_noisy[big batch]", "test_exact_only",
                                                                "test_quiet", "test_also_noisy"))
    by_node = {r.nodeid: r for r in result.results.records}
    for nodeid in (noisy_id, also_id):
        noisy = by_node[nodeid]
        # Beyond reach after two pairs: at its own spread, the one pair left would not decide it.
        assert noisy.outcome == "inconclusive" and noisy.base is not None and noisy.base.pairs == 2, (noisy.reason, logs)
        info = noisy.base
        assert info is not None and info.detectable is not None and info.detectable > 0
        assert f"this run could resolve changes beyond +{info.detectable * 100:.3g} %" in noisy.reason
    quiet, exact = by_node[quiet_id], by_node[exact_id]
    assert quiet.outcome == "pass" and quiet.base is not None and quiet.base.pairs == 2, (quiet.reason, logs)
    assert exact.outcome == "pass" and "vs base: same as the base (1000)" in exact.reason
    assert result.exit_code == 0 and result.stopped == "beyond reach" and result.comparison.inconclusive
    # Pair 1 ran the user's selection; pair 2 every test with a statistical check (none has
    # min_pairs yet); no pair 3: what is still straddling is beyond its reach. The same nodeids
    # on both sides, in the head's order, brackets and spaces included.
    runs = result.results.meta.ab.runs
    assert [r["tests"] for r in runs] == [None, [noisy_id, quiet_id, also_id]], logs
    assert [r["ran"] for r in runs] == [[noisy_id, exact_id, quiet_id, also_id], [noisy_id, quiet_id, also_id]]
    base_ran = [list(dict.fromkeys(r.nodeid for r in load_results(p.sides["base"].results).records))
                for p in result.pairs]
    assert base_ran == [r["ran"] for r in runs]
