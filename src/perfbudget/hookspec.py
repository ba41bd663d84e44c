"""Hooks a user's conftest implements to add measurements and receive the results (``docs/hooks.md``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .recorder import PerfRecorder
    from .results import Results

__all__ = ["pytest_perfbudget_measured", "pytest_perfbudget_results"]


@pytest.hookspec
def pytest_perfbudget_measured(item: pytest.Item, perf: PerfRecorder) -> None:
    """A test that uses ``perf`` has returned from its body; its verdicts are not yet a decision.

    Called on the process that ran the test, through the item's conftests, and not for a test that
    raised, skipped or failed. An implementation can add a metric (``perf.record(metric, samples,
    more=..., extra=...)``, judged like the test's own, or ``perf.unmeasurable(metric, reason)``) and
    change what was recorded: ``perf.verdicts``, the list the records and outcome are made from
    (replace an entry with ``v.with_(attribution=...)``, or remove one), and ``perf.extras[metric]``.
    An exception raised here fails the test.

    Args:
        item: the test.
        perf: the test's :class:`~perfbudget.PerfRecorder` (the ``perf`` fixture's value).
    """


@pytest.hookspec
def pytest_perfbudget_results(config: pytest.Config, results: Results, path: Path) -> None:
    """The run's results, written to ``path`` (``--perf-json``; Markdown and HTML reports beside it).

    Called once per run, on the controller, after the results, the reports and any budget update
    were written; not when no test used ``perf``. Under xdist the controller loads only the
    rootdir's conftest and those of the paths named on the command line.

    Args:
        config: the pytest config.
        results: every record of the run (``results.records``), budgets no test recorded
            included, and ``results.meta``, the run's :class:`~perfbudget.results.RunInfo`.
        path: the results JSON file.
    """
