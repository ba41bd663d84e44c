"""The ``perfbudget`` command: render, merge and compare results; show and update budgets.

Exit codes: 0 ok; 1 regressions found (``report``, ``diff``) or values refused by the
ratchet (``update``); 2 usage or input error (unreadable results, broken budget files).
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from .budgets.loader import BudgetSet, load_dir
from .budgets.schema import BudgetFile
from .budgets.update import UpdateReport, apply_updates, git_commit
from .device import DeviceInfo, Selector
from .metrics import DEFAULT_TOLERANCE, UnknownMetricError, parse_name
from .report import (
    REGRESSION_OUTCOMES,
    device_label,
    fmt_value,
    junit_xml,
    markdown_report,
    op_rows,
    terminal_report,
    text_table,
)
from .results import Record, Results, load_results, merge_results

__all__ = ["EXIT_INPUT", "EXIT_OK", "EXIT_REGRESSION", "diff_results", "explain_budgets", "main"]

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_INPUT = 2

_EPILOG = """exit codes:
  0  ok
  1  regressions found (report, diff) or measured values refused by the ratchet (update)
  2  usage or input error: unreadable or invalid results/budget files, bad arguments
"""


class InputError(Exception):
    """A problem with the command's input, already naming the file."""


# --------------------------------------------------------------------------- helpers


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
            k = (device_label(r), r.nodeid, r.key, r.metric)
            if k in seen and seen[k] != p:
                raise InputError(f"{p}: record {r.nodeid} {r.key}.{r.metric} on {k[0]} is also in {seen[k]}; "
                                 "shards must not overlap")
            seen[k] = p
    if len(parts) == 1:
        return parts[0][1], parts
    merged = merge_results(res for _, res in parts)
    merged.meta["sources"] = [p for p, _ in parts]
    return merged, parts


def _emit(text: str, output: str | None, out: TextIO) -> None:
    if output in (None, "-"):
        out.write(text if text.endswith("\n") else text + "\n")
        return
    path = Path(output)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot write: {exc.strerror or exc}") from None


def _has_regressions(results: Results) -> bool:
    return any(r.outcome in REGRESSION_OUTCOMES for r in results.records)


# --------------------------------------------------------------------------- report / merge


def cmd_report(args: argparse.Namespace, out: TextIO) -> int:
    results, _ = _load(args.results)
    fmt = args.format
    if fmt == "terminal":
        text = terminal_report(results)
    elif fmt == "markdown":
        text = markdown_report(results, title=args.title)
    elif fmt == "junit":
        text = junit_xml(results)
    else:
        from .html_report import render_html

        text = render_html(results, title=args.title)
    _emit(text, args.output, out)
    if args.output not in (None, "-"):
        print(f"perfbudget: wrote {fmt} report of {len(results.records)} records to {args.output}", file=sys.stderr)
    return EXIT_REGRESSION if _has_regressions(results) and not args.exit_zero else EXIT_OK


def cmd_merge(args: argparse.Namespace, out: TextIO) -> int:
    merged, parts = _load(args.results)
    if len(parts) == 1:
        merged = merge_results([merged])
        merged.meta["sources"] = [parts[0][0]]
    try:
        merged.write(args.output)
    except OSError as exc:
        raise InputError(f"{args.output}: cannot write: {exc.strerror or exc}") from None
    counts = ", ".join(f"{n} {o}" for o, n in sorted(merged.counts().items()))
    out.write(f"merged {len(parts)} file(s), {len(merged.records)} records ({counts or 'none'}) into {args.output}\n")
    return EXIT_OK


# --------------------------------------------------------------------------- diff


@dataclass(frozen=True, kw_only=True)
class Change:
    """One metric compared between a base and a new results file."""

    key: str
    metric: str
    base: Record | None
    new: Record | None
    threshold: float

    @property
    def direction(self) -> str:
        r = self.new or self.base
        return r.direction if r and r.direction else "lower"

    @property
    def rel(self) -> float | None:
        b = _f(self.base.value) if self.base else None
        n = _f(self.new.value) if self.new else None
        if b is None or n is None:
            return None
        if b == 0:
            return 0.0 if n == 0 else math.inf
        return n / b - 1

    @property
    def status(self) -> str:
        """``worse``, ``better``, ``same`` (within the threshold or overlapping CIs), ``new``, ``gone``, ``n/a``."""
        if self.base is None:
            return "new"
        if self.new is None:
            return "gone"
        rel = self.rel
        if rel is None:
            return "n/a"
        worse = rel > 0 if self.direction == "lower" else rel < 0
        if abs(rel) <= self.threshold or rel == 0:
            return "same"
        if self.base.ci and self.new.ci and _overlap(self.base.ci, self.new.ci):
            return "same"  # the medians' CIs overlap: not distinguishable from noise
        return "worse" if worse else "better"


def _f(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def _overlap(a: Sequence[Any], b: Sequence[Any]) -> bool:
    fa, fb = [_f(x) for x in a], [_f(x) for x in b]
    if None in fa or None in fb:
        return False
    return fa[0] <= fb[1] and fb[0] <= fa[1]  # type: ignore[operator]


def _threshold(r: Record, override: float | None) -> float:
    if override is not None:
        return override
    if r.budget and _f(r.budget.get("tolerance")) is not None:
        return float(r.budget["tolerance"])
    try:
        return parse_name(r.metric).metric.default_tolerance
    except UnknownMetricError:
        return DEFAULT_TOLERANCE["timing"]


def diff_results(base: Results, new: Results, *, threshold: float | None = None,
                 key: str | None = None) -> tuple[list[Change], str]:
    """Pair the records of two results files by device, key and metric.

    Records are matched on (device, key, metric); when the two files share no device
    they are matched on (key, metric) alone and the returned note says so.

    Args:
        base: the reference run (e.g. the main branch).
        new: the run to judge.
        threshold: relative change counted as a move; default each metric's budget
            tolerance, else its kind's default.
        key: only this workload key.

    Returns:
        The changes (sorted by key, then operators last) and a note (empty or why matching was loose).
    """
    def index(res: Results, with_device: bool) -> dict[tuple[str, ...], Record]:
        out: dict[tuple[str, ...], Record] = {}
        for r in res.records:
            if key is not None and r.key != key:
                continue
            k = (device_label(r), r.key, r.metric) if with_device else (r.key, r.metric)
            out.setdefault(k, r)
        return out

    note = ""
    devices_b = {device_label(r) for r in base.records}
    devices_n = {device_label(r) for r in new.records}
    with_device = bool(devices_b & devices_n) or not devices_b or not devices_n
    if not with_device:
        note = (f"no common device ({', '.join(sorted(devices_b))} vs {', '.join(sorted(devices_n))}): "
                "compared by key and metric")
    ib, inew = index(base, with_device), index(new, with_device)
    changes = []
    for k in sorted(set(ib) | set(inew)):
        b, n = ib.get(k), inew.get(k)
        ref = n or b
        assert ref is not None
        changes.append(Change(key=ref.key, metric=ref.metric, base=b, new=n, threshold=_threshold(ref, threshold)))
    return changes, note


def _op_name(metric: str) -> tuple[str, str] | None:
    if "[" not in metric or not metric.endswith("]"):
        return None
    fam, arg = metric[:-1].split("[", 1)
    return (fam, arg) if fam in ("op_self_ms", "op_share", "op_count") else None


def _pct(rel: float | None) -> str:
    if rel is None:
        return ""
    return "new" if math.isinf(rel) else f"{rel:+.1%}"


def _val(r: Record | None) -> str:
    return fmt_value(r.value, r.unit) if r is not None else "-"


def _render_diff(changes: list[Change], base: Results, new: Results, note: str, *, fmt: str,
                 show_all: bool) -> str:
    md = fmt == "markdown"

    def table(header: list[str], rows: list[list[str]]) -> list[str]:
        if not md:
            return [text_table(header, rows)]
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out.extend("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows)
        return out

    def head(text: str, level: int) -> str:
        return f"{'#' * (level + 2)} {text}" if md else (text if level == 1 else f"-- {text}")

    lines: list[str] = []
    if note:
        lines += [f"note: {note}", ""]
    keys = sorted({c.key for c in changes})
    counts = {s: sum(1 for c in changes if c.status == s) for s in ("worse", "better", "same", "new", "gone")}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "nothing to compare"
    lines.append(head(f"perf diff: {summary}", 1))
    for k in keys:
        mine = [c for c in changes if c.key == k]
        if not show_all and all(c.status in ("same", "n/a") for c in mine):
            continue
        lines += ["", head(f"{k}", 2)]
        ops: dict[str, dict[str, Change]] = {}
        other = []
        for c in mine:
            parsed = _op_name(c.metric)
            if parsed:
                ops.setdefault(parsed[1], {})[parsed[0]] = c
            else:
                other.append(c)
        if ops:
            rows = []
            def weight(item: tuple[str, dict[str, Change]]) -> float:
                c = item[1].get("op_self_ms") or next(iter(item[1].values()))
                bv = _f(c.base.value) if c.base else 0.0
                nv = _f(c.new.value) if c.new else 0.0
                return -abs((nv or 0.0) - (bv or 0.0))
            for op, fams in sorted(ops.items(), key=weight):
                if not show_all and all(c.status in ("same", "n/a") for c in fams.values()):
                    continue
                cells = [op]
                for fam in ("op_self_ms", "op_share", "op_count"):
                    fc = fams.get(fam)
                    cells.append(f"{_val(fc.base)} -> {_val(fc.new)} {_pct(fc.rel)}".strip() if fc else "-")
                cells.append(", ".join(sorted({c.status for c in fams.values()})))
                rows.append(cells)
            if rows:
                lines += ["", "operators:", *table(["operator", "self ms", "share", "calls", "change"], rows)]
        rows = [[c.metric, _val(c.base), _val(c.new), _pct(c.rel), c.status] for c in other
                if show_all or c.status not in ("same", "n/a")]
        if rows:
            lines += ["", "metrics:", *table(["metric", "base", "new", "change", "status"], rows)]
        lines += _extra_tables(mine, table, show_all)
    return "\n".join(lines) + "\n"


def _extra_tables(changes: list[Change], table: Callable[[list[str], list[list[str]]], list[str]],
                  show_all: bool) -> list[str]:
    """Operator tables kept in records' ``extra`` (``{"ops": [...]}``), compared op by op."""
    lines: list[str] = []
    for c in changes:
        b_ops = {str(o["name"]): o for o in op_rows(c.base.extra)} if c.base else {}
        n_ops = {str(o["name"]): o for o in op_rows(c.new.extra)} if c.new else {}
        if not b_ops and not n_ops:
            continue
        rows = []
        for name in set(b_ops) | set(n_ops):
            b, n = b_ops.get(name, {}), n_ops.get(name, {})
            bs, ns = _f(b.get("self_ms")), _f(n.get("self_ms"))
            rel = (ns / bs - 1) if bs and ns is not None else None
            moved = name not in b_ops or name not in n_ops or (rel is not None and abs(rel) > c.threshold) \
                or b.get("calls") != n.get("calls")
            if not moved and not show_all:
                continue
            calls = f"{fmt_value(_f(b.get('calls')))} -> {fmt_value(_f(n.get('calls')))}"
            rows.append((abs((ns or 0.0) - (bs or 0.0)), [name, f"{fmt_value(bs)} -> {fmt_value(ns)}",
                                                          _pct(rel) if name in b_ops else "new", calls]))
        rows.sort(key=lambda x: -x[0])
        if rows:
            lines += ["", f"operator table of {c.metric} (extra):"]
            lines += table(["operator", "self ms", "change", "calls"], [r for _, r in rows[:25]])
    return lines


def cmd_diff(args: argparse.Namespace, out: TextIO) -> int:
    base, _ = _load([args.base])
    new, _ = _load([args.new])
    changes, note = diff_results(base, new, threshold=args.threshold, key=args.key)
    out.write(_render_diff(changes, base, new, note, fmt=args.format, show_all=args.all))
    return EXIT_REGRESSION if any(c.status == "worse" for c in changes) else EXIT_OK


# --------------------------------------------------------------------------- show


def _why_not(selector: Selector, info: DeviceInfo) -> list[str]:
    """The selector fields this device does not match, each as ``field=want (device has have)``."""
    out = []
    for name, want in selector.criteria:
        if not Selector(((name, want),)).matches(info):
            out.append(f"{name}={want} (this device: {getattr(info, name)})")
    return out


def explain_budgets(budgets: BudgetSet, info: DeviceInfo, *, key: str | None = None) -> tuple[str, bool]:
    """Which budget files apply to ``info`` and why, and which file wins per entry.

    Returns:
        The text and whether any budget file has errors.
    """
    lines = [f"device: {info.label}"]
    lines.append("  " + ", ".join(f"{k}={v}" for k, v in info.as_dict().items() if v not in (None, "")))
    lines.append("")
    lines.append(f"budget files in {budgets.root} ({len(budgets.files)}):")
    broken = bool(budgets.errors)
    for e in budgets.errors:
        lines.append(f"  ERROR {e}")
    rows = []
    for f in sorted(budgets.files, key=lambda f: (-(f.selector.specificity if f.selector else -1), f.path.name)):
        rows.append(_file_row(f, info))
        broken = broken or bool(f.errors)
    if rows:
        lines.append(text_table(["file", "specificity", "applies", "selector / why"], rows))
    for f in budgets.files:
        for e in f.errors:
            lines.append(f"  error: {e}")
    matching = budgets.matching(info)
    lines.append("")
    if not matching:
        lines.append("no budget file selects this device: every metric is unbudgeted here "
                     "(pytest perf_tests --update-budgets creates the device's file)")
        return "\n".join(lines), broken
    lines.append("budgets that apply (most specific file wins per entry):")
    entries: dict[tuple[str, str], list[tuple[BudgetFile, Any]]] = {}
    for f in matching:
        for k, metrics in f.entries.items():
            if key is not None and k != key:
                continue
            for m, b in metrics.items():
                entries.setdefault((k, m), []).append((f, b))
    rows = []
    for (k, m), found in sorted(entries.items()):
        try:
            win = budgets.resolve(k, m, info)
        except ValueError:
            win = None
        shadowed = [f"{f.path.name}={fmt_value(b.value)}" for f, b in found if win is None or b is not win]
        if win is None:
            broken = True
            rows.append([k, m, "-", "-", "AMBIGUOUS: equally specific files", ", ".join(shadowed)])
            continue
        unit = parse_name(m).metric.unit
        src = f"{Path(win.source).name}:{win.line}" if win.line else Path(win.source).name
        rows.append([k, m, fmt_value(win.value, unit), f"{win.tolerance:.0%}", src, ", ".join(shadowed) or "-"])
    if rows:
        lines.append(text_table(["key", "metric", "budget", "tol", "from", "overrides"], rows))
    else:
        lines.append(f"  no entries{f' for key {key!r}' if key else ''}")
    return "\n".join(lines), broken


def _file_row(f: BudgetFile, info: DeviceInfo) -> list[str]:
    if f.selector is None or f.file_errors:
        errs = f.file_errors or f.errors
        return [f.path.name, "-", "ERROR", errs[0].message if errs else "unusable"]
    if f.matches(info):
        return [f.path.name, str(f.selector.specificity), "yes", str(f.selector)]
    return [f.path.name, str(f.selector.specificity), "no", "; ".join(_why_not(f.selector, info))]


def _devices_for_show(args: argparse.Namespace) -> list[DeviceInfo]:
    if args.from_results:
        res, _ = _load([args.from_results])
        seen: dict[str, DeviceInfo] = {}
        for r in res.records:
            try:
                seen.setdefault(device_label(r), r.device_info)
            except TypeError as exc:
                raise InputError(f"{args.from_results}: device of {r.nodeid}: {exc}") from None
        if not seen:
            raise InputError(f"{args.from_results}: no records, so no device to show budgets for")
        return [seen[k] for k in sorted(seen)]
    from .device import describe

    try:
        return [describe(args.device, threads=args.threads)]
    except RuntimeError as exc:
        raise InputError(f"--device {args.device}: {exc}") from None


def cmd_show(args: argparse.Namespace, out: TextIO) -> int:
    budgets = load_dir(args.budgets_dir)
    if not Path(args.budgets_dir).is_dir():
        out.write(f"note: {args.budgets_dir} does not exist: no budgets yet\n")
    broken = False
    for i, info in enumerate(_devices_for_show(args)):
        text, bad = explain_budgets(budgets, info, key=args.key)
        out.write(("\n" if i else "") + text + "\n")
        broken = broken or bad
    return EXIT_INPUT if broken else EXIT_OK


# --------------------------------------------------------------------------- update


def cmd_update(args: argparse.Namespace, out: TextIO) -> int:
    results, _ = _load(args.results)
    root = Path(args.budgets_dir)
    measured = results.measured()
    if args.dry_run:
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "budgets"
            if root.is_dir():
                shutil.copytree(root, copy)
            report = apply_updates(measured, load_dir(copy), allow_loosen=args.allow_loosen,
                                   commit=git_commit(Path.cwd()))
            text = _render_update(report).replace(str(copy), str(root))
        out.write(f"dry run: nothing written to {root}\n{text}\n")
    else:
        report = apply_updates(measured, load_dir(root), allow_loosen=args.allow_loosen,
                               commit=git_commit(Path.cwd()))
        out.write(_render_update(report) + "\n")
    if report.errors:
        return EXIT_INPUT
    return EXIT_REGRESSION if any(c.action == "refused" for c in report.changes) else EXIT_OK


def _render_update(report: UpdateReport) -> str:
    text = report.render()
    kept = sum(1 for c in report.changes if c.action == "kept")
    return text + (f"\n{kept} value(s) kept (unchanged or within noise)" if kept else "")


# --------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="perfbudget", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EPILOG,
        description="Render, merge and compare perfbudget results; show and update budgets.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    r = sub.add_parser("report", help="render results JSON (several files are merged first)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EPILOG)
    r.add_argument("results", nargs="+", help="results JSON file(s) written by pytest (--perf-json)")
    r.add_argument("-f", "--format", choices=("terminal", "markdown", "html", "junit"), default="terminal")
    r.add_argument("-o", "--output", help="write here instead of standard output")
    r.add_argument("--title", default="perf budgets", help="heading of markdown/html reports")
    r.add_argument("--exit-zero", action="store_true", help="exit 0 even when the results hold regressions")
    r.set_defaults(func=cmd_report)

    m = sub.add_parser("merge", help="merge shard results (xdist workers, CI matrix jobs) into one file",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EPILOG)
    m.add_argument("results", nargs="+", help="results JSON files to merge")
    m.add_argument("-o", "--output", required=True, help="merged results JSON to write")
    m.set_defaults(func=cmd_merge)

    d = sub.add_parser("diff", help="compare two results files, operator by operator",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EPILOG)
    d.add_argument("base", help="reference results JSON (e.g. from the main branch)")
    d.add_argument("new", help="results JSON to judge")
    d.add_argument("--threshold", type=float, default=None,
                   help="relative change that counts as a move (default: each budget's tolerance)")
    d.add_argument("--key", help="only this workload key")
    d.add_argument("--all", action="store_true", help="also list what did not move")
    d.add_argument("-f", "--format", choices=("text", "markdown"), default="text")
    d.set_defaults(func=cmd_diff)

    s = sub.add_parser("show", help="the budgets that apply to this machine, and why",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EPILOG)
    s.add_argument("--budgets-dir", default="budgets", help="budget folder (default: budgets)")
    s.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="which device of this machine")
    s.add_argument("--threads", type=int, default=1, help="torch threads the CPU budgets assume (default 1)")
    s.add_argument("--from-results", metavar="RESULTS",
                   help="use the device(s) recorded in a results file instead of this machine")
    s.add_argument("--key", help="only this workload key")
    s.set_defaults(func=cmd_show)

    u = sub.add_parser("update", help="write a results file's measured values into the budgets (ratchet)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EPILOG)
    u.add_argument("results", nargs="+", help="results JSON file(s)")
    u.add_argument("--budgets-dir", default="budgets", help="budget folder (default: budgets)")
    u.add_argument("--allow-loosen", action="store_true", help="also write values worse than the budget")
    u.add_argument("--dry-run", action="store_true", help="print the diff, write nothing")
    u.set_defaults(func=cmd_update)
    return p


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
        print(f"perfbudget {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except BrokenPipeError:  # `perfbudget report ... | head`
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
