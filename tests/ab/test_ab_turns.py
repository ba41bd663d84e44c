"""Turn-taking through the real coordinator and real client processes: one side runs at a time."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ab_support import HERE, client_env

from perfbudget.ab.coordinator import Coordinator
from perfbudget.measure import turns
from perfbudget.settings import SPEC_ENV, RunSpec

CLIENT = HERE / "turn_client.py"


def _start(sock: Path, side: str, mode: str, log: Path, n: int = 0, **spec: object) -> subprocess.Popen[bytes]:
    """A client process told its side, the socket and ``spec`` in a run spec beside ``log``."""
    path = log.with_suffix(".spec.json")
    path.write_text(RunSpec(side=side, socket=str(sock), **spec).to_json())  # type: ignore[arg-type]
    return subprocess.Popen(
        [sys.executable, str(CLIENT), mode, str(log), str(n)],
        env=client_env(**{SPEC_ENV: str(path)}), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )


def _until_joined(coordinator: Coordinator, side: str, timeout_s: float = 60) -> None:
    """Wait (not sleep a guess) until ``side`` has joined: a loaded machine starts Python slowly."""
    deadline = time.monotonic() + timeout_s
    while side not in coordinator.log().joined:
        assert time.monotonic() < deadline, f"{side} never joined"
        time.sleep(0.02)


def _finish(proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    out, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, out.decode()


def test_the_coordinator_alternates_and_the_sides_never_run_at_once(sock: Path, tmp_path: Path) -> None:
    logs = {s: tmp_path / f"{s}.json" for s in turns.SIDES}
    with Coordinator(sock, first="head") as coordinator:
        procs = {s: _start(sock, s, "bursts", logs[s], 8, burst_ms=15) for s in turns.SIDES}
        for s, p in procs.items():
            _finish(p)
            coordinator.side_exited(s)
        log = coordinator.log()
    got = {s: json.loads(logs[s].read_text()) for s in turns.SIDES}
    for s in turns.SIDES:
        assert len(got[s]["intervals"]) == 8 and got[s]["warnings"] == [] and got[s]["active_after"] is False
    # Never both running: no base burst overlaps a head burst (time.monotonic is system-wide).
    for b0, b1 in got["base"]["intervals"]:
        for h0, h1 in got["head"]["intervals"]:
            assert b1 <= h0 or h1 <= b0, ((b0, b1), (h0, h1))
    # Strict alternation: the bursts in time order go head, base, head, base, ...
    timeline = sorted((t0, s) for s in turns.SIDES for t0, _ in got[s]["intervals"])
    assert [s for _, s in timeline] == ["head", "base"] * 8
    # The coordinator's own log: grants alternate and never overlap either.
    assert [t.side for t in log.turns[:4]] == ["head", "base", "head", "base"]
    assert all(a.end_s <= b.start_s for a, b in zip(log.turns, log.turns[1:], strict=False))
    assert log.grants("base") >= 8 and log.grants("head") >= 8
    assert set(log.joined) == {"base", "head"} and set(log.left) == {"base", "head"}


def test_a_side_that_dies_holding_the_machine_leaves_and_the_other_runs_alone(sock: Path, tmp_path: Path) -> None:
    with Coordinator(sock, first="base") as coordinator:
        dying = _start(sock, "base", "die-holding", tmp_path / "base.json")
        other = _start(sock, "head", "bursts", tmp_path / "head.json", 5, burst_ms=5,
                       report=str(tmp_path / "head.turns"))
        dying.wait(timeout=60)
        assert dying.returncode == 3
        _finish(other)
        log = coordinator.log()
    head = json.loads((tmp_path / "head.json").read_text())
    assert len(head["intervals"]) == 5 and head["warnings"] == []  # SOLO is the normal end, no warning
    assert not (tmp_path / "head.turns").exists() and log.problems == ()  # and nothing reported
    assert log.left[0] == "base" and log.solo_s.get("head", 0) > 0


def test_a_side_that_never_starts_is_reported_by_the_parent_and_the_other_runs_alone(
        sock: Path, tmp_path: Path) -> None:
    with Coordinator(sock, first="base") as coordinator:
        head = _start(sock, "head", "bursts", tmp_path / "head.json", 3, burst_ms=5)
        _until_joined(coordinator, "head")
        time.sleep(0.2)
        assert head.poll() is None and coordinator.log().turns == ()  # waits for the base to join before the first grant
        coordinator.side_exited("base")  # the base crashed before joining
        _finish(head)
    assert len(json.loads((tmp_path / "head.json").read_text())["intervals"]) == 3


def test_coordinator_gone_means_a_warning_and_no_hang(sock: Path, tmp_path: Path) -> None:
    # Nobody listens on the socket: the client warns and measures on without turns.
    _finish(_start(sock, "base", "bursts", tmp_path / "none.json", 2, burst_ms=5))
    got = json.loads((tmp_path / "none.json").read_text())
    assert len(got["intervals"]) == 2 and "cannot reach the coordinator" in got["warnings"][0]
    # The coordinator closes while the client waits for a side that never comes.
    coordinator = Coordinator(sock, first="base").start()
    report = tmp_path / "base.turns"
    waiting = _start(sock, "base", "wait", tmp_path / "gone.json", 0, report=str(report))
    _until_joined(coordinator, "base")
    assert waiting.poll() is None
    coordinator.close()
    _finish(waiting)
    assert "closed the connection" in json.loads((tmp_path / "gone.json").read_text())["warnings"][0]
    # ... and says so to the A/B driver: one line per loss, "<pid> <problem>".
    (line,) = report.read_text().splitlines()
    pid, _, problem = line.partition(" ")
    assert pid == str(waiting.pid) and problem == "the coordinator closed the connection"


def test_a_second_process_for_one_side_is_refused(sock: Path, tmp_path: Path) -> None:
    with Coordinator(sock, first="base") as coordinator:
        first = _start(sock, "base", "wait", tmp_path / "a.json")
        _until_joined(coordinator, "base")
        second = _start(sock, "base", "wait", tmp_path / "b.json")
        _finish(second)
        coordinator.side_exited("head")
        _finish(first)
        log = coordinator.log()
    assert "has joined already" in json.loads((tmp_path / "b.json").read_text())["warnings"][0]
    # The coordinator keeps the refusal too: the pair lost turn-taking for that process.
    (problem,) = log.problems
    assert problem.startswith("refused a process: side 'base' has joined already")
    assert log.as_dict()["problems"] == [problem]


def test_outside_an_ab_run_everything_is_a_no_op(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(SPEC_ENV, raising=False)
    assert turns.active() is False and turns.burst_ms() == turns.DEFAULT_BURST_MS == 100.0
    turns.join()
    turns.pass_turn()
    turns.leave()
    # A side that does not take turns (instruction counts): a spec without a socket.
    spec = tmp_path / "base.spec.json"
    spec.write_text(RunSpec(side="base", burst_ms=25).to_json())
    monkeypatch.setenv(SPEC_ENV, str(spec))
    monkeypatch.setattr(turns, "_stopped", False)
    assert turns.active() is False and turns.burst_ms() == 25.0


def test_a_bad_side_name_is_refused_loudly(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text('{"side": "left", "socket": "/nowhere"}')
    proc = subprocess.run(
        [sys.executable, "-c", "from perfbudget.measure import turns; turns.join()"],
        env=client_env(**{SPEC_ENV: str(spec)}), capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode != 0
    assert f"{SPEC_ENV}={spec} (the run spec of `perfbudget ab`): side: expected one of ('base', 'head'), " \
           "got 'left'" in proc.stderr


def test_first_must_be_a_side(sock: Path) -> None:
    with pytest.raises(ValueError, match="first: expected one of"):
        Coordinator(sock, first="middle")
