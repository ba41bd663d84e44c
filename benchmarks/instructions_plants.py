"""Instruction counts against timing: A/A spread and planted CPU work, both through ``perfbudget ab``.

Works in a scratch clone of this repository's HEAD (never in the checkout itself):

- A/A: ``perfbudget ab --base HEAD --instructions`` with the working tree equal to the base, on
  the suite's tiny MLP count (``perf_tests/test_tiny.py -m instructions``): its head/base ratio is
  the spread between two valgrind processes;
- plants: real commits on top of the base that add F of the tiny MLP step's instructions as
  pure-Python work inside the step (``fixtures/tiny.py``): a loop sized from the loop's own cost
  per iteration, counted under callgrind first. A plant is named by what it did to the count
  (the measured head/base) beside what was planted;
- the same plant commits through the timing A/B (``perfbudget ab`` on the tiny MLP's
  ``step_ms``, ``--max-pairs 4`` as ``.ci/run`` uses): what timing resolves of the same work.

``--part instructions`` and ``--part timing`` run separately (a timing run wants the machine
quiet, a callgrind run does not care); each run is appended to the JSON next to ``--out`` and
the Markdown table is rewritten from all runs so far.

Usage::

    python benchmarks/instructions_plants.py --part instructions --aa 10 --plant-runs 2 --cpus 0
    python benchmarks/instructions_plants.py --part timing --aa 2 --plant-runs 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLANTS = (0.005, 0.01, 0.02)
INSTRUCTION_TESTS = ("perf_tests/test_tiny.py", "-m", "instructions", "-p", "no:randomly")
TIMING_TESTS = ("perf_tests/test_tiny.py", "-k", "step_time", "-p", "no:randomly")
TINY = "fixtures/tiny.py"
METRIC = {"instructions": "instructions[callgrind]", "timing": "step_ms"}

LOOP = """\
def _planted_cpu_work(n={n}):
    x = 0
    for i in range(n):
        x += i
    return x
"""

CALIBRATE = """\
from perfbudget.measure.instructions import instructions
{loop}
small = instructions(lambda: _planted_cpu_work(1000), steps=5, warmup=10)
big = instructions(lambda: _planted_cpu_work(11000), steps=5, warmup=10)
print("IR_PER_ITERATION", (big.per_step - small.per_step) / 10000)
"""


def sh(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    return subprocess.run(args, cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def ir_per_iteration(clone: Path) -> float:
    """Instructions of one iteration of the planted loop, counted under callgrind."""
    sys.path.insert(0, str(clone / "src"))
    from perfbudget.instructions_run import callgrind_environment, under_callgrind

    out = Path(tempfile.mkdtemp(prefix="plant-calibrate-"))
    script = out / "calibrate.py"
    script.write_text(CALIBRATE.format(loop=LOOP.format(n=0)))
    env = callgrind_environment(out, {**os.environ, "PYTHONPATH": str(clone / "src")})
    got = sh(*under_callgrind([sys.executable, str(script)], out), cwd=clone, env=env)
    shutil.rmtree(out, ignore_errors=True)
    return float(got.split("IR_PER_ITERATION", 1)[1].split()[0])


def plant(clone: Path, base: str, frac: float, iterations: int) -> str:
    """A commit on ``base`` whose tiny MLP step also runs ``iterations`` of the planted loop."""
    sh("git", "checkout", "-q", "--detach", base, cwd=clone)
    path = clone / TINY
    text = path.read_text()
    anchor = "        opt.step()\n"
    if text.count(anchor) != 1:
        raise SystemExit(f"{TINY}: cannot find the step's '{anchor.strip()}' line to plant after")
    text = text.replace(anchor, anchor + "        _planted_cpu_work()\n")
    text = text.replace("\n\n@dataclass", "\n\n" + LOOP.format(n=iterations) + "\n\n@dataclass", 1)
    path.write_text(text)
    sh("git", "commit", "-q", "-am", f"plant: +{frac:.1%} of the tiny MLP step's instructions", cwd=clone)
    return sh("git", "rev-parse", "HEAD", cwd=clone).strip()


def ab_run(clone: Path, base: str, part: str, out: Path, cpus: str | None) -> dict:
    cmd = [sys.executable, "-m", "perfbudget.cli", "ab", "--base", base, "--out", str(out)]
    if part == "instructions":
        cmd += ["--instructions"]
        tests = INSTRUCTION_TESTS
    else:
        cmd += ["--max-pairs", "4"]
        tests = TIMING_TESTS
    if cpus:
        cmd += ["--cpus", cpus]
    env = {**os.environ, "PYTHONPATH": str(clone / "src")}
    t0 = time.perf_counter()
    proc = subprocess.run([*cmd, "--", *tests], cwd=clone, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    data = json.loads(out.read_text()) if out.exists() else {"records": []}
    rec = next((r for r in data["records"] if r["metric"] == METRIC[part]), None)
    if rec is None:
        raise SystemExit(f"no {METRIC[part]} record (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    base_side = rec.get("base") or {}
    return {"exit": proc.returncode, "wall_s": round(wall, 1), "outcome": rec["outcome"], "head": rec["value"],
            "base": base_side.get("value"), "ratio": base_side.get("ratio"), "ci": base_side.get("ratio_ci"),
            "pairs": base_side.get("pairs"), "detectable": base_side.get("detectable"),
            "identity": _identity(rec.get("device") or {})}


def _identity(device: dict) -> str | None:
    """The identity a results file's device describes (the file keeps its fields, not the slug)."""
    from perfbudget.device import DeviceInfo

    try:
        return DeviceInfo(**device).identity
    except TypeError:
        return None


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{(x - 1) * 100:+.3f} %"


def table(data: dict) -> str:
    lines = ["# Instruction counts against timing: A/A spread and planted CPU work", "",
             f"Machine: {data.get('machine', '?')}; torch threads 1. Commands:", ""]
    lines += [f"    {c}" for c in data.get("commands", [])]
    lines += ["", f"Planted loop: {data.get('ir_per_iteration', 0):.1f} callgrind instructions per iteration "
              "(counted before planting); the tiny MLP step's base count: "
              f"{data.get('base_per_step', 0):,.0f} per step.", ""]
    for part in ("instructions", "timing"):
        runs = [r for r in data.get("runs", []) if r["part"] == part]
        if not runs:
            continue
        seen = sorted({r["identity"] for r in runs if r.get("identity")})
        what = ("`tiny-mlp-train.instructions[callgrind]`, one pair per run, tolerance 0.5 %"
                f" (identity under valgrind: {', '.join(seen) or '?'})" if part == "instructions"
                else "`tiny-mlp-train.step_ms`, lockstep pairs (`--max-pairs 4`), A/B tolerance of the metric")
        lines += [f"## {part}: {what}", "",
                  "| scenario | runs | detected (fail) | inconclusive | head/base per run | median wall (s) |",
                  "|---|---|---|---|---|---|"]
        for name in dict.fromkeys(r["scenario"] for r in runs):
            rs = [r for r in runs if r["scenario"] == name]
            ratios = ", ".join(_pct(r["ratio"]) for r in rs)
            lines.append(f"| {name} | {len(rs)} | {sum(r['outcome'] == 'fail' for r in rs)}/{len(rs)} | "
                         f"{sum(r['outcome'] == 'inconclusive' for r in rs)}/{len(rs)} | {ratios} | "
                         f"{statistics.median(r['wall_s'] for r in rs):.0f} |")
        aa = [r["ratio"] for r in runs if r["scenario"] == "A/A" and r["ratio"]]
        if len(aa) >= 2:
            spread = (max(aa) - min(aa)) * 100
            lines += ["", f"A/A: {len(aa)} runs, head/base from {_pct(min(aa))} to {_pct(max(aa))} "
                          f"(spread {spread:.4f} percentage points)."]
        mde = [r["detectable"] for r in runs if r.get("detectable")]
        if mde:
            lines += [f"Median detectable effect of the timing runs: +{statistics.median(mde) * 100:.1f} %."]
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("instructions", "timing"))
    ap.add_argument("--aa", type=int, default=10, help="A/A runs")
    ap.add_argument("--plant-runs", type=int, default=2, help="runs per plant")
    ap.add_argument("--plants", default=",".join(map(str, PLANTS)), help="fractions, comma-separated")
    ap.add_argument("--cpus", default=None, help="passed to perfbudget ab --cpus")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "instructions-plants-cpu.md")
    ap.add_argument("--render", action="store_true", help="only rewrite the table from the JSON")
    args = ap.parse_args()
    store = args.out.with_suffix(".json")
    data = json.loads(store.read_text()) if store.exists() else {"runs": [], "commands": []}
    if args.render:
        args.out.write_text(table(data))
        return 0
    if args.part is None:
        ap.error("--part is required (or --render)")
    data["commands"] = [*data.get("commands", []), " ".join(["python benchmarks/instructions_plants.py",
                                                             *sys.argv[1:]])]
    tmp = Path(tempfile.mkdtemp(prefix="instr-plants-"))
    clone = tmp / "scratch"
    sh("git", "clone", "-q", str(ROOT), str(clone), cwd=tmp)
    base = sh("git", "rev-parse", "HEAD", cwd=clone).strip()
    sys.path.insert(0, str(clone / "src"))
    from perfbudget.measure.machine import describe

    data["machine"] = f"{describe('cpu').identity} (as seen outside valgrind)"
    if "ir_per_iteration" not in data:
        data["ir_per_iteration"] = ir_per_iteration(clone)
    def record(name: str, head: str) -> dict:
        sh("git", "checkout", "-q", "--detach", head, cwd=clone)
        got = ab_run(clone, base, args.part, tmp / f"run-{len(data['runs'])}.json", args.cpus)
        data["runs"].append({"part": args.part, "scenario": name, **got})
        print(f"{args.part} {name}: {got['outcome']} head/base {_pct(got['ratio'])} in {got['wall_s']:.0f} s",
              flush=True)
        store.write_text(json.dumps(data, indent=1))
        args.out.write_text(table(data))
        return got

    aa = args.aa
    if "base_per_step" not in data:  # the first A/A run also gives the count the plants are sized from
        data["base_per_step"] = record("A/A", base)["base"] if args.part == "instructions" else \
            ab_run(clone, base, "instructions", tmp / "size.json", args.cpus)["base"]
        aa -= args.part == "instructions"
    fracs = [float(f) for f in args.plants.split(",") if f]
    commits = {f: plant(clone, base, f, round(f * data["base_per_step"] / data["ir_per_iteration"])) for f in fracs}
    for name, head in [("A/A", base)] * aa + [(f"planted +{f:.1%}", commits[f]) for f in fracs] * args.plant_runs:
        record(name, head)
    shutil.rmtree(tmp, ignore_errors=True)
    print(textwrap.indent(args.out.read_text(), "  "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
