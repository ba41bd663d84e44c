"""Per-operator A/B checks: a ratio of the sides' medians, or the median of per-round ratios?

An A/B run's sides profile their operator rounds in turns, so the head's round i ran beside
the base's round i. This reads ``perfbudget ab`` results files (A/A runs: any spread is noise)
and recomputes, for every ``op_self_ms`` / ``op_share`` check and every pair, the pair's
head/base both ways from the samples the record keeps (each pair's rounds in order):

- *medians*: median of the head's rounds / median of the base's rounds (before 2026-12-03);
- *per round*: the median of round-by-round ratios (``metrics.Metric.paired``, since then).

It prints, per check and pooled per family, the per-pair sd of ln(head/base) and the mean, and
with ``--json`` keeps every pair's two ratios. A file written since per-round pairing was the
default also says whether the record's own pair ratios are the per-round ones.

Usage::

    python benchmarks/op_pairing.py RESULTS.json... [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path


def pairs_of(record: dict) -> list[tuple[list[float], list[float]]] | None:
    """The record's (head rounds, base rounds) per pair, or ``None`` when they cannot be split."""
    head, base = record.get("samples") or [], (record.get("base") or {}).get("samples") or []
    n_pairs = len((record.get("base") or {}).get("pair_ratios") or [])
    if n_pairs < 2 or not head or len(head) != len(base) or len(head) % n_pairs:
        return None
    k = len(head) // n_pairs
    return [(head[i * k:(i + 1) * k], base[i * k:(i + 1) * k]) for i in range(n_pairs)]


def ratios(record: dict) -> dict[str, list[float]] | None:
    split = pairs_of(record)
    if split is None or any(x <= 0 for h, b in split for x in (*h, *b)):
        return None
    return {
        "medians": [statistics.median(h) / statistics.median(b) for h, b in split],
        "per_round": [statistics.median([x / y for x, y in zip(h, b, strict=True)]) for h, b in split],
        "recorded": list(record["base"]["pair_ratios"]),
        "rounds": [len(split[0][0])],
    }


def sd(xs: list[float]) -> float:
    return statistics.stdev([math.log(x) for x in xs])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--json", help="keep every check's pair ratios, both ways, here")
    args = ap.parse_args(argv)
    kept: dict[str, dict[str, dict[str, list[float]]]] = {}
    pooled: dict[str, list[float]] = {}  # family -> [ss medians, ss per round, df]
    print("| run | check | rounds | pairs | sd per pair, medians | sd per pair, per round | mean, medians | mean, per round |")
    print("|---|---|---|---|---|---|---|---|")
    for path in args.results:
        run = Path(path).name
        for r in json.loads(Path(path).read_text())["records"]:
            family = r["metric"].split("[", 1)[0]
            if family not in ("op_self_ms", "op_share"):
                continue
            got = ratios(r)
            if got is None:
                continue
            name = f"{r['key']}.{r['metric']}"
            kept.setdefault(run, {})[name] = got
            m, p = got["medians"], got["per_round"]
            acc = pooled.setdefault(family, [0.0, 0.0, 0.0])
            acc[0] += sd(m) ** 2 * (len(m) - 1)
            acc[1] += sd(p) ** 2 * (len(p) - 1)
            acc[2] += len(m) - 1
            lm = statistics.mean(math.log(x) for x in m)
            lp = statistics.mean(math.log(x) for x in p)
            print(f"| {run} | `{name}` | {got['rounds'][0]} | {len(m)} | {sd(m):.1%} | {sd(p):.1%} "
                  f"| {math.expm1(lm):+.1%} | {math.expm1(lp):+.1%} |")
    for family, (ss_m, ss_p, df) in sorted(pooled.items()):
        print(f"| **pooled** | **{family}** | | {df:.0f} df | **{math.sqrt(ss_m / df):.2%}** "
              f"| **{math.sqrt(ss_p / df):.2%}** | | |")
    recorded = [(run, name) for run, checks in kept.items() for name, got in checks.items()
                if all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(got["recorded"], got["per_round"], strict=True))]
    print(f"\nrecords whose own pair ratios are the per-round ones: {len(recorded)} of "
          f"{sum(len(c) for c in kept.values())}")
    if args.json:
        Path(args.json).write_text(json.dumps(kept, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
