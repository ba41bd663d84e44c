"""A side joins the turn-taking at its first test, after its set-up: the two sides' set-ups overlap, their
measurements never do, and a side whose other side never joins stops waiting with the reason."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from ab_support import HERE, client_env

from perfbudget.ab.coordinator import Coordinator
from perfbudget.measure import turns
from perfbudget.settings import SPEC_ENV, RunSpec


def _start(sock: Path, side: str, mode: str, log: Path, n: int, setup_s: float, **spec: object) -> subprocess.Popen[bytes]:
    path = log.with_suffix(".spec.json")
    path.write_text(RunSpec(side=side, socket=str(sock), **spec).to_json())  # type: ignore[arg-type]
    return subprocess.Popen([sys.executable, str(HERE / "turn_client.py"), mode, str(log), str(n), str(setup_s)],
                            env=client_env(**{SPEC_ENV: str(path)}), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _finish(proc: subprocess.Popen[bytes]) -> None:
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out.decode()


def test_the_sides_set_up_at_once_and_measure_one_at_a_time_once_both_have_joined(sock: Path, tmp_path: Path) -> None:
    logs = {s: tmp_path / f"{s}.json" for s in turns.SIDES}
    setup_s = {"base": 2.0, "head": 3.0}  # the base, first, is ready first and waits for the head
    with Coordinator(sock, first="base") as coordinator:
        procs = {s: _start(sock, s, "bursts", logs[s], 4, setup_s[s], burst_ms=10) for s in turns.SIDES}
        for s, p in procs.items():
            _finish(p)
            coordinator.side_exited(s)
        log = coordinator.log()
    got = {s: json.loads(logs[s].read_text()) for s in turns.SIDES}
    (b0, b1), (h0, h1) = got["base"]["setup"], got["head"]["setup"]
    assert max(b0, h0) < min(b1, h1)  # the set-ups ran at the same time
    bursts = sorted((t0, t1, s) for s in turns.SIDES for t0, t1 in got[s]["intervals"])
    assert len(bursts) == 8 and bursts[0][0] >= h1 and bursts[0][2] == "base"  # nothing before both joined
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(bursts))  # never both measuring
    assert log.turns[0].start_s >= h1 and got["base"]["warnings"] == got["head"]["warnings"] == []


def test_a_side_whose_other_side_never_joins_stops_waiting_and_says_why(sock: Path, tmp_path: Path) -> None:
    report = tmp_path / "head.turns"
    with Coordinator(sock, first="base") as coordinator:
        _finish(_start(sock, "head", "wait", tmp_path / "head.json", 0, 0.0, wait_s=1, report=str(report)))
        log = coordinator.log()
    (warning,) = json.loads((tmp_path / "head.json").read_text())["warnings"]
    assert "waited 1 s for the first turn (the run spec's wait_s): the other side never joined" in warning
    assert "the other side never joined" in report.read_text()  # the driver marks the pair invalid
    assert log.joined == ("head",) and log.turns == ()


def test_the_plugin_joins_at_a_sides_first_test_call_after_its_set_up(pytester: pytest.Pytester,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    built = pytester.path / "built"
    joins: list[bool] = []  # per join: had the session fixture been set up?
    monkeypatch.setattr(turns, "join", lambda: joins.append(built.exists()))
    pytester.makepyfile(test_side=f"""
        import pathlib, pytest

        @pytest.fixture(scope="session")
        def workload():
            pathlib.Path({str(built)!r}).touch()

        def test_one(perf, workload):
            perf.record("flops", 1)

        def test_two(perf, workload):
            perf.record("flops", 1)
        """)
    pytester.runpytest_inprocess("--perf-collect", "--perf-json", "side.json", "-p", "no:cacheprovider") \
        .assert_outcomes(passed=2)
    assert joins == [True, True]  # not at configure: the start, collection and set-up overlap the other side's
    pytester.runpytest_inprocess("-p", "no:cacheprovider", "--perf-json", "plain.json")
    assert joins == [True, True]  # a run that is no A/B side takes no turns
