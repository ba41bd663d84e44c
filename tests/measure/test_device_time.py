"""Device busy time per profiled step, on constructed kineto traces: streams, copies, annotations, lag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from perfbudget.measure.occupancy import step_device_times


def _step(n: int, ts: float, dur: float, cat: str = "user_annotation") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": f"ProfilerStep#{n}", "ts": ts, "dur": dur, "pid": 1, "tid": 1}


def _launch(corr: int, ts: float, cat: str = "cuda_runtime", name: str = "cudaLaunchKernel") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": 2.0, "args": {"correlation": corr}}


def _work(corr: int, ts: float, dur: float, *, cat: str = "kernel", stream: int = 7) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": f"{cat}-{corr}", "ts": ts, "dur": dur,
            "args": {"correlation": corr, "stream": stream, "device": 0}}


def _trace(*events: dict[str, Any]) -> dict[str, Any]:
    return {"traceEvents": list(events)}


def test_overlapping_streams_count_once_in_busy_time_and_twice_in_the_sum() -> None:
    trace = _trace(
        _step(1, 0, 1000),
        _launch(1, 10), _launch(2, 20),
        _work(1, 100, 300, stream=7),   # 100-400
        _work(2, 300, 200, stream=13),  # 300-500: overlaps the first by 100 us
    )
    (step,) = step_device_times(trace)
    assert step.step == "ProfilerStep#1" and step.kernels == 2 and step.copies == 0
    assert step.busy_ms == pytest.approx(0.4)  # 100-500
    assert step.summed_ms == pytest.approx(0.5)


def test_copies_and_fills_are_work_and_device_annotations_are_not() -> None:
    trace = _trace(
        _step(1, 0, 1000),
        _launch(1, 10, name="cudaMemcpyAsync"), _launch(2, 20), _launch(3, 30, name="cudaMemsetAsync"),
        _work(1, 50, 100, cat="gpu_memcpy"),   # 50-150
        _work(2, 200, 100),                    # 200-300
        _work(3, 400, 10, cat="gpu_memset"),   # 400-410
        # The step drawn on the device timeline spans everything: a range, not work.
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#1", "ts": 40, "dur": 900},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "forward", "ts": 40, "dur": 300},
    )
    (step,) = step_device_times(trace)
    assert (step.kernels, step.copies) == (1, 2)
    assert step.busy_ms == pytest.approx(0.21) and step.summed_ms == pytest.approx(0.21)


def test_work_lagging_into_the_next_step_belongs_to_the_step_that_launched_it() -> None:
    trace = _trace(
        _step(3, 0, 100), _step(4, 100, 100),
        _launch(1, 90),                       # launched at the end of step 3 ...
        _work(1, 120, 50),                    # ... runs inside step 4's range
        _launch(2, 110, cat="cuda_driver", name="cuLaunchKernelEx"),  # a Triton kernel: driver API
        _work(2, 180, 30),
        _work(99, 150, 5),                    # no launch record: placed by its own start (step 4)
        _launch(3, 250), _work(3, 260, 10),   # launched after the last step: not the steps' work
    )
    three, four = step_device_times(trace)
    assert (three.step, three.kernels, three.busy_ms) == ("ProfilerStep#3", 1, pytest.approx(0.05))
    assert (four.step, four.kernels) == ("ProfilerStep#4", 2)
    assert four.busy_ms == pytest.approx(0.035)


def test_steps_come_from_host_ranges_in_time_order_and_a_trace_without_steps_has_none(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(_trace(
        _step(2, 500, 100), _step(1, 0, 100),
        _step(1, 0, 100, cat="python_function"),  # with_stack's copy of the range: not a second step
        _launch(1, 10), _work(1, 20, 40), _launch(2, 510), _work(2, 530, 60),
    )))
    assert [(s.step, s.busy_ms) for s in step_device_times(path)] == [
        ("ProfilerStep#1", pytest.approx(0.04)), ("ProfilerStep#2", pytest.approx(0.06))]
    assert step_device_times(_trace(_launch(1, 10), _work(1, 20, 40))) == []
    (empty,) = step_device_times(_trace(_step(1, 0, 100)))
    assert (empty.busy_ms, empty.summed_ms, empty.kernels, empty.copies) == (0.0, 0.0, 0, 0)
