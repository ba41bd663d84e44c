"""The lockstep A/B run: base worktree, shims, process pairs until every check is decided, merged results."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..budgets.loader import BudgetSet, load_dir
from ..results import Results, load_results
from .compare import Comparison, PairRecords, compare_pairs
from .pairs import PairRun, SideCommand, one_cpu, pytest_command, run_pair
from .trees import AB_DIR, GitError, build_shim, head_commit, instrument_dir, prepare_base
from .verdict import ABPolicy

__all__ = ["ABConfig", "ABRun", "UsageError", "run_ab"]

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2


class UsageError(ValueError):
    """Bad arguments or a checkout the run cannot work in (exit status 2)."""


@dataclass(frozen=True, kw_only=True)
class ABConfig:
    """One ``perfbudget ab`` run.

    Attributes:
        root: the repository root: the head side is this checkout's working tree.
        base: the base commit-ish.
        merge_base: measure ``git merge-base HEAD base`` instead of ``base``.
        min_pairs: process pairs run whatever the verdicts (>= 1; 2 cancels a side's
            advantage of starting first).
        max_pairs: most process pairs; checks still undecided then are decided on the
            point estimate.
        max_minutes: wall-clock bound: no pair is started that would likely end past it,
            and a pair running past it is stopped.
        out: the merged results file (default ``<root>/.perfbudget/ab/results.json``).
        pytest_args: what both sides pass to pytest (tests to select, options).
        burst_ms: burst length for the sides (``None``: the instrument's default).
        cpus: CPUs both sides are pinned to: ``None`` one CPU (``pairs.one_cpu``), ``()``
            not pinned (e.g. when the measured code needs several host threads).
        policy: the A/B decision settings.
    """

    root: Path
    base: str
    merge_base: bool = False
    min_pairs: int = 2
    max_pairs: int = 6
    max_minutes: float = 40.0
    out: Path | None = None
    pytest_args: tuple[str, ...] = ()
    burst_ms: float | None = None
    cpus: tuple[int, ...] | None = None
    policy: ABPolicy = field(default_factory=ABPolicy)

    def __post_init__(self) -> None:
        if self.min_pairs < 1:
            raise UsageError(f"--min-pairs: expected >= 1, got {self.min_pairs!r}")
        if self.max_pairs < self.min_pairs:
            raise UsageError(f"--max-pairs: expected >= --min-pairs ({self.min_pairs}), got {self.max_pairs!r}")
        if not self.max_minutes > 0:
            raise UsageError(f"--max-minutes: expected a positive number, got {self.max_minutes!r}")
        if self.cpus and hasattr(os, "sched_getaffinity") and not set(self.cpus) <= os.sched_getaffinity(0):
            raise UsageError(f"--cpus {','.join(map(str, self.cpus))}: this process may only use CPUs "
                             f"{sorted(os.sched_getaffinity(0))}")
        if self.burst_ms is not None and not self.burst_ms > 0:
            raise UsageError(f"burst_ms: expected a positive number, got {self.burst_ms!r}")
        xdist = [a for a in self.pytest_args if a in ("-n", "--numprocesses", "--dist")
                 or a.startswith(("-n=", "--numprocesses=", "--dist="))
                 or (a.startswith("-n") and a[2:].isdigit())]
        if xdist:
            raise UsageError(f"pytest args {xdist}: an A/B run takes turns between two single processes; "
                             "drop -n/--dist (xdist workers cannot share one turn)")

    @property
    def workdir(self) -> Path:
        return self.root / AB_DIR

    @property
    def results_path(self) -> Path:
        return self.out if self.out is not None else self.workdir / "results.json"


@dataclass(frozen=True, kw_only=True)
class ABRun:
    """What an A/B run produced."""

    results: Results
    path: Path
    """Where ``results`` was written."""
    exit_code: int
    """0 every check passed, 1 any failed or errored (or a head side failed), 2 usage error."""
    comparison: Comparison
    pairs: tuple[PairRun, ...]
    problems: tuple[str, ...] = ()
    """What went wrong with the sides, one readable paragraph each."""
    stopped: str = ""
    """Why no further pair ran: ``decided``, ``max pairs``, ``time``, ``base unavailable``, ``head failed``."""


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _read(path: Path) -> tuple[Results | None, str]:
    if not path.is_file():
        return None, f"{path} was not written"
    try:
        return load_results(path), ""
    except ValueError as exc:
        return None, str(exc)


def run_ab(config: ABConfig, *, command: SideCommand | None = None, say: Callable[[str], None] = _say) -> ABRun:
    """Run the lockstep A/B comparison and write its merged results.

    Args:
        config: what to run.
        command: the argv of one side (default: pytest with ``--perf-collect``).
        say: where progress lines go (standard error by default).

    Raises:
        UsageError: the base is not a commit here, or the root is not a git checkout.
    """
    t0 = time.monotonic()
    deadline = t0 + config.max_minutes * 60.0
    root = config.root.resolve()
    try:
        base = prepare_base(root, config.base, merge_base=config.merge_base)
        head = head_commit(root)
    except GitError as exc:
        raise UsageError(str(exc)) from None
    say(f"perfbudget ab: base {base.commit[:12]} ({config.base}{', merge-base' if base.merge_base else ''}) "
        f"vs head {head[:12]}{' (working tree)' if head.endswith('-dirty') else ''}")
    workdir = config.workdir
    for old in workdir.glob("pair-*"):
        if old.is_dir():
            shutil.rmtree(old)  # a pair left by an earlier run must not be read as this run's
    trees = {"base": base.path, "head": root}
    instrument = instrument_dir(root)
    shims = {s: build_shim(workdir / f"shim-{s}", tree=t, instrument=instrument) for s, t in trees.items()}
    command = command or pytest_command(config.pytest_args)
    cpus = one_cpu() if config.cpus is None else config.cpus

    runs: list[PairRun] = []
    records: list[PairRecords] = []
    problems: list[str] = []
    comparison = Comparison(records=[])
    budgets: BudgetSet | None = None
    stopped = "max pairs"
    head_failed = False
    for index in range(1, config.max_pairs + 1):
        now = time.monotonic()
        if runs:
            expected_s = max(r.wall_s for r in runs)
            if now + expected_s > deadline:
                stopped = "time"
                say(f"perfbudget ab: stopping after {len(runs)} pair(s): another (~{expected_s:.0f} s) would end "
                    f"past --max-minutes {config.max_minutes:g}")
                break
        first = "base" if index % 2 == 1 else "head"
        say(f"perfbudget ab: pair {index} ({first} first) ...")
        run = run_pair(index, trees=trees, shims=shims, workdir=workdir, command=command, first=first,
                       timeout_s=max(deadline - now, 1.0), burst_ms=config.burst_ms, cpus=cpus)
        runs.append(run)
        say(f"perfbudget ab: pair {index} took {run.wall_s:.0f} s "
            f"(turns: base {run.turns.grants('base')}, head {run.turns.grants('head')})")
        if run.timed_out and records:
            # Stopped by our own clock: the pair is incomplete, the earlier ones stand.
            stopped = "time"
            problems.append(f"pair {index}: stopped at --max-minutes {config.max_minutes:g}; not used")
            break
        pair, side_problems = _pair_records(run)
        records.append(pair)
        problems.extend(side_problems)
        if run.sides["head"].returncode not in (0, None):
            head_failed = True
        if pair.head is None:
            stopped = "head failed"
            break
        if budgets is None:
            budgets = _budgets(root, pair.head)
        if run.timed_out:
            stopped = "time"
            break
        if index == 1 and pair.base is None:
            stopped = "base unavailable"
            break
        comparison = compare_pairs(records, budgets=budgets, policy=config.policy, final=False)
        if index >= config.min_pairs and not comparison.undecided:
            stopped = "decided"
            break
        if comparison.undecided and index >= config.min_pairs:
            say(f"perfbudget ab: {len(comparison.undecided)} check(s) undecided")
    comparison = compare_pairs(records, budgets=budgets or BudgetSet(root=root / "budgets"), policy=config.policy,
                               final=True)
    if not comparison.records and not problems:
        problems.append("the head side recorded no checks (did the pytest args select any perf test?)")
    head_meta = next((p.head.meta for p in records if p.head is not None), {})
    wall_s = time.monotonic() - t0
    results = Results(records=comparison.records, meta={
        **head_meta,
        "mode": "ab",
        "ab": {
            "base_ref": config.base, "base_commit": base.commit, "merge_base": base.merge_base,
            "head_commit": head, "pairs": len(runs), "min_pairs": config.min_pairs,
            "max_pairs": config.max_pairs, "stopped": stopped, "wall_s": round(wall_s, 3), "cpus": list(cpus),
            "compared": sum(1 for r in comparison.records if r.base is not None),
            "not_compared": len(comparison.not_compared), "base_only": [list(c) for c in comparison.base_only],
            "policy": {"confidence": config.policy.confidence, "prior_sd": dict(config.policy.prior_sd),
                       "prior_df": config.policy.prior_df},
            "runs": [r.as_dict() for r in runs],
            "problems": problems,
        },
    })
    path = results.write(config.results_path)
    bad = any(r.outcome in ("fail", "error") for r in comparison.records)
    first_head = runs[0].sides["head"].returncode if runs else None
    if first_head == 4 and not comparison.records:
        code = EXIT_USAGE  # pytest's own usage error: the pytest args are wrong
    elif bad or head_failed or not comparison.records:
        code = EXIT_FAIL
    else:
        code = EXIT_OK
    return ABRun(results=results, path=path, exit_code=code, comparison=comparison, pairs=tuple(runs),
                 problems=tuple(problems), stopped=stopped)


def _pair_records(run: PairRun) -> tuple[PairRecords, list[str]]:
    """Read both sides' results; describe what went wrong with each side."""
    problems: list[str] = []
    read: dict[str, Results | None] = {}
    why: dict[str, str] = {}
    for side, sr in run.sides.items():
        res, err = _read(sr.results)
        status = "was stopped at the time limit" if sr.returncode is None else f"exited {sr.returncode}"
        if res is not None and side == "base" and not res.records and sr.returncode != 0:
            res, err = None, "no records"  # e.g. every base test module failed to import
        if res is None:
            why[side] = f"pytest {status}; {err}"
            problems.append(f"pair {run.index}: {side}: pytest {status} and wrote no results ({err}); "
                            f"log {sr.log}:\n{sr.tail()}")
        elif sr.returncode not in (0, None) and side == "head":
            problems.append(f"pair {run.index}: head: pytest {status}; log {sr.log}:\n{sr.tail()}")
        read[side] = res
    return PairRecords(head=read.get("head"), base=read.get("base"), base_problem=why.get("base", "")), problems


def _budgets(root: Path, head: Results) -> BudgetSet:
    """The head's budgets: the folder its pytest run used, else ``<root>/budgets``."""
    return load_dir(head.meta.get("budgets_dir") or root / "budgets")
