"""The lockstep A/B run: base worktree, shims, process pairs until every check is decided, merged results."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..budgets.loader import BudgetSet, load_dir
from ..budgets.noise import load_noise
from ..budgets.schema import BudgetError
from ..exitcodes import ExitCode
from ..fileio import atomic_write
from ..instructions_run import callgrind_environment, under_callgrind
from ..measure import allocator
from ..measure.instructions import INSTALL_HINT, build_helper
from ..measure.unmeasurable import Unmeasurable
from ..metrics import STATISTICAL_KINDS, op_metric
from ..pinning import nvml_gpu_count
from ..results import ABPolicyInfo, ABRunInfo, PairClocks, Results, RunInfo, load_results
from ..settings import RunSpec, Settings, for_folder, pytest_cli, pytest_overrides
from ..verdict.judge import ab_run_fails
from ..vocabulary import RunMode, StrEnum
from .merge import Comparison, PairRecords, compare_pairs
from .pairs import (
    HALVES,
    STOP_S,
    CpuChoice,
    PairRun,
    SideCommand,
    SideSetup,
    one_cpu,
    placement,
    pytest_command,
    run_pair,
)
from .ratios import ABPolicy, resolvable_lines
from .trees import AB_DIR, BaseTree, GitError, build_shim, head_commit, instrument_dir, prepare_base

__all__ = ["ABConfig", "ABRun", "StopReason", "UsageError", "default_cpus", "run_ab"]

class StopReason(StrEnum):
    """Why the run started no further pair (``meta["ab"]["stopped"]`` in the results)."""

    DECIDED = "decided"
    """Every statistical check was decided."""
    BEYOND_REACH = "beyond reach"
    """Every statistical check was decided, or is one that the pairs left would not decide."""
    MAX_PAIRS = "max pairs"
    """``--max-pairs`` were run; checks still straddling are inconclusive."""
    TIME = "time"
    """Another pair would have ended past ``--max-minutes`` (or one was stopped there)."""
    HEAD_FAILED = "head failed"
    """The head side wrote no usable results."""
    BASE_UNAVAILABLE = "base unavailable"
    """The base side could not run in the first pair."""


class UsageError(ValueError):
    """Bad arguments or a checkout the run cannot work in (exit status 2)."""


@dataclass(frozen=True, kw_only=True)
class ABConfig:
    """One ``perfbudget ab`` run.

    Attributes:
        root: the repository root; the head side is its working tree.
        base: the base commit-ish.
        merge_base: measure ``git merge-base HEAD base`` instead of ``base``.
        min_pairs: pairs a check is compared in before it may be decided (>= 1; 2 cancels
            a side's advantage of starting first).
        max_pairs: most pairs started, invalid ones and re-runs included.
        max_minutes: no pair starts that would likely end past it; one running past it is stopped.
        out: the merged results file (default ``<workdir>/results.json``).
        pytest_args: what both sides pass to pytest.
        burst_ms: the sides' burst length (``None``: :class:`perfbudget.settings.Settings`'s).
        cpus: ``None`` :func:`default_cpus`, ``()`` not pinned, ``"halves"`` each side its
            own half (``pairs.placement``), or the CPUs of both.
        policy: the A/B decision settings.
        strict: an inconclusive check fails the run (also ``--perf-strict`` in the pytest args or ini).
        allow_missing_base: a base that cannot run is judged "not compared" instead of an error.
        precision: the half-width each check's within-pair ratio samples to (``None`` or 0: one
            fixed sample set; :attr:`perfbudget.verdict.judge.ABSide.precision`).
        instructions: both sides run under callgrind, one pair, comparing ``perf.instructions``.
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
    cpus: CpuChoice | None = None
    policy: ABPolicy = field(default_factory=ABPolicy)
    strict: bool = False
    allow_missing_base: bool = False
    precision: float | None = None
    instructions: bool = False

    def __post_init__(self) -> None:
        if self.instructions and (self.min_pairs, self.max_pairs) != (1, 1):
            raise UsageError("--instructions: instruction counts repeat exactly, so one pair decides; "
                             f"got --min-pairs {self.min_pairs} --max-pairs {self.max_pairs} (use 1 and 1)")
        if self.precision is not None and not 0 <= self.precision < 1:
            raise UsageError(f"--precision: expected a fraction in [0, 1) such as 0.01, got {self.precision!r}")
        if self.min_pairs < 1:
            raise UsageError(f"--min-pairs: expected >= 1, got {self.min_pairs!r}")
        if self.max_pairs < self.min_pairs:
            raise UsageError(f"--max-pairs: expected >= --min-pairs ({self.min_pairs}), got {self.max_pairs!r}")
        if not self.max_minutes > 0:
            raise UsageError(f"--max-minutes: expected a positive number, got {self.max_minutes!r}")
        if isinstance(self.cpus, tuple) and hasattr(os, "sched_getaffinity") \
                and not set(self.cpus) <= os.sched_getaffinity(0):
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
        """The run's folder; instruction counts keep their own, to run beside a timing run."""
        return self.root / AB_DIR / "instructions" if self.instructions else self.root / AB_DIR

    @property
    def results_path(self) -> Path:
        return self.out if self.out is not None else self.workdir / "results.json"


@dataclass(frozen=True, kw_only=True)
class ABRun:
    """What an A/B run produced."""

    results: Results
    path: Path
    """Where ``results`` was written."""
    exit_code: ExitCode
    """0: no check failed (inconclusive unless ``strict``); 1: the run fails
    (:func:`~perfbudget.verdict.judge.ab_run_fails`); 2: usage error."""
    comparison: Comparison
    pairs: tuple[PairRun, ...]
    problems: tuple[str, ...] = ()
    """What went wrong with the sides, one readable paragraph each."""
    stopped: StopReason = StopReason.MAX_PAIRS
    """Why no further pair ran."""
    invalid: tuple[int, ...] = ()
    """Numbers of the pairs not used because they lost turn-taking."""


def default_cpus(*, gpus: int, instructions: bool = False) -> CpuChoice:
    """The sides' CPUs without ``--cpus``: callgrind sides unpinned (counts ignore the machine's
    load), each side its own half with ``gpus`` > 0 (``pairs`` says why), else one CPU for both."""
    if instructions:
        return ()
    return HALVES if gpus > 0 else one_cpu()


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
    """Run ``config``'s A/B comparison and write its merged results; ``command`` is one side's argv
    (default: pytest with ``--perf-collect``), ``say`` takes progress lines (default: stderr).

    Raises:

        UsageError: the base is not a commit here, or the root is not a git checkout.
    """
    t0 = time.monotonic()
    deadline = t0 + config.max_minutes * 60.0
    root = config.root.resolve()
    settings = _settings(config, root)
    burst_ms = settings.burst_ms
    base, head = _base_and_head(config, root, say)
    workdir = config.workdir
    trees = {"base": base.path, "head": root}
    instrument = instrument_dir(root)
    shims = {s: build_shim(workdir / f"shim-{s}", tree=t, instrument=instrument) for s, t in trees.items()}
    env = {**os.environ, **allocator.environment(settings.allocator)}  # both sides settled from their start
    if command is None:
        command = pytest_command(config.pytest_args)
        if config.instructions:
            command, env = _under_callgrind(command, workdir / "callgrind", env)
    cpus = default_cpus(gpus=nvml_gpu_count(), instructions=config.instructions) if config.cpus is None \
        else config.cpus

    operators_file = workdir / "operators.json"
    operators_file.unlink(missing_ok=True)
    spec = RunSpec(side="head", burst_ms=burst_ms, wait_s=settings.wait_s, precision=config.precision or None,
                   operators_file=str(operators_file), lease=settings.lease, allocator=settings.allocator)
    plan = _Plan(config=config, budgets_dir=settings.budgets_dir, deadline=deadline, operators_file=operators_file,
                 policy=_with_noise(config, settings.budgets_dir, say, burst_ms=burst_ms), say=say,
                 stable_machine=settings.stable_machine)
    while (index := plan.next_pair()) is not None:
        replaces = plan.to_replace
        first = replaces.first if replaces is not None else ("base" if plan.slot % 2 == 1 else "head")
        what = f"re-running invalid pair {replaces.index}" if replaces is not None else \
            ("every selected test" if plan.tests is None else f"{len(plan.tests)} test(s) with undecided checks")
        say(f"perfbudget ab: pair {index} ({first} first; {what}) ...")
        plan.took(run_pair(index, trees=trees, shims=shims, workdir=workdir, command=command, first=first,
                           timeout_s=max(deadline - time.monotonic() - STOP_S, 1.0), spec=spec,
                           cpus=placement(cpus, index),
                           tests=plan.tests, env=env, replaces=None if replaces is None else replaces.index,
                           lockstep=not config.instructions))
    plan.finish()
    runs, records, problems, policy = plan.runs, plan.records, plan.problems, plan.policy
    stopped = plan.stopped or StopReason.MAX_PAIRS
    budgets, head_failed = plan.budgets, plan.head_failed
    missing_base = stopped == StopReason.BASE_UNAVAILABLE and not config.allow_missing_base
    if missing_base:
        why = records[0].base_problem if records else ""
        problems.append(f"the base {base.commit[:12]} ({config.base}) could not run under this instrument"
                        f"{f' ({why})' if why else ''}: there is nothing to compare the head with. Fix the base "
                        "side (its log is named above), or pass --allow-missing-base to judge the head against "
                        "the stored budgets instead")
    comparison = compare_pairs(records, budgets=budgets or BudgetSet(root=settings.budgets_dir), policy=policy,
                               final=True, min_pairs=config.min_pairs, require_base=not config.allow_missing_base,
                               stable_machine=settings.stable_machine)
    invalid = tuple(r.index for r in runs if r.invalid)
    if not records and invalid and stopped != StopReason.HEAD_FAILED:
        problems.append(f"no valid pair: every pair lost turn-taking ({', '.join(map(str, invalid))})")
    elif not comparison.records and not problems:
        problems.append("the head side recorded no checks (did the pytest args select any perf test?)")
    cut = _selection_cut(runs, config.max_minutes)
    if cut:
        problems.append(cut)
    head_meta = next((p.head.meta for p in records if p.head is not None), RunInfo())
    # Every side's measuring faults, of every pair: a base test that raised leaves its checks "not compared".
    faults = {json.dumps(e, sort_keys=True): e for p in records for side, res in (("head", p.head), ("base", p.base))
              if res is not None for e in ({**x, "side": side} for x in res.meta.errors)}
    info = _run_info(config, plan, comparison, base=base, head=head, stopped=stopped, strict=settings.strict,
                     burst_ms=burst_ms, wall_s=time.monotonic() - t0, problems=problems)
    results = Results(records=comparison.records, meta=replace(head_meta, errors=tuple(faults.values()), mode=RunMode.AB,
                                                               ab=info, lease=settings.lease or None))
    path = results.write(config.results_path)
    code = _exit_code(comparison, runs, failed=bool(head_failed or missing_base or cut),
                      strict=settings.strict)
    return ABRun(results=results, path=path, exit_code=code, comparison=comparison, pairs=tuple(runs),
                 problems=tuple(problems), stopped=stopped, invalid=invalid)


def _base_and_head(config: ABConfig, root: Path, say: Callable[[str], None]) -> tuple[BaseTree, str]:
    """The base's worktree and the head's commit, said; the pairs an earlier run left are removed."""
    try:
        base = prepare_base(root, config.base, merge_base=config.merge_base, path=config.workdir / "base")
        head = head_commit(root)
    except GitError as exc:
        raise UsageError(str(exc)) from None
    say(f"perfbudget ab: base {base.commit[:12]} ({config.base}{', merge-base' if base.merge_base else ''}) "
        f"vs head {head[:12]}{' (working tree)' if head.endswith('-dirty') else ''}")
    for old in config.workdir.glob("pair-*"):
        if old.is_dir():
            shutil.rmtree(old)  # a pair left by an earlier run must not be read as this run's
    return base, head


def _settings(config: ABConfig, root: Path) -> Settings:
    """The run's settings, resolved once as the sides' pytest would (args and -o overrides too)."""
    try:
        cli = {**pytest_cli(config.pytest_args), "burst_ms": config.burst_ms}
        if config.strict:
            cli["strict"] = True
        return for_folder(root, cli=cli, overrides=pytest_overrides(config.pytest_args))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _run_info(config: ABConfig, plan: _Plan, comparison: Comparison, *, base: BaseTree, head: str,
              stopped: StopReason, strict: bool, burst_ms: float, wall_s: float, problems: Sequence[str]) -> ABRunInfo:
    """What the merged results say of the run (``meta.ab``)."""
    runs, records = plan.runs, plan.records
    return ABRunInfo(
        base_ref=config.base, base_commit=base.commit, merge_base=base.merge_base, head_commit=head,
        pairs=len(runs), valid_pairs=len(records), invalid_pairs=tuple(r.index for r in runs if r.invalid),
        min_pairs=config.min_pairs, max_pairs=config.max_pairs, stopped=stopped, strict=strict,
        allow_missing_base=config.allow_missing_base, wall_s=round(wall_s, 3),
        cpus=tuple(sorted({c for r in runs for cs in r.cpus.values() for c in cs})), burst_ms=burst_ms,
        compared=sum(1 for r in comparison.records if r.vs_base is not None),
        not_compared=len(comparison.not_compared), base_only=tuple(comparison.base_only),
        inconclusive=tuple(comparison.inconclusive),
        clocks=tuple(PairClocks(pair=p.index, base=p.clocks.get("base"), head=p.clocks.get("head"), refused=p.refused)
                     for p in records if p.clocks),
        policy=ABPolicyInfo(confidence=config.policy.confidence, prior_sd=dict(config.policy.prior_sd),
                            prior_df=config.policy.prior_df, family_alpha=config.policy.family_alpha,
                            noise=tuple(sorted(t.where for t in plan.policy.noise.values()))),
        runs=tuple(r.as_dict() for r in runs), problems=tuple(problems))


def _exit_code(comparison: Comparison, runs: Sequence[PairRun], *, failed: bool, strict: bool) -> ExitCode:
    """Usage error when the head's first pytest said so and nothing was recorded, else
    :func:`~perfbudget.verdict.judge.ab_run_fails` (``failed``: a side or the selection failed)."""
    first_head = runs[0].sides["head"].returncode if runs else None
    if first_head == 4 and not comparison.records:
        return ExitCode.USAGE  # pytest's own usage error: the pytest args are wrong
    fails = ab_run_fails([r.outcome for r in comparison.records], inconclusive=bool(comparison.inconclusive),
                         failed=failed, strict=strict)
    return ExitCode.FAILED if fails else ExitCode.OK


@dataclass(kw_only=True)
class _Plan:
    """Which pair runs next, and when none does: the state of :func:`run_ab`'s loop."""

    config: ABConfig
    budgets_dir: Path
    """The budgets folder when the head's results do not name theirs, and the measured noise's."""
    deadline: float
    policy: ABPolicy
    operators_file: Path
    say: Callable[[str], None]
    stable_machine: str = ""

    runs: list[PairRun] = field(default_factory=list)
    records: list[PairRecords] = field(default_factory=list)
    """The valid pairs only."""
    problems: list[str] = field(default_factory=list)
    budgets: BudgetSet | None = None
    stopped: StopReason | None = None
    """Why no further pair runs, once one of :meth:`took`'s outcomes or the clock says so."""
    head_failed: bool = False
    slot: int = 1
    """The valid pair being run: odd slots start with the base, even ones with the head."""
    to_replace: PairRun | None = None
    """An invalid pair awaiting its one re-run."""
    tests: tuple[str, ...] | None = None
    """The tests of the next pair (``None``: the user's selection, pair 1)."""

    def next_pair(self) -> int | None:
        """The next pair's number, or ``None`` when the run stops (:attr:`stopped` says why)."""
        if self.stopped is not None:
            return None
        if len(self.runs) >= self.config.max_pairs:
            self._stop(StopReason.MAX_PAIRS)
            return None
        if self.runs:
            expected_s = self.runs[-1].wall_s  # the next pair runs the same tests or fewer
            if time.monotonic() + expected_s > self.deadline:
                self.say(f"perfbudget ab: stopping after {len(self.runs)} pair(s): another (~{expected_s:.0f} s) "
                         f"would end past --max-minutes {self.config.max_minutes:g}")
                self._stop(StopReason.TIME)
                return None
        return len(self.runs) + 1

    def _stop(self, why: StopReason) -> None:
        self.stopped = why

    def took(self, run: PairRun) -> None:
        """Take in one pair's outcome."""
        config, index = self.config, run.index
        pair, side_problems = _pair_records(run)
        run = replace(run, ran=() if pair.head is None else tuple(dict.fromkeys(
            r.nodeid for r in pair.head.records if r.nodeid)))  # the tests it holds checks for, in order
        self.runs.append(run)
        self.say(f"perfbudget ab: pair {index} took {run.wall_s:.0f} s "
                 f"(turns: base {run.turns.grants('base')}, head {run.turns.grants('head')})")
        self.problems.extend(side_problems)
        if run.sides["head"].returncode not in (0, None):
            self.head_failed = True
        if pair.head is None:
            return self._stop(StopReason.TIME if run.timed_out else StopReason.HEAD_FAILED)
        if run.invalid:
            # Part of the pair ran out of lockstep: its ratios would carry the machine's drift.
            self.problems.append(f"pair {index}: invalid, its records are not used: {run.invalid}")
            if run.timed_out:
                return self._stop(StopReason.TIME)
            if self.to_replace is None:
                self.to_replace = run
                self.say(f"perfbudget ab: pair {index} is invalid ({run.invalid}); re-running it once")
            else:
                self.say(f"perfbudget ab: pair {index} (re-running pair {self.to_replace.index}) is invalid too; "
                         "dropped")
                self.problems.append(f"pair {self.to_replace.index}: dropped: its re-run (pair {index}) was invalid too")
                self.to_replace = None
                self.slot += 1
            return None
        self.to_replace = None
        self.records.append(replace(pair, index=index))
        _pin_operators(self.operators_file, self.records)
        if pair.refused:
            self.problems.append(f"pair {index}: its GPU timing checks were not compared: {pair.refused}")
        if self.budgets is None:  # the folder the head's pytest used
            self.budgets = load_dir(pair.head.meta.budgets_dir or self.budgets_dir)
            _say_noise(self.policy, pair.head, self.say, pairs=config.max_pairs)
        if run.timed_out:
            self.problems.extend(_unreached(self.records[-1], config.max_minutes))
            return self._stop(StopReason.TIME)
        if len(self.records) == 1 and pair.base is None:
            return self._stop(StopReason.BASE_UNAVAILABLE)
        comparison = compare_pairs(self.records, budgets=self.budgets, policy=self.policy, final=False,
                                   min_pairs=config.min_pairs,
                                   pairs_left=_pairs_left(config, self.runs, self.deadline),
                                   stable_machine=self.stable_machine)
        if comparison.beyond_reach:
            self.say(f"perfbudget ab: {len(comparison.beyond_reach)} check(s) beyond reach: the pairs left (within "
                     f"--max-pairs {config.max_pairs} and --max-minutes {config.max_minutes:g}) would not decide "
                     "them at their spread; no pair is spent on them")
        if not comparison.undecided:
            return self._stop(StopReason.BEYOND_REACH if comparison.beyond_reach else StopReason.DECIDED)
        self.tests = _tests_of(comparison)
        self.slot += 1
        self.say(f"perfbudget ab: {len(comparison.undecided)} check(s) undecided in {len(self.tests)} test(s)")
        return None

    def finish(self) -> None:
        """Say what the loop left: an invalid pair with no pair or time left to re-run it."""
        if self.to_replace is not None:
            self.problems.append(f"pair {self.to_replace.index}: dropped: no pair budget (--max-pairs "
                                 f"{self.config.max_pairs}) or time left to re-run it")
            self.say(f"perfbudget ab: pair {self.to_replace.index} dropped: no pair or time left to re-run it")


def _pairs_left(config: ABConfig, runs: Sequence[PairRun], deadline: float) -> int:
    """Pairs the run may still start: within --max-pairs, and within --max-minutes at the last pair's length."""
    left = config.max_pairs - len(runs)
    if runs and runs[-1].wall_s > 0:
        left = min(left, int(max(deadline - time.monotonic(), 0.0) // runs[-1].wall_s))
    return max(left, 0)


def _with_noise(config: ABConfig, budgets_dir: Path, say: Callable[[str], None], *, burst_ms: float) -> ABPolicy:
    """The policy with the measured noise of ``<budgets_dir>/noise`` unless it brings its own (a file
    measured in turns of another length than ``burst_ms`` set aside, and said); ``UsageError`` if unreadable."""
    if config.policy.noise or config.instructions:
        return config.policy
    try:
        tables = load_noise(budgets_dir)
    except BudgetError as exc:
        raise UsageError(f"measured noise: {exc}") from None
    kept = {}
    for identity, table in tables.items():
        if table.bursts_ms and table.bursts_ms != {burst_ms}:
            say(f"perfbudget ab: the measured noise of {identity} ({table.where}) holds for turns of "
                f"{table.turns_text}, this run takes {burst_ms:g} ms: its timing checks start from the flat prior "
                "(calibrate again with runs of this length)")
        else:
            kept[identity] = table
    return replace(config.policy, noise=kept) if kept else config.policy


def _say_noise(policy: ABPolicy, head: Results, say: Callable[[str], None], *, pairs: int) -> None:
    """Per device the first pair's checks timed: the change each can resolve, or the flat prior."""
    identities = dict.fromkeys(r.device.identity for r in head.records
                               if r.kind in STATISTICAL_KINDS and r.device is not None and r.device.identity)
    for identity in identities:
        table = policy.noise.get(identity)
        if table is None:
            say(f"perfbudget ab: no measured noise for {identity} in turns of this length (used: "
                f"{', '.join(sorted(policy.noise)) or 'none'}): its timing checks start from the flat prior")
            continue
        for line in resolvable_lines(table, policy, pairs=pairs):
            say(f"perfbudget ab: {line}")


def _under_callgrind(command: SideCommand, out: Path, env: dict[str, str]) -> tuple[SideCommand, dict[str, str]]:
    """Each side's pytest run under callgrind, its dumps in ``out``; ``UsageError`` without valgrind."""
    valgrind = shutil.which("valgrind", path=env.get("PATH"))
    if valgrind is None:
        raise UsageError(f"--instructions: {INSTALL_HINT}")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    fast = not isinstance(build_helper(), Unmeasurable)

    def wrapped(setup: SideSetup) -> list[str]:
        return under_callgrind(list(command(setup)), out, valgrind=valgrind, fast_start=fast)

    return wrapped, callgrind_environment(out, env)


def _pin_operators(path: Path, pairs: Sequence[PairRecords]) -> None:
    """Write, per test and key, every operator either side recorded so far: later pairs record those."""
    ops: dict[str, dict[str, set[str]]] = {}
    for pair in pairs:
        for side in (pair.head, pair.base):
            for r in side.records if side is not None else ():
                parsed = op_metric(r.metric)
                if parsed is not None and r.nodeid:
                    ops.setdefault(r.nodeid, {}).setdefault(r.key, set()).add(parsed[1])
    data = {n: {k: sorted(v) for k, v in keys.items()} for n, keys in ops.items()}
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True))



def _tests_of(comparison: Comparison) -> tuple[str, ...]:
    """The tests holding undecided checks, in the head's order (``comparison.records`` keeps it)."""
    undecided = set(comparison.undecided)
    return tuple(dict.fromkeys(r.nodeid for r in comparison.records if (r.nodeid, r.key, r.metric) in undecided))


def _pair_records(run: PairRun) -> tuple[PairRecords, list[str]]:
    """Read both sides' results; describe what went wrong with each side."""
    problems: list[str] = []
    read: dict[str, Results | None] = {}
    why: dict[str, str] = {}
    for side, sr in run.sides.items():
        res, err = _read(sr.results)
        status = "was stopped at the time limit (--max-minutes)" if sr.returncode is None \
            else f"exited {sr.returncode}"
        if res is not None and side == "base" and not res.records and sr.returncode != 0:
            res, err = None, "no records"  # e.g. every base test module failed to import
        if res is None:
            why[side] = f"pytest {status}; {err}"
            problems.append(f"pair {run.index}: {side}: pytest {status} and wrote no results ({err}); "
                            f"log {sr.log}:\n{sr.tail()}")
        elif sr.returncode not in (0, None) and side == "head":
            problems.append(f"pair {run.index}: head: pytest {status}; log {sr.log}:\n{sr.tail()}")
        read[side] = res
    stopped = tuple(s for s, sr in run.sides.items() if sr.returncode is None)
    return PairRecords(head=read.get("head"), base=read.get("base"), base_problem=why.get("base", ""),
                       stopped=stopped, clocks=run.clocks), problems


def _selection_cut(runs: Sequence[PairRun], max_minutes: float) -> str:
    """Why the run did not measure its whole selection (pair 1's head stopped at the time limit), or ""."""

    if not runs or not runs[0].timed_out or runs[0].sides["head"].returncode is not None:
        return ""
    return (f"pair 1's head was stopped at --max-minutes {max_minutes:g} before it ran every selected test: those it "
            "did not reach were measured by no pair; raise --max-minutes or select fewer tests")


def _unreached(pair: PairRecords, max_minutes: float) -> list[str]:
    """Per side of ``pair`` stopped at the time limit, the checks it did not reach that the other side recorded."""
    out = []
    for side, other in (("base", pair.head), ("head", pair.base)):
        if side not in pair.stopped or other is None:
            continue
        mine = {(r.nodeid, r.key, r.metric) for r in ((pair.base if side == "base" else pair.head) or Results()).records}
        missed = [f"{r.nodeid} {r.key}.{r.metric}" for r in other.records
                  if r.nodeid and (r.nodeid, r.key, r.metric) not in mine]
        if missed:
            out.append(f"pair {pair.index}: the {side} was stopped at --max-minutes {max_minutes:g} before it "
                       f"recorded {len(missed)} check(s) the other side did; they were not compared in this pair: "
                       f"{', '.join(missed[:8])}{' ...' if len(missed) > 8 else ''}")
    return out

