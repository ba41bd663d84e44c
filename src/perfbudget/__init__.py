"""perfbudget: performance budgets for PyTorch models, checked by pytest on every pull request."""

from typing import TYPE_CHECKING, Any

from .budgets import (
    Budget,
    BudgetError,
    BudgetSet,
    Measured,
    UpdateReport,
    accept_results,
    apply_updates,
    load_dir,
)
from .device import DeviceInfo
from .measure.machine import describe
from .metrics import METRICS, Metric, parse_name
from .recorder import PerfRecorder
from .results import BaseSide, BudgetRef, Record, Results, load_results, merge_results
from .verdict.judge import (
    ABSide,
    Decision,
    Judge,
    JudgeConfig,
    Judging,
    Stored,
    Update,
    Verdict,
    VerdictPolicy,
    decide,
)
from .vocabulary import OUTCOMES, Outcome, TestOutcome

if TYPE_CHECKING:
    from .benchmark import BenchmarkFixture

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # The pytest-benchmark fixture imports pytest: loaded when asked for, so that the instrument (measure,
    # budgets, the judge) imports without pytest, in a notebook or a script.
    if name == "BenchmarkFixture":
        from .benchmark import BenchmarkFixture

        return BenchmarkFixture
    raise AttributeError(f"module 'perfbudget' has no attribute {name!r}")


__all__ = [
    "METRICS",
    "OUTCOMES",
    "ABSide",
    "BaseSide",
    "BenchmarkFixture",
    "Budget",
    "BudgetError",
    "BudgetRef",
    "BudgetSet",
    "Decision",
    "DeviceInfo",
    "Judge",
    "JudgeConfig",
    "Judging",
    "Measured",
    "Metric",
    "Outcome",
    "PerfRecorder",
    "Record",
    "Results",
    "Stored",
    "TestOutcome",
    "Update",
    "UpdateReport",
    "Verdict",
    "VerdictPolicy",
    "__version__",
    "accept_results",
    "apply_updates",
    "decide",
    "describe",
    "load_dir",
    "load_results",
    "merge_results",
    "parse_name",
]
