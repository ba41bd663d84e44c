"""``--max-minutes`` in the middle of a pair: what each side finished is kept, used and said (constructed pairs)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from perfbudget.ab.coordinator import Coordinator, TurnLog
from perfbudget.ab.merge import compare_pairs
from perfbudget.ab.pairs import PairRun, SideRun
from perfbudget.ab.ratios import ABPolicy
from perfbudget.ab.run import ABConfig, StopReason, _Plan
from perfbudget.budgets.loader import BudgetSet
from perfbudget.device import DeviceInfo
from perfbudget.results import Record, Results

CPU = DeviceInfo(type="cpu", model="fake cpu", count=1, threads=1, cpuid="6/1/1", isa_class="avx2")
STEP = ("t.py::test_step", "step", "step_ms")
OPS = ("t.py::test_ops", "ops", "op_self_ms[aten::mm]")


def record(check: tuple[str, str, str], scale: float = 1.0) -> Record:
    nodeid, key, metric = check
    xs = tuple(scale * x for x in (1.0, 1.02, 0.98, 1.01, 0.99))
    return Record(nodeid=nodeid, key=key, metric=metric, outcome="unbudgeted", value=1.0, samples=xs, n=len(xs),  # type: ignore[arg-type]
                  unit="ms", kind="timing", direction="lower", device=CPU)


def side(tmp: Path, name: str, checks: list[tuple[str, str, str]] | None, returncode: int | None) -> SideRun:
    path = tmp / f"{name}.json"
    if checks is not None:
        Results(records=[record(c) for c in checks]).write(path)
    return SideRun(side=name, results=path, log=tmp / f"{name}.log", returncode=returncode, wall_s=60.0)


def pair(tmp: Path, *, base: SideRun, head: SideRun) -> PairRun:
    return PairRun(index=1, first="base", sides={"base": base, "head": head}, wall_s=151.0, timed_out=True,
                   turns=TurnLog(turns=(), joined=("base", "head"), left=("head",)))


def plan(tmp: Path) -> _Plan:
    return _Plan(config=ABConfig(root=tmp, base="HEAD", max_minutes=2.6), budgets_dir=tmp / "budgets",
                 deadline=time.monotonic(), policy=ABPolicy(), operators_file=tmp / "operators.json", say=lambda _: None)


def test_a_time_limit_mid_pair_keeps_the_finished_sides_results(tmp_path: Path) -> None:
    # The H200 case: the head finished both tests, the base was stopped inside the second one.
    p = plan(tmp_path)
    p.took(pair(tmp_path, head=side(tmp_path, "head", [STEP, OPS], 0), base=side(tmp_path, "base", [STEP], None)))
    assert p.stopped == StopReason.TIME and not p.head_failed
    (kept,) = p.records
    assert kept.head is not None and kept.base is not None and kept.stopped == ("base",)
    assert [r.metric for r in kept.base.records] == ["step_ms"]  # the base's finished test is kept
    assert any("the base was stopped at --max-minutes 2.6 before it recorded 1 check(s)" in x
               and "t.py::test_ops ops.op_self_ms[aten::mm]" in x for x in p.problems), p.problems
    comparison = compare_pairs(p.records, budgets=BudgetSet(root=tmp_path), final=True, require_base=True)
    step, ops = comparison.records
    assert step.vs_base is not None and step.vs_base.pairs == 1  # compared on what both sides finished
    assert ops.base is not None and not ops.base.compared and ops.outcome != "error"
    assert "the base was stopped at the time limit (--max-minutes) before it recorded it" in ops.reason
    assert comparison.not_compared == (OPS,)


def test_a_base_stopped_before_writing_anything_is_a_time_stop_not_a_missing_base(tmp_path: Path) -> None:
    p = plan(tmp_path)
    p.took(pair(tmp_path, head=side(tmp_path, "head", [STEP], 0), base=side(tmp_path, "base", None, None)))
    assert p.stopped == StopReason.TIME
    assert any("base: pytest was stopped at the time limit (--max-minutes) and wrote no results" in x
               for x in p.problems), p.problems
    (step,) = compare_pairs(p.records, budgets=BudgetSet(root=tmp_path), final=True, require_base=True).records
    assert step.outcome != "error" and "stopped at the time limit" in step.reason


def test_checks_a_stopped_head_did_not_reach_are_named_not_listed_as_the_bases_own(tmp_path: Path) -> None:
    p = plan(tmp_path)
    p.took(pair(tmp_path, head=side(tmp_path, "head", [STEP], None), base=side(tmp_path, "base", [STEP, OPS], 0)))
    assert p.stopped == StopReason.TIME and not p.head_failed
    assert any("the head was stopped at --max-minutes 2.6 before it recorded 1 check(s)" in x for x in p.problems)
    comparison = compare_pairs(p.records, budgets=BudgetSet(root=tmp_path), final=True)
    assert comparison.base_only == () and [r.metric for r in comparison.records] == ["step_ms"]


def _wait(until: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not until():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_halted_coordinator_grants_no_turn_and_names_the_sides_left_waiting(sock: Path) -> None:
    with Coordinator(sock, first="base") as coordinator:
        clients = {}
        for name in ("base", "head"):
            clients[name] = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            clients[name].connect(str(sock))
            clients[name].sendall(f"JOIN {name} 1\n".encode())
        assert clients["base"].recv(16) == b"GO\n"
        _wait(lambda: coordinator.running == "base")
        coordinator.halt()
        assert "base" not in coordinator.parked()  # the holder runs on until it passes (head may wait already)
        clients["base"].sendall(b"PASS\n")
        _wait(lambda: coordinator.parked() == {"base", "head"})
        assert coordinator.running is None
        clients["head"].settimeout(0.2)
        try:
            got = clients["head"].recv(16)
        except TimeoutError:
            got = b""
        assert got == b""  # no GO after the halt
        for c in clients.values():
            c.close()


def test_sides_that_ignore_their_stop_are_killed_within_one_grace_for_all_with_what_they_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopping a pair takes one kill grace for all its sides (STOP_S counts one), and a child a side left
    behind (a server, a DataLoader worker) dies with it, though the side itself had exited."""
    import subprocess
    import sys

    from perfbudget.ab import pairs as pairs_mod

    monkeypatch.setattr(pairs_mod, "_KILL_GRACE_S", 1.0)
    monkeypatch.setattr(pairs_mod, "_KILLED_S", 1.0)
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    marker = tmp_path / "child.pid"
    leaver = (f"import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              f"open({str(marker)!r}, 'w').write(str(p.pid))")
    procs = [subprocess.Popen([sys.executable, "-c", code], start_new_session=True) for code in (stubborn, stubborn)]
    left = subprocess.Popen([sys.executable, "-c", leaver], start_new_session=True)
    left.wait(timeout=30)
    child = int(marker.read_text())
    time.sleep(0.5)  # the stubborn sides have set their handlers
    t0 = time.monotonic()
    pairs_mod._stop_all([*procs, left])
    took = time.monotonic() - t0
    assert all(p.poll() is not None for p in procs) and took < 2 * 1.0 + 1.0, took  # not one grace per side
    stat = Path(f"/proc/{child}/stat")
    _wait(lambda: not stat.exists() or stat.read_text().split()[2] == "Z")


def test_a_head_stopped_in_the_first_pair_fails_the_run_for_the_tests_nobody_measured(tmp_path: Path) -> None:
    from perfbudget.ab.run import _selection_cut

    cut = pair(tmp_path, head=side(tmp_path, "head", [STEP], None), base=side(tmp_path, "base", [STEP], 0))
    assert "pair 1's head was stopped at --max-minutes 2.6 before it ran every selected test" in \
        _selection_cut([cut], 2.6)
    finished = pair(tmp_path, head=side(tmp_path, "head", [STEP, OPS], 0), base=side(tmp_path, "base", [STEP], None))
    assert _selection_cut([finished], 2.6) == ""  # the base's unreached checks are said as not compared
