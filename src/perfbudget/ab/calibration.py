"""``perfbudget calibrate``: each check's measured A/B noise, by machine identity, from A/B results."""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import sys
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from ..budgets.loader import confined
from ..budgets.noise import CheckNoise, NoiseTable, load_noise
from ..budgets.schema import BudgetError
from ..metrics import UnknownMetricError, parse_name
from ..report.common import terminal_text
from ..results import Results
from ..settings import for_folder

__all__ = ["calibrate", "cmd_calibrate", "register"]


def calibrate(results: Iterable[tuple[str, Results]], *, date: str | None = None) -> dict[str, NoiseTable]:
    """The noise each named A/B results file shows, pooled by machine identity: statistical checks'
    per-pair spread (two pairs or more), counts' ratio from an A/A run only.

    Raises:

        ValueError: a file that is not an A/B run's results, naming it.
    """
    day = date or _dt.date.today().isoformat()
    tables: dict[str, NoiseTable] = {}
    for name, res in results:
        ab = res.meta.ab
        if ab is None:
            raise ValueError(f"{name}: not the results of `perfbudget ab` (no meta.ab): calibration reads "
                             "the process pairs' ratios")
        head, base = ab.head_commit, ab.base_commit
        aa = bool(head) and head == base
        per_identity: dict[str, dict[tuple[str, str], CheckNoise]] = {}
        pairs_seen = 0
        for r in res.records:
            identity = r.device.identity if r.device is not None else None
            if identity is None or r.vs_base is None:
                continue
            try:
                metric = parse_name(r.metric).metric
            except UnknownMetricError:
                continue
            noise: CheckNoise | None = None
            # Set-aside pairs too: the prior serves runs of 2-3 pairs, where none is set aside.

            every = [*r.vs_base.pair_ratios, *(p.ratio for p in r.vs_base.set_aside)]
            ratios = [x for x in every if x > 0 and math.isfinite(x)]
            if metric.statistical and len(ratios) >= 2:
                ys = [math.log(x) for x in ratios]
                mean = sum(ys) / len(ys)
                noise = CheckNoise(ss=sum((y - mean) ** 2 for y in ys), df=len(ys) - 1, runs=1)
                pairs_seen = max(pairs_seen, len(ys))
            elif metric.kind == "count" and aa and r.vs_base.ratio is not None and r.vs_base.ratio > 0:
                noise = CheckNoise(ss=math.log(r.vs_base.ratio) ** 2, df=1, runs=1, spread="runs")
            if noise is not None:
                per_identity.setdefault(identity, {})[(r.key, r.metric)] = noise
        for identity, checks in per_identity.items():
            prov = {"file": Path(name).name, "head": head[:12], "base": base[:12], "aa": aa, "pairs": pairs_seen,
                    "date": day, "checks": len(checks)}
            if ab.burst_ms is not None:  # the spread depends on it: benchmarks/burst-length-cpu.md
                prov["burst_ms"] = ab.burst_ms
            table = NoiseTable(identity=identity, checks=checks, provenance=(prov,))
            tables[identity] = tables[identity].pooled(table) if identity in tables else table
    return tables


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``calibrate`` subcommand to the ``perfbudget`` parser's subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "calibrate", help="measure each check's A/B noise from A/B results and keep it beside the budgets",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Read `perfbudget ab` results files (an A/A run: --base HEAD, or earlier A/B runs on the\n"
                    "same machine identity) and write each check's per-pair spread of ln(head/base) to\n"
                    "<budgets-dir>/noise/<identity>.yaml, pooled with what the file already holds. `perfbudget ab`\n"
                    "then judges each measured check with its own prior instead of the flat one, and a count's\n"
                    "comparison with its base follows its spread over A/A runs.",
    )
    p.add_argument("results", nargs="+", help="results JSON files written by `perfbudget ab`")
    p.add_argument("--budgets-dir", help="budget folder (default: ini perfbudget_budgets_dir, else budgets; "
                                         "refused when it leads out of the repository)")
    p.add_argument("--replace", action="store_true",
                   help="start the machine's noise file over instead of pooling into it")
    p.add_argument("--pairs", type=int, default=4,
                   help="say the change each check resolves with this many pairs (default 4)")
    p.add_argument("--trust-identity", action="store_true",
                   help="write the noise of machine identities other than this one's (perfbudget show "
                        "--identity) that the results claim. A results file cannot prove where it ran: pass "
                        "it only for results the trusted runner's own job produced")
    p.set_defaults(func=cmd_calibrate)
    return p


def cmd_calibrate(args: argparse.Namespace, out: TextIO) -> int:
    from ..exitcodes import ExitCode
    from ..measure.machine import trusted_identities
    from ..results import load_results
    from .ratios import ABPolicy, resolvable_lines

    named = []
    for path in args.results:
        try:
            named.append((path, load_results(path)))
        except ValueError as exc:
            print(f"perfbudget calibrate: error: {terminal_text(exc)}", file=sys.stderr)
            return ExitCode.USAGE
    try:
        budgets_dir = confined(for_folder(Path.cwd(), cli={"budgets_dir": args.budgets_dir}).budgets_dir,
                               named=args.budgets_dir is not None)
        new = calibrate(named)
        old = {} if args.replace else load_noise(budgets_dir)
        pooled = {i: old[i].pooled(t) if i in old else t for i, t in new.items()}  # all or nothing is written
    except (ValueError, BudgetError) as exc:
        print(f"perfbudget calibrate: error: {terminal_text(exc)}", file=sys.stderr)
        return ExitCode.USAGE
    if not new:
        print("perfbudget calibrate: error: no check with two pairs or more (or an A/A count) in "
              f"{', '.join(args.results)}: nothing to measure the noise from", file=sys.stderr)
        return ExitCode.USAGE
    claimed = {r.device.identity: r.device.type for _, res in named for r in res.records
               if r.device is not None and r.device.identity in new}
    trusted = trusted_identities(claimed, trust_claims=args.trust_identity, out=out)
    refused = sorted(set(new) - trusted)
    for identity in refused:
        print(f"perfbudget calibrate: refused: the results claim machine identity {identity}, not this "
              "machine's: noise not written (--trust-identity for results the trusted runner's own job "
              "produced)", file=sys.stderr)
    for identity, merged in pooled.items():
        if identity in refused:
            continue
        table = new[identity]
        try:
            path = merged.write(budgets_dir)
        except BudgetError as exc:  # a noise folder that leads out of the budgets folder
            print(f"perfbudget calibrate: error: {terminal_text(exc)}", file=sys.stderr)
            return ExitCode.USAGE
        merged = replace(merged, path=path)
        lines = [f"{path}: {len(table.checks)} check(s) from {len(table.provenance)} run(s)"
                 f"{' pooled with ' + str(len(old[identity].provenance)) + ' earlier' if identity in old else ''}",
                 *resolvable_lines(merged, ABPolicy(noise={identity: merged}), pairs=args.pairs)]
        counts = [(cid, n) for cid, n in sorted(merged.checks.items()) if n.spread == "runs"]
        for (key, metric), n in counts:
            tol = n.count_tolerance()
            lines.append(f"  {key}.{metric}: sd {n.sd:.4%} over {n.runs} A/A run(s); tolerance vs base "
                         + (f"{tol:.3%}" if tol is not None else "stays the default (needs 2 A/A runs or more)"))
        out.write(terminal_text("\n".join(lines)) + "\n")  # keys of the noise file, the folder's path
    return ExitCode.FAILED if refused else ExitCode.OK
