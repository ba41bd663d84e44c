"""One side of a fake A/B pair, standing in for ``pytest --perf-collect``: ``python fake_side.py RESULTS``.

Runs in the side's tree; ``fakelib`` (the code under test) comes from that tree through the
A/B shim, ``perfbudget`` from the instrument. Its timer loop takes turns like the
instrument's timers: ``pass_turn()`` at every burst boundary. Writes the plugin's results
JSON to RESULTS, and each burst's ``time.monotonic()`` interval and the CPUs it may run on to
RESULTS.bursts.json.

A ``fakelib`` that defines ``SAMPLES_MS`` still takes its turns, but records those samples
instead of the times it measured: a check whose ratios are fixed by construction, so that
what the driver decides does not depend on how busy the machine is.
"""

from __future__ import annotations

import json
import os
import sys
import time

import fakelib

from perfbudget.device import DeviceInfo
from perfbudget.measure import stats, turns
from perfbudget.results import Record, Results

BURSTS = 6
NODE = "tests/test_fake.py::test_step"


def main(results: str) -> int:
    turns.join()
    samples: list[float] = []
    bursts: list[list[float]] = []
    for _ in range(BURSTS):
        turns.pass_turn()
        t0 = time.monotonic()
        end = t0 + turns.burst_ms() / 1e3
        while True:
            s = time.perf_counter()
            fakelib.step()
            samples.append((time.perf_counter() - s) * 1e3)
            if time.monotonic() >= end:
                break
        bursts.append([t0, time.monotonic()])
    turns.leave()
    samples = list(getattr(fakelib, "SAMPLES_MS", samples))
    dev = DeviceInfo(type="cpu", model="fake cpu", count=1, threads=1)
    common = dict(nodeid=NODE, key="fake-step", device=dev)
    records = [
        Record(metric="step_ms", outcome="pass", value=stats.median(samples), samples=tuple(samples),
               n=len(samples), unit="ms", kind="timing", direction="lower", **common),  # type: ignore[arg-type]
        Record(metric="flops", outcome="pass", value=float(fakelib.FLOPS), n=1, unit="1", kind="exact",
               direction="lower", reason="within budget", **common),  # type: ignore[arg-type]
    ]
    if getattr(fakelib, "EXTRA", False):  # a check only the head has
        records.append(Record(metric="latency_ms[extra]", outcome="pass", value=1.0, samples=(1.0, 1.0, 1.0), n=3,
                              unit="ms", kind="timing", direction="lower", **common))  # type: ignore[arg-type]
    Results(records=records).write(results)
    with open(results + ".bursts.json", "w") as fh:
        json.dump({"bursts": bursts, "cpus": sorted(os.sched_getaffinity(0))}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
