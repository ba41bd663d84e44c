"""Run by tests/measure/test_instructions.py under ``perfbudget instructions``: counts a few steps, writes them as JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from perfbudget.measure import instructions as ins


def _as_json(got: ins.InstructionCount | ins.Unmeasurable) -> dict[str, object]:
    if isinstance(got, ins.Unmeasurable):
        return {"unmeasurable": got.reason}
    return {"per_step": got.per_step, "total": got.total, "steps": got.steps, "counter": got.counter,
            "dump": str(got.dump), "history_dependent": got.history_dependent}


def test_probe(tmp_path: Path, perf: Any) -> None:
    perf.record("graph_breaks", 0)  # a record, so the session writes its results file
    torch.manual_seed(0)
    a, b, c = torch.randn(32, 64), torch.randn(64, 64), torch.randn(64, 48)

    def step() -> None:
        torch.relu(a @ b)

    def planted() -> None:
        torch.relu(a @ b)
        a @ c  # the planted extra op

    def plant_alone() -> None:
        a @ c

    out: dict[str, object] = {"under_valgrind": ins.running_under_valgrind()}
    for name, fn in [("base", step), ("again", step), ("planted", planted), ("plant_alone", plant_alone)]:
        out[name] = _as_json(ins.instructions(fn, steps=100, label=name))
    out["hardware_under_valgrind"] = _as_json(ins.instructions(step, counter="hardware"))
    # Without the helper, torch's toggles cannot start instrumentation (--instr-atstart=no).
    os.environ[ins.HELPER_CACHE_ENV] = str(tmp_path / "empty-cache")
    os.environ["CC"] = "no-such-compiler"
    out["without_helper"] = _as_json(ins.instructions(step, steps=5, label="without_helper"))
    Path(os.environ["PROBE_OUT"]).write_text(json.dumps(out), encoding="utf-8")
