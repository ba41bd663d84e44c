"""How noisy the measurement layer is on this machine: timer CV, profiler overhead, per-op self-time CV.

Run: ``.venv/bin/python benchmarks/measure_noise.py [--rounds 5] [--json out.json]``.

The workload is a small training step: ``nn.TransformerEncoder`` (d_model 128, 4 heads, FFN
512, 2 layers, no dropout) plus a Linear head, batch 16 x 64 tokens, MSE loss, backward and
AdamW. Rounds of the different configurations are interleaved so that slow drifts of the
machine (other jobs, thermal state) hit all of them alike. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from perfbudget.measure import stats
from perfbudget.measure.operators import profile_steps
from perfbudget.measure.timing import bench, pinned_threads


def encoder_step(seed: int = 0) -> Callable[[], None]:
    """The reference training step (see the module docstring)."""
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True)
    model = nn.Sequential(
        nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), nn.Linear(128, 128)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(16, 64, 128)
    y = torch.randn(16, 64, 128)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    return step


def timer_noise(step: Callable[[], None], rounds: int, max_ms: float) -> dict[str, Any]:
    """Within-run CV and the spread of run medians at 1 and 2 threads, rounds interleaved."""
    per_threads: dict[int, list[Any]] = {1: [], 2: []}
    for _ in range(rounds):
        for threads in (1, 2):
            s = bench(step, warmup_ms=300, min_samples=30, max_ms=max_ms, threads=threads)
            per_threads[threads].append(s)
    out: dict[str, Any] = {}
    for threads, runs in per_threads.items():
        medians = [r.median_ms for r in runs]
        out[f"{threads}_thread"] = {
            "run_medians_ms": [round(m, 3) for m in medians],
            "within_run_cv": [round(stats.cv(r.samples_ms), 4) for r in runs],
            "within_run_cv_median": round(
                statistics.median(stats.cv(r.samples_ms) for r in runs), 4
            ),
            "across_runs_cv": round(stats.cv(medians), 4),
            "samples_per_run": [r.n for r in runs],
        }
    return out


def profiler_overhead(step: Callable[[], None], rounds: int, steps: int) -> dict[str, Any]:
    """Per-step wall time with and without the profiler (CPU, shapes and FLOPs), interleaved."""
    from torch.profiler import ProfilerActivity, profile

    def timed(n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            step()
            out.append((time.perf_counter() - t0) * 1e3)
        return out

    plain: list[float] = []
    profiled: list[float] = []
    with pinned_threads(1):
        for _ in range(3):
            step()
        for _ in range(rounds):
            plain.append(stats.median(timed(steps)))
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True):
                profiled.append(stats.median(timed(steps)))
    base = stats.median(plain)
    slow = sum(1 for p in profiled if p > 1.5 * base)
    return {
        "unprofiled_round_medians_ms": [round(x, 3) for x in plain],
        "profiled_round_medians_ms": [round(x, 3) for x in profiled],
        "overhead_ratio": round(stats.median(profiled) / base, 4),
        "profiled_rounds_over_1_5x": f"{slow}/{len(profiled)}",
    }


def op_self_time_noise(step: Callable[[], None], repeats: int, min_share: float) -> dict[str, Any]:
    """CV across repeated ``profile_steps`` runs of each heavy operator's self time per step."""
    tables = [profile_steps(step, steps=5, warmup=1, peaks=None, threads=1) for _ in range(repeats)]
    heavy = [r.name for r in tables[0].rows if r.share >= min_share]
    rows: dict[str, dict[str, Any]] = {}
    for name in heavy:
        values = [t.by_name(name).self_ms for t in tables if t.get(name) is not None]
        rows[name] = {
            "share": round(tables[0].by_name(name).share, 4),
            "self_ms_per_step": [round(v, 4) for v in values],
            "cv": round(stats.cv(values), 4),
        }
    step_ms = [t.step_self_ms for t in tables]
    return {
        "ops": rows,
        "step_self_ms": [round(v, 3) for v in step_ms],
        "step_self_ms_cv": round(stats.cv(step_ms), 4),
        "median_op_cv": round(statistics.median(r["cv"] for r in rows.values()), 4)
        if rows
        else math.nan,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds per configuration"
    )
    parser.add_argument(
        "--max-ms", type=float, default=1500, help="time budget of one timer run (ms)"
    )
    parser.add_argument("--json", help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)

    step = encoder_step()
    t0 = time.perf_counter()
    report: dict[str, Any] = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "loadavg_start": os.getloadavg(),
        },
        "timer": timer_noise(step, args.rounds, args.max_ms),
        "profiler_overhead": profiler_overhead(step, rounds=max(args.rounds, 4) * 2, steps=20),
        "op_self_time": op_self_time_noise(step, repeats=args.rounds, min_share=0.05),
    }
    report["machine"]["loadavg_end"] = os.getloadavg()
    report["wall_s"] = round(time.perf_counter() - t0, 1)

    t = report["timer"]
    p = report["profiler_overhead"]
    o = report["op_self_time"]
    print(
        f"torch {torch.__version__}, {os.cpu_count()} cores, load {report['machine']['loadavg_start']}"
    )
    print("timer (perf_counter, median of >= 30 steps per run):")
    for key in ("1_thread", "2_thread"):
        r = t[key]
        print(
            f"  {key.replace('_', ' ')}: run medians {r['run_medians_ms']} ms; within-run CV "
            f"{r['within_run_cv_median']:.1%} (median); across-run CV of medians {r['across_runs_cv']:.1%}"
        )
    print(
        f"profiler overhead (CPU + shapes + FLOPs, 1 thread): x{p['overhead_ratio']:.3f}; "
        f"profiled rounds > 1.5x: {p['profiled_rounds_over_1_5x']}"
    )
    print(f"per-op self time across {args.rounds} profile_steps runs (ops >= 5 % of the step):")
    for name, r in o["ops"].items():
        print(f"  {name:<60} share {r['share']:.1%}  CV {r['cv']:.1%}")
    print(f"  summed op self time per step: CV {o['step_self_ms_cv']:.1%}")
    print(f"wall {report['wall_s']} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
