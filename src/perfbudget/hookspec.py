"""Hooks perfbudget calls so that a user's conftest can add measurements and receive the results.

Implement them in a ``conftest.py`` (or a plugin) under these names; pytest matches the
arguments by name, so an implementation may take any subset of them::

    def pytest_perfbudget_measured(item, perf):
        perf.record("latency_ms[tokenize]", my_timer(item), more=lambda: my_timer(item))

    def pytest_perfbudget_results(results, path):
        post_to_dashboard(path.read_bytes())
"""

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
    """A test that uses ``perf`` has run its body; its verdicts are not yet a decision.

    Called on the process that ran the test (an xdist worker under ``-n``), through the
    item's conftests (``item.ihook``: a ``conftest.py`` applies to the tests below it), and
    only when the body returned: a test that raised, skipped or failed keeps what it
    measured, and the hook is not called for it.

    What an implementation can do, before the test's outcome and records are made:

    - add a metric measured its own way: ``perf.record(metric, samples, more=..., extra=...)``
      judges it against the budgets of the test's key and device like the test's own
      measurements (stale, unbudgeted, ``--update-budgets`` and ``--perf-strict`` included),
      and its verdict takes part in the test's outcome; ``perf.unmeasurable(metric, reason)``
      notes one that cannot be measured here;
    - change what the test recorded: ``perf.verdicts`` is the list the records and the
      outcome are made from, in order (replace an entry with ``v.with_(attribution=...)``
      to explain a failure, or remove one); ``perf.extras[metric]`` is the JSON data kept
      with a metric's record.

    ``perf.key``, ``perf.device`` and ``perf.budgeted()`` say what is being judged. An
    exception raised here fails the test with its traceback, as one raised by the test would.

    Args:
        item: the test.
        perf: the test's :class:`~perfbudget.PerfRecorder` (the ``perf`` fixture's value).
    """


@pytest.hookspec
def pytest_perfbudget_results(config: pytest.Config, results: Results, path: Path) -> None:
    """The run's results, written to ``path`` (``--perf-json``; Markdown and HTML reports beside it).

    Called once per run, at the end of the session, on the controller (never on an xdist
    worker: ``results`` holds every worker's records), after the results file and the reports
    were written and after ``--update-budgets`` applied its changes. Not called when no test
    used ``perf``. Use it to post the results somewhere, or to check them as a whole.

    Implement it in the rootdir's ``conftest.py`` or a plugin: under xdist the controller
    collects no tests, so it loads only the conftests of the rootdir and of the paths named
    on the command line, not those further down.

    Args:
        config: the pytest config.
        results: every record of the run (``results.records``), including the budgets
            that applied but that no test recorded, and ``results.meta``, the run's
            :class:`~perfbudget.results.RunInfo` (typed since results schema 3: ``results.meta.mode``,
            ``results.meta.ab``; ``results.as_dict()["meta"]`` is the JSON form).
        path: the results JSON file.
    """
