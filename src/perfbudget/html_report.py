"""Moved to :mod:`perfbudget.report.html`; kept so ``from perfbudget.html_report import write_html`` still works."""

from .report.html import render_html, write_html

__all__ = ["render_html", "write_html"]
