"""Main-branch history: kept runs, change points, the A/B chain, trends, the page; never imports pytest."""

from .analysis import (
    Finding,
    SeriesAnalysis,
    analyze,
    analyze_store,
    chain_gaps_since,
    findings_since,
    machine_trends,
)
from .chain import Cumulative, Gap, Link, chain_of, cumulative, cumulative_series, pooled
from .changepoints import ChangeConfig, Drift, Shift, chained_drifts, level_shifts
from .commits import CommitError, git_commit_info, git_rev, run_of
from .page import render_history
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
from .trend import Trend, level_trend

__all__ = [
    "SCHEMA_VERSION",
    "ChangeConfig",
    "Check",
    "CommitError",
    "Cumulative",
    "Drift",
    "Finding",
    "Gap",
    "HistoryError",
    "HistoryStore",
    "Link",
    "Mode",
    "Point",
    "Run",
    "SeriesAnalysis",
    "Shift",
    "Trend",
    "analyze",
    "analyze_store",
    "by_machine",
    "chain_gaps_since",
    "chain_of",
    "chained_drifts",
    "checks_from_results",
    "cumulative",
    "cumulative_series",
    "findings_since",
    "git_commit_info",
    "git_rev",
    "level_shifts",
    "level_trend",
    "machine_trends",
    "mode_of",
    "pooled",
    "render_history",
    "run_of",
]
