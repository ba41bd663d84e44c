"""Where the encoder's training step spends a GPU's time: wall, device busy, idle share, kernels.

Run on a CUDA machine (results in benchmarks/gpu-step-probe-h200.md):

    PYTHONPATH=src python3 benchmarks/gpu_step_probe.py --out probe.json

Each variant of the reference encoder step (BERT-base geometry, the suite's levers: fp32-statistics
LayerNorm, per-layer clipping, the bf16 policy) is built fresh, warmed for 3 steps, timed unprofiled
(``--steps`` steps, host clock around a synchronised window, one sample per step from CUDA events),
then profiled with CUDA activity only over 5 steps: kernels + memcpy + memset per step, their summed
duration, and their union (busy time; overlapping streams counted once). Idle share is
``1 - union per step / unprofiled wall per step``. Also the bf16 policy's peak memory against fp32
(the precision lever's saving) and the Triton LayerNorm op under ``torch.compile(fullgraph=True,
dynamic=True)`` at two sequence lengths.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch


def busy_union_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals (same unit in, ms out if given us)."""
    total = 0.0
    end = float("-inf")
    start = 0.0
    for s, e in sorted(intervals):
        if s > end:
            if end > float("-inf"):
                total += end - start
            start, end = s, e
        else:
            end = max(end, e)
    if end > float("-inf"):
        total += end - start
    return total


def device_events(prof: Any) -> list[tuple[str, float, float]]:
    """(name, start_us, end_us) of every kernel, memcpy and memset in a finished profile."""
    out = []
    for ev in prof.profiler.kineto_results.events():
        if ev.device_type() != torch.autograd.DeviceType.CUDA:
            continue
        name = ev.name()
        if ev.is_user_annotation() or name.startswith("ProfilerStep") or ev.duration_ns() <= 0:
            continue
        start = ev.start_ns() / 1e3
        out.append((name, start, start + ev.duration_ns() / 1e3))
    return out


def measure(name: str, step: Callable[[], Any], *, steps: int, flops_per_step: float | None) -> dict[str, Any]:
    torch.cuda.synchronize()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    # Unprofiled: one CUDA-event sample per step, and the host clock over the window.
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    t0 = time.perf_counter()
    starts[0].record()
    for i in range(steps):
        step()
        starts[i + 1].record()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    per_step = [starts[i].elapsed_time(starts[i + 1]) for i in range(steps)]
    # Profiled: device activity only (the host side is not recorded, so it is not slowed much).
    n_prof = 5
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n_prof):
            step()
        torch.cuda.synchronize()
    evs = device_events(prof)
    kernels = [e for e in evs if "memcpy" not in e[0].lower() and "memset" not in e[0].lower()]
    union_ms = busy_union_ms([(s, e) for _, s, e in evs]) / 1e3 / n_prof
    sum_ms = sum(e - s for _, s, e in evs) / 1e3 / n_prof
    med = statistics.median(per_step)
    row = {
        "variant": name,
        "wall_ms_per_step": round(wall_ms, 3),
        "event_ms_median": round(med, 3),
        "event_ms_cv": round(statistics.pstdev(per_step) / statistics.mean(per_step), 4),
        "kernels_per_step": len(kernels) / n_prof,
        "device_events_per_step": len(evs) / n_prof,
        "device_sum_ms": round(sum_ms, 3),
        "device_union_ms": round(union_ms, 3),
        "idle_share": round(1 - union_ms / med, 4),
    }
    if flops_per_step:
        row["tflops_per_s"] = round(flops_per_step / (med / 1e3) / 1e12, 1)
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu-step-probe.json")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--only", default="", help="comma-separated variant names")
    args = ap.parse_args()
    from perfbudget.measure.operators import count_flops
    from torchlevers import FP32StatsLayerNorm, PerLayerClipConfig, PerLayerClipper, PrecisionPolicy
    from torchlevers.workloads import EncoderConfig, EncoderWorkload

    rows: list[dict[str, Any]] = []
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0),
           "cpus": len(os.sched_getaffinity(0))}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    print(json.dumps(env), flush=True)

    def build(*, batch: int = 64, seq: int = 128, fused: bool = False, clip: bool = True, bf16: bool = True,
              ln_backend: str = "auto") -> tuple[EncoderWorkload, Any]:
        cfg = EncoderConfig.for_size("large", device="cuda", batch_size=batch, seq_len=seq)

        def opt(model: torch.nn.Module) -> torch.optim.Optimizer:
            return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused)

        w = EncoderWorkload(
            cfg,
            norm_factory=lambda d, eps: FP32StatsLayerNorm(d, eps=eps, backend=ln_backend),  # type: ignore[arg-type,misc]
            precision=PrecisionPolicy(dtype="bf16").apply if bf16 else None,
            clip=PerLayerClipper(PerLayerClipConfig()).clip if clip else None,
            optimizer_factory=opt,
        )
        return w, w.make_batch()

    variants: dict[str, dict[str, Any]] = {
        "as-timed (64x128, foreach AdamW)": {},
        "fused AdamW": {"fused": True},
        "fused AdamW, no clipping": {"fused": True, "clip": False},
        "fused AdamW, torch LayerNorm": {"fused": True, "ln_backend": "torch"},
        "fused AdamW, 128x128": {"fused": True, "batch": 128},
        "fused AdamW, 256x128": {"fused": True, "batch": 256},
        "fused AdamW, 64x512": {"fused": True, "seq": 512},
    }
    only = {v.strip() for v in args.only.split(",") if v.strip()}
    for name, kw in variants.items():
        if only and name not in only:
            continue
        try:
            w, batch = build(**kw)
            def one(w: EncoderWorkload = w, batch: Any = batch) -> Any:
                return w.step(batch)

            rows.append(measure(name, one, steps=args.steps, flops_per_step=count_flops(one).total_flops))
            del w, batch
            torch.cuda.empty_cache()
        except Exception as exc:  # a variant that fails is reported, the others still run
            rows.append({"variant": name, "error": f"{type(exc).__name__}: {exc}"[:500]})
            print(json.dumps(rows[-1]), flush=True)

    # Host affinity of a launch-bound step: one core, eight cores, all.
    try:
        w, batch = build(fused=True)
        every = sorted(os.sched_getaffinity(0))
        for label, cpus in (("1 core", every[-1:]), ("8 cores", every[-8:]), ("all cores", every)):
            os.sched_setaffinity(0, cpus)
            rows.append(measure(f"fused AdamW, pinned {label}", lambda: w.step(batch), steps=args.steps,
                                flops_per_step=None))
        os.sched_setaffinity(0, every)
        del w, batch
        torch.cuda.empty_cache()
    except Exception as exc:
        rows.append({"variant": "affinity", "error": f"{type(exc).__name__}: {exc}"[:500]})

    # The precision lever's memory: peak allocated over two steps, bf16 policy vs fp32.
    try:
        peaks = {}
        for label, bf16 in (("fp32", False), ("bf16", True)):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            w, batch = build(bf16=bf16)
            for _ in range(2):
                w.step(batch)
            torch.cuda.synchronize()
            peaks[label] = (torch.cuda.max_memory_allocated() - base) / 2**20
            del w, batch
        row = {"variant": "precision memory", "peak_mib_fp32": round(peaks["fp32"], 1),
               "peak_mib_bf16": round(peaks["bf16"], 1), "ratio_bf16_over_fp32": round(peaks["bf16"] / peaks["fp32"], 4)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    except Exception as exc:
        rows.append({"variant": "precision memory", "error": f"{type(exc).__name__}: {exc}"[:500]})

    # The Triton LayerNorm op under torch.compile(fullgraph=True, dynamic=True), two sizes.
    try:
        import torch._dynamo as dynamo

        dynamo.reset()
        ln = FP32StatsLayerNorm(768, backend="triton").cuda()
        f = torch.compile(lambda x: ln(x).float().square().mean(), fullgraph=True, dynamic=True)
        t0 = time.perf_counter()
        got = []
        for rows_n in (512, 1000):
            x = torch.randn(rows_n, 768, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            f(x).backward()
            ref = torch.nn.functional.layer_norm(x.detach().float(), (768,), ln.weight, ln.bias)
            got.append(float((ln(x.detach()).float() - ref).abs().max()))
        torch.cuda.synchronize()
        row = {"variant": "triton layernorm compiled fullgraph dynamic", "ok": True,
               "compile_and_run_s": round(time.perf_counter() - t0, 1), "max_abs_err": got,
               "frames": dict(dynamo.utils.counters["stats"])}
    except Exception as exc:
        row = {"variant": "triton layernorm compiled fullgraph dynamic", "ok": False,
               "error": "".join(traceback.format_exception_only(exc))[-800:]}
    rows.append(row)
    print(json.dumps(row, default=str), flush=True)

    # The encoder's compiled forward (as the encoder_compiled fixture), one shape, timed.
    try:
        import torch._dynamo as dynamo

        dynamo.reset()
        w, batch = build(fused=True)
        t0 = time.perf_counter()
        w.compile(dynamic=True)
        for _ in range(2):
            w.step(batch)
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        row = measure("compiled forward, fused AdamW", lambda: w.step(batch), steps=args.steps, flops_per_step=None)
        row["compile_s"] = round(compile_s, 1)
        rows.append(row)
    except Exception as exc:
        rows.append({"variant": "compiled forward", "error": "".join(traceback.format_exception_only(exc))[-800:]})
        print(json.dumps(rows[-1]), flush=True)

    with open(args.out, "w") as fh:
        json.dump({"env": env, "rows": rows}, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
