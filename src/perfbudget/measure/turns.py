"""Turn-taking with the other side of a lockstep A/B run (interface; the coordinator lives in ``perfbudget.ab``)."""

from __future__ import annotations

import os

__all__ = ["active", "burst_ms", "join", "leave", "pass_turn"]


def active() -> bool:
    """Whether this process takes turns with another one (``PERFBUDGET_TURNS`` is set)."""
    return bool(os.environ.get("PERFBUDGET_TURNS"))


def burst_ms() -> float:
    """Target length of one burst, in ms (``PERFBUDGET_TURNS_BURST_MS``, default 400)."""
    return float(os.environ.get("PERFBUDGET_TURNS_BURST_MS", "400"))


def join() -> None:
    """Wait for the first turn (no-op when not taking turns)."""


def pass_turn() -> None:
    """Hand the machine to the other side and wait until it is handed back."""


def leave() -> None:
    """Stop taking turns."""
