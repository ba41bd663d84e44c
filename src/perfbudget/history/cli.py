"""The ``perfbudget history`` command: ``add``, ``show``, ``report`` and ``check``."""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from typing import Any, TextIO

from ..exitcodes import ExitCode
from ..fileio import atomic_write
from ..report.common import fmt_tolerance, terminal_text
from ..results import load_results
from ..verdict.rule import SERIES_TOLERANCE
from .analysis import SeriesAnalysis, analyze_store, chain_gaps_since, findings_since, first_after
from .changepoints import MissingPackageError
from .commits import CommitError, git_commit_info, run_of
from .page import render_history
from .store import HistoryError, HistoryStore, checks_from_results

__all__ = ["DEFAULT_DB", "register"]

DEFAULT_DB = ".perfbudget/history.db"
"""Where the history lives unless ``--db`` says otherwise."""

_DESCRIPTION = """\
Main-branch history: every merge's results kept in one SQLite file, plotted, and searched for change
points, including regressions made of many small steps.
"""

_EPILOG = f"""exit codes:
  {ExitCode.OK:d}  ok (check: no regression since REF; a gap in the A/B chain is a warning)
  {ExitCode.FAILED:d}  check: a change point, drift, cumulative change or trend for the worse since REF
  {ExitCode.USAGE:d}  usage or input error: unreadable results, a corrupt, newer, locked or unwritable history
     database, an unknown ref
"""


class _InputError(Exception):
    """A problem with the command's input, already naming the file or the value."""


def _open(args: argparse.Namespace, *, write: bool = False) -> HistoryStore:
    """The store of ``--db``: created or migrated only to ``write`` (``add``); read-only otherwise."""
    path = Path(args.db)
    if not write and not path.exists():
        raise _InputError(f"{path}: no history database (create it with: perfbudget history add RESULTS.json "
                          f"--db {path})")
    try:
        return HistoryStore(path, read_only=not write)
    except HistoryError as exc:
        raise _InputError(str(exc)) from None


def cmd_add(args: argparse.Namespace, out: TextIO) -> int:
    try:
        results = load_results(args.results)
        run = run_of(results, source=args.results, commit=args.commit, parent=args.parent, date=args.date,
                     machine=args.machine)
        checks = checks_from_results(results)
    except (ValueError, CommitError) as exc:
        raise _InputError(str(exc)) from None
    with _open(args, write=True) as store:
        try:
            written = store.add(run, checks)
        except HistoryError as exc:
            raise _InputError(str(exc)) from None
        total = len(store.runs())
    out.write(terminal_text(f"perfbudget history: kept {written} check(s) of {run.short} ({run.mode}, {run.machine}, "
                            f"{run.date}) in {args.db}; {total} run(s) in all\n"))
    return ExitCode.OK


def _name(store: HistoryStore, wanted: str) -> tuple[str, str]:
    names = {f"{k}.{m}": (k, m) for k, m in store.names()}
    if wanted in names:
        return names[wanted]
    close = difflib.get_close_matches(wanted, list(names), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; it holds {len(names)} check(s)"
    raise _InputError(f"{store.path}: no check {wanted!r} in the history{hint}")


def _analyses(store: HistoryStore, names: list[tuple[str, str]] | None = None,
              machine: str | None = None) -> list[SeriesAnalysis]:
    try:
        return analyze_store(store, names=names, machine=machine)
    except ValueError as exc:
        raise _InputError(f"{store.path}: {exc}") from None


def cmd_show(args: argparse.Namespace, out: TextIO) -> int:
    with _open(args) as store:
        key, metric = _name(store, args.check)
        analyses = _analyses(store, [(key, metric)], machine=args.machine)
    if not analyses:
        raise _InputError(f"{args.db}: no series of {args.check} on machine {args.machine!r}")
    out.write(terminal_text("\n\n".join(_series_text(a) for a in analyses)) + "\n")  # names, dates from the store
    return ExitCode.OK


def _series_text(a: SeriesAnalysis) -> str:
    unit = a.unit or "value"
    lines = [f"{a.name} on {a.machine} ({'lockstep A/B' if a.mode == 'ab' else 'stored'}; "
             f"{'lower' if a.direction == 'lower' else 'higher' if a.direction == 'higher' else 'either'} is better)"]
    shifts = {s.index: s for s in a.shifts}
    link_of = {link.commit: i for i, link in enumerate(a.links)}
    drift_at = {d.first: d for d in a.drifts}
    header = f"  {'commit':<10} {'date (UTC)':<20} {unit:>12} {'outcome':<12}"
    if a.links:
        header += f" {'vs parent':>10} {'cumulative':>11} {'95 % interval':>17}"
    lines.append(header)
    for i, p in enumerate(a.points):
        if i in shifts:
            s = shifts[i]
            lines.append(f"  ---- change point: {s.before:.4g} -> {s.after:.4g} {a.unit} ({s.label}) "
                         f"{'WORSE' if a.worse(s.change) else 'better'}")
        c = p.check
        value = f"{c.value:.4g}" if c.value is not None else "-"
        row = f"  {p.run.short:<10} {p.run.date:<20} {value:>12} {c.outcome!s:<12}"
        j = link_of.get(p.run.commit)
        if j is not None:
            if j in drift_at:
                d = drift_at[j]
                lines.append(f"  ---- drift over {d.last - d.first + 1} merge(s) from here: {d.change:+.1%} "
                             f"({d.ci[0] - 1:+.1%} to {d.ci[1] - 1:+.1%}) {'WORSE' if a.worse(d.change) else 'better'}")
            cum = a.cumulative[j]
            row += (f" {(c.ratio or 1) - 1:>+10.1%} {cum.change:>+11.1%} "
                    f"{f'{cum.ci[0] - 1:+.1%}..{cum.ci[1] - 1:+.1%}':>17}")
        lines.append(row)
    if a.links:
        lines.append(f"  cumulative: since {a.links[0].parent and a.links[0].parent[:8]}, the chain's start")
    lines += [f"  note: {g}" for g in a.gaps]
    return "\n".join(lines)


def cmd_report(args: argparse.Namespace, out: TextIO) -> int:
    with _open(args) as store:
        analyses = _analyses(store)
    text = render_history(analyses, title=args.title, tolerance=args.tolerance, source=str(args.db))
    try:
        atomic_write(args.output, text)
    except OSError as exc:
        raise _InputError(f"{args.output}: cannot write: {exc.strerror or exc}") from None
    out.write(f"perfbudget history: wrote {len(analyses)} series to {args.output}\n")
    return ExitCode.OK


def _since_date(store: HistoryStore, ref: str) -> tuple[str, str]:
    """``(commit, date)`` of ``ref``: a commit-ish git knows, or a SHA (prefix) the history holds."""
    info = git_commit_info(ref)
    if info is not None:
        return info[0], info[2]
    found = store.resolve(ref)
    if not found:  # a commit the history holds only as a parent (the first commit of a chain)
        found = sorted({r.parent for r in store.runs() if r.parent and r.parent.startswith(ref)})
        if len(found) == 1:
            return found[0], min(r.date for r in store.runs() if r.parent == found[0])
    if len(found) == 1:
        return found[0], min(r.date for r in store.runs() if r.commit == found[0])
    if len(found) > 1:
        raise _InputError(f"--since {ref}: ambiguous: {len(found)} commits in the history start with it")
    raise _InputError(f"--since {ref}: not a commit in this git repository or in {store.path}")


def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    if not 0 <= args.tolerance < 1:
        raise _InputError(f"--tolerance: expected a fraction in [0, 1), got {args.tolerance}")

    def say(text: str) -> None:  # commits, names and machines come from the store
        out.write(terminal_text(text))

    with _open(args) as store:
        try:
            since, since_date = _since_date(store, args.since)
        except ValueError as exc:  # git answered with something that is not a commit date
            raise _InputError(f"--since {args.since}: {exc}") from None
        analyses = _analyses(store)
        runs = store.runs()
        # In the history's order (dates can tie), else by date.
        start = first_after(runs, since)
        after = runs[start:] if start is not None else [r for r in runs if r.date > since_date]
    if not analyses:
        raise _InputError(f"{args.db}: the history is empty")
    findings, lines, unreached = [], [], []
    for a in analyses:
        found, said = findings_since(a, since_date, since_commit=since, tolerance=args.tolerance)
        findings += found
        lines += said
        if chain_gaps_since(a, since_date, since_commit=since):
            unreached.append(a.name)
    warning = ""
    if unreached:
        names = ", ".join(unreached[:3]) + (f" and {len(unreached) - 3} more" if len(unreached) > 3 else "")
        warning = (f"warning: the A/B chain of {len(unreached)} series ({names}) does not reach back to {since[:12]} "
                   "(gaps above): its cumulative change covers only the merges after the gap\n")
    say(f"perfbudget history check: since {since[:12]} ({since_date}): {len(after)} run(s), "
        f"{len(analyses)} series, tolerance {fmt_tolerance(args.tolerance)}\n")
    if not after:
        say(f"  nothing measured after {since[:12]}: nothing to check\n")
    for line in lines:
        say(f"  {line}\n")
    for f in findings:
        say(f"REGRESSION {f.describe()}\n")
    if findings:
        first = findings[0]
        say(f"{len(findings)} regression(s) since {since[:12]}; bisect each range above "
            f"(e.g. git bisect start {first.bad[:12]} {first.good[:12]})\n{warning}")
        return ExitCode.FAILED
    if unreached:
        say(f"no change point, drift or trend for the worse since {since[:12]}; no cumulative change for the "
            f"worse after the gaps, which it cannot reach back over\n{warning}")
        return ExitCode.OK
    say(f"no change point, drift, cumulative change or trend for the worse since {since[:12]}\n")
    return ExitCode.OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``history`` subcommands, on a parser of their own or the ``perfbudget history`` subcommand."""
    sub = p.add_subparsers(dest="history_command", required=True, metavar="SUBCOMMAND")

    def subcommand(name: str, text: str, description: str | None = None) -> argparse.ArgumentParser:
        q = sub.add_parser(name, help=text, description=description, epilog=_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        q.add_argument("--db", default=DEFAULT_DB, metavar="PATH", help=f"the history database (default {DEFAULT_DB})")
        return q

    a = subcommand("add", "keep a results file's run (stored mode: values; A/B: head/parent ratios), "
                          "replacing the same commit, machine and mode's")
    a.add_argument("results", help="results JSON (perfbudget ab --out, or pytest --perf-json)")
    a.add_argument("--commit", metavar="SHA", help="the commit measured (default: the A/B head, else git HEAD)")
    a.add_argument("--parent", metavar="SHA", help="its parent (default: the A/B base, else the first parent)")
    a.add_argument("--date", metavar="ISO8601", help="its date (default: the commit date from git)")
    a.add_argument("--machine", metavar="ID", help="machine identity (default: the records' device identity)")
    a.set_defaults(history_func=cmd_add)

    s = subcommand("show", "one check's series in the terminal, change points marked")
    s.add_argument("check", metavar="KEY.METRIC", help="e.g. encoder-train.step_ms")
    s.add_argument("--machine", metavar="ID", help="only this machine identity")
    s.set_defaults(history_func=cmd_show)

    r = subcommand("report", "the history page (self-contained HTML): a plot per check over commits, change "
                             "points, the cumulative A/B ratio with its band")
    r.add_argument("-o", "--output", required=True, metavar="FILE.html", help="the page to write")
    r.add_argument("--title", default="perf history", help="the page's heading")
    r.add_argument("--tolerance", type=float, default=SERIES_TOLERANCE,
                   help=f"drawn on the cumulative plots (default {SERIES_TOLERANCE:g})")
    r.set_defaults(history_func=cmd_report)

    c = subcommand("check", "exit 1 on a change point, drift, cumulative change or trend for the worse since REF",
                   "Exit 1 on a change point, drift, cumulative change or trend for the worse since REF (see\n"
                   "--tolerance), naming the commits to bisect. A gap in the A/B chain after REF (commits no run\n"
                   "measured: a push of several commits, a cancelled run) is printed with a warning, not a\n"
                   "failure: the cumulative ratio then covers only the merges after the gap.")
    c.add_argument("--since", required=True, metavar="REF", help="a commit-ish (a release tag, HEAD~20, a SHA)")
    c.add_argument("--tolerance", type=float, default=SERIES_TOLERANCE,
                   help="a cumulative chained A/B ratio fails when it is worse than 1 with its whole 99 %% interval "
                        "and beyond 1 +- this on its estimate; the trend of one machine's values when its 95 %% "
                        f"interval lies entirely beyond 1 +- this (default {SERIES_TOLERANCE:g})")
    c.set_defaults(history_func=cmd_check)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``history`` subcommand to the ``perfbudget`` parser's subparsers; its ``func(args, out)``
    returns the exit code."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "history", help="main-branch history: add results, show a series, the history page, check for drift",
        description=_DESCRIPTION, epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Run a parsed ``perfbudget history`` command; input errors print one line naming the problem and exit 2."""
    try:
        return int(args.history_func(args, out))
    except (_InputError, HistoryError, MissingPackageError) as exc:  # HistoryError: a read the lock kept out
        print(f"perfbudget history {args.history_command}: error: {terminal_text(exc)}", file=sys.stderr)
        return ExitCode.USAGE
