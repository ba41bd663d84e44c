"""Bucket boundaries saved to and loaded from a versioned JSON file, validated on load."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchlevers.bucketing.buckets import Buckets, _check_boundaries

__all__ = ["BUCKET_FILE_FORMAT", "BUCKET_FILE_VERSION", "BucketFileError", "load_buckets", "save_buckets"]

BUCKET_FILE_FORMAT = "perfbudget.buckets"
"""Format tag every bucket file carries (the name predates the library's own; files in use have it)."""
BUCKET_FILE_VERSION = 1
"""Version of the file layout this module writes and reads."""


class BucketFileError(ValueError):
    """A bucket JSON file is unreadable or invalid; the message names file, key and value."""


def save_buckets(buckets: Buckets, path: str | os.PathLike[str], *, meta: Mapping[str, Any] | None = None) -> None:
    """Write buckets to a versioned JSON file, atomically (write then rename).

    Args:
        buckets: the boundaries to save.
        path: destination file.
        meta: optional JSON-serialisable provenance (sample size, padding rate, date...).
    """
    doc: dict[str, Any] = {
        "format": BUCKET_FILE_FORMAT,
        "version": BUCKET_FILE_VERSION,
        "boundaries": [int(b) for b in buckets.boundaries],
    }
    if meta is not None:
        doc["meta"] = dict(meta)
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_buckets(path: str | os.PathLike[str]) -> Buckets:
    """Read and validate a bucket file written by :func:`save_buckets`.

    Raises:
        BucketFileError: naming the file, the key and the offending value.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise BucketFileError(f"{p}: cannot read bucket file: {exc.strerror or exc}") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BucketFileError(
            f"{p}: line {exc.lineno} column {exc.colno}: invalid JSON: {exc.msg}"
        ) from exc
    if not isinstance(doc, dict):
        raise BucketFileError(f"{p}: expected a JSON object at the top level, got {type(doc).__name__}")
    allowed = {"format", "version", "boundaries", "meta"}
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise BucketFileError(f"{p}: {unknown[0]}: unknown key (allowed: {', '.join(sorted(allowed))})")
    for key in ("format", "version", "boundaries"):
        if key not in doc:
            raise BucketFileError(f"{p}: {key}: missing required key")
    if doc["format"] != BUCKET_FILE_FORMAT:
        raise BucketFileError(f"{p}: format: expected {BUCKET_FILE_FORMAT!r}, got {doc['format']!r}")
    version = doc["version"]
    if isinstance(version, bool) or version != BUCKET_FILE_VERSION:
        raise BucketFileError(
            f"{p}: version: unsupported version {version!r} (this perfbudget reads {BUCKET_FILE_VERSION})"
        )
    bounds = doc["boundaries"]
    if not isinstance(bounds, list):
        raise BucketFileError(f"{p}: boundaries: expected a list of integers, got {bounds!r}")
    try:
        _check_boundaries(bounds, where="boundaries")
    except ValueError as exc:
        raise BucketFileError(f"{p}: {exc}") from None
    if "meta" in doc and not isinstance(doc["meta"], dict):
        raise BucketFileError(f"{p}: meta: expected a JSON object, got {doc['meta']!r}")
    return Buckets(boundaries=tuple(bounds))
