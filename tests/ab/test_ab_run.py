"""``perfbudget ab`` end to end with two tiny fake sides taking turns for real (no pytest sides).

A pair's sides are processes that time for real: the tests that run pairs are in the integration
tier, and assert what holds for any timing, or the instrument's promises with wide margins (an A/A
fails nothing, a +100 % plant fails). Verdicts on fixed ratios: test_ab_ratios.py, test_ab_merge.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from ab_support import HERE

from perfbudget.ab import pairs as pairs_module
from perfbudget.ab.cli import build_parser, main, register, summary
from perfbudget.ab.coordinator import Coordinator
from perfbudget.ab.pairs import PairRun, SideSetup, parse_cpus
from perfbudget.ab.run import ABConfig, ABRun, StopReason, UsageError, run_ab
from perfbudget.cli import main as report_main
from perfbudget.results import load_results
from perfbudget.verdict.ratio import pair_ratio

FAKE_SIDE = HERE / "fake_side.py"

# Busy work proportional to FACTOR: a planted slowdown is a change of the library's code.
FAKELIB = """\
FACTOR = {factor}
FLOPS = {flops}
EXTRA = {extra}


def step():
    x = 0
    for i in range(int(6000 * FACTOR)):
        x += i
    return x
"""

BUDGETS = """\
schema: 1
device:
  type: cpu
budgets:
  fake-step:
    step_ms:
      value: 1.0
      tolerance: 0.3
      ab_tolerance: 0.2
    flops:
      value: 1000
      tolerance: 0.0
"""


def lib(factor: float = 1.0, flops: int = 1000, extra: bool = False) -> str:
    return FAKELIB.format(factor=factor, flops=flops, extra=extra)


def fake_command(setup: SideSetup) -> list[str]:
    return [sys.executable, str(FAKE_SIDE), str(setup.results)]


def run(repo: Path, **kw: object) -> ABRun:
    settings: dict[str, object] = {"min_pairs": 2, "max_pairs": 4, "burst_ms": 15, **kw}
    config = ABConfig(root=repo, base="HEAD", **settings)  # type: ignore[arg-type]
    return run_ab(config, command=fake_command, say=lambda line: None)


def test_a_bad_burst_length_is_a_usage_error_before_any_pair(make_repo: Callable[..., Path],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo({"src/fakelib/__init__.py": lib(), "budgets/cpu.yaml": BUDGETS})
    monkeypatch.setenv("PERFBUDGET_TURNS_BURST_MS", "fast")
    with pytest.raises(UsageError, match="PERFBUDGET_TURNS_BURST_MS"):
        run(repo, burst_ms=None)
    assert not list((repo / ".perfbudget" / "ab").glob("pair-*"))


def side_log(path: Path) -> dict[str, list]:
    return json.loads(Path(str(path) + ".bursts.json").read_text())


def bursts(path: Path) -> list[tuple[float, float]]:
    return [tuple(x) for x in side_log(path)["bursts"]]


def assert_never_both_running(result: ABRun) -> None:
    for pair in result.pairs:
        base, head = (bursts(pair.sides[s].results) for s in ("base", "head"))
        assert len(base) == len(head) == 6
        for b0, b1 in base:
            assert all(b1 <= h0 or h1 <= b0 for h0, h1 in head)


def test_a_fast_tier_test_cannot_start_an_ab_side(make_repo: Callable[..., Path]) -> None:
    repo = make_repo({"src/fakelib/__init__.py": lib(), "budgets/cpu.yaml": BUDGETS})
    with pytest.raises(pytest.fail.Exception, match="starts an A/B side process"):
        run(repo)


@pytest.mark.integration
def test_aa_passes_through_real_turn_taking(make_repo: Callable[..., Path]) -> None:
    repo = make_repo({"src/fakelib/__init__.py": lib(), "budgets/cpu.yaml": BUDGETS})
    # A sub-millisecond step timed for 90 ms a side: on a loaded machine its per-pair sd reaches
    # 16 %, and an A/A may end inconclusive, after any number of pairs and for any stop reason
    # (benchmarks/process-modes-cpu.md). What an A/A must never be is a failure.
    result = run(repo, max_pairs=6)
    assert result.exit_code == 0, [r.reason for r in result.results.records]
    step, flops = result.results.records
    assert step.metric == "step_ms" and step.base is not None, step.reason
    assert step.outcome in ("pass", "inconclusive") and 2 <= step.base.pairs <= 6, step.reason
    assert flops.outcome == "pass" and "same as the base (1000)" in flops.reason
    assert result.pairs[0].first == "base" and result.pairs[1].first == "head"
    assert all(p.turns.grants("base") >= 6 and p.turns.grants("head") >= 6 for p in result.pairs)
    assert_never_both_running(result)
    # Both sides ran pinned to one and the same CPU.
    cpus = {tuple(side_log(p.sides[s].results)["cpus"]) for p in result.pairs for s in ("base", "head")}
    assert cpus == {result.results.meta.ab.cpus} and len(cpus.pop()) == 1
    saved = load_results(repo / ".perfbudget" / "ab" / "results.json")
    meta = saved.meta.ab
    assert meta.base_commit and meta.pairs == len(result.pairs) and meta.stopped in set(StopReason)
    assert meta.burst_ms == 15  # the spread depends on it: calibrations keep it
    assert saved.records[0].base == step.base


@pytest.mark.integration
def test_a_planted_slowdown_fails_and_exact_changes_are_shown(make_repo: Callable[..., Path]) -> None:
    repo = make_repo({"src/fakelib/__init__.py": lib(), "budgets/cpu.yaml": BUDGETS},
                     {"src/fakelib/__init__.py": lib(factor=2.0, flops=1200, extra=True)})
    result = run(repo, max_pairs=6)  # +100 % against a tolerance of +20 %: a margin no load closes
    assert result.exit_code == 1
    by_metric = {r.metric: r for r in result.results.records}
    step = by_metric["step_ms"]
    assert step.outcome == "fail" and "entirely beyond the tolerance +20 %" in step.reason, step.reason
    assert "[tolerance from" in step.reason and "cpu.yaml:6]" in step.reason
    assert "vs base: base 1000 -> head 1200 (+20.0 %)" in by_metric["flops"].reason
    extra = by_metric["latency_ms[extra]"]
    info = extra.base
    assert info is not None and not info.compared and extra.outcome == "unbudgeted"
    assert "not compared with the base: the base lacks it" in extra.reason
    assert_never_both_running(result)
    # Every report renders the merged file with its "vs base" columns.
    for fmt in ("terminal", "markdown", "html", "junit"):
        out = repo / f"report.{fmt}"
        assert report_main(["report", str(result.path), "--format", fmt, "-o", str(out), "--exit-zero"]) == 0
        assert "head/base" in out.read_text() or ".ratio" in out.read_text(), fmt


NO_STEP_BUDGET = BUDGETS.replace("    step_ms:\n      value: 1.0\n      tolerance: 0.3\n      ab_tolerance: 0.2\n", "")
BASE_CANNOT_RUN = "raise ImportError('the base predates fakelib')\n"


@pytest.mark.integration
def test_a_base_that_cannot_run_is_an_error_naming_why_and_the_flag(make_repo: Callable[..., Path]) -> None:
    repo = make_repo({"src/fakelib/__init__.py": BASE_CANNOT_RUN, "budgets/cpu.yaml": NO_STEP_BUDGET},
                     {"src/fakelib/__init__.py": lib()})
    result = run(repo)
    assert result.exit_code == 1 and result.stopped == "base unavailable" and len(result.pairs) == 1
    (message,) = [p for p in result.problems if p.startswith("the base ")]
    assert "could not run under this instrument (pytest exited 1;" in message and "--allow-missing-base" in message
    step, flops = result.results.records
    assert step.outcome == "error" and step.vs_base is None and "--allow-missing-base" in step.reason
    assert flops.outcome == "pass" and "not compared with the base" in flops.reason  # exact: the head's budgets
    assert result.results.meta.ab.allow_missing_base is False


@pytest.mark.integration
def test_a_base_that_cannot_run_is_judged_on_budgets_with_allow_missing_base(make_repo: Callable[..., Path]) -> None:
    repo = make_repo({"src/fakelib/__init__.py": BASE_CANNOT_RUN, "budgets/cpu.yaml": NO_STEP_BUDGET},
                     {"src/fakelib/__init__.py": lib()})
    result = run(repo, allow_missing_base=True)
    assert result.stopped == "base unavailable" and len(result.pairs) == 1
    step, flops = result.results.records
    assert step.outcome == "unbudgeted" and step.vs_base is None
    assert "the base could not run under this instrument (pytest exited 1;" in step.reason
    assert flops.outcome == "pass" and "not compared with the base" in flops.reason
    assert any("base: pytest exited 1 and wrote no results" in p and "predates fakelib" in p for p in result.problems)
    assert result.exit_code == 0


@pytest.mark.integration
def test_a_head_that_fails_is_an_error_exit(make_repo: Callable[..., Path]) -> None:
    repo = make_repo({"src/fakelib/__init__.py": lib(), "budgets/cpu.yaml": BUDGETS},
                     {"src/fakelib/__init__.py": "raise RuntimeError('broken head')\n"})
    result = run(repo)
    assert result.exit_code == 1 and result.stopped == "head failed" and result.results.records == []
    assert any("head: pytest exited 1" in p and "broken head" in p for p in result.problems)


def test_usage_errors(make_repo: Callable[..., Path], monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str]) -> None:
    repo = make_repo({"a.txt": "a\n"})
    with pytest.raises(UsageError, match="drop -n/--dist"):
        ABConfig(root=repo, base="HEAD", pytest_args=("perf_tests", "-n", "2"))
    with pytest.raises(UsageError, match="--max-pairs: expected >= --min-pairs"):
        ABConfig(root=repo, base="HEAD", min_pairs=3, max_pairs=2)
    monkeypatch.chdir(repo)
    assert main(["--base", "no-such-ref"]) == 2
    assert "--base 'no-such-ref': not a commit" in capsys.readouterr().err
    assert main(["--base", "HEAD", "--", "-n4"]) == 2
    assert main(["--min-pairs", "1"]) == 2  # --base is required (argparse)
    assert main(["--base", "HEAD", "--cpus", "x"]) == 2
    with pytest.raises(UsageError, match="--instructions: instruction counts repeat exactly, so one pair decides"):
        ABConfig(root=repo, base="HEAD", instructions=True)
    bin_dir = repo.parent / "bin-without-valgrind"
    bin_dir.mkdir()
    (bin_dir / "git").symlink_to(shutil.which("git") or "/usr/bin/git")
    monkeypatch.setenv("PATH", str(bin_dir))
    assert main(["--base", "HEAD", "--instructions", "--", "perf_tests"]) == 2
    assert "valgrind" in capsys.readouterr().err


@pytest.mark.integration
def test_cpus_are_pinned_as_asked(make_repo: Callable[..., Path]) -> None:
    repo = make_repo({"src/fakelib/__init__.py": lib(), "budgets/cpu.yaml": BUDGETS})
    everything = sorted(os.sched_getaffinity(0))
    result = run(repo, cpus=(), max_pairs=2)
    assert result.results.meta.ab.cpus == ()
    assert all(side_log(p.sides[s].results)["cpus"] == everything for p in result.pairs for s in ("base", "head"))


def test_cpus_are_parsed_and_checked(make_repo: Callable[..., Path]) -> None:
    repo = make_repo({"a.txt": "a\n"})
    assert parse_cpus("auto") is None and parse_cpus("all") == () and parse_cpus("0,2-3") == (0, 2, 3)
    with pytest.raises(ValueError, match="--cpus: expected 'auto', 'all' or a list"):
        parse_cpus("fast")
    with pytest.raises(UsageError, match="this process may only use CPUs"):
        ABConfig(root=repo, base="HEAD", cpus=(100_000,))


@pytest.mark.integration
def test_instruction_count_sides_run_at_once_on_every_cpu_without_turns(make_repo: Callable[..., Path]) -> None:
    repo = make_repo({"src/fakelib/__init__.py": lib(), "budgets/cpu.yaml": BUDGETS})
    result = run(repo, instructions=True, min_pairs=1, max_pairs=1)
    (pair,) = result.pairs
    assert pair.invalid == "" and pair.turns.grants("base") == pair.turns.grants("head") == 0
    assert pair.turns.joined == () and result.results.meta.ab.cpus == ()
    everything = sorted(os.sched_getaffinity(0))
    assert all(side_log(pair.sides[s].results)["cpus"] == everything for s in ("base", "head"))
    assert pair.sides["base"].returncode == pair.sides["head"].returncode == 0
    flops = next(r for r in result.results.records if r.metric == "flops")
    assert flops.outcome == "pass" and "same as the base (1000)" in flops.reason


@pytest.mark.integration
def test_an_instruction_run_and_a_timing_run_of_one_checkout_can_run_at_once(make_repo: Callable[..., Path]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    repo = make_repo({"src/fakelib/__init__.py": lib(), "budgets/cpu.yaml": BUDGETS})
    with ThreadPoolExecutor(2) as pool:
        counts = pool.submit(run, repo, instructions=True, min_pairs=1, max_pairs=1,
                             out=repo / ".perfbudget" / "counts.json")
        timing = pool.submit(run, repo, max_pairs=6)
        counts_run, timing_run = counts.result(), timing.result()
    assert counts_run.pairs[0].sides["base"].returncode == 0 and timing_run.exit_code == 0
    # Each run has its own base worktree and pairs: neither refreshed the other's away.
    sides = {p.sides["base"].results.parent.parent for p in (*counts_run.pairs, *timing_run.pairs)}
    assert sides == {repo / ".perfbudget" / "ab", repo / ".perfbudget" / "ab" / "instructions"}
    assert (repo / ".perfbudget" / "ab" / "base").is_dir()
    assert (repo / ".perfbudget" / "ab" / "instructions" / "base").is_dir()


def test_the_command_line_takes_pytest_args_after_a_double_dash() -> None:
    args = build_parser().parse_args(["--base", "origin/main", "--merge-base", "--max-pairs", "8", "--",
                                      "perf_tests", "-k", "encoder", "--perf-strict"])
    assert args.base == "origin/main" and args.merge_base and args.max_pairs == 8 and args.min_pairs == 2
    assert not args.perf_strict and not args.allow_missing_base
    flags = build_parser().parse_args(["--base", "main", "--perf-strict", "--allow-missing-base"])
    assert flags.perf_strict and flags.allow_missing_base
    assert [a for a in args.pytest_args if a != "--"] == ["perf_tests", "-k", "encoder", "--perf-strict"]
    # The same options as a subcommand of the `perfbudget` command.
    top = argparse.ArgumentParser(prog="perfbudget")
    register(top.add_subparsers(dest="command", required=True))
    sub = top.parse_args(["ab", "--base", "abc123", "--", "perf_tests"])
    assert sub.command == "ab" and sub.base == "abc123" and callable(sub.func)


def dying_coordinator(monkeypatch: pytest.MonkeyPatch, *, pairs: int) -> None:
    """The first ``pairs`` pairs' coordinators drop every connection after three grants, as one that died."""
    died: list[int] = []

    class Dying(Coordinator):
        dead = False

        def _schedule(self) -> None:
            super()._schedule()
            if not self.dead and len(self._turns) >= 3 and len(died) < pairs:
                self.dead = True
                died.append(1)
                for conn in list(self._conns.values()):
                    self._unregister(conn)  # both clients now find the coordinator gone

    monkeypatch.setattr(pairs_module, "Coordinator", Dying)


@pytest.mark.integration
def test_a_pair_that_lost_turn_taking_is_invalid_and_re_run_once(
        make_repo: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo({"src/fakelib/__init__.py": lib(), "budgets/cpu.yaml": BUDGETS})
    dying_coordinator(monkeypatch, pairs=1)
    lines: list[str] = []
    result = run_ab(ABConfig(root=repo, base="HEAD", min_pairs=2, max_pairs=4, burst_ms=15),
                    command=fake_command, say=lines.append)
    first, again, third = result.pairs[:3]
    assert "turn-taking was lost" in first.invalid and "coordinator" in first.invalid, first.invalid
    assert result.invalid == (1,) and not again.invalid and not third.invalid
    assert again.replaces == 1 and again.first == first.first == "base" and third.first == "head"
    assert any(p.startswith("pair 1: invalid, its records are not used: turn-taking was lost") for p in result.problems)
    assert any("pair 1 is invalid" in line and "re-running it once" in line for line in lines)
    assert any("re-running invalid pair 1" in line for line in lines)
    step = next(r for r in result.results.records if r.metric == "step_ms")
    assert step.base is not None and step.base.pairs == len(result.pairs) - 1 >= 2
    # The verdict holds exactly the valid pairs' samples and ratios; the invalid pair's are not in it.
    def samples(p: PairRun, side: str) -> tuple[float, ...]:
        return load_results(p.sides[side].results).records[0].samples

    valid = result.pairs[1:]
    assert step.samples == tuple(x for p in valid for x in samples(p, "head"))
    assert step.base.samples == tuple(x for p in valid for x in samples(p, "base"))
    assert step.base.pair_ratios == pytest.approx([pair_ratio(samples(p, "head"), samples(p, "base")) for p in valid])
    meta = result.results.meta.ab
    assert meta.invalid_pairs == (1,) and meta.runs[0]["invalid"] == first.invalid
    assert meta.runs[1]["replaces"] == 1 and meta.valid_pairs == len(result.pairs) - 1
    assert result.exit_code == 0


@pytest.mark.integration
def test_an_invalid_re_run_is_dropped_and_no_valid_pair_fails(
        make_repo: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo({"src/fakelib/__init__.py": lib(), "budgets/cpu.yaml": BUDGETS})
    dying_coordinator(monkeypatch, pairs=2)
    result = run(repo, max_pairs=2)
    assert result.invalid == (1, 2) and result.pairs[1].replaces == 1
    assert "pair 1: dropped: its re-run (pair 2) was invalid too" in result.problems
    assert any(p.startswith("no valid pair") for p in result.problems)
    assert result.results.records == [] and result.exit_code == 1


# The step's samples are fixed, not timed: head/base reads 1.0 in pair 1 and 1.5 in pair 2,
# an interval that straddles a tolerance of 0 after both pairs however busy the machine is.
UNRESOLVABLE_LIB = """\
import re
import sys

from perfbudget.settings import run_spec

_pair = re.search(r"pair-([0-9]+)", sys.argv[1] if len(sys.argv) > 1 else "")
_slow = run_spec().side == "head" and _pair is not None and _pair.group(1) == "2"
SAMPLES_MS = [1.5 if _slow else 1.0] * 9
FLOPS = 1000
EXTRA = False


def step():
    x = 0
    for i in range(6000):
        x += i
    return x
"""


@pytest.mark.integration
@pytest.mark.parametrize(("how", "strict"), [({}, False), ({"strict": True}, True),
                                             ({"pytest_args": ("tests", "--perf-strict")}, True)])
def test_an_unresolvable_check_is_inconclusive_and_fails_only_under_strict(
        make_repo: Callable[..., Path], how: dict[str, object], strict: bool) -> None:
    # Strict from `perfbudget ab --perf-strict`, or from --perf-strict among the pytest args as the
    # sides' pytest reads it.
    repo = make_repo({"src/fakelib/__init__.py": UNRESOLVABLE_LIB,
                      "budgets/cpu.yaml": BUDGETS.replace("ab_tolerance: 0.2", "ab_tolerance: 0.0")})
    result = run(repo, min_pairs=1, max_pairs=2, **how)
    assert result.results.meta.ab is not None and result.results.meta.ab.strict is strict
    step = next(r for r in result.results.records if r.metric == "step_ms")
    assert step.outcome == "inconclusive" and step.base is not None and step.base.pairs == 2, step.reason
    assert "inconclusive, not decided on the estimate" in step.reason and "could resolve changes beyond +" in step.reason
    assert result.comparison.inconclusive == ((step.nodeid, step.key, step.metric),)
    assert result.results.meta.ab.inconclusive == ((step.nodeid, step.key, step.metric),)
    assert result.exit_code == (1 if strict else 0)
    assert "INCONCLUSIVE tests/test_fake.py::test_step fake-step.step_ms" in summary(result)
