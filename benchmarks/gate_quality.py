"""How good is the gate? False-alarm and detection rates of the suite's timing checks, measured.

Runs the encoder's timing checks (step latency/throughput and per-operator self time/share)
in separate pytest processes, one at a time, as CI would:

- A/A: unchanged code, against the budgets in ``budgets/`` -> every "fail" is a false alarm;
- planted whole-step slowdowns (``PERFBUDGET_PLANT=step_slowdown=F``) -> detection by ``step_ms``;
- planted single-operator slowdowns (``op_slowdown=F``: a matmul sized to add F to the
  step's ``aten::mm`` FLOPs) -> detection by ``op_self_ms[aten::mm]``.

Usage (a quiet machine, nothing else timing; budgets measured beforehand with
``pytest perf_tests --update-budgets``)::

    python benchmarks/gate_quality.py --aa 50 --runs 20 --out .perfbudget/gate-quality.md

Prints a table with the counts behind every rate and the time the checks cost per run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# In the suite's own order, so each test runs in the same process context as in a full run.
TESTS = (
    "perf_tests/test_decoder.py::test_serving_latency[cpu]",
    "perf_tests/test_encoder.py::test_step_latency_and_throughput[cpu]",
    "perf_tests/test_encoder.py::test_operators[cpu]",
)
#: A/A covers more of the suite's timing checks (planted runs only need the encoder's).
TESTS_AA = (
    *TESTS,
    "perf_tests/test_segmentation.py::test_step_latency_and_throughput[cpu]",
    "perf_tests/test_segmentation.py::test_operators[cpu]",
    "perf_tests/test_tiny.py::test_tiny_mlp_step_time",
)
TIMING_KINDS = ("timing", "rate")


@dataclass
class Scenario:
    """One kind of run: what is planted and which check should catch it."""

    name: str
    plant: str
    runs: int
    target: tuple[str, ...] | None  # metrics expected to fail (any of them detects); None for A/A
    outcomes: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    measured: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    ratios: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    seconds: list[float] = field(default_factory=list)


def run_once(plant: str, json_path: Path, tests: tuple[str, ...]) -> tuple[list[dict], float]:
    env = dict(os.environ, PERFBUDGET_PLANT=plant, PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *tests, "-q", "-o", "perfbudget_artifacts=none", "-o", "perfbudget_html=false", "-p", "no:cacheprovider", "-p", "no:randomly",
         f"--perf-json={json_path}"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    took = time.perf_counter() - start
    if proc.returncode not in (0, 1) or not json_path.exists():
        raise RuntimeError(f"pytest failed to run (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(json_path.read_text())["records"], took


def apply_floors(aa: Scenario) -> None:
    """Widen tolerances to the between-run noise the A/A runs measured (never narrow them)."""
    from perfbudget.budgets import load_dir
    from perfbudget.budgets.update import widen_tolerances
    from perfbudget.measure.machine import describe

    floors = {}
    for name, ratios in aa.ratios.items():
        if len(ratios) < 5:
            continue
        key, metric = name.split(".", 1)
        spread = abs(statistics.median(ratios) - 1) + 3 * statistics.stdev(ratios)
        floors[(key, metric)] = float(f"{spread + 0.005:.2f}")  # round up to whole percent
    why = f"tolerance floor from {len(next(iter(aa.ratios.values()), []))} A/A runs (benchmarks/gate_quality.py)"
    report = widen_tolerances(floors, load_dir(ROOT / "budgets"), describe("cpu", threads=1), why=why)
    print(report.render(), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aa", type=int, default=50, help="A/A runs (unchanged code)")
    ap.add_argument("--runs", type=int, default=20, help="runs per planted slowdown at 10 %%")
    ap.add_argument("--runs-other", type=int, default=10, help="runs per planted slowdown at 5 %% and 20 %%")
    ap.add_argument("--out", type=Path, default=None, help="also write the Markdown table here")
    ap.add_argument("--apply-floors", action="store_true",
                    help="after the A/A runs, raise each timing budget's tolerance to the between-run "
                         "noise they measured: |median(measured/budget) - 1| + 3 x sd(measured/budget)")
    ap.add_argument("--aa-only", action="store_true", help="run only the A/A scenario")
    ap.add_argument("--tests", nargs="+", default=None, help="A/A on these test ids instead")
    args = ap.parse_args(argv)

    scenarios = [Scenario("A/A (unchanged)", "", args.aa, None)]
    for frac in (0.05, 0.10, 0.20):
        n = args.runs if frac == 0.10 else args.runs_other
        scenarios.append(Scenario(f"step +{frac:.0%}", f"step_slowdown={frac}", n, ("encoder-train.step_ms", "encoder-train.throughput_samples_per_s")))
        scenarios.append(Scenario(f"aten::mm +{frac:.0%} FLOPs", f"op_slowdown={frac}", n,
                                  ("encoder-train.op_self_ms[aten::mm]", "encoder-train.op_share[aten::mm]")))

    if args.aa_only:
        scenarios = scenarios[:1]
    aa_tests = tuple(args.tests) if args.tests else TESTS_AA
    with tempfile.TemporaryDirectory() as tmp:
        for sc in scenarios:
            for i in range(sc.runs):
                records, took = run_once(sc.plant, Path(tmp) / f"r{i}.json", aa_tests if sc.target is None else TESTS)
                sc.seconds.append(took)
                for r in records:
                    if r["kind"] in TIMING_KINDS:
                        r["metric"] = f"{r['key']}.{r['metric']}"
                        sc.outcomes[r["metric"]].append(r["outcome"])
                        if isinstance(r["value"], (int, float)):
                            sc.measured[r["metric"]].append(r["value"])
                            if r["budget"]:
                                sc.ratios[r["metric"]].append(r["value"] / r["budget"]["value"])
                if sc.target:
                    sc.outcomes["any of them"].append(
                        "fail" if any(sc.outcomes[t][-1:] == ["fail"] for t in sc.target) else "pass")
                failing = [r["metric"] for r in records if r["kind"] in TIMING_KINDS and r["outcome"] == "fail"]
                print(f"{sc.name:28s} run {i + 1:3d}/{sc.runs}: {took:5.1f} s, failing: {', '.join(failing) or '-'}",
                      flush=True)
            if sc.target is None and args.apply_floors:
                apply_floors(sc)

    lines = ["| scenario | check | runs | fail | rate | median measured/budget | sd of measured/budget |",
             "|---|---|---|---|---|---|---|"]
    for sc in scenarios:
        metrics = sorted(sc.outcomes) if sc.target is None else [*sc.target, "any of them"]
        for m in metrics:
            key = m
            outs = sc.outcomes.get(key, [])
            fails = sum(o == "fail" for o in outs)
            rs = sorted(sc.ratios.get(m, []))
            med = f"{rs[len(rs) // 2]:.3f}" if rs else "-"
            sd = f"{statistics.stdev(rs):.3f}" if len(rs) > 1 else "-"
            what = "false alarms" if sc.target is None else "detected"
            lines.append(f"| {sc.name} | {m} | {len(outs)} | {fails} | {what} {fails}/{len(outs)} | {med} | {sd} |")
    per_run = [s for sc in scenarios for s in sc.seconds]
    lines.append("")
    lines.append(f"processes: {len(per_run)}, median seconds per process (pytest start-up included): "
                 f"{sorted(per_run)[len(per_run) // 2]:.1f}")
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
