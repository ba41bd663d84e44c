"""Budgets: typed schema, validated loading and the ratchet updater."""

from .loader import BudgetSet, load_dir, load_file, parse_text
from .schema import Budget, BudgetError, BudgetFile, Provenance
from .update import Change, Measured, UpdateReport, accept_results, apply_updates

__all__ = [
    "Budget",
    "BudgetError",
    "BudgetFile",
    "BudgetSet",
    "Change",
    "Measured",
    "Provenance",
    "UpdateReport",
    "accept_results",
    "apply_updates",
    "load_dir",
    "load_file",
    "parse_text",
]
