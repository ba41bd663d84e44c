"""Does a shorter turn make A/B pairs agree better? A/A runs of the suite at several burst lengths.

Each burst length gets one A/A run (``perfbudget ab --base HEAD``, fixed pair count, the same
tests), one after the other; per timing/rate check it prints the per-pair sd of ln(head/base)
(each check's own pairs), and the pooled sd per family (steps, serving, per-operator). If the
machine's speed drifts inside a burst (``process-causes-cpu.md``), shorter bursts should cut the
per-pair spread; each hand-over costs an untimed re-warm call, so they also cost time.

Usage::

    python benchmarks/burst_length.py --bursts 400,100 --pairs 6 [--out-dir DIR] -- PYTEST_ARGS
    python benchmarks/burst_length.py --table 400=a.json 100=b.json     # from existing results
    (--save PATH: also keep every check's pair ratios per run, as JSON)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path


def family(metric: str) -> str:
    if metric.startswith("op_"):
        return "per-operator"
    if metric in ("ttft_ms", "token_ms", "e2e_ms_p50", "e2e_ms_p90", "tokens_per_s"):
        return "serving"
    return "steps and rates"


def spreads(path: str) -> dict[str, tuple[float, int]]:
    """check -> (sum of squares of ln ratio about its mean, degrees of freedom)."""
    out = {}
    for r in json.loads(Path(path).read_text())["records"]:
        ab = {**(r.get("base") or {}), **((r.get("extra") or {}).get("ab") or {})}  # results schema 2 / 1
        pairs = (r.get("base") or {}).get("pair_ratios") or []
        if ab.get("compared") and r.get("kind") in ("timing", "rate") and len(pairs) > 1:
            ys = [math.log(x) for x in pairs]
            m = sum(ys) / len(ys)
            out[f"{r['key']}.{r['metric']}"] = (sum((y - m) ** 2 for y in ys), len(ys) - 1)
    return out


def pair_ratios(path: str) -> dict[str, list[float]]:
    return {f"{r['key']}.{r['metric']}": r["base"]["pair_ratios"] for r in json.loads(Path(path).read_text())["records"]
            if r.get("kind") in ("timing", "rate") and (r.get("base") or {}).get("pair_ratios")}


def table(runs: dict[str, str], walls: dict[str, float], save: str | None = None) -> None:
    if save:
        Path(save).write_text(json.dumps({b: pair_ratios(p) for b, p in runs.items()}, indent=1) + "\n")
    got = {b: spreads(p) for b, p in runs.items()}
    names = sorted(set().union(*got.values()))
    bursts = list(runs)
    print("| check | " + " | ".join(f"sd per pair, {b} ms bursts" for b in bursts) + " |")
    print("|---|" + "---|" * len(bursts))
    for name in names:
        cells = [f"{math.sqrt(got[b][name][0] / got[b][name][1]):.1%} ({got[b][name][1]} df)" if name in got[b] else "-"
                 for b in bursts]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for fam in ("steps and rates", "serving", "per-operator"):
        cells = []
        for b in bursts:
            ss = sum(v[0] for k, v in got[b].items() if family(k.split(".", 1)[1]) == fam)
            df = sum(v[1] for k, v in got[b].items() if family(k.split(".", 1)[1]) == fam)
            cells.append(f"{math.sqrt(ss / df):.1%} ({df} df)" if df else "-")
        print(f"| **pooled: {fam}** | " + " | ".join(cells) + " |")
    if walls:
        print("| **wall time** | " + " | ".join(f"{walls[b]:.0f} s" for b in bursts) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bursts", default="400,100")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--out-dir", default=".perfbudget/burst-length")
    ap.add_argument("--table", nargs="+", metavar="MS=RESULTS.json")
    ap.add_argument("--save", metavar="PATH")
    ap.add_argument("pytest_args", nargs="*")
    args = ap.parse_args()
    if args.table:
        table(dict(t.split("=", 1) for t in args.table), {}, args.save)
        return 0
    os.makedirs(args.out_dir, exist_ok=True)
    runs, walls = {}, {}
    for b in args.bursts.split(","):
        out = os.path.join(args.out_dir, f"aa-burst{b}.json")
        t0 = time.monotonic()
        subprocess.run(["perfbudget", "ab", "--base", "HEAD", "--min-pairs", str(args.pairs), "--max-pairs",
                        str(args.pairs), "--max-minutes", "60", "--out", out, "--", *args.pytest_args],
                       env={**os.environ, "PERFBUDGET_TURNS_BURST_MS": b}, check=False)
        runs[b], walls[b] = out, time.monotonic() - t0
    table(runs, walls, args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
