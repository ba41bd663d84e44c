"""Per-pair spread of the serving checks of a lockstep A/B run, judged two ways on the same pairs.

Reads the side results an A/B run keeps per pair (``.perfbudget/ab/pair-*/{head,base}.json``)
and computes, for every serving metric, each pair's head/base ratio as a ratio of the sides'
quantiles (unpaired, how serving was judged before) and request by request
(``pair_ratio(..., paired=True)``, how it is judged now), and the spread of each over the
pairs. On an A/A (both sides the same serving code) every ratio's truth is 1.

    perfbudget ab --base HEAD --min-pairs 6 --max-pairs 6 -- perf_tests/test_decoder.py -k cpu
    python benchmarks/serving_pairs.py [.perfbudget/ab]      # then this, in the same checkout
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from perfbudget.metrics import parse_name
from perfbudget.verdict.ratio import pair_ratio

SERVING = ("ttft_ms", "token_ms", "e2e_ms_p50", "e2e_ms_p90", "tokens_per_s")


def side_samples(path: Path) -> dict[str, list[float]]:
    records = json.loads(path.read_text())["records"]
    return {r["metric"]: list(r.get("samples") or []) for r in records
            if r["metric"] in SERVING and r.get("samples")}


def main(workdir: Path) -> None:
    ratios: dict[str, dict[str, list[float]]] = {m: {"unpaired": [], "paired": []} for m in SERVING}
    pairs = sorted(workdir.glob("pair-*"), key=lambda p: int(p.name.split("-")[1]))
    for pair in pairs:
        if not (pair / "head.json").exists() or not (pair / "base.json").exists():
            continue
        head, base = side_samples(pair / "head.json"), side_samples(pair / "base.json")
        for m in SERVING:
            if m in head and m in base:
                q = parse_name(m).metric.quantile
                ratios[m]["unpaired"].append(pair_ratio(head[m], base[m], quantile=q))
                ratios[m]["paired"].append(pair_ratio(head[m], base[m], quantile=q, paired=True))
    print(f"{len(pairs)} pair(s) in {workdir}")
    print("| metric | pairs | unpaired ratios | sd | paired ratios | sd |")
    print("|---|---|---|---|---|---|")
    for m, by in ratios.items():
        if not by["paired"]:
            continue

        def sd(xs: list[float]) -> str:
            return f"{statistics.stdev(math.log(x) for x in xs):.1%}" if len(xs) > 1 else "-"

        fmt = ", ".join
        print(f"| `{m}` | {len(by['paired'])} | {fmt(f'{x:.3f}' for x in by['unpaired'])} | {sd(by['unpaired'])} "
              f"| {fmt(f'{x:.3f}' for x in by['paired'])} | {sd(by['paired'])} |")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ".perfbudget/ab"))
