"""Files that are never half-written, and the advisory lock that serialises writers across processes."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_write", "lock", "shown_path"]

DEFAULT_MODE = 0o644
"""Permissions of a new file (the temp file is created 0600; results and budgets are meant to be shared)."""


def shown_path(path: str | os.PathLike[str], line: int | None = None) -> str:
    """``path`` as a message shows it (relative to the working folder when under it), ``path:line`` with ``line``."""
    p = Path(path)
    shown = str(p)
    if p.is_absolute():
        with contextlib.suppress(ValueError):
            shown = str(p.resolve().relative_to(Path.cwd().resolve()))
    return f"{shown}:{line}" if line else shown


def atomic_write(path: str | os.PathLike[str], data: str | bytes, *, encoding: str = "utf-8") -> Path:
    """Replace ``path`` with ``data`` so that a reader sees the old file or the new one, never a part,
    even after a crash or an interrupt; the new file keeps the old one's permissions (else 0644).

    Args:
        path: the file to write; its folder is created when missing.
        data: text (encoded with ``encoding``) or bytes.
        encoding: for text.

    Returns:
        ``path`` as a :class:`Path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode(encoding) if isinstance(data, str) else data
    # The temp file's name is chosen before it exists, inside the clean-up's reach: an interrupt
    # between creating it and knowing its name (as ``mkstemp`` allows) would leave it behind.
    tmp = ""
    # A temp file in the same folder (a rename is atomic only within one file system), fsynced, renamed
    # over ``path``, and the folder fsynced, so the rename survives a crash too.
    try:
        while True:
            tmp = str(path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                break
            except FileExistsError:  # another writer's temp file: never removed by this one
                tmp = ""
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            mode = path.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = DEFAULT_MODE
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return path


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def lock(path: str | os.PathLike[str], *, shared: bool = False) -> Iterator[None]:
    """Hold an advisory ``flock`` on ``path`` for the block, waiting until it is granted; a process that
    dies releases it.

    Args:
        path: an existing folder, locked itself (no file appears in it: a budgets folder
            under version control stays clean), or a lock file, created (with its folder)
            when missing and never removed (removing it would let two holders lock two
            different files of one name).
        shared: take a shared lock instead of an exclusive one.
    """
    path = Path(path)
    if path.is_dir():
        fd = os.open(path, os.O_RDONLY)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, DEFAULT_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
