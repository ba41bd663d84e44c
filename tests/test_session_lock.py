"""The run-wide timing lock: held by timing sessions, never by a callgrind session beside them."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from perfbudget import session as session_module
from perfbudget.session import PerfSession
from perfbudget.settings import Settings
from perfbudget.verdict.judge import Stored


def make(tmp_path: Path) -> PerfSession:
    return PerfSession(rootdir=tmp_path, settings=Settings(budgets_dir=tmp_path / "budgets"),
                       judging=Stored(), allow_loosen=False, json_path=tmp_path / "results.json", is_worker=False)


def free(path: Path) -> bool:
    """Whether another holder could take ``path`` exclusively right now."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing releases a lock taken here
    return True


@pytest.mark.parametrize("valgrind", [False, True])
def test_a_callgrind_session_does_not_hold_the_timing_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           valgrind: bool) -> None:
    monkeypatch.setattr(session_module, "running_under_valgrind", lambda: valgrind)
    lock_file = tmp_path / ".perfbudget" / "timing.lock"
    with make(tmp_path).exclusive():
        assert free(lock_file) is valgrind
    assert free(lock_file)
