"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest

from perfbudget.judge import STABLE_MACHINE_ENV
from perfbudget.measure.machine import describe


@pytest.fixture
def stable_machine(monkeypatch: pytest.MonkeyPatch) -> str:
    """Declare this machine stable (stored timing budgets keyed by its identity gate); its identity."""
    identity = describe("cpu").identity
    assert identity, "this machine's CPU identity is unknown"
    monkeypatch.setenv(STABLE_MACHINE_ENV, identity)
    return identity
