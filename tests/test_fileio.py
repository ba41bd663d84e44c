"""Atomic replacement and the advisory lock, with real processes: the old file or the new, writers in turn."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perfbudget.fileio import atomic_write, lock


def test_atomic_write_replaces_keeps_permissions_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "r.json"
    assert atomic_write(target, "one") == target  # the folder is created
    assert target.read_text() == "one" and target.stat().st_mode & 0o777 == 0o644
    target.chmod(0o600)
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two" and target.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["r.json"]


# The file-size limit makes the kernel refuse the write part-way (EFBIG): a real failure mid-write.
FAILING_WRITER = r"""
import resource, signal, sys
from perfbudget.fileio import atomic_write
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    atomic_write(sys.argv[1], "x" * 100_000)
except OSError as exc:
    print(exc.errno)
"""


def test_a_write_failing_midway_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "budgets.yaml"
    target.write_text("old\n")
    got = subprocess.run([sys.executable, "-c", FAILING_WRITER, str(target)], capture_output=True, text=True,
                         timeout=60)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "27"  # EFBIG: it failed inside the write, not before it
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["budgets.yaml"]


INTERRUPTED_WRITER = r"""
import signal, sys
from perfbudget.fileio import atomic_write
# A process started in the background by a non-interactive shell inherits SIGINT ignored (as
# `cmd &` in a script does): make the interrupt reach Python here, however the tests were started.
signal.signal(signal.SIGINT, signal.default_int_handler)
n = 0
while True:
    atomic_write(sys.argv[1], str(n % 10) * 2_000_000)
    n += 1
    if n == 1:
        print("written", flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["interrupted", "killed"])
def test_a_writer_stopped_mid_write_leaves_a_whole_file(tmp_path: Path, sig: signal.Signals) -> None:
    target = tmp_path / "results.json"
    for attempt in range(3):
        p = subprocess.Popen([sys.executable, "-c", INTERRUPTED_WRITER, str(target)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            assert p.stdout is not None
            assert p.stdout.readline() == "written\n"
            time.sleep(0.02 * attempt)
            os.kill(p.pid, sig)
            p.wait(timeout=60)
        finally:
            if p.poll() is None:  # never leave a writer looping behind a failed test
                p.kill()
                p.wait()
        text = target.read_text()
        assert len(text) == 2_000_000 and len(set(text)) == 1  # one whole version, never a part or a mix
        leftovers = [q.name for q in tmp_path.iterdir() if q != target]
        if sig == signal.SIGINT:  # the interrupt reaches Python: its temp file is removed
            assert leftovers == []
        else:  # SIGKILL runs no clean-up: a temp file may stay, but never under the target's name
            assert all(n.startswith(".results.json.") and n.endswith(".tmp") for n in leftovers)
            for q in leftovers:
                (tmp_path / q).unlink()


HOLDER = r"""
import json, sys, time
from pathlib import Path
from perfbudget.fileio import lock
path, go, how = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
print("ready", flush=True)
while not go.exists():
    time.sleep(0.005)
spans = []
for _ in range(3):
    with lock(path, shared=how == "shared"):
        start = time.monotonic()
        time.sleep(0.05)
        spans.append((start, time.monotonic(), how))
print(json.dumps(spans))
"""

Span = tuple[float, float, str]


def _hold_together(path: Path, go: Path, how: list[str]) -> list[Span]:
    """Spans during which each of several processes held the lock (all start on one signal)."""
    procs = [subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(go), h], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for h in how]
    for p in procs:  # every process at the start line, then all go at once
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
    go.touch()
    spans: list[Span] = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        spans += [(float(a), float(b), str(h)) for a, b, h in json.loads(out)]
    assert len(spans) == 3 * len(how)
    return sorted(spans)


def _overlapping(spans: list[Span]) -> list[tuple[Span, Span]]:
    return [(a, b) for i, a in enumerate(spans) for b in spans[i + 1:] if b[0] < a[1]]


def test_processes_contending_for_the_lock_take_it_in_turn(tmp_path: Path) -> None:
    spans = _hold_together(tmp_path / "locks" / "timing.lock", tmp_path / "go", ["exclusive"] * 3)
    assert _overlapping(spans) == []
    # The same measurement sees overlap where it is allowed: shared holders run side by side.
    shared = _hold_together(tmp_path / "shared.lock", tmp_path / "go2", ["shared"] * 3)
    assert _overlapping(shared) != []


def test_an_exclusive_holder_excludes_shared_ones(tmp_path: Path) -> None:
    spans = _hold_together(tmp_path / "l.lock", tmp_path / "go", ["shared", "shared", "exclusive"])
    assert [pair for pair in _overlapping(spans) if "exclusive" in (pair[0][2], pair[1][2])] == []


def test_a_folder_is_locked_itself_and_stays_clean(tmp_path: Path) -> None:
    folder = tmp_path / "budgets"
    folder.mkdir()
    spans = _hold_together(folder, tmp_path / "go", ["exclusive", "exclusive"])
    assert _overlapping(spans) == [] and list(folder.iterdir()) == []
    with lock(folder):  # free again once both have left
        pass
