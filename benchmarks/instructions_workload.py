"""The workload of benchmarks/instructions_aa.py, run as a pytest file under ``perfbudget instructions``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from torch import nn

from perfbudget.measure.instructions import InstructionCount, instructions

STEPS = 20


def test_tiny_mlp_training_step() -> None:
    started = time.monotonic()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    rows = []
    for label in ("first", "second"):  # the same step twice in one process
        t0 = time.monotonic()
        got = instructions(step, steps=STEPS, label=label)
        assert isinstance(got, InstructionCount), got
        rows.append({"label": label, "per_step": got.per_step, "total": got.total, "counter": got.counter,
                     "dump": str(got.dump), "wall_s": time.monotonic() - t0})
    out = {"threads": torch.get_num_threads(), "torch": torch.__version__,
           "test_wall_s": time.monotonic() - started, "rows": rows}
    Path(os.environ["WORKLOAD_OUT"]).write_text(json.dumps(out), encoding="utf-8")
