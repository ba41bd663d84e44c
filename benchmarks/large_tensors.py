"""Large-tensor benchmarks under the A/B gate: A/A runs and planted changes of an image library's suite.

The suite is ``examples/image-colour-suite`` as it stands (pytest-benchmark style, no edit): two colour
conversions of float32 image batches, batch 1 and 8, 128² to 512² (12 benchmarks; an 8x3x512x512
input is 25 MB). ``setup`` copies it into a scratch git repository with three branches:

- ``main``: the suite;
- ``plant30``: ``rgb_to_hsv`` makes extra passes over a batch-8 256² tensor, sized at set-up to +30 %
  of that benchmark (measured in one process, interleaved): that check alone must fail;
- ``alloc25``: ``rgb_to_grayscale`` fills an extra 25 MiB buffer per call on batch-8 512² input: its
  reason must name the allocation.

``run KIND`` is one ``perfbudget ab --base main`` with default settings (``--env K=V`` adds to both
sides' environment, e.g. ``PERFBUDGET_ALLOCATOR=as-is``). Every run's checks (outcome, pair ratios,
reason), wall time and machine are appended to ``benchmarks/large-tensors-cpu.json``; ``table`` writes
``benchmarks/large-tensors-cpu.md``. The per-process distribution behind it: ``processes``.

Usage (a quiet 2-vCPU machine, nothing else timing)::

    python benchmarks/large_tensors.py processes [--processes 8]   # each process's ms per call, by allocator
    python benchmarks/large_tensors.py setup
    python benchmarks/large_tensors.py run aa [--runs 3] [--env PERFBUDGET_ALLOCATOR=as-is]
    python benchmarks/large_tensors.py run plant30
    python benchmarks/large_tensors.py run alloc25
    python benchmarks/large_tensors.py table
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLE = ROOT / "examples" / "image-colour-suite"
RESULTS = HERE / "large-tensors-cpu.json"
TABLE = HERE / "large-tensors-cpu.md"
WORK = ROOT / ".perfbudget" / "large-tensors"
LIB = "src/imgcolour/__init__.py"
PLANT30 = "benchmarks/test_colour.py::test_hsv[256px-b8]"
ALLOC25 = "benchmarks/test_colour.py::test_grayscale[512px-b8]"
METRIC = "latency_ms[benchmark]"

PROBE = r'''
import ctypes, json, os, sys, time
mode, fname, batch, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if mode == "settled":
    from perfbudget.measure import allocator
    allocator.settle("settled")
import random
import torch
torch.set_num_threads(1)
sys.path.insert(0, os.path.join(sys.argv[5], "src"))
import imgcolour
fn = getattr(imgcolour, fname)
junk = [torch.empty(random.randint(1, 300_000)) for _ in range(random.randint(0, 50))]  # a history of its own
x = torch.rand(batch, 3, size, size)
for _ in range(10):
    fn(x)
windows = []
for _ in range(5):
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        fn(x)
        n += 1
    windows.append((time.perf_counter() - t0) / n * 1e3)
print(json.dumps(windows))
'''


def sh(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    return subprocess.run(args, cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def machine() -> str:
    sys.path.insert(0, str(ROOT / "src"))
    from perfbudget.measure.machine import describe

    return describe("cpu", threads=1).identity or platform.processor()


def processes(n: int) -> None:
    """Each of ``n`` fresh processes' mean ms per call (5 windows of 0.3 s), as-is and settled."""
    lines = ["| function | input | allocator | each process's mean ms per call | spread (max/min) |", "|---|---|---|---|---|"]
    for fname, batch, size in (("rgb_to_grayscale", 8, 256), ("rgb_to_grayscale", 8, 512), ("rgb_to_hsv", 8, 256)):
        for mode in ("as-is", "settled"):
            env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
            means = [statistics.mean(json.loads(sh(sys.executable, "-c", PROBE, mode, fname, str(batch), str(size),
                                                   str(EXAMPLE), cwd=ROOT, env=env))) for _ in range(n)]
            lines.append(f"| {fname} | {batch}x3x{size}x{size} | {mode} | {', '.join(f'{m:.2f}' for m in means)} "
                         f"| {max(means) / min(means):.2f}x |")
            print(lines[-1], flush=True)
    print("\n".join(lines))


def setup() -> None:
    repo = WORK / "repo"
    shutil.rmtree(WORK, ignore_errors=True)
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns("__pycache__", ".perfbudget", ".benchmarks"))
    git = ("git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid")
    sh("git", "init", "-q", "-b", "main", cwd=repo)
    sh(*git, "add", "-A", cwd=repo)
    sh(*git, "commit", "-q", "-m", "suite", cwd=repo)
    text = (repo / LIB).read_text()
    passes = _plant30_passes(repo)
    for branch, old, new in (
        ("plant30", "    maxc, argmax = image.max(dim=-3)\n",
         f"    if image.shape[0] == 8 and image.shape[-1] == 256:\n"
         f"        for _ in range({passes}):\n            image = image * 1.0\n    maxc, argmax = image.max(dim=-3)\n"),
        ("alloc25", "    r, g, b = image.unbind(dim=-3)\n    return (",
         "    if image.shape[0] == 8 and image.shape[-1] == 512:\n        torch.ones(25 << 20, dtype=torch.uint8)\n"
         "    r, g, b = image.unbind(dim=-3)\n    return ("),
    ):
        assert old in text, branch
        sh("git", "checkout", "-q", "-b", branch, "main", cwd=repo)
        (repo / LIB).write_text(text.replace(old, new, 1))
        sh(*git, "commit", "-q", "-am", branch, cwd=repo)
        sh("git", "checkout", "-q", "main", cwd=repo)
    print(f"set up {repo}: plant30 makes {passes} extra passes")


def _plant30_passes(repo: Path) -> int:
    """Extra passes over an 8x3x256x256 tensor that add 30 % to ``rgb_to_hsv`` on it: the planted
    function itself (10 passes) timed interleaved with the plain one, in one settled process."""
    code = (f"import sys, time, torch; torch.set_num_threads(1); sys.path.insert(0, {str(repo / 'src')!r}); import imgcolour\n"
            "def planted(x):\n"
            "    for _ in range(10):\n"
            "        x = x * 1.0\n"
            "    return imgcolour.rgb_to_hsv(x)\n"
            "x = torch.rand(8, 3, 256, 256); a = []; b = []\n"
            "for _ in range(60):\n"
            "    t = time.perf_counter(); imgcolour.rgb_to_hsv(x); a.append(time.perf_counter() - t)\n"
            "    t = time.perf_counter(); planted(x); b.append(time.perf_counter() - t)\n"
            "import statistics as s; print((s.median(b[10:]) / s.median(a[10:]) - 1) / 10)")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    per_pass = float(sh(sys.executable, "-c", "from perfbudget.measure import allocator; allocator.settle('settled')\n" + code,
                        cwd=ROOT, env=env))
    return max(1, round(0.30 / per_pass))


def run(kind: str, runs: int, env_extra: list[str]) -> None:
    repo = WORK / "repo"
    branch = "main" if kind == "aa" else kind
    extra = dict(e.split("=", 1) for e in env_extra)
    for _ in range(runs):
        sh("git", "checkout", "-q", branch, cwd=repo)
        out = WORK / f"results-{kind}-{datetime.datetime.now():%Y%m%d-%H%M%S}.json"
        t0 = time.monotonic()
        proc = subprocess.run([str(Path(sys.executable).with_name("perfbudget")), "ab", "--base", "main", "--out", str(out), "--", "-q"],
                              cwd=repo, env={**os.environ, **extra}, capture_output=True, text=True)
        wall = time.monotonic() - t0
        sh("git", "checkout", "-q", "main", cwd=repo)
        if not out.exists():
            raise SystemExit(f"perfbudget ab wrote no results (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        row = ingest(out, kind, extra, wall_s=wall, exit_code=proc.returncode)
        print(_line(row), flush=True)
    table()


def ingest(out: Path, kind: str, extra: dict[str, str], *, wall_s: float | None = None,
           exit_code: int | None = None) -> dict:
    """One run's row from its merged results, appended to :data:`RESULTS`."""
    data = json.loads(out.read_text())
    ab = data["meta"]["ab"]
    checks = {r["nodeid"]: {"outcome": r["outcome"], "pairs": r["base"]["pair_ratios"] if r.get("base") else [],
                            "reason": r.get("reason", ""), "allocation": r.get("extra", {}).get("allocation")}
              for r in data["records"] if r["metric"] == METRIC}
    row = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "kind": kind,
           "env": extra, "allocator": data["meta"]["measured"]["settings"].get("allocator", "as-is"),
           "machine": machine(), "wall_s": round(wall_s if wall_s is not None else ab["wall_s"], 1),
           "exit": exit_code, "pairs": ab["pairs"], "checks": checks}
    rows = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    RESULTS.write_text(json.dumps([*rows, row], indent=1) + "\n")
    return row


def _line(row: dict) -> str:
    checks = row["checks"].values()
    decided = sum(c["outcome"] in ("pass", "fail") for c in checks)
    failed = [n.split("::")[-1] for n, c in row["checks"].items() if c["outcome"] == "fail"]
    bimodal = [n.split("::")[-1] for n, c in row["checks"].items() if "bimodal" in c["reason"]]
    return (f"| {row['date']} | {row['kind']} | {row['allocator']} | {decided} of {len(checks)} | {', '.join(failed) or '-'} "
            f"| {', '.join(bimodal) or '-'} | {row['pairs']} | {row['wall_s']:.0f} | {row['machine']} |")


def table() -> None:
    rows = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    head = TABLE.read_text().split("\n## Runs\n")[0] if TABLE.exists() else "# Large tensors under the A/B gate\n"
    lines = ["| date (UTC) | run | allocator | decided | failed | named bimodal | pairs | wall (s) | machine |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [_line(r) for r in rows]
    TABLE.write_text(f"{head}\n## Runs\n\n" + "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("processes")
    p.add_argument("--processes", type=int, default=8)
    sub.add_parser("setup")
    r = sub.add_parser("run")
    r.add_argument("kind", choices=("aa", "plant30", "alloc25"))
    r.add_argument("--runs", type=int, default=1)
    r.add_argument("--env", action="append", default=[])
    sub.add_parser("table")
    i = sub.add_parser("ingest", help="a run's merged results made by hand")
    i.add_argument("results", type=Path)
    i.add_argument("kind", choices=("aa", "plant30", "alloc25"))
    i.add_argument("--env", action="append", default=[])
    args = parser.parse_args()
    if args.cmd == "processes":
        processes(args.processes)
    elif args.cmd == "setup":
        setup()
    elif args.cmd == "run":
        run(args.kind, args.runs, args.env)
    elif args.cmd == "ingest":
        print(_line(ingest(args.results, args.kind, dict(e.split("=", 1) for e in args.env))))
        table()
    else:
        table()


if __name__ == "__main__":
    main()
