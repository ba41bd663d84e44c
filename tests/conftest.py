"""Fixtures shared by the unit tests, and the guard of the fast tier."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import NoReturn

import pytest

from perfbudget.ab import pairs as ab_pairs
from perfbudget.ab import run as ab_run
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


@pytest.fixture(autouse=True)
def _temporary_folders_restored() -> Iterator[None]:
    """Each test leaves TMPDIR and inductor's cache where it found them.

    An in-process session with a ``compiles`` test moves both under its own rootdir
    (``compile_health.inductor_dirs``); left there, every later test's temporary folders would be
    under that test's tmp_path: too long a path for a Unix socket, gone when pytest prunes it.
    """
    names = ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR")
    saved, tempdir = {name: os.environ.get(name) for name in names}, tempfile.tempdir
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    tempfile.tempdir = tempdir


@pytest.fixture(autouse=True)
def _ab_sides_only_in_the_integration_tier(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test not marked ``integration`` that starts an A/B pair fails.

    A pair starts two side processes that time for real and take turns: seconds each, and what
    they measure is the machine's. The fast tier (``scripts/test.sh``) tests the driver's decisions
    on recorded or constructed samples; real pairs run in ``scripts/test.sh --integration``.
    """
    if request.node.get_closest_marker("integration") is not None:
        return

    def refused(*args: object, **kwargs: object) -> NoReturn:
        pytest.fail(f"{request.node.nodeid} starts an A/B side process: mark it @pytest.mark.integration, "
                    "or test the decision on recorded samples", pytrace=False)

    for module in (ab_pairs, ab_run):
        monkeypatch.setattr(module, "run_pair", refused)
