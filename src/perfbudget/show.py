"""Which budget files apply to a device, why, and which file wins per entry: what ``perfbudget show`` prints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .budgets.loader import BudgetSet
from .budgets.schema import BudgetFile
from .device import DeviceInfo, Selector
from .metrics import parse_name
from .report.common import fmt_tolerance, fmt_value, text_table

__all__ = ["explain_budgets"]


def explain_budgets(budgets: BudgetSet, info: DeviceInfo, *, key: str | None = None,
                    stable: bool = False) -> tuple[str, bool]:
    """Which budget files apply to ``info`` and why, and which file wins per entry.

    Args:
        stable: the machine is declared stable (stored timing budgets keyed by its identity gate).

    Returns:
        The text and whether any budget file has errors.
    """
    lines = [f"device: {info.label}"]
    lines.extend(f"  {line}" for line in info.describe_identity())
    lines.append("  " + ", ".join(f"{k}={v}" for k, v in info.as_dict().items() if v not in (None, "")))
    if stable:
        lines.append(f"  declared stable: stored timing budgets in files keyed by identity={info.identity} gate here")
    else:
        lines.append("  not declared stable: stored timing budgets are advisory here (judge timing with "
                     "`perfbudget ab`); a runner that is always this machine sets "
                     f"PERFBUDGET_STABLE_MACHINE={info.identity or '<identity>'}")
    lines.append("")
    lines.append(f"budget files in {budgets.root} ({len(budgets.files)}):")
    broken = bool(budgets.errors) or any(f.errors for f in budgets.files)
    lines.extend(f"  ERROR {e}" for e in budgets.errors)
    files = sorted(budgets.files, key=lambda f: (-(f.selector.specificity if f.selector else -1), f.path.name))
    if files:
        rows = [_file_row(f, info) for f in files]
        lines.append(text_table(["file", "specificity", "applies", "selector / why"], rows))
    lines.extend(f"  error: {e}" for f in budgets.files for e in f.errors)
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
        rows.append([k, m, fmt_value(win.value, unit), fmt_tolerance(win.tolerance), src, ", ".join(shadowed) or "-"])
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
    why_not = [f"{name}={want} (this device: {getattr(info, name)})" for name, want in f.selector.criteria
               if not Selector(((name, want),)).matches(info)]
    return [f.path.name, str(f.selector.specificity), "no", "; ".join(why_not)]


