"""The exit statuses of the ``perfbudget`` commands (``report``, ``diff``, ``merge``, ``show``, ``update``, ``ab``)."""

from __future__ import annotations

import enum

__all__ = ["ExitCode"]


class ExitCode(enum.IntEnum):
    """What a ``perfbudget`` command's exit status says; each command's ``--help`` lists what sets it."""

    OK = 0
    """Nothing the command checks failed."""
    FAILED = 1
    """What the command checks failed (regressions, values the ratchet refused, a failing A/B check)."""
    USAGE = 2
    """Usage or input error: bad arguments, unreadable or invalid results or budget files."""
