"""Where one lockstep A/B pair's time goes: interpreter and imports, fixtures, measuring, turns.

Run: ``.venv/bin/python benchmarks/pair_cost.py [--pairs 2] [-- PYTEST ARGS]`` (default
``perf_tests -m "not instructions"``). It runs ``perfbudget ab --base HEAD`` (an A/A) for the
given number of pairs with ``--durations=0`` on both sides, then reads, per pair and side: the
side's wall time, pytest's setup (fixtures: model builds, compile warm-up) and call (the
measurement, in turns) totals, and the rest (interpreter start, torch import, collection,
teardown, the placement draw). The sides share one CPU, so their set-ups run side by side and
the pair's wall time is less than the two sides' sum. Prints a Markdown table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DURATION = re.compile(r"^(\d+\.\d+)s (setup|call|teardown)\s+(\S+)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("pytest_args", nargs="*")
    args = p.parse_args(argv)
    pytest_args = args.pytest_args or ["perf_tests", "-m", "not instructions"]
    out = ROOT / ".perfbudget" / "pair-cost.json"
    cmd = [sys.executable, "-m", "perfbudget.cli", "ab", "--base", "HEAD", "--min-pairs", str(args.pairs),
           "--max-pairs", str(args.pairs), "--out", str(out), "--", *pytest_args, "-p", "no:randomly",
           "--durations=0", "--durations-min=0"]
    subprocess.run(cmd, cwd=ROOT, check=False)
    meta = json.loads(out.read_text())["meta"]["ab"]
    print("| pair | tests | pair wall s | side | side wall s | setup s | call s | rest s | largest setups |")
    print("|---|---|---|---|---|---|---|---|---|")
    for run in meta["runs"]:
        k = run["pair"]
        sides = {s["side"]: s for s in run["sides"]}
        for side in ("base", "head"):
            log = ROOT / ".perfbudget" / "ab" / f"pair-{k}" / f"{side}.log"
            totals = {"setup": 0.0, "call": 0.0, "teardown": 0.0}
            setups: list[tuple[float, str]] = []
            for line in log.read_text().splitlines():
                m = DURATION.match(line)
                if m:
                    totals[m.group(2)] += float(m.group(1))
                    if m.group(2) == "setup":
                        setups.append((float(m.group(1)), m.group(3).split("::")[-1]))
            wall = sides[side]["wall_s"]
            rest = wall - sum(totals.values())
            top = ", ".join(f"{n} {s:.1f}" for s, n in sorted(setups, reverse=True)[:2])
            print(f"| {k} | {len(run.get('ran') or [])} | {run['wall_s']:.0f} | {side} | {wall:.1f} | "
                  f"{totals['setup']:.1f} | {totals['call']:.1f} | {rest:.1f} | {top} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
