"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest

from perfbudget.measure import turns
from perfbudget.measure.machine import describe
from perfbudget.settings import STABLE_MACHINE_ENV


@pytest.fixture
def stable_machine(monkeypatch: pytest.MonkeyPatch) -> str:
    """Declare this machine stable (stored timing budgets keyed by its identity gate); its identity."""
    identity = describe("cpu").identity
    assert identity, "this machine's CPU identity is unknown"
    monkeypatch.setenv(STABLE_MACHINE_ENV, identity)
    return identity


@pytest.fixture(autouse=True)
def _turn_taking_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test leaves this process's turn-taking as it found it.

    Turn-taking is per process: once a process leaves or stops (``turns.leave()``, a failed join of an
    in-process pytester run as an A/B side) it never takes turns again, so a test that leaves would
    turn every later test's A/B side in this process into a no-op.
    """
    monkeypatch.setattr(turns, "_stopped", turns._stopped)
    monkeypatch.setattr(turns, "_client", turns._client)
