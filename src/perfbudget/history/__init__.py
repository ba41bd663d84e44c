"""Main-branch history: every merge's results kept in one SQLite file (``history.store``), change
points on each check's series (``history.changepoints``), the cumulative head/parent ratio chained
along first parents (``history.chain``), a self-contained HTML page (``history.report``) and the
``perfbudget history`` command (``history.cli``). Never imports pytest."""

from .commits import CommitError, git_commit_info, git_rev, run_of
from .store import (
    SCHEMA_VERSION,
    Check,
    HistoryError,
    HistoryStore,
    Mode,
    Point,
    Run,
    by_machine,
    checks_from_results,
    mode_of,
)

__all__ = [
    "SCHEMA_VERSION",
    "Check",
    "CommitError",
    "HistoryError",
    "HistoryStore",
    "Mode",
    "Point",
    "Run",
    "by_machine",
    "checks_from_results",
    "git_commit_info",
    "git_rev",
    "mode_of",
    "run_of",
]
