"""A/A spread of callgrind instructions per step across separate valgrind processes, and what a process costs.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/instructions_aa.py [--runs 5] [--out DIR]``.

Each run is one ``perfbudget instructions`` session (``--instr-atstart=no``, one torch thread,
PYTHONHASHSEED=0) of ``benchmarks/instructions_workload.py``: a tiny MLP training step
(64-128-128-10, batch 32, SGD) counted over 20 steps, twice in the process. Runs are one
after the other, never two valgrind processes at once. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from perfbudget.instructions_run import run_instructions

WORKLOAD = Path(__file__).resolve().parent / "instructions_workload.py"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--out", default=None, help="keep dumps and per-run JSON here (default: a temporary folder)")
    args = p.parse_args(argv)
    root = Path(args.out or tempfile.mkdtemp(prefix="instructions-aa-"))
    runs = []
    for i in range(args.runs):
        folder = root / f"run{i}"
        folder.mkdir(parents=True, exist_ok=True)
        test_file = folder / "test_workload.py"
        shutil.copy(WORKLOAD, test_file)
        env = {**os.environ, "WORKLOAD_OUT": str(folder / "workload.json")}
        run = run_instructions([str(test_file), "-q", "-p", "no:cacheprovider", "-p", "no:perfbudget"],
                               folder / "out", env=env)
        if run.exit_code:
            print(f"run {i}: pytest exited {run.exit_code}; see {folder}", file=sys.stderr)
            return 1
        data = json.loads((folder / "workload.json").read_text(encoding="utf-8"))
        data["process_wall_s"] = run.wall_s
        runs.append(data)
        print(json.dumps({"run": i, "process_wall_s": round(run.wall_s, 1),
                          "rows": [{k: r[k] for k in ("label", "per_step", "wall_s")} for r in data["rows"]]}),
              flush=True)
    firsts = [r["rows"][0]["per_step"] for r in runs]
    seconds = [r["rows"][1]["per_step"] for r in runs]
    summary = {
        "runs": len(runs),
        "first_per_step": firsts,
        "second_per_step": seconds,
        "first_spread_pct": 100 * (max(firsts) - min(firsts)) / statistics.median(firsts),
        "second_spread_pct": 100 * (max(seconds) - min(seconds)) / statistics.median(seconds),
        "in_process_pct": [100 * (s / f - 1) for f, s in zip(firsts, seconds, strict=True)],
        "process_wall_s": [r["process_wall_s"] for r in runs],
        "workload_wall_s": [[row["wall_s"] for row in r["rows"]] for r in runs],
    }
    (root / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
