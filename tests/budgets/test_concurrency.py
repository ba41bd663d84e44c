"""Concurrent and interrupted updates, with real processes: no lost entry, never a broken file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from perfbudget.budgets import load_dir
from perfbudget.device import DeviceInfo

WRITER = r"""
import sys
from pathlib import Path
from perfbudget.budgets import Measured, apply_updates, load_dir
from perfbudget.device import DeviceInfo

root, tag, n, rounds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
dev = DeviceInfo(type="cpu", model="Fuzz CPU", count=2, torch="2.13.0+cpu", threads=1)
for r in range(rounds):
    # Each round rewrites every entry: tightening by 1 % keeps the file changing.
    ms = [Measured(key=f"{tag}-{i}", metric="step_ms", value=100.0 * 0.99 ** r, samples=30, cv=0.01, device=dev)
          for i in range(n)]
    rep = apply_updates(ms, load_dir(root))
    assert not rep.errors, rep.errors
    print("round", r, flush=True)
"""

DEV = DeviceInfo(type="cpu", model="Fuzz CPU", count=2, torch="2.13.0+cpu", threads=1)


def spawn(root: Path, tag: str, n: int, rounds: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(root), tag, str(n), str(rounds)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_processes_updating_one_file_lose_no_entry(tmp_path: Path) -> None:
    procs = [spawn(tmp_path, tag, 20, 5) for tag in ("a", "b")]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    bs = load_dir(tmp_path)
    assert [f.path.name for f in bs.files] == ["cpu-fuzz-cpu.yaml"]
    keys = set(bs.files[0].entries)
    assert keys == {f"{t}-{i}" for t in "ab" for i in range(20)}
    assert all(b.value == round(100 * 0.99**4, 2) for e in bs.files[0].entries.values() for b in e.values())


def test_a_killed_updater_leaves_the_old_or_the_new_file(tmp_path: Path) -> None:
    seen_states = set()
    for attempt in range(4):  # killed 0-150 ms after its first round: a process start each
        p = spawn(tmp_path, "k", 200, 1000)
        assert p.stdout is not None
        p.stdout.readline()  # at least one round written: the file exists
        time.sleep(0.05 * attempt)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        bs = load_dir(tmp_path)
        assert len(bs.files) == 1 and bs.files[0].errors == [], bs.files[0].errors
        entries = bs.files[0].entries
        assert len(entries) == 200  # every entry present: a whole file, old or new
        seen_states.add(len({b.value for e in entries.values() for b in e.values()}))
    assert seen_states == {1}  # never a mix of two rounds inside one file
