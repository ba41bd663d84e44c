#!/usr/bin/env python3
"""Re-key budget files written before machine identity: model-name files, path-dependent numerics.

Two kinds of entries stop meaning what they say once machines are told apart by identity
(vendor, family/model/stepping, ISA class; see ``perfbudget.device.DeviceInfo.identity``):

1. A CPU file selected by its model name alone (``device: {type: cpu, model: "Intel(R) Xeon(R)
   Processor"}``) matches every machine kind that reports that string: different Xeon
   generations, with and without AMX. When every entry's provenance names one identity, the
   file is re-keyed to it (``identity: ...``); otherwise nobody can say which machine it
   describes, and it moves, whole, to ``budgets/unidentified/`` (not loaded; kept for review,
   and re-keyable with ``--identity`` by whoever knows the machine).
2. Low-precision numerics (metrics with ``per_isa``: ``loss_drift``, ``max_abs_error``) depend on
   the kernel path (AMX, AVX-512 bf16, AVX2), so a portable ``{type: cpu}`` file cannot hold
   them. Entries whose provenance names an identity move to that ISA class's file
   (``cpu-isa-<class>.yaml``); the others to ``budgets/unidentified/<file>-path-dependent-numerics.yaml``.

Values are moved, never typed: every entry keeps its value, tolerance, note and provenance.
Re-measure on each machine kind with ``pytest perf_tests --update-budgets``.

Usage:
    scripts/migrate-budgets.py [--budgets-dir DIR] [--dry-run]    (default: the ini's perfbudget_budgets_dir)
    scripts/migrate-budgets.py --identity cpu-intel-xeon-processor-6-143-8-amx budgets/unidentified/X.yaml

Exit status: 0 migrated (or nothing to do), 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from perfbudget.budgets import load_dir
from perfbudget.budgets.update import render_doc
from perfbudget.fileio import atomic_write, lock
from perfbudget.metrics import UnknownMetricError, parse_name
from perfbudget.settings import for_folder

UNIDENTIFIED = "unidentified"


def _doc(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict) or not isinstance(data.get("device"), dict):
        raise ValueError(f"{path}: not a budget file (no device block)")
    data["budgets"] = data.get("budgets") or {}
    return data


def _identities(data: dict[str, Any]) -> set[str | None]:
    out: set[str | None] = set()
    for metrics in data["budgets"].values():
        for entry in (metrics or {}).values():
            prov = entry.get("provenance") if isinstance(entry, dict) else None
            out.add(prov.get("identity") if isinstance(prov, dict) else None)
    return out


def _isa_class(identity: str) -> str:
    """The ISA class is the identity's last part (``cpu-amd-epyc-25-1-1-avx2`` -> ``avx2``)."""
    for cls in ("avx512_bf16", "avx512-bf16"):
        if identity.endswith(cls):
            return "avx512_bf16"
    return identity.rsplit("-", 1)[-1]


def _per_isa(metric: str) -> bool:
    try:
        return parse_name(metric).metric.per_isa
    except UnknownMetricError:
        return False


def _merge_into(path: Path, device: dict[str, Any], moved: dict[str, dict[str, Any]], plan: list[str],
                dry_run: bool) -> None:
    data = _doc(path) if path.exists() else {"schema": 1, "device": device, "budgets": {}}
    for key, metrics in moved.items():
        for metric, entry in metrics.items():
            if metric in data["budgets"].get(key, {}):
                raise ValueError(f"{path}: {key}.{metric} exists already; resolve by hand before migrating")
            data["budgets"].setdefault(key, {})[metric] = entry
            plan.append(f"  {key}.{metric} -> {path}")
    if not dry_run:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, render_doc(data))


def migrate(root: Path, *, dry_run: bool = False) -> list[str]:
    """Migrate every budget file in ``root``; returns what was (or would be) done, one line each."""
    budgets = load_dir(root)
    broken = budgets.file_errors
    if broken:
        raise ValueError("budget files that cannot be loaded (fix them first):\n" + "\n".join(f"  {e}" for e in broken))
    plan: list[str] = []
    with lock(root):
        for f in budgets.files:
            data = _doc(f.path)
            sel = data["device"]
            if sel.get("type") == "cpu" and "model" in sel and not ({"identity", "cpuid"} & set(sel)):
                ids = _identities(data)
                if len(ids) == 1 and None not in ids:
                    ident = next(iter(ids))
                    data["device"] = {"type": "cpu", "identity": ident,
                                      **({"threads": sel["threads"]} if "threads" in sel else {})}
                    plan.append(f"{f.path}: keyed by the model name {sel['model']!r}; re-keyed to identity {ident}")
                    if not dry_run:
                        atomic_write(f.path, render_doc(data))
                else:
                    dest = root / UNIDENTIFIED / f.path.name
                    plan.append(f"{f.path}: keyed by the model name {sel['model']!r}, which several machine kinds "
                                f"report, and its provenance names no identity: moved to {dest} (not loaded)")
                    if not dry_run:
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        f.path.replace(dest)
                continue
            if set(sel) != {"type"}:
                continue
            # A portable file: path-dependent numerics leave it.
            moved: dict[Path, dict[str, dict[str, Any]]] = {}
            devices: dict[Path, dict[str, Any]] = {}
            for key, metrics in list(data["budgets"].items()):
                for metric in [m for m in metrics if _per_isa(m)]:
                    entry = metrics.pop(metric)
                    prov = entry.get("provenance") if isinstance(entry, dict) else None
                    ident = prov.get("identity") if isinstance(prov, dict) else None
                    if ident:
                        cls = _isa_class(ident)
                        dest = root / f"{sel['type']}-isa-{cls}.yaml"
                        devices[dest] = {"type": sel["type"], "isa_class": cls}
                    else:
                        dest = root / UNIDENTIFIED / f"{f.path.stem}-path-dependent-numerics.yaml"
                        devices[dest] = dict(sel)
                    moved.setdefault(dest, {}).setdefault(key, {})[metric] = entry
                if not metrics:
                    del data["budgets"][key]
            if not moved:
                continue
            plan.append(f"{f.path}: numerics that depend on the kernel path leave the portable file:")
            for dest, entries in moved.items():
                _merge_into(dest, devices[dest], entries, plan, dry_run)
            if not dry_run:
                atomic_write(f.path, render_doc(data))
    return plan


def rekey(path: Path, identity: str, root: Path, *, dry_run: bool = False) -> list[str]:
    """Key an unidentified file by ``identity`` (its machine is known to whoever runs this)."""
    data = _doc(path)
    sel = data["device"]
    data["device"] = {"type": sel.get("type", "cpu"), "identity": identity,
                      **({"threads": sel["threads"]} if "threads" in sel else {})}
    dest = root / f"{identity}.yaml"
    if dest.exists():
        raise ValueError(f"{dest} exists: merge by hand")
    if not dry_run:
        atomic_write(dest, render_doc(data))
        path.unlink()
    return [f"{path}: keyed by identity {identity} -> {dest}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets-dir", default=None, type=Path,
                    help="the budgets folder (default: the ini key perfbudget_budgets_dir as pytest reads it here, "
                         "else budgets)")
    ap.add_argument("--dry-run", action="store_true", help="say what would change; write nothing")
    ap.add_argument("--identity", help="with FILE: key an unidentified file by this machine identity")
    ap.add_argument("file", nargs="?", type=Path, help="with --identity: the file to key")
    args = ap.parse_args(argv)
    try:
        if args.budgets_dir is None:
            args.budgets_dir = for_folder(Path.cwd()).budgets_dir
        if args.identity or args.file:
            if not (args.identity and args.file):
                ap.error("--identity and FILE go together")
            plan = rekey(args.file, args.identity, args.budgets_dir, dry_run=args.dry_run)
        else:
            plan = migrate(args.budgets_dir, dry_run=args.dry_run)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"migrate-budgets: {exc}", file=sys.stderr)
        return 2
    print("\n".join(plan) if plan else "nothing to migrate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
