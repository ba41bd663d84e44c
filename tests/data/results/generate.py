"""Regenerate the sample results files: ``python tests/data/results/generate.py``.

The records are made by the real ``PerfRecorder`` against budgets written here, so
they look exactly like a run's: ``base.json`` is a healthy run, ``regression.json``
the same suite after a change that made ``aten::addmm`` 45 % slower (the step fails,
the operator moved), ``shard-*.json`` split ``regression.json`` by test file as
two CI shards would write it, and ``ab.json`` is ``regression.json`` compared in lockstep
with ``base.json`` as the base commit (each record's ``base`` side, head/base over three
process pairs and the verdict on that ratio).
"""

from __future__ import annotations

import math
import random
import statistics
import tempfile
from pathlib import Path

from perfbudget.budgets.loader import load_dir
from perfbudget.device import DeviceInfo
from perfbudget.extras import OperatorTable, PaddingByWidth
from perfbudget.measure.operators import OpRow
from perfbudget.measure.padding import PaddingStats
from perfbudget.metrics import parse_name
from perfbudget.recorder import PerfRecorder
from perfbudget.results import BaseSide, Record, Results, RunInfo
from perfbudget.verdict.judge import VerdictPolicy
from perfbudget.verdict.rule import tolerance_for

HERE = Path(__file__).parent
CPU = DeviceInfo(type="cpu", model="AMD EPYC 7763 64-Core Processor", count=2, torch="2.13.0+cpu",
                 triton="3.7.1", cpu_model="AMD EPYC 7763 64-Core Processor", threads=1)

BUDGETS = {
    "cpu.yaml": """schema: 1
device: {type: cpu}
budgets:
  encoder-train:
    flops: {value: 2416000000, tolerance: 0.0}
    op_count[aten::mm]: {value: 6, tolerance: 0.0}
  bucketing-padding:
    padding_rate: {value: 0.12, tolerance: 0.0}
""",
    "cpu-amd-epyc-7763-64-core-processor.yaml": """schema: 1
device: {type: cpu, model: AMD EPYC 7763, threads: 1}
budgets:
  encoder-train:
    step_ms: {value: 38.2, tolerance: 0.05}
    op_self_ms[aten::addmm]: {value: 8.1, tolerance: 0.05}
    op_self_ms[aten::gelu]: {value: 3.05, tolerance: 0.05}
    op_self_ms[aten::native_layer_norm]: {value: 2.2, tolerance: 0.05}
    op_share[aten::addmm]: {value: 0.46, tolerance: 0.05}
    peak_allocated_mib[forward]: {value: 182.0, tolerance: 0.02}
  decoder-generate:
    tokens_per_s: {value: 410.0, tolerance: 0.05}
    ttft_ms: {value: 31.0, tolerance: 0.05}
""",
}

OPS_BASE = {"aten::addmm": 8.0, "aten::gelu": 3.0, "aten::native_layer_norm": 2.2, "aten::mm": 1.9,
            "aten::softmax": 1.1, "aten::add": 0.8, "aten::copy_": 0.5}


def _samples(rng: random.Random, median: float, n: int = 40, cv: float = 0.02) -> list[float]:
    return [round(median * (1 + rng.gauss(0, cv)), 4) for _ in range(n)]


def _ops_extra(ops: dict[str, float]) -> dict[str, object]:
    total = sum(ops.values())
    rows = tuple(OpRow(name=k, self_ms=v, calls=6 if k == "aten::addmm" else 2, share=v / total, total_ms=v, flops=0.0)
                 for k, v in sorted(ops.items(), key=lambda kv: -kv[1]))
    return OperatorTable(rows=rows).to_extra()


def run(slow_addmm: float, seed: int) -> list[Record]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in BUDGETS.items():
            (Path(tmp) / name).write_text(text)
        budgets = load_dir(tmp)
        # Budget sources as a repository would show them.
        for f in budgets.files:
            for entries in f.entries.values():
                for m, b in list(entries.items()):
                    entries[m] = type(b)(**{**b.__dict__, "source": f"budgets/{f.path.name}"})
        policy = VerdictPolicy(confirm=True)
        ops = dict(OPS_BASE, **{"aten::addmm": OPS_BASE["aten::addmm"] * slow_addmm})
        step = sum(ops.values()) + 20.4

        enc = PerfRecorder(key="encoder-train", device=CPU, budgets=budgets, policy=policy,
                           nodeid="perf_tests/test_encoder.py::test_encoder_train_step")
        enc.record("step_ms", _samples(rng, step), more=lambda: _samples(rng, step), extra=_ops_extra(ops))
        for op in ("aten::addmm", "aten::gelu", "aten::native_layer_norm"):
            enc.record(f"op_self_ms[{op}]", _samples(rng, ops[op], n=30, cv=0.015),
                       more=lambda op=op: _samples(rng, ops[op], n=30, cv=0.015))
        share = ops["aten::addmm"] / sum(ops.values())
        enc.record("op_share[aten::addmm]", _samples(rng, share, n=30, cv=0.01),
                   more=lambda: _samples(rng, share, n=30, cv=0.01))
        enc.record("op_count[aten::mm]", 6)
        enc.record("flops", 2416000000)
        enc.record("peak_allocated_mib[forward]", 181.4)

        dec = PerfRecorder(key="decoder-generate", device=CPU, budgets=budgets, policy=policy,
                           nodeid="perf_tests/test_decoder.py::test_decoder_generate")
        dec.record("tokens_per_s", _samples(rng, 415.0), more=lambda: _samples(rng, 415.0))
        dec.record("ttft_ms", _samples(rng, 26.0), more=lambda: _samples(rng, 26.0))  # faster: stale
        dec.record("token_ms", _samples(rng, 2.4))  # unbudgeted
        dec.unmeasurable("energy_j_per_token", "no RAPL energy counter on this CPU")

        pad = PerfRecorder(key="bucketing-padding", device=CPU, budgets=budgets, policy=policy,
                           nodeid="perf_tests/test_bucketing.py::test_bucketed_padding")
        by_width = {32: PaddingStats(real_tokens=9100, padded_tokens=9710, batches=10),
                    64: PaddingStats(real_tokens=15200, padded_tokens=16680, batches=9),
                    128: PaddingStats(real_tokens=20400, padded_tokens=23300, batches=6),
                    512: PaddingStats(real_tokens=31000, padded_tokens=36100, batches=3)}
        total = sum(by_width.values(), PaddingStats(real_tokens=0, padded_tokens=0, batches=0))
        pad.record("padding_rate", round(total.rate, 4),
                   extra=PaddingByWidth(widths=tuple(by_width), rates=tuple(s.rate for s in by_width.values()),
                                        sorted_rate=0.031).to_extra())
        return [*enc.records(), *dec.records(), *pad.records()]


PAIRS = 3
#: Two-sided 95 % t quantile for PAIRS - 1 degrees of freedom.
T_95 = 4.303


def _vs_base(head: Record, base: Record | None) -> Record:
    """``head`` as a lockstep A/B run reports it: the base side, head/base over PAIRS process
    pairs (each pair: a slice of both sides' samples) and the verdict on that ratio."""
    if base is None or head.value is None or base.value is None or head.outcome == "unmeasurable":
        return head
    metric = parse_name(head.metric).metric
    tol = head.budget.tolerance if head.budget else tolerance_for(metric).value
    if metric.statistical and min(len(head.samples), len(base.samples)) >= PAIRS:
        hs, bs = head.samples, base.samples
        cut = [len(hs) * i // PAIRS for i in range(PAIRS + 1)], [len(bs) * i // PAIRS for i in range(PAIRS + 1)]
        pair_ratios = tuple(round(statistics.median(hs[cut[0][i]:cut[0][i + 1]])
                                  / statistics.median(bs[cut[1][i]:cut[1][i + 1]]), 5) for i in range(PAIRS))
        logs = [math.log(x) for x in pair_ratios]
        mean, half = statistics.fmean(logs), T_95 * statistics.stdev(logs) / math.sqrt(PAIRS)
        ratio = round(math.exp(mean), 5)
        ratio_ci: tuple[float, float] | None = (round(math.exp(mean - half), 5), round(math.exp(mean + half), 5))
    else:
        ratio = round(head.value / base.value, 5) if base.value else math.inf
        pair_ratios, ratio_ci = (ratio,) * PAIRS, None
    lo, hi = ratio_ci or (ratio, ratio)
    worse = lo > 1 + tol if metric.direction == "lower" else hi < 1 - tol
    side = BaseSide(value=base.value, samples=base.samples, ratio=ratio, ratio_ci=ratio_ci, pairs=PAIRS,
                    pair_ratios=pair_ratios)
    if worse:
        return head.with_(base=side, outcome="fail",
                          reason=f"head/base {ratio:.4g} (CI {lo:.4g}-{hi:.4g}) entirely beyond 1 ± {tol:.0%} "
                                 f"over {PAIRS} process pairs")
    outcome = head.outcome if head.outcome in ("unbudgeted", "stale") else "pass"
    return head.with_(base=side, outcome=outcome, reason="" if outcome == "pass" else head.reason)


def main() -> None:
    meta = RunInfo(budgets_dir="budgets")
    base = run(slow_addmm=1.0, seed=1)
    new = run(slow_addmm=1.45, seed=2)
    Results(records=base, meta=meta).write(HERE / "base.json")
    Results(records=new, meta=meta).write(HERE / "regression.json")
    Results(records=[r for r in new if "test_encoder" in r.nodeid], meta=meta).write(HERE / "shard-1.json")
    Results(records=[r for r in new if "test_encoder" not in r.nodeid], meta=meta).write(HERE / "shard-2.json")
    by_metric = {(r.key, r.metric): r for r in base}
    ab = [_vs_base(r, by_metric.get((r.key, r.metric))) for r in new]
    Results(records=ab, meta=meta).write(HERE / "ab.json")
    for r, a in zip(new, ab, strict=True):
        print(f"{r.key:18} {r.metric:36} {r.outcome:13} vs base: {a.outcome}")


if __name__ == "__main__":
    main()
