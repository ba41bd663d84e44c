"""A pytest run cut off mid-way keeps every finished test's records: killed, or interrupted at a bound."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perfbudget.results import load_results

TESTS = """
import os, time
import pytest

@pytest.mark.budget("first")
def test_first(perf):
    perf.record("flops", 1000)

@pytest.mark.budget("second")
def test_second(perf):
    perf.record("op_count[aten::mm]", 3)

def test_stalls():
    open(os.environ["STALLED_MARKER"], "w").close()
    time.sleep(600)

@pytest.mark.budget("never")
def test_never_reached(perf):
    perf.record("flops", 5)
"""


def start(tmp: Path, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    """A pytest process over :data:`TESTS`, returned once it stalls in the third test."""
    (tmp / "test_cut.py").write_text(TESTS)
    marker = tmp / "stalled"
    env = {**os.environ, "STALLED_MARKER": str(marker)}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-o", "perfbudget_max_load=1e9",
         "--perf-json", str(tmp / "results.json"), "--budgets-dir", str(tmp / "budgets"), *args, "test_cut.py"],
        cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        # As a terminal or `timeout -s INT` would find it: a run started in the background by a
        # non-interactive shell (`.ci/run ... &`) inherits SIGINT ignored, and Python then never
        # raises KeyboardInterrupt (this test hung so, its child still asleep in test_stalls).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"pytest did not reach the stalling test:\n{proc.communicate()[0].decode()[-3000:]}")
        time.sleep(0.05)
    return proc, marker


def test_a_killed_run_keeps_the_records_of_the_tests_it_finished(tmp_path: Path) -> None:
    proc, _ = start(tmp_path)
    proc.kill()  # SIGKILL: no hook runs, nothing is written after this
    proc.communicate(timeout=60)
    got = load_results(tmp_path / "results.json")
    assert [(r.key, r.metric) for r in got.records] == [("first", "flops"), ("second", "op_count[aten::mm]")]
    assert got.meta.mode == "stored"
    assert got.meta.unfinished is not None and "did not finish" in got.meta.unfinished
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "no temp file left behind"


def test_an_interrupted_update_writes_the_budgets_of_the_tests_it_finished(tmp_path: Path) -> None:
    # What a bound (timeout -s INT) does: pytest stops, finishes the session, and perfbudget
    # writes the results and the budgets of what was measured.
    proc, _ = start(tmp_path, "--update-budgets")
    proc.send_signal(signal.SIGINT)
    try:
        out = proc.communicate(timeout=120)[0].decode()
    except subprocess.TimeoutExpired:
        # Say where it hangs (pytest's faulthandler prints every thread's stack on SIGABRT).
        proc.send_signal(signal.SIGABRT)
        pytest.fail(f"pytest did not end within 120 s of SIGINT; its stacks:\n{proc.communicate()[0].decode()[-6000:]}")
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out[-3000:]
    got = load_results(tmp_path / "results.json")
    assert got.meta.unfinished is None
    assert {r.key for r in got.records} == {"first", "second"}
    budgets = "".join(p.read_text() for p in (tmp_path / "budgets").glob("*.yaml"))
    assert "first:" in budgets and "second:" in budgets and "never:" not in budgets
