"""The suite's instruction counts across sessions with different histories: every function, and the recorded value.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/instructions_history.py [--out DIR] [--parallel 2]``.

Each session is one ``perfbudget instructions`` run of ``perf_tests -m instructions`` (or a part
of it), so a check's step is counted after a different history: alone, after other tests, with
glibc's dynamic mmap threshold fixed, in two processes at once. From each record it reads the
recorded value (history-dependent functions left out) and the count of every function (value
plus ``history_dependent_per_step``), and prints both spreads per check as a Markdown table.
Sessions may run two at a time (``--parallel``): a count does not depend on the machine's load.
Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from perfbudget.extras import InstructionProfile
from perfbudget.instructions_run import run_instructions

ROOT = Path(__file__).resolve().parent.parent

#: (name, pytest selection, extra environment): each gives the counted steps another history.
SESSIONS: list[tuple[str, list[str], dict[str, str]]] = [
    ("decode alone", ["perf_tests/test_instructions.py", "-k", "decode"], {}),
    ("decode alone, again", ["perf_tests/test_instructions.py", "-k", "decode"], {}),
    ("tiny + decode", ["perf_tests/test_instructions.py", "-k", "tiny or decode"], {}),
    ("whole selection", ["perf_tests", "-m", "instructions"], {}),
    ("whole selection, mmap threshold fixed", ["perf_tests", "-m", "instructions"],
     {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"}),
]


def _session(root: Path, i: int, name: str, selection: list[str], env: dict[str, str]) -> dict[str, object]:
    folder = root / f"session{i}"
    results = folder / "results.json"
    with open(folder.with_suffix(".log"), "w", encoding="utf-8") as log:
        run = run_instructions([*selection, "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                                "--perf-json", str(results)], folder / "out", env={**os.environ, **env}, err=log)
    rows: dict[str, dict[str, float]] = {}
    if run.results_json is not None:
        for r in json.loads(results.read_text(encoding="utf-8"))["records"]:
            if not str(r.get("metric", "")).startswith("instructions[callgrind]") or r.get("value") is None:
                continue
            profile = InstructionProfile.from_extra(r.get("extra") or {})
            left_out = profile.history_dependent_per_step if profile is not None else 0.0
            rows[str(r["key"])] = {"value": float(r["value"]), "every_function": float(r["value"]) + left_out}
    return {"session": name, "exit_code": run.exit_code, "wall_s": round(run.wall_s, 1), "checks": rows}


def _spread(xs: list[float]) -> float:
    return 100 * (max(xs) - min(xs)) / statistics.median(xs) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=None, help="keep dumps, logs and the JSON here (default: a temporary folder)")
    p.add_argument("--parallel", type=int, default=2, help="sessions at once (default 2)")
    args = p.parse_args(argv)
    root = Path(args.out or tempfile.mkdtemp(prefix="instructions-history-"))
    for i in range(len(SESSIONS)):
        (root / f"session{i}").mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.parallel) as pool:
        futures = [pool.submit(_session, root, i, *s) for i, s in enumerate(SESSIONS)]
        sessions = [f.result() for f in futures]
    for s in sessions:
        print(json.dumps(s), flush=True)
    if any(s["exit_code"] for s in sessions):
        print(f"a session failed; see {root}", file=sys.stderr)
        return 1
    keys = sorted({k for s in sessions for k in s["checks"]})  # type: ignore[attr-defined]
    print("\n| check | sessions | every function: min - max | spread | recorded value: min - max | spread |")
    print("|---|---|---|---|---|---|")
    for key in keys:
        got = [s["checks"][key] for s in sessions if key in s["checks"]]  # type: ignore[index,operator]
        every = [g["every_function"] for g in got]
        value = [g["value"] for g in got]
        print(f"| {key} | {len(got)} | {min(every):,.0f} - {max(every):,.0f} | {_spread(every):.3f} % "
              f"| {min(value):,.0f} - {max(value):,.0f} | {_spread(value):.3f} % |")
    (root / "instructions-history.json").write_text(json.dumps(sessions, indent=1), encoding="utf-8")
    print(f"\nraw: {root / 'instructions-history.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
