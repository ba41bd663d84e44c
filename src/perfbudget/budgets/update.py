"""Write measured values back into budget files (ratchet, provenance, atomic replace) and accept results."""

from __future__ import annotations

import datetime as _dt
import difflib
import math
import os
import re
import subprocess
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ..device import DeviceInfo, device_file_stem
from ..fileio import atomic_write, lock
from ..measure.stats import normal_quantile
from ..metrics import parse_name
from ..verdict.rule import Limits, classify, tolerance_for
from .loader import BudgetSet, _Doc, _finite, parse_text, read_text
from .schema import SCHEMA_VERSION, BudgetError

__all__ = [
    "CI_COMMIT_VARIABLES",
    "UNKNOWN_COMMIT",
    "Change",
    "Measured",
    "UpdateReport",
    "accept_results",
    "apply_updates",
    "check_commit",
    "git_commit",
    "measured_value",
    "provenance_commit",
    "widen_tolerances",
]

Action = Literal["added", "tightened", "loosened", "kept", "refused", "skipped"]


@dataclass(frozen=True, kw_only=True)
class Measured:
    """A measured value offered to the updater.

    Attributes:
        value: the median (statistical kinds) or the worst value (exact kinds).
        samples: number of samples behind ``value``.
        cv: noise of the samples, recorded in provenance for timing kinds.
        ref_ms: the machine-speed reference time the value is normalised to, if any.
        noise: relative standard error of ``value`` (statistical kinds), from its CI.
    """

    key: str
    metric: str
    value: float
    samples: int
    cv: float | None
    device: DeviceInfo
    ref_ms: float | None = None
    noise: float | None = None


def measured_value(
    *,
    key: str,
    metric: str,
    value: float,
    n: int,
    cv: float | None,
    device: DeviceInfo,
    ci: tuple[float, float] | None = None,
    confidence: float | None = None,
    ref_ms: float | None = None,
) -> Measured:
    """The :class:`Measured` for a judged value, its noise (relative standard error) from its CI;
    a noise that is not finite is left out, a value that is not finite kept for the updater to refuse."""
    noise = None
    if ci is not None and math.isfinite(value) and value and all(math.isfinite(x) for x in ci):
        z = normal_quantile(0.5 + (confidence or 0.95) / 2)
        noise = abs(ci[1] - ci[0]) / (2 * z * abs(value))
        noise = noise if math.isfinite(noise) else None
    return Measured(key=key, metric=metric, value=float(value), samples=n, cv=cv, device=device,
                    ref_ms=ref_ms, noise=noise)


@dataclass(frozen=True, kw_only=True)
class Change:
    """What the updater did with one measured value."""

    path: Path
    key: str
    metric: str
    action: Action
    old: float | None
    new: float | None
    why: str = ""


@dataclass(kw_only=True)
class UpdateReport:
    """Everything an update did: changes per entry, a unified diff per file, errors."""

    changes: list[Change] = field(default_factory=list)
    diffs: dict[Path, str] = field(default_factory=dict)
    errors: list[BudgetError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def render(self) -> str:
        """Readable text: the diffs, then one line per change, then errors."""
        lines = [diff.rstrip("\n") for diff in self.diffs.values()]
        for c in self.changes:
            if c.action in ("added", "tightened", "loosened"):
                old = "-" if c.old is None else f"{c.old:.6g}"
                lines.append(f"{c.action:>9}  {c.path.name}  {c.key}.{c.metric}: {old} -> {c.new:.6g}")
            elif c.action == "refused":
                lines.append(f"{c.action:>9}  {c.path.name}  {c.key}.{c.metric}: {c.why}")
        skipped: dict[str, list[str]] = {}
        for c in self.changes:
            if c.action == "skipped":
                skipped.setdefault(c.why, []).append(f"{c.key}.{c.metric}")
        for why, names in skipped.items():
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            shown = ", ".join(names[:3]) + more
            lines.append(f"  skipped  {shown}: {why}")
        lines += [f"  warning  {w}" for w in self.warnings]
        lines += [f"    error  {e}" for e in self.errors]
        if not self.diffs and not self.errors:
            lines.append("budgets unchanged")
        return "\n".join(lines)


def git_commit(cwd: str | Path | None = None) -> str | None:
    """Short hash of HEAD (with ``-dirty`` for a changed tree), or ``None`` outside git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, timeout=10,
        )
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


#: What provenance records when nothing names the commit measured (shown in the diff, never a guess).
UNKNOWN_COMMIT = "unknown"

#: (the variable a CI sets in every job, its commit variable): the commit is read only inside that
#: CI; exported anywhere else, GITHUB_SHA is a claim about some other checkout.
CI_COMMIT_VARIABLES: tuple[tuple[str, str], ...] = (("GITHUB_ACTIONS", "GITHUB_SHA"), ("GITLAB_CI", "CI_COMMIT_SHA"))

_COMMIT = re.compile(r"[0-9a-fA-F]{4,40}(-dirty)?")


def check_commit(text: str) -> str:
    """``text`` if it is a commit hash (``-dirty`` allowed); a branch or tag name moves, so it is refused.

    Raises:
        ValueError: naming the value.
    """
    if not _COMMIT.fullmatch(text):
        raise ValueError(f"expected a git commit hash (4 to 40 hex digits, '-dirty' allowed), got {text!r}")
    return text


def provenance_commit(
    cwd: str | Path | None = None, *, given: str | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The commit a budget update records as measured, or ``None`` when nothing names it.

    Asked in order: ``given`` (``pytest --perf-commit SHA``), which wins over git because a copied
    tree may hold a ``.git`` of its own (``scripts/gpu-check.sh`` commits a snapshot); git in
    ``cwd``; the CI's own variable, inside that CI only (:data:`CI_COMMIT_VARIABLES`).

    Raises:
        ValueError: ``given`` is not a commit hash (:func:`check_commit`).
    """
    if given:
        return check_commit(given)
    found = git_commit(cwd)
    if found:
        return found
    env = os.environ if environ is None else environ
    for marker, variable in CI_COMMIT_VARIABLES:
        sha = env.get(variable, "")
        if env.get(marker, "").lower() == "true" and _COMMIT.fullmatch(sha):
            return sha
    return None


def _round(metric: str, value: float) -> float | int:
    kind = parse_name(metric).metric.kind
    if kind in ("exact", "count"):
        # Exact budgets and counts keep full precision: rounding could put the budget below the value.
        return int(value) if float(value).is_integer() else float(value)
    return float(f"{value:.4g}")


#: The stem of a budget file the updater names itself: one path segment, no ``..``.
_FILE_STEM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def _new_file(root: Path, stem: str, measured: Measured) -> Path:
    """``root/<stem>.yaml``; ``BudgetError`` unless ``stem`` (from a results file a pull request's code
    may have written) is one plain segment inside ``root``."""
    path = root / f"{stem}.yaml"
    inside = _FILE_STEM.fullmatch(stem) and ".." not in stem and \
        path.resolve().parent == root.resolve()
    if not inside:
        raise BudgetError(f"{measured.key}.{measured.metric}: refusing to write a budget file outside "
                          f"the budgets folder: the device fields make its name {stem!r}", path=root)
    return path


def _target(measured: Measured, budgets: BudgetSet) -> tuple[Path, dict[str, Any]]:
    """The file a measured value belongs in, and the device block for a new file: where its budget
    lives, else ``cpu.yaml`` (portable), ``cpu-isa-avx2.yaml`` (per ISA) or the identity's file."""
    info = measured.device
    existing = budgets.resolve(measured.key, measured.metric, info)
    if existing is not None:
        return Path(existing.source), {}
    matching = budgets.matching(info)
    metric = parse_name(measured.metric).metric
    if metric.portable_on(info.type):
        broad = [f for f in matching if f.selector and f.selector.specificity == 1]
        if broad:
            return broad[0].path, {}
        return _new_file(budgets.root, info.type, measured), {"type": info.type}
    if metric.per_isa and info.isa_class:
        by_isa = [f for f in matching if f.selector and set(f.selector.as_dict()) == {"type", "isa_class"}]
        if by_isa:
            return by_isa[0].path, {}
        return _new_file(budgets.root, f"{info.type}-isa-{info.isa_class}", measured), \
            {"type": info.type, "isa_class": info.isa_class}
    named = [f for f in matching if f.selector and "identity" in f.selector.as_dict()]
    if named:
        return named[0].path, {}
    selector: dict[str, Any] = {"type": info.type}
    if info.identity:
        selector["identity"] = info.identity
    else:
        selector["model"] = info.model
    if info.type == "cpu" and info.threads:
        selector["threads"] = info.threads
    return _new_file(budgets.root, device_file_stem(info), measured), selector


def _raw_doc(text: str | None, selector: dict[str, Any], path: Path | None = None) -> dict[str, Any]:
    """The budget file's text as plain data, parsed as the loader parses it (or ``BudgetError``)."""

    if text is None:
        return {"schema": SCHEMA_VERSION, "device": selector, "budgets": {}}
    data = _Doc(text, path or Path("<budget file>")).data or {}
    data.setdefault("budgets", {})
    if data["budgets"] is None:
        data["budgets"] = {}
    return data


def render_doc(data: dict[str, Any]) -> str:
    """Deterministic YAML for a budget file: fixed top-level order, keys sorted below."""
    ordered: dict[str, Any] = {"schema": data.get("schema", SCHEMA_VERSION), "device": data["device"]}
    if data.get("note"):
        ordered["note"] = data["note"]
    budgets = {}
    for key in sorted(data.get("budgets", {})):
        metrics = data["budgets"][key]
        budgets[key] = {m: metrics[m] for m in sorted(metrics)}
    ordered["budgets"] = budgets
    header = "# perfbudget budgets (schema 1). Values are written by `pytest --update-budgets`\n" \
             "# or by a reviewer; provenance says where each measured value came from.\n"
    return header + yaml.safe_dump(ordered, sort_keys=False, default_flow_style=False, width=100)


#: Tolerances of statistical budgets stay at least this many standard errors wide.
NOISE_MULTIPLE = 3


def noise_tolerance(default: float, noise: float | None) -> float:
    """A new budget's tolerance: ``default`` widened to 3x a finite noise (whole percent, at most 1)."""
    if noise is None or not math.isfinite(noise):
        return default
    return min(1.0, max(default, math.ceil(min(1.0, NOISE_MULTIPLE * noise) * 100) / 100))


def _unfit(m: Measured) -> str:
    """Why ``m`` cannot go into a budget file (which holds only finite, non-negative numbers), or ``""``."""
    for name in ("value", "cv", "noise", "ref_ms"):
        v = getattr(m, name)
        if (v is not None or name == "value") and not (_finite(v) and v >= 0):
            return f"measured {name} {v!r}: expected a finite non-negative number"
    if isinstance(m.samples, bool) or not isinstance(m.samples, int) or m.samples < 0:
        return f"measured samples {m.samples!r}: expected a non-negative integer"
    return ""


def _decide(entry: Any, m: Measured, allow_loosen: bool) -> tuple[Action, float | None, str]:
    info = parse_name(m.metric).metric
    if entry is None:
        return "added", None, ""
    old = float(entry["value"] if isinstance(entry, dict) else entry)
    tol = float(entry.get("tolerance", tolerance_for(info).value)) if isinstance(entry, dict) else tolerance_for(info).value
    new = float(_round(m.metric, m.value))
    better = new < old if info.direction == "lower" else new > old
    rel = abs(new - old) / abs(old) if old else (0.0 if new == old else float("inf"))
    if new == old:
        return "kept", old, "unchanged"
    if not info.statistical and isinstance(entry, dict) and entry.get("note") and tol > 0 and better:
        # Its tolerance spans several machine kinds: tightening it to this one would fail the others.
        return "kept", old, ("derived from several machines (see its note); re-derive it with "
                             "scripts/portable-budgets.py")
    # Skip churn from noise: a statistical budget moves only beyond a third of its tolerance.
    within = info.statistical and classify(new, new, Limits.around(old, tol / 3, info.direction)) == "pass"
    if better:
        return ("kept", old, f"within a third of the tolerance ({rel:.1%})") if within else ("tightened", old, "")
    if not allow_loosen:
        return "refused", old, f"measured {new:.6g} is worse than {old:.6g}; pass --allow-loosen to accept it"
    return ("kept", old, f"within a third of the tolerance ({rel:.1%})") if within else ("loosened", old, "")


def apply_updates(
    measured: Iterable[Measured],
    budgets: BudgetSet,
    *,
    allow_loosen: bool = False,
    commit: str | None = None,
    date: str | None = None,
    reason: str | None = None,
    trusted: Collection[str] | None = None,
) -> UpdateReport:
    """Write measured values into their budget files, each once, under a folder lock, atomically.

    Args:
        measured: values to write.
        budgets: the loaded budget set (decides targets); none is written while a file cannot be read.
        allow_loosen: accept worse values (default: tighten only).
        commit: the commit measured; ``None``: recorded as :data:`UNKNOWN_COMMIT`, with a warning.
        date: ISO date for provenance (default today).
        reason: why a reviewer accepted the values, recorded in provenance.
        trusted: machine identities whose keyed files may be written (a results file cannot prove
            where it ran); others are ``refused``. ``None``: every one.

    Returns:
        The :class:`UpdateReport` (diffs to print, per-entry actions, errors).
    """
    report = UpdateReport()
    if budgets.file_errors:
        # A file that cannot be read may decide where a value goes: nothing is written until it reads.
        report.errors.extend(budgets.file_errors)
        return report
    date = date or _dt.date.today().isoformat()
    per_file = _by_file(measured, budgets, report, trusted=trusted)
    if not per_file:
        return report
    root = budgets.root
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        report.errors.append(BudgetError(f"cannot create the budgets folder: {exc.strerror}", path=root))
        return report
    try:
        with lock(root):
            for path, (selector, items) in sorted(per_file.items()):
                try:  # one file's failure leaves the files already written, and their diffs, reported
                    _update_file(path, root, selector, items, report, allow_loosen=allow_loosen,
                                 commit=commit, date=date, reason=reason)
                except BudgetError as exc:
                    report.errors.append(exc)
                except Exception as exc:
                    report.errors.append(BudgetError(f"not updated: {type(exc).__name__}: {exc}", path=path))
    except OSError as exc:
        report.errors.append(BudgetError(f"cannot lock the budgets folder: {exc.strerror}", path=root))
    if commit is None and report.diffs:
        report.warnings.append(
            f"provenance records 'commit: {UNKNOWN_COMMIT}': no git repository, no commit passed "
            "(pytest --perf-commit SHA, for a tree copied without .git) and no CI commit variable "
            "(GITHUB_SHA on GitHub Actions, CI_COMMIT_SHA on GitLab CI)")
    return report


def _by_file(measured: Iterable[Measured], budgets: BudgetSet, report: UpdateReport, *,
             trusted: Collection[str] | None) -> dict[Path, tuple[dict[str, Any], list[Measured]]]:
    """The values to write by file (with its selector); one with no file, or not ``trusted``, is reported."""
    per_file: dict[Path, tuple[dict[str, Any], list[Measured]]] = {}
    for m in measured:
        try:
            path, selector = _target(m, budgets)
        except BudgetError as exc:
            report.errors.append(exc)
            continue
        keyed = _keyed_by(path, selector, budgets)
        if trusted is not None and keyed is not None and m.device.identity not in trusted:
            report.changes.append(Change(
                path=path, key=m.key, metric=m.metric, action="refused", old=None, new=m.value,
                why=f"the results claim {keyed}, which a results file cannot prove: write it on that machine, "
                    "or trust the claim (--trust-identity)"))
            continue
        per_file.setdefault(path, (selector, []))[1].append(m)
    return per_file


def _update_file(
    path: Path,
    root: Path,
    selector: dict[str, Any],
    items: list[Measured],
    report: UpdateReport,
    *,
    allow_loosen: bool,
    commit: str | None,
    date: str,
    reason: str | None,
) -> None:
    old_text = read_text(path, root) if os.path.lexists(path) else None
    if old_text is not None:
        parsed = parse_text(old_text, path)
        if parsed.errors:
            report.errors.append(
                BudgetError(f"not updated: the file has {len(parsed.errors)} error(s), first: {parsed.errors[0]}",
                            path=path)
            )
            return
    data = _raw_doc(old_text, selector, path)
    changes: list[Change] = []  # reported once the file is written (kept and refused ones in any case)
    for m in items:
        why = _unfit(m)
        if why:  # refused alone: the file's other values are still written
            changes.append(Change(path=path, key=m.key, metric=m.metric, action="refused", old=None,
                                  new=None, why=why))
            continue
        entries = data["budgets"].setdefault(m.key, {})
        entry = entries.get(m.metric)
        action, old, why = _decide(entry, m, allow_loosen)
        tol = entry.get("tolerance") if isinstance(entry, dict) else None
        if tol is not None and m.noise is not None and float(tol) < NOISE_MULTIPLE * m.noise:
            report.warnings.append(
                f"{path.name} {m.key}.{m.metric}: tolerance {float(tol):.1%} is below {NOISE_MULTIPLE}x the "
                f"measured noise ({m.noise:.1%}): expect false alarms; widen it or measure more samples"
            )
        changes.append(Change(path=path, key=m.key, metric=m.metric, action=action, old=old,
                              new=_round(m.metric, m.value), why=why))
        if action in ("kept", "refused"):
            continue
        info = parse_name(m.metric).metric
        new_entry: dict[str, Any] = {"value": _round(m.metric, m.value)}
        if isinstance(entry, dict):
            new_entry.update({k: v for k, v in entry.items() if k in ("tolerance", "note")})
        # A new budget's tolerance covers its own measurement noise (>= 3 standard errors).
        new_entry.setdefault("tolerance", noise_tolerance(tolerance_for(info).value, m.noise))
        optional = {"identity": m.device.identity or None, "commit": commit or UNKNOWN_COMMIT,
                    "cv": round(m.cv, 4) if info.statistical and m.cv is not None else None,
                    "threads": (m.device.threads or None) if m.device.type == "cpu" else None,
                    "ref_ms": None if m.ref_ms is None else float(f"{m.ref_ms:.4g}"),
                    "noise": round(m.noise, 4) if info.statistical and m.noise is not None else None,
                    "reason": reason or None}
        new_entry["provenance"] = {"device": m.device.label, "torch": m.device.torch, "samples": m.samples,
                                   "date": date, **{k: v for k, v in optional.items() if v is not None}}
        entries[m.metric] = new_entry
    written = False
    try:
        written = any(c.action not in ("kept", "refused") for c in changes) and \
            _write(path, old_text, render_doc(data), report)
    finally:
        report.changes.extend(c for c in changes if written or c.action in ("kept", "refused"))


def _write(path: Path, old_text: str | None, new_text: str, report: UpdateReport) -> bool:
    """Replace ``old_text`` with ``new_text`` (checked to read back); whether ``path`` now holds it."""
    if new_text == old_text:
        return True
    check = parse_text(new_text, path)
    if check.errors:  # never write a file we could not read back
        report.errors.append(BudgetError(f"refusing to write an invalid file: {check.errors[0]}", path=path))
        return False
    try:
        atomic_write(path, new_text)
    except OSError as exc:
        report.errors.append(BudgetError(f"cannot write: {exc.strerror or exc}", path=path))
        return False
    diff = difflib.unified_diff(
        (old_text or "").splitlines(keepends=True),
        new_text.splitlines(keepends=True),
        fromfile=f"a/{path.name}" if old_text is not None else "/dev/null",
        tofile=f"b/{path.name}",
    )
    report.diffs[path] = "".join(diff)
    return True


def _keyed_by(path: Path, selector: Mapping[str, Any], budgets: BudgetSet) -> str | None:
    """The identity the file at ``path`` (or a new one with ``selector``) is keyed by, or ``None``."""
    if not selector:
        f = next((f for f in budgets.files if f.path == path), None)
        selector = f.selector.as_dict() if f is not None and f.selector is not None else {}
    named = selector.get("identity")
    return None if named is None else str(named)


def accept_results(
    measured: Iterable[Measured],
    budgets: BudgetSet,
    *,
    reason: str,
    commit: str,
    date: str | None = None,
    trusted: Collection[str] | None = None,
) -> UpdateReport:
    """Accept a reviewed change from a run's own results: write its values, worse ones too, with the
    reviewer's reason and the results' commit in provenance (:func:`apply_updates`, ``trusted``).

    A timing value is ``skipped`` unless a file keyed by the measuring machine's identity holds or
    would take it: a hosted runner is another machine every time.

    Raises:
        ValueError: ``reason`` is empty, or ``commit`` is not a commit hash (naming the value).
    """
    if not reason.strip():
        raise ValueError("reason: expected why the change is expected (kept in provenance), "
                         f"got {reason!r}")
    check_commit(commit)
    keep: list[Measured] = []
    skipped: list[Change] = []
    for m in measured:
        if parse_name(m.metric).metric.statistical:
            try:
                path, selector = _target(m, budgets)
            except BudgetError:
                keep.append(m)  # apply_updates reports it where it reports every such error
                continue
            identity = m.device.identity
            if selector or identity is None or _keyed_by(path, {}, budgets) is None:
                where = identity or "a machine of unknown identity"
                skipped.append(Change(
                    path=path, key=m.key, metric=m.metric, action="skipped", old=None, new=m.value,
                    why=f"timing measured on {where}: no budget file here is keyed by that "
                        "identity"))
                continue
        keep.append(m)
    report = apply_updates(keep, budgets, allow_loosen=True, commit=commit, date=date,
                           reason=reason.strip(), trusted=trusted)
    report.changes.extend(skipped)
    return report


def widen_tolerances(
    floors: Mapping[tuple[str, str], float],
    budgets: BudgetSet,
    device: DeviceInfo,
    *,
    why: str,
) -> UpdateReport:
    """Raise tolerances to measured floors (never lower them), where each budget lives.

    Floors come from A/A runs (``benchmarks/gate_quality.py``): an update run sees only within-run noise.

    Args:

        floors: ``(key, metric) -> minimum tolerance``.
        budgets: the loaded budget set.
        device: the device whose budgets apply.
        why: recorded as the entry's ``note``.

    Returns:
        An :class:`UpdateReport` with the diff of every file changed.
    """
    report = UpdateReport()
    per_file: dict[Path, dict[tuple[str, str], float]] = {}
    for (key, metric), floor in floors.items():
        b = budgets.resolve(key, metric, device)
        if b is not None and floor > b.tolerance:
            per_file.setdefault(Path(b.source), {})[(key, metric)] = min(1.0, floor)
    with lock(budgets.root):
        for path, items in sorted(per_file.items()):
            old_text = read_text(path, budgets.root)
            data = _raw_doc(old_text, {}, path)
            for (key, metric), tol in items.items():
                entry = data["budgets"][key][metric]
                if not isinstance(entry, dict):
                    entry = data["budgets"][key][metric] = {"value": entry}
                old = float(entry.get("tolerance", 0.0))
                entry["tolerance"] = round(tol, 2)
                entry["note"] = why
                report.changes.append(Change(path=path, key=key, metric=metric, action="loosened",
                                             old=old, new=round(tol, 2), why="tolerance"))
            _write(path, old_text, render_doc(data), report)
    return report

