"""perfbudget: performance budgets for PyTorch models, checked by pytest on every pull request."""

from .benchmark import BenchmarkFixture
from .budgets import (
    Budget,
    BudgetError,
    BudgetSet,
    Measured,
    UpdateReport,
    Verdict,
    VerdictPolicy,
    accept_results,
    apply_updates,
    decide,
    load_dir,
)
from .device import DeviceInfo
from .judge import Decision, Judge, JudgeConfig
from .judging import ABSide, Judging, Stored, Update
from .measure.machine import describe
from .metrics import METRICS, Metric, parse_name
from .recorder import PerfRecorder
from .results import BaseSide, BudgetRef, Record, Results, load_results, merge_results
from .vocabulary import OUTCOMES, Outcome, TestOutcome

__version__ = "0.1.0"

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
