"""Budgets: typed schema, validated loading, verdicts and the ratchet updater."""

from .loader import BudgetSet, load_dir, load_file, parse_text
from .schema import Budget, BudgetError, BudgetFile, Provenance
from .update import Change, Measured, UpdateReport, accept_results, apply_updates
from .verdict import OUTCOMES, Outcome, Verdict, VerdictPolicy, decide

__all__ = [
    "OUTCOMES",
    "Budget",
    "BudgetError",
    "BudgetFile",
    "BudgetSet",
    "Change",
    "Measured",
    "Outcome",
    "Provenance",
    "UpdateReport",
    "Verdict",
    "VerdictPolicy",
    "accept_results",
    "apply_updates",
    "decide",
    "load_dir",
    "load_file",
    "parse_text",
]
