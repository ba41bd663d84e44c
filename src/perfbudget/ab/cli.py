"""``perfbudget ab --base REF [-- pytest args]``: the lockstep A/B run from the command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from ..exitcodes import ExitCode
from ..report.common import terminal_text
from ..results import Record
from ..verdict.judge import DEFAULT_AB_PRECISION
from ..vocabulary import Outcome, count_outcomes, tally_text
from .pairs import parse_cpus
from .run import ABConfig, ABRun, UsageError, run_ab
from .trees import GitError, repo_root

__all__ = ["add_arguments", "build_parser", "cmd_ab", "main", "register", "summary"]

_DESCRIPTION = """\
Measure the base commit and this working tree in one job, on one machine: two pytest
processes run the same tests and take turns (short bursts, exactly one running at a
time), in process pairs until every timing check is decided; pairs after the first re-run
only the tests still undecided. Timing and rate checks are judged on head/base with a CI
from the pairs; one still straddling its tolerance after the last pair is inconclusive
(with the smallest change the run could resolve), never decided on a guess. Exact and
bytes checks keep their budget verdict and show any change from the base. A pair that
lost turn-taking is not used (and re-run once).

  perfbudget ab --base origin/main -- perf_tests
  perfbudget ab --base "$BASE_SHA" --merge-base -- perf_tests -k encoder
"""

_EPILOG = f"""exit codes:
  {ExitCode.OK:d}  no check failed (inconclusive checks are shown, not failures)
  {ExitCode.FAILED:d}  a check failed or errored; an inconclusive check under --perf-strict; the head's
     pytest failed; the base could not run (without --allow-missing-base); no valid pair
  {ExitCode.USAGE:d}  usage error: bad arguments, a base that is not a commit here, not a git checkout
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``ab`` options, on a parser of its own or a ``perfbudget`` subcommand."""
    p.add_argument("--base", required=True, metavar="REF", help="the base commit-ish (a SHA, origin/main)")
    p.add_argument("--merge-base", action="store_true",
                   help="measure `git merge-base HEAD REF` instead of REF (what a pull request changes)")
    p.add_argument("--min-pairs", type=int, default=2, metavar="N", help="process pairs run in any case (default 2)")
    p.add_argument("--max-pairs", type=int, default=6, metavar="N",
                   help="most process pairs; checks still straddling then are inconclusive (default 6)")
    p.add_argument("--max-minutes", type=float, default=40.0, metavar="MIN",
                   help="wall-clock bound: no pair starts that would likely end later (default 40)")
    p.add_argument("--cpus", default="auto", metavar="SPEC",
                   help="CPUs the sides are pinned to: auto (the default: one CPU for both, or on a machine with "
                        "an NVIDIA GPU each side its own half), halves (each side its own half), all (no pinning), "
                        "or a list for both such as 3 or 0,2-3")
    p.add_argument("--perf-strict", action="store_true",
                   help="an inconclusive check (its CI still straddles the tolerance after the last pair) fails "
                        "the run (also when --perf-strict is among the pytest args, or the ini file sets perfbudget_strict)")
    p.add_argument("--precision", type=float, nargs="?", const=DEFAULT_AB_PRECISION, default=0.0,
                   metavar="FRACTION",
                   help="inside a pair, a statistical check keeps taking turns until its head/base ratio is "
                        f"within +-FRACTION (or a per-check cap); alone: {DEFAULT_AB_PRECISION:g}. Off by default "
                        "(one fixed sample set per check): it costs a multiple of a pair's time "
                        "(benchmarks/ab-precision-cpu.md)")
    p.add_argument("--instructions", action="store_true",
                   help="run both sides under callgrind, one pair, and compare their perf.instructions counts "
                        "(select those tests: -- perf_tests -m instructions); implies --min-pairs 1 --max-pairs 1")
    p.add_argument("--allow-missing-base", action="store_true",
                   help="a base that cannot run is not an error: judge the head against the stored budgets")
    p.add_argument("--out", metavar="PATH", help="merged results JSON (default .perfbudget/ab/results.json)")
    p.add_argument("pytest_args", nargs="*", metavar="-- PYTEST_ARGS",
                   help="what both sides pass to pytest, after `--` (e.g. -- perf_tests -k encoder)")
    p.set_defaults(func=cmd_ab)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``ab`` subcommand (its ``func(args, out)`` returns the exit code) to ``subparsers``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "ab", help="lockstep A/B run against a base commit (the pull-request timing verdict)",
        description=_DESCRIPTION, epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    return p


def build_parser() -> argparse.ArgumentParser:
    """A parser for ``perfbudget ab`` alone."""
    p = argparse.ArgumentParser(prog="perfbudget ab", description=_DESCRIPTION, epilog=_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return p



def cmd_ab(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``perfbudget ab`` from parsed arguments; returns the exit code."""
    pytest_args = list(args.pytest_args)
    if pytest_args and pytest_args[0] == "--":
        pytest_args = pytest_args[1:]  # argparse keeps a `--` that follows the options on some versions
    try:
        cpus = parse_cpus(args.cpus)
        root = repo_root(Path.cwd())
        pairs = (1, 1) if args.instructions else (args.min_pairs, args.max_pairs)
        config = ABConfig(root=root, base=args.base, merge_base=args.merge_base, min_pairs=pairs[0],
                          max_pairs=pairs[1], max_minutes=args.max_minutes, cpus=cpus,
                          out=Path(args.out).resolve() if args.out else None, pytest_args=tuple(pytest_args),
                          strict=args.perf_strict,
                          allow_missing_base=args.allow_missing_base, precision=args.precision or None,
                          instructions=args.instructions)
    except (UsageError, GitError, ValueError) as exc:  # ValueError: a bad --cpus
        print(f"perfbudget ab: error: {terminal_text(exc)}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        run = run_ab(config)
    except (UsageError, GitError) as exc:
        print(f"perfbudget ab: error: {terminal_text(exc)}", file=sys.stderr)
        return ExitCode.USAGE
    for problem in run.problems:
        print(f"perfbudget ab: {terminal_text(problem)}", file=sys.stderr)
    out.write(summary(run) + "\n")
    return run.exit_code


def summary(run: ABRun) -> str:
    """A few lines for the terminal: totals, every compared timing check, every failure."""
    recs = run.results.records
    wall_s = run.results.meta.ab.wall_s if run.results.meta.ab is not None else 0.0
    tally = tally_text(count_outcomes(r.outcome for r in recs)) or "none recorded"
    lines = [
        f"perfbudget ab: {len(recs)} check(s): {tally}; {len(run.pairs)} pair(s) ({run.stopped}), "
        f"{wall_s:.0f} s; results: {run.path}",
    ]
    timed = [(r, b) for r in recs if (b := r.vs_base) is not None and b.ratio_ci is not None]
    if timed:
        lines.append(f"  {'outcome':<12} {'head/base':>9} {'CI':>15} {'pairs':>5}  check")
        for r, b in timed:
            assert b.ratio is not None and b.ratio_ci is not None
            ci = f"{b.ratio_ci[0]:.3f}-{b.ratio_ci[1]:.3f}"
            lines.append(f"  {r.outcome:<12} {b.ratio:>9.3f} {ci:>15} {b.pairs:>5}  {_name(r)}")
    for r in recs:
        if r.outcome in (Outcome.FAIL, Outcome.ERROR, Outcome.INCONCLUSIVE):
            lines.append(f"{r.outcome.upper()} {_name(r)}: {r.reason}")
    for c in run.results.meta.ab.clocks if run.results.meta.ab is not None else ():
        sides = "; ".join(f"{name} {clocks.text}" for name, clocks in (("base", c.base), ("head", c.head)) if clocks)
        lines.append(f"pair {c.pair} GPU clocks: {sides}" + (f": GPU timing not compared ({c.refused})" if c.refused else ""))
    if run.invalid:
        lines.append(f"{len(run.invalid)} pair(s) not used: turn-taking was lost (pair "
                     f"{', '.join(map(str, run.invalid))}; see the problems above)")
    not_compared = [(r, b) for r in recs if (b := r.base) is not None and not b.compared]
    if not_compared:
        shown = "; ".join(f"{_name(r)} ({b.note})" for r, b in not_compared[:5])
        lines.append(f"{len(not_compared)} check(s) not compared with the base (against the stored budgets; "
                     f"timing advisory unless the machine is declared stable): {shown}"
                     + (" ..." if len(not_compared) > 5 else ""))
    # Names, reasons, notes and clock text come from the sides' results files: no escape sequence reaches the terminal.
    return terminal_text("\n".join(lines))


def _name(r: Record) -> str:
    return f"{r.nodeid} {r.key}.{r.metric}"


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """``perfbudget ab`` alone; returns the exit code."""
    try:
        args = build_parser().parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # argparse: --help exits 0, usage errors 2
        return int(exc.code or 0)
    return cmd_ab(args, out or sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
