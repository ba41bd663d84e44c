"""Each A/B side process draws its own memory placement: pages taken and touched before set-up."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from perfbudget.measure import placement
from perfbudget.settings import SPEC_ENV, RunSpec


def resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_a_shift_takes_and_keeps_the_pages_it_drew() -> None:
    draws = [random.Random(seed).randrange(0, 8 * (1 << 20) // placement.PAGE + 1) for seed in (1, 2)]
    assert draws[0] != draws[1]  # the draw is random, not a fixed offset
    before = resident_bytes()
    pages = placement.shift(max_mib=8, rng=random.Random(1))
    assert pages == draws[0]
    assert resident_bytes() - before >= 0.9 * pages * placement.PAGE  # touched: physically backed, and held
    assert all(0 <= placement.shift(max_mib=1) <= (1 << 20) // placement.PAGE for _ in range(5))


def test_an_ab_side_draws_its_placement_when_it_starts(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    calls: list[int] = []
    monkeypatch.setattr(placement, "shift", lambda **kw: calls.append(1) or 0)
    pytester.makepyfile("def test_nothing_timed():\n    pass\n")
    pytester.runpytest_inprocess("-p", "no:randomly").assert_outcomes(passed=1)
    assert calls == []  # outside an A/B run: nothing taken
    spec = tmp_path / "head.spec.json"
    spec.write_text(RunSpec(side="head", socket=str(tmp_path / "coordinator.sock")).to_json())
    monkeypatch.setenv(SPEC_ENV, str(spec))
    pytester.runpytest_inprocess("-p", "no:randomly").assert_outcomes(passed=1)
    assert calls == [1]
