"""``StrEnum`` on every supported Python: members are their string values (in comparisons,
``str()``, f-strings and JSON), so a typed vocabulary reads and writes as plain text."""

from __future__ import annotations

import enum
import sys

__all__ = ["StrEnum"]

if sys.version_info >= (3, 11):
    StrEnum = enum.StrEnum
else:  # pragma: no cover - exercised on Python 3.10 only

    class StrEnum(str, enum.Enum):
        """A ``str`` whose ``str()`` and format are its value, as ``enum.StrEnum`` in 3.11."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return str(self.value).__format__(spec)
