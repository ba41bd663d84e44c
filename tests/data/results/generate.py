"""Regenerate the sample results files: ``python tests/data/results/generate.py``.

The records are made by the real ``PerfRecorder`` against budgets written here, so
they look exactly like a run's: ``base.json`` is a healthy run, ``regression.json``
the same suite after a change that made ``aten::addmm`` 45 % slower (the step fails,
the operator moved), and ``shard-*.json`` split ``regression.json`` by test file as
two CI shards would write it.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from perfbudget.budgets.loader import load_dir
from perfbudget.budgets.verdict import VerdictPolicy
from perfbudget.device import DeviceInfo
from perfbudget.recorder import PerfRecorder
from perfbudget.report import padding_extra
from perfbudget.results import Record, Results

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
    return {"ops": [{"name": k, "self_ms": v, "calls": 6 if k == "aten::addmm" else 2, "share": v / total}
                    for k, v in sorted(ops.items(), key=lambda kv: -kv[1])]}


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
        per_bucket = {"<=32": {"real_tokens": 9100, "pad_tokens": 610}, "33-64": {"real_tokens": 15200, "pad_tokens": 1480},
                      "65-128": {"real_tokens": 20400, "pad_tokens": 2900}, "129-512": {"real_tokens": 31000, "pad_tokens": 5100}}
        real = sum(b["real_tokens"] for b in per_bucket.values())
        padded = sum(b["pad_tokens"] for b in per_bucket.values())
        pad.record("padding_rate", round(padded / (real + padded), 4),
                   extra=padding_extra(per_bucket, sorted_rate=0.031))
        return [*enc.records(), *dec.records(), *pad.records()]


def main() -> None:
    meta = {"budgets_dir": "budgets"}
    base = run(slow_addmm=1.0, seed=1)
    new = run(slow_addmm=1.45, seed=2)
    Results(records=base, meta=meta).write(HERE / "base.json")
    Results(records=new, meta=meta).write(HERE / "regression.json")
    Results(records=[r for r in new if "test_encoder" in r.nodeid], meta=meta).write(HERE / "shard-1.json")
    Results(records=[r for r in new if "test_encoder" not in r.nodeid], meta=meta).write(HERE / "shard-2.json")
    for r in new:
        print(f"{r.key:18} {r.metric:36} {r.outcome}")


if __name__ == "__main__":
    main()
