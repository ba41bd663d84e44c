"""The ``perfbudget`` command: render, merge and compare results; show, update and accept budgets."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from .ab.calibration import register as register_calibrate
from .ab.cli import register as register_ab
from .budgets.loader import BudgetSet, confined, load_dir
from .budgets.update import (
    Measured,
    UpdateReport,
    accept_results,
    apply_updates,
    check_commit,
    provenance_commit,
)
from .device import DeviceInfo
from .exitcodes import ExitCode
from .extras import ExtraError
from .fileio import atomic_write, shown_path
from .history.cli import register as register_history
from .instructions_run import run_instructions
from .metrics import parse_name
from .report import (
    CommentLinks,
    device_label,
    diff_results,
    junit_xml,
    markdown_report,
    pr_comment,
    regressions,
    render_diff,
    render_html,
    run_problems,
    terminal_report,
)
from .report.common import plain, terminal_text
from .results import Results, is_unrecorded_budget, load_results, merge_results
from .settings import Settings, for_folder
from .show import explain_budgets
from .verdict.judge import stable_identity
from .vocabulary import tally_text

__all__ = ["EXIT_INPUT", "EXIT_OK", "EXIT_REGRESSION", "ExitCode", "diff_results", "explain_budgets", "main"]

# The names this module has always exported, for callers of ``main``.
EXIT_OK = ExitCode.OK
EXIT_REGRESSION = ExitCode.FAILED
EXIT_INPUT = ExitCode.USAGE

_EPILOG = f"""exit codes:
  {ExitCode.OK:d}  ok
  {ExitCode.FAILED:d}  regressions found (report, diff) or measured values refused by the ratchet (update)
  {ExitCode.USAGE:d}  usage or input error: unreadable or invalid results/budget files, bad arguments
"""


class InputError(Exception):
    """A problem with the command's input, already naming the file."""


def _load(paths: Sequence[str]) -> tuple[Results, list[tuple[str, Results]]]:
    """Load (and merge) results files; duplicated records across files are an input error."""
    parts = []
    for p in paths:
        try:
            parts.append((p, load_results(p)))
        except ValueError as exc:
            raise InputError(str(exc)) from None
    seen: dict[tuple[str, str, str, str], str] = {}
    for p, res in parts:
        for r in res.records:
            if is_unrecorded_budget(r):
                continue  # a shard's "budgeted, not recorded here": the merge reconciles those
            k = (device_label(r), r.nodeid, r.key, r.metric)
            if k in seen and seen[k] != p:
                raise InputError(f"{p}: record {r.nodeid} {r.key}.{r.metric} on {k[0]} is also in {seen[k]}; "
                                 "shards must not overlap")
            seen[k] = p
    if len(parts) == 1:
        return parts[0][1], parts
    merged = merge_results(res for _, res in parts)
    merged.meta = replace(merged.meta, sources=tuple(p for p, _ in parts))
    return merged, parts


def _emit(text: str, output: str | None, out: TextIO) -> None:
    if output in (None, "-"):
        out.write(text if text.endswith("\n") else text + "\n")
        return
    path = Path(output)
    try:
        atomic_write(path, text)  # CI reads these files: never a half-written report
    except OSError as exc:
        raise InputError(f"{path}: cannot write: {exc.strerror or exc}") from None


def _render(results: Results, fmt: str, args: argparse.Namespace) -> str:
    if fmt == "terminal":
        return terminal_report(results)
    if fmt == "markdown":
        return markdown_report(results, title=args.title)
    if fmt == "junit":
        return junit_xml(results)
    if fmt == "comment":
        links = CommentLinks(report_url=args.report_url, history_url=args.history_url,
                             results_url=args.results_url)
        return pr_comment(results, title=args.title, links=links,
                          results_name=" ".join(args.results))
    return render_html(results, title=args.title)


def cmd_report(args: argparse.Namespace, out: TextIO) -> int:
    results, _ = _load(args.results)
    fmt = args.format
    try:
        text = _render(results, fmt, args)
    except ExtraError as exc:
        raise InputError(f"{', '.join(args.results)}: {exc}") from None
    _emit(text, args.output, out)
    if args.output not in (None, "-"):
        print(f"perfbudget: wrote {fmt} report of {len(results.records)} records to {args.output}", file=sys.stderr)
    problems = run_problems(results)
    for problem in problems:
        print(f"perfbudget: {', '.join(args.results)}: {plain(problem)}", file=sys.stderr)
    return ExitCode.FAILED if (regressions(results.records) or problems) and not args.exit_zero else ExitCode.OK


def cmd_merge(args: argparse.Namespace, out: TextIO) -> int:
    merged, parts = _load(args.results)
    if len(parts) == 1:
        merged = merge_results([merged])
        merged.meta = replace(merged.meta, sources=(parts[0][0],))
    try:
        merged.write(args.output)
    except OSError as exc:
        raise InputError(f"{args.output}: cannot write: {exc.strerror or exc}") from None
    counts = tally_text(merged.counts())
    out.write(f"merged {len(parts)} file(s), {len(merged.records)} records ({counts or 'none'}) into {args.output}\n")
    return ExitCode.OK


def cmd_diff(args: argparse.Namespace, out: TextIO) -> int:
    base, _ = _load([args.base])
    new, _ = _load([args.new])
    changes, note = diff_results(base, new, threshold=args.threshold, key=args.key)
    try:
        text = render_diff(changes, note, fmt=args.format, show_all=args.all)
    except ExtraError as exc:
        raise InputError(f"{args.base} or {args.new}: {exc}") from None
    out.write(text)
    return ExitCode.FAILED if any(c.status == "worse" for c in changes) else ExitCode.OK


def _settings(args: argparse.Namespace) -> Settings:
    """The settings a pytest run here would use; the budgets folder inside the repository unless
    named with --budgets-dir (:func:`~perfbudget.budgets.loader.confined`)."""
    try:
        settings = for_folder(Path.cwd(), cli={"budgets_dir": args.budgets_dir,
                                               "threads": getattr(args, "threads", None)})
        budgets_dir = confined(settings.budgets_dir, named=args.budgets_dir is not None)
    except ValueError as exc:  # a BudgetError too
        raise InputError(str(exc)) from None
    return replace(settings, budgets_dir=Path(shown_path(budgets_dir)))


def _devices_for_show(args: argparse.Namespace, threads: int) -> list[DeviceInfo]:
    if args.from_results:
        res, _ = _load([args.from_results])
        seen: dict[str, DeviceInfo] = {}
        for r in res.records:
            if r.device is None:
                raise InputError(f"{args.from_results}: record {r.nodeid} {r.key}.{r.metric} has no device")
            seen.setdefault(device_label(r), r.device)
        if not seen:
            raise InputError(f"{args.from_results}: no records, so no device to show budgets for")
        return [seen[k] for k in sorted(seen)]
    from .measure.machine import describe

    try:
        return [describe(args.device, threads=threads)]
    except RuntimeError as exc:
        raise InputError(f"--device {args.device}: {exc}") from None


def cmd_show(args: argparse.Namespace, out: TextIO) -> int:
    settings = _settings(args)
    budgets = load_dir(settings.budgets_dir)
    if not settings.budgets_dir.is_dir():
        out.write(terminal_text(f"note: {settings.budgets_dir} does not exist: no budgets yet\n"))
    broken = False
    devices = _devices_for_show(args, settings.threads)
    if args.identity:
        for info in devices:
            out.write(f"{info.identity or 'unknown'}\n")
        return ExitCode.OK
    for i, info in enumerate(devices):
        try:
            stable = not args.from_results and stable_identity(settings.stable_machine, info) is not None
        except ValueError as exc:
            raise InputError(str(exc)) from None
        text, bad = explain_budgets(budgets, info, key=args.key, stable=stable)
        out.write(("\n" if i else "") + terminal_text(text) + "\n")  # keys and paths from budget files
        broken = broken or bad
    return ExitCode.USAGE if broken else ExitCode.OK


def _not_plain(folder: str, names: list[str]) -> list[str]:
    """The entries of ``folder`` a dry run does not copy: neither a folder, a regular file nor a link."""
    return [n for n in names if not (os.path.islink(p := os.path.join(folder, n)) or os.path.isdir(p)
                                     or os.path.isfile(p))]


def _write_budgets(root: Path, dry_run: bool, write: Callable[[BudgetSet], UpdateReport],
                   out: TextIO) -> int:
    """Run ``write`` on the budgets at ``root`` (a copy for a dry run), print it; the exit code."""
    if dry_run:
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "budgets"
            if root.is_dir():
                # Links copied as links (the loader refuses them as in a real run, never reads what they
                # lead to); a FIFO or device left out (copying /dev/zero would never end).
                shutil.copytree(root, copy, symlinks=True, ignore=_not_plain)
            report = write(load_dir(copy))
            text = _render_update(report).replace(str(copy), terminal_text(root))
        out.write(f"dry run: nothing written to {terminal_text(root)}\n{text}\n")
    else:
        report = write(load_dir(root))
        out.write(_render_update(report) + "\n")
    if report.errors:
        return ExitCode.USAGE
    return ExitCode.FAILED if any(c.action == "refused" for c in report.changes) else ExitCode.OK


def _trusted(measured: Sequence[Measured], args: argparse.Namespace, out: TextIO) -> frozenset[str]:
    """The claimed machine identities whose machine-dependent budget files may be written, said on ``out``."""
    from .measure.machine import trusted_identities

    claimed = {m.device.identity: m.device.type for m in measured
               if m.device.identity and not parse_name(m.metric).metric.portable_on(m.device.type)}
    return trusted_identities(claimed, trust_claims=args.trust_identity, out=out)


def cmd_update(args: argparse.Namespace, out: TextIO) -> int:
    results, _ = _load(args.results)
    measured = results.measured()
    commit = provenance_commit(Path.cwd())
    trusted = _trusted(measured, args, out)
    return _write_budgets(_settings(args).budgets_dir, args.dry_run, lambda budgets: apply_updates(
        measured, budgets, allow_loosen=args.allow_loosen, commit=commit, trusted=trusted), out)


def _measured_commit(parts: Sequence[tuple[str, Results]], given: str | None) -> str:
    """The commit the results measured: ``--commit``, else the files' ``meta.ab.head_commit``."""
    if given:
        try:
            return check_commit(given)
        except ValueError as exc:
            raise InputError(f"--commit: {exc}") from None
    named = {path: res.head_commit for path, res in parts}
    for path, commit in named.items():
        if commit is None:
            raise InputError(f"{path}: meta.ab.head_commit: the results do not name the commit "
                             "they measured (a pytest run, not perfbudget ab): pass --commit SHA")
        try:
            check_commit(commit)
        except ValueError as exc:
            raise InputError(f"{path}: meta.ab.head_commit: {exc}") from None
    commits = set(named.values())
    if len(commits) > 1:
        which = ", ".join(f"{p}: {c}" for p, c in named.items())
        raise InputError(f"the results measured different commits ({which}): accept one run's "
                         "results")
    return str(commits.pop())


def cmd_accept(args: argparse.Namespace, out: TextIO) -> int:
    results, parts = _load(args.results)
    if not args.reason.strip():
        raise InputError("--reason: expected why the change is expected (kept in the budgets' "
                         f"provenance), got {args.reason!r}")
    commit = _measured_commit(parts, args.commit)
    measured = results.measured()
    trusted = _trusted(measured, args, out)
    return _write_budgets(_settings(args).budgets_dir, args.dry_run, lambda budgets: accept_results(
        measured, budgets, reason=args.reason, commit=commit, trusted=trusted), out)


def _render_update(report: UpdateReport) -> str:
    """The update's report for the terminal: keys, diffs and errors come from budget and results files."""
    text = report.render()
    kept = sum(1 for c in report.changes if c.action == "kept")
    return terminal_text(text + (f"\n{kept} value(s) kept (unchanged or within noise)" if kept else ""))


def cmd_instructions(args: argparse.Namespace, out: TextIO) -> int:
    pytest_args = list(args.pytest_args)
    if pytest_args and pytest_args[0] == "--":
        pytest_args = pytest_args[1:]
    return run_instructions(pytest_args, args.out).exit_code


_BUDGETS_DIR_HELP = ("budget folder (default: ini perfbudget_budgets_dir of the pytest run here, else budgets; "
                     "refused when it leads out of the repository)")
_TRUST_HELP = ("write timing, instruction counts and other values of a budget file keyed by a machine identity "
               "when the results claim another identity than this machine's (perfbudget show --identity). A "
               "results file cannot prove where it ran (anyone can write an identity into one): pass it only "
               "for results the trusted runner's own job produced")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="perfbudget", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EPILOG,
        description="Render, merge and compare perfbudget results; show and update budgets.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _results_commands(sub)
    _budget_commands(sub)
    register_ab(sub)  # perfbudget ab: the lockstep A/B run (its own module)
    register_calibrate(sub)  # perfbudget calibrate: each check's A/B noise, beside the budgets
    register_history(sub)  # perfbudget history: main's results kept, plotted, checked for drift
    return p


def _command(sub: Any, name: str, help: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help, epilog=_EPILOG,
                                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    return parser


def _results_commands(sub: Any) -> None:
    """report, merge, diff: what reads results files."""
    r = _command(sub, "report", "render results JSON (several files are merged first)")
    r.add_argument("results", nargs="+", help="results JSON file(s) written by pytest (--perf-json)")
    r.add_argument("-f", "--format", choices=("terminal", "markdown", "html", "junit", "comment"),
                   default="terminal",
                   help="comment: the pull-request comment (failures first, one line per passing "
                        "group, the accept command)")
    r.add_argument("-o", "--output", help="write here instead of standard output")
    r.add_argument("--title", default="perf budgets",
                   help="heading of markdown/html reports and the comment")
    r.add_argument("--report-url", default="", metavar="URL",
                   help="comment: link to the HTML report")
    r.add_argument("--history-url", default="", metavar="URL",
                   help="comment: link to the history page")
    r.add_argument("--results-url", default="", metavar="URL",
                   help="comment: link to the results file (or the artifact holding it)")
    r.add_argument("--exit-zero", action="store_true", help="exit 0 even when the results hold regressions")
    r.set_defaults(func=cmd_report)

    m = _command(sub, "merge", "merge shard results (xdist workers, CI matrix jobs) into one file")
    m.add_argument("results", nargs="+", help="results JSON files to merge")
    m.add_argument("-o", "--output", required=True, help="merged results JSON to write")
    m.set_defaults(func=cmd_merge)

    d = _command(sub, "diff", "compare two results files, operator by operator")
    d.add_argument("base", help="reference results JSON (e.g. from the main branch)")
    d.add_argument("new", help="results JSON to judge")
    d.add_argument("--threshold", type=float, default=None,
                   help="relative change that counts as a move (default: each budget's tolerance)")
    d.add_argument("--key", help="only this workload key")
    d.add_argument("--all", action="store_true", help="also list what did not move")
    d.add_argument("-f", "--format", choices=("text", "markdown"), default="text")
    d.set_defaults(func=cmd_diff)


def _budget_commands(sub: Any) -> None:
    """show, update, accept, instructions: what reads or writes budgets, or measures for them."""
    s = _command(sub, "show", "the budgets that apply to this machine, and why")
    s.add_argument("--budgets-dir", help=_BUDGETS_DIR_HELP)
    s.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="which device of this machine")
    s.add_argument("--threads", type=int, help="torch threads the CPU budgets assume (default: ini perfbudget_threads, "
                                               "else 1)")
    s.add_argument("--from-results", metavar="RESULTS",
                   help="use the device(s) recorded in a results file instead of this machine")
    s.add_argument("--key", help="only this workload key")
    s.add_argument("--identity", action="store_true",
                   help="print only the machine identity (what PERFBUDGET_STABLE_MACHINE and budget files name)")
    s.set_defaults(func=cmd_show)

    u = _command(sub, "update", "write a results file's measured values into the budgets (ratchet)")
    u.add_argument("results", nargs="+", help="results JSON file(s)")
    u.add_argument("--budgets-dir", help=_BUDGETS_DIR_HELP)
    u.add_argument("--allow-loosen", action="store_true", help="also write values worse than the budget")
    u.add_argument("--dry-run", action="store_true", help="print the diff, write nothing")
    u.add_argument("--trust-identity", action="store_true", help=_TRUST_HELP)
    u.set_defaults(func=cmd_update)

    a = _command(sub, "accept", "accept a reviewed change: write budgets from a run's own "
                                      "results, with the reason and the commit in provenance")
    a.add_argument("results", nargs="+",
                   help="results JSON file(s) of the run that made the change (a pull request's "
                        "A/B results)")
    a.add_argument("--reason", required=True,
                   help="why the change is expected (kept in each entry's provenance)")
    a.add_argument("--budgets-dir", help=_BUDGETS_DIR_HELP)
    a.add_argument("--commit", metavar="SHA",
                   help="the commit measured, for results that do not name it (a pytest run); "
                        "default: the A/B run's head")
    a.add_argument("--dry-run", action="store_true", help="print the diff, write nothing")
    a.add_argument("--trust-identity", action="store_true", help=_TRUST_HELP)
    a.set_defaults(func=cmd_accept)
    i = _command(sub, "instructions", "run pytest under callgrind, so perf instruction counts are measured")
    i.add_argument("--out", default=".perfbudget/instructions",
                   help="folder for callgrind dumps, valgrind logs and the results JSON "
                        "(default: .perfbudget/instructions)")
    i.add_argument("pytest_args", nargs="*", metavar="-- PYTEST_ARGS", help="arguments for pytest")
    i.set_defaults(func=cmd_instructions)


def main(argv: Iterable[str] | None = None, *, out: TextIO | None = None) -> int:
    """Run the command line; returns the exit code (see the module docstring)."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # argparse: --help exits 0, usage errors 2
        return int(exc.code or 0)
    stream = out or sys.stdout
    try:
        return int(args.func(args, stream))
    except InputError as exc:
        print(f"perfbudget {args.command}: error: {terminal_text(exc)}", file=sys.stderr)
        return ExitCode.USAGE
    except BrokenPipeError:  # `perfbudget report ... | head`
        return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
