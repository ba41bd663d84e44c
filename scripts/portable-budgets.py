#!/usr/bin/env python3
"""Move machine-independent budgets into the portable ``cpu.yaml``, with tolerances from several machine kinds.

A CPU-model file (``device: {type: cpu, model: ...}``) should hold timing only; memory per
phase, numeric errors, loss drift and lever ratios hold on any CPU, so there they are
unbudgeted on every other model. This script

1. moves every non-statistical entry (kind ``exact`` or ``bytes``: not timing, rate or
   energy) of a CPU-model file into the ``{type: cpu}`` file, keeping its value and
   provenance;
2. for every entry of that file that was also measured on another machine kind, sets

       tolerance = max(kind default, SAFETY x (max / min - 1))

   over the values of all machine kinds (rounded up to a whole percent, at most 1), and
   a ``note`` naming the machines and values it came from (for a lever ratio that is the
   lever's guarantee, the guarantee too);
3. checks, on the result, that every value measured on every machine passes (neither
   fails nor reads stale), and that a device of each model resolves the same budgets
   as before plus the moved ones.

Values are never typed in: the other machine's values come from folders that
``pytest --update-budgets --budgets-dir DIR`` wrote into on that machine (start from an
empty folder, so every value is written), e.g. on an AMD EPYC VM::

    mkdir /tmp/amd && pytest perf_tests/test_levers.py perf_tests/test_padding.py -k "not bucketing" \\
        "perf_tests/test_encoder.py::test_peak_memory_per_phase" \\
        "perf_tests/test_encoder.py::test_numerical_health" \\
        perf_tests/test_segmentation.py::test_peak_memory_per_phase \\
        --budgets-dir /tmp/amd --update-budgets
    scripts/portable-budgets.py --measured /tmp/amd

Why ``max / min - 1``: the relative spread over the smallest value bounds how far any
measured machine sits from any other, so the budget holds on each of them whichever one
later writes the value (the updater tightens exact budgets to the last machine that ran).
Why SAFETY = 2: two or three machine kinds give a lower bound of the spread across all
CPUs (vector widths, libm and oneDNN paths differ); doubling it leaves room for the next
kind while a regression of twice the observed spread still fails.

Exit status: 0 written (or nothing to do), 1 a check failed (nothing written), 2 bad input.
"""

from __future__ import annotations

import argparse
import difflib
import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfbudget.budgets import Budget, BudgetFile, BudgetSet, load_dir, parse_text
from perfbudget.budgets.loader import read_text

# The updater's file handling: one lock per folder, deterministic rendering, atomic replace.
from perfbudget.budgets.update import _raw_doc, render_doc
from perfbudget.device import DeviceInfo
from perfbudget.fileio import atomic_write, lock
from perfbudget.metrics import parse_name
from perfbudget.settings import for_folder
from perfbudget.verdict.judge import decide
from perfbudget.verdict.rule import tolerance_for

SAFETY = 2.0
"""Multiple of the observed cross-machine spread a tolerance covers (see the module doc)."""

GUARANTEES: dict[tuple[str, str], str] = {
    ("lever-clipping", "ratio[small_layer_shrink]"):
        "per-layer clipping leaves a layer whose own gradient did not spike unshrunk",
    ("lever-precision", "ratio[nonfinite_steps_layered_vs_whole_fp16]"):
        "the layered fp16 policy applies no optimizer step with non-finite gradients (the scaler skips it)",
    ("lever-precision", "nonfinite_grads"):
        "the layered fp16 policy applies no optimizer step with non-finite gradients (the scaler skips it)",
}
"""Budgets that encode a lever's own guarantee (an exact bound), named in the entry's note."""

NOTE_PREFIX = "portable, measured on"
NOTE_MARK = "scripts/portable-budgets.py"
"""Marks a note this script wrote, so a rerun replaces it rather than appending."""


@dataclass(frozen=True, kw_only=True)
class Seen:
    """One machine kind's value for an entry."""

    machine: str
    """``provenance.device`` of the entry that holds the value."""
    value: float
    source: str


@dataclass(kw_only=True)
class Plan:
    """What the script will write for one (key, metric)."""

    key: str
    metric: str
    budget: Budget
    seen: list[Seen]
    tolerance: float
    note: str
    move_from: Path | None = None
    old_tolerance: float = 0.0


@dataclass(kw_only=True)
class Result:
    plans: list[Plan] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    """Entries left where they are, with the reason."""


def _machine(b: Budget) -> str | None:
    return b.provenance.device if b.provenance is not None else None


def _ceil_percent(x: float) -> float:
    # Round first: 0.03 * 100 is 3.0000000000000004 and must not become 4 %.
    return math.ceil(round(x * 100, 6)) / 100


def spread(values: Iterable[float]) -> float:
    """``max / min - 1`` over ``values``; 0 when all are equal, ``inf`` when only the smallest is 0."""
    vs = list(values)
    lo, hi = min(vs), max(vs)
    if hi == lo:
        return 0.0
    return math.inf if lo <= 0 else hi / lo - 1.0


def derive_tolerance(metric: str, values: Iterable[float], safety: float = SAFETY) -> float:
    """``max(kind default, safety x spread)``, rounded up to a whole percent, at most 1."""
    default = tolerance_for(parse_name(metric).metric).value
    s = spread(values)
    return min(1.0, max(default, _ceil_percent(safety * s) if math.isfinite(s) else 1.0))


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def _note(key: str, metric: str, seen: list[Seen], tol: float, safety: float) -> str:
    info = parse_name(metric).metric
    values = ", ".join(f"{s.machine} {_fmt(s.value)}" for s in seen)
    s = spread(s.value for s in seen)
    spread_txt = "identical" if s == 0 else (f"spread {s:.1%}" if math.isfinite(s) else "spread unbounded (a 0)")
    text = (f"{NOTE_PREFIX} {values}; {spread_txt}; tolerance max({info.kind} default "
            f"{tolerance_for(info).value:.0%}, {safety:g} x spread) = {tol:.0%} ({NOTE_MARK})")
    guarantee = GUARANTEES.get((key, metric))
    return f"lever guarantee: {guarantee}; {text}" if guarantee else text


def _merge_note(old: str | None, new: str) -> str:
    """The derived note, after a reviewer's own note (a note this script wrote is replaced)."""
    if not old or NOTE_MARK in old:
        return new
    return f"{old}; {new}"


def _observed(measured: list[BudgetSet]) -> dict[tuple[str, str], list[Budget]]:
    out: dict[tuple[str, str], list[Budget]] = {}
    for bs in measured:
        for f in bs.files:
            for key, metrics in f.entries.items():
                for metric, b in metrics.items():
                    out.setdefault((key, metric), []).append(b)
    return out


def _portable_file(budgets: BudgetSet) -> BudgetFile | None:
    for f in budgets.files:
        if f.selector is not None and f.selector.as_dict() == {"type": "cpu"}:
            return f
    return None


def _model_files(budgets: BudgetSet) -> list[BudgetFile]:
    return [f for f in budgets.files
            if f.selector is not None and f.selector.as_dict().get("type") == "cpu" and "model" in f.selector.as_dict()]


def plan(budgets: BudgetSet, measured: list[BudgetSet], safety: float = SAFETY) -> Result:
    """Decide moves, tolerances and notes; reads only, writes nothing."""
    result = Result()
    observed = _observed(measured)
    portable = _portable_file(budgets)
    candidates: list[tuple[Budget, Path | None]] = []
    for f in _model_files(budgets):
        for metrics in f.entries.values():
            for b in metrics.values():
                info = parse_name(b.metric).metric
                # Numerics that follow the kernel path are filed per ISA class, never portable.
                if not info.statistical and not info.per_isa:
                    candidates.append((b, f.path))
    if portable is not None:
        moving = {(b.key, b.metric): b for b, _ in candidates}
        for metrics in portable.entries.values():
            for b in metrics.values():
                twin = moving.get((b.key, b.metric))
                if twin is None:
                    candidates.append((b, None))
                elif twin.value != b.value:
                    raise SystemExit(f"{b.source}:{b.line}: budgets.{b.key}.{b.metric}: {_fmt(b.value)} here, "
                                     f"{_fmt(twin.value)} in {twin.source}; keep one of them by hand first")
                # Same value in both (an interrupted earlier run): the move overwrites this one.
    for b, move_from in candidates:
        here = _machine(b)
        if here is None:
            result.kept.append(f"{b.key}.{b.metric}: no provenance, so no machine to compare with")
            continue
        seen = [Seen(machine=here, value=b.value, source=b.source)]
        for other in observed.get((b.key, b.metric), []):
            machine = _machine(other)
            if machine is not None and machine not in {s.machine for s in seen}:
                seen.append(Seen(machine=machine, value=other.value, source=other.source))
        if len(seen) < 2:
            if move_from is not None:
                result.kept.append(f"{b.key}.{b.metric}: measured only on {here}; measure it on another "
                                   "machine kind (--measured) before it moves")
            continue
        tol = derive_tolerance(b.metric, (s.value for s in seen), safety)
        result.plans.append(Plan(key=b.key, metric=b.metric, budget=b, seen=seen, tolerance=tol,
                                 note=_merge_note(b.note, _note(b.key, b.metric, seen, tol, safety)),
                                 move_from=move_from,
                                 old_tolerance=b.tolerance))
    result.plans.sort(key=lambda p: (p.key, p.metric))
    return result


def _entry(data: dict[str, Any], key: str, metric: str) -> dict[str, Any]:
    raw = data["budgets"][key][metric]
    return dict(raw) if isinstance(raw, dict) else {"value": raw}


def render(budgets: BudgetSet, result: Result) -> dict[Path, tuple[str | None, str]]:
    """New text per changed file: ``path -> (old text or None, new text)``."""
    portable = _portable_file(budgets)
    target = portable.path if portable is not None else budgets.root / "cpu.yaml"
    docs: dict[Path, tuple[str | None, dict[str, Any]]] = {}

    def doc(path: Path, selector: dict[str, Any]) -> dict[str, Any]:
        if path not in docs:
            old = read_text(path, budgets.root) if path.exists() or path.is_symlink() else None
            docs[path] = (old, _raw_doc(old, selector))
        return docs[path][1]

    dest = doc(target, {"type": "cpu"})
    for p in result.plans:
        src = doc(p.move_from, {}) if p.move_from is not None else dest
        entry = _entry(src, p.key, p.metric)
        if p.move_from is not None:
            del src["budgets"][p.key][p.metric]
            if not src["budgets"][p.key]:
                del src["budgets"][p.key]
        entry["tolerance"] = p.tolerance
        entry["note"] = p.note
        # Field order as the updater writes it: value, tolerance, note, provenance.
        ordered = {k: entry[k] for k in ("value", "tolerance", "note", "provenance") if k in entry}
        dest["budgets"].setdefault(p.key, {})[p.metric] = ordered
    out = {}
    for path, (old, data) in docs.items():
        new = render_doc(data)
        if new != old:
            out[path] = (old, new)
    return out


def _device_of(f: BudgetFile) -> DeviceInfo:
    """A device that a CPU-model file's selector picks (for resolving before and after)."""
    sel = f.selector.as_dict() if f.selector is not None else {}
    return DeviceInfo(type="cpu", model=str(sel.get("model", "")), count=int(sel.get("count", 1)),
                      threads=sel.get("threads"))


def verify(before: BudgetSet, after: BudgetSet, measured: list[BudgetSet], result: Result) -> list[str]:
    """Problems with the result; empty when every check holds."""
    problems = [str(e) for e in after.file_errors + after.entry_errors]
    if problems:
        return problems
    devices = [_device_of(f) for f in _model_files(before)]
    devices += [_device_of(f) for bs in measured for f in _model_files(bs)]
    keys = {k for bs in (before, after) for f in bs.files for k in f.entries}
    for dev in devices:
        for key in sorted(keys):
            old, new = before.budgets_for(key, dev), after.budgets_for(key, dev)
            for metric, b in old.items():
                if metric not in new:
                    problems.append(f"{dev.model}: {key}.{metric} was budgeted and no longer is")
                elif new[metric].value != b.value or new[metric].tolerance < b.tolerance:
                    problems.append(f"{dev.model}: {key}.{metric} changed from {_fmt(b.value)} ±{b.tolerance:.0%} "
                                    f"to {_fmt(new[metric].value)} ±{new[metric].tolerance:.0%}")
    # Every value measured on every machine is judged "pass" by the new budget.
    for p in result.plans:
        now = after.resolve(p.key, p.metric, DeviceInfo(type="cpu", model="any other CPU", count=1, threads=1))
        if now is None:
            problems.append(f"{p.key}.{p.metric}: not budgeted on a CPU model without a file of its own")
            continue
        for s in p.seen:
            v = decide(p.key, p.metric, s.value, now)
            if v.outcome != "pass":
                problems.append(f"{p.key}.{p.metric}: {s.machine} {_fmt(s.value)} would be {v.outcome}: {v.reason}")
    return problems


def table(result: Result) -> str:
    machines: list[str] = []
    for p in result.plans:
        for s in p.seen:
            if s.machine not in machines:
                machines.append(s.machine)
    head = ["key", "metric", *machines, "ratio", "tolerance", "file"]
    rows = []
    for p in result.plans:
        by = {s.machine: s.value for s in p.seen}
        values = [by[m] for m in machines if m in by]
        ratio = max(values) / min(values) if min(values) > 0 else (1.0 if max(values) == 0 else math.inf)
        where = f"{p.move_from.name} -> cpu.yaml" if p.move_from is not None else "cpu.yaml"
        rows.append([p.key, p.metric, *(_fmt(by[m]) if m in by else "-" for m in machines), f"{ratio:.4f}",
                     f"{p.old_tolerance:.0%} -> {p.tolerance:.0%}", where])
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--budgets", type=Path, default=None,
                    help="the budgets folder to rewrite (default: the repository's, its ini key "
                         "perfbudget_budgets_dir, else budgets/)")
    ap.add_argument("--measured", type=Path, action="append", default=[], required=True,
                    help="a budgets folder written by --update-budgets on another machine kind (repeatable)")
    ap.add_argument("--safety", type=float, default=SAFETY, help=f"multiple of the spread (default {SAFETY:g})")
    ap.add_argument("--dry-run", action="store_true", help="print the table and the diff, write nothing")
    args = ap.parse_args(argv)
    if args.budgets is None:
        try:
            args.budgets = for_folder(Path(__file__).resolve().parents[1]).budgets_dir
        except ValueError as exc:  # an ini file that does not parse, a bad value
            print(f"--budgets: {exc}", file=sys.stderr)
            return 2
    if not args.safety >= 1:
        print(f"--safety must be >= 1, got {args.safety}", file=sys.stderr)
        return 2
    budgets = load_dir(args.budgets)
    measured = [load_dir(d) for d in args.measured]
    bad = [str(e) for bs in (budgets, *measured) for e in bs.file_errors + bs.entry_errors]
    bad += [f"{d}: no budget files" for d, bs in zip(args.measured, measured, strict=True) if not bs.files]
    if bad:
        print("\n".join(bad), file=sys.stderr)
        return 2
    with lock(args.budgets):
        result = plan(budgets, measured, args.safety)
        texts = render(budgets, result)
        after = BudgetSet(root=budgets.root, files=[
            parse_text(texts[f.path][1], f.path) if f.path in texts else f for f in budgets.files
        ] + [parse_text(new, p) for p, (old, new) in texts.items() if old is None])
        problems = verify(budgets, after, measured, result)
        print(table(result))
        for line in result.kept:
            print(f"kept in place: {line}")
        for path, (old, new) in sorted(texts.items()):
            if args.dry_run:
                sys.stdout.writelines(difflib.unified_diff(
                    (old or "").splitlines(keepends=True), new.splitlines(keepends=True),
                    fromfile=f"a/{path.name}", tofile=f"b/{path.name}"))
        if problems:
            print("\n".join(f"check failed: {p}" for p in problems), file=sys.stderr)
            return 1
        if args.dry_run or not texts:
            print("nothing written" + (" (dry run)" if args.dry_run else ": budgets already portable"))
            return 0
        # Write the portable file first: a crash in between leaves an entry in both files
        # (the model file's still wins, and a rerun finishes the move), never in none.
        for path in sorted(texts, key=lambda p: p.name != "cpu.yaml"):
            atomic_write(path, texts[path][1])
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
