"""Which commit a results file measured, its first parent and its date, from the results or git."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ..results import ABRunInfo, Results
from .store import Run, mode_of, utc_date

__all__ = ["CommitError", "git_commit_info", "git_rev", "run_of"]


class CommitError(ValueError):
    """The commit, parent, date or machine of a run cannot be established; the message says what to pass."""


def _git(cwd: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_rev(ref: str, cwd: str | Path = ".") -> str | None:
    """The full SHA of commit-ish ``ref`` in the repository at ``cwd``, or ``None``."""
    return _git(Path(cwd), "rev-parse", "--verify", "-q", f"{ref}^{{commit}}")


def git_commit_info(commit: str, cwd: str | Path = ".") -> tuple[str, str | None, str] | None:
    """``(full SHA, first parent or None, commit date UTC)`` of commit-ish ``commit`` (an annotated tag:
    the commit it tags), or ``None`` when git does not know it.

    Raises:
        ValueError: git's date is not an ISO 8601 date (naming it).
    """
    # ``commit`` may come from a results file: after --end-of-options, '--output=FILE' is no option.
    # ``^{commit}``: `git show TAG` prints an annotated tag's header before the commit.
    out = _git(Path(cwd), "show", "-s", "--format=%H %P%n%cI", "--end-of-options", f"{commit}^{{commit}}")
    if not out:
        return None
    shas, _, date = out.partition("\n")
    parts = shas.split()
    return parts[0], (parts[1] if len(parts) > 1 else None), utc_date(date)


def run_of(results: Results, *, source: str, commit: str | None = None, parent: str | None = None,
           date: str | None = None, machine: str | None = None, cwd: str | Path = ".") -> Run:
    """The :class:`Run` a results file records: each of commit, parent, date and machine as given, else
    from the A/B run's meta, else from git (``HEAD``, its first parent, its date) or the records' device.

    Raises:
        CommitError: naming what is missing and the option that supplies it.
    """
    mode = mode_of(results)
    ab = results.meta.ab or ABRunInfo()
    if commit is None and (measured := _text(ab.head_commit)) and measured.endswith("-dirty"):
        raise CommitError(f"{source}: meta.ab.head_commit {measured!r}: the run measured uncommitted changes, "
                          "which are no commit of the history; pass --commit SHA to keep it as that commit anyway")
    commit = commit or _text(ab.head_commit) or git_rev("HEAD", cwd)
    if not commit:
        raise CommitError(f"{source}: no commit in the results and no git repository at {Path(cwd).resolve()}: "
                          "pass --commit SHA (and --parent, --date)")
    info = git_commit_info(commit, cwd)
    if info is not None:
        commit = info[0]
    if parent is None:
        parent = _text(ab.base_commit) if mode == "ab" else None
        if parent is None and info is not None:
            parent = info[1]
    if date is None:
        if info is None:
            raise CommitError(f"{source}: commit {commit} is not in the git repository at {Path(cwd).resolve()}: "
                              "pass --date (the commit date, ISO 8601)")
        date = info[2]
    try:
        date = utc_date(date)
    except ValueError as exc:
        raise CommitError(f"--date: {exc}") from None
    machine = machine or _identity(results)
    if not machine:
        raise CommitError(f"{source}: no record names its machine identity (recorded before the identity was "
                          "measured?): pass --machine NAME")
    return Run(commit=str(commit), parent=None if parent is None else str(parent), date=date, machine=machine,
               mode=mode, source=source)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _identity(results: Results) -> str | None:
    """The machine identity of the records (the first device that has one; the label's slug otherwise)."""
    labels = []
    for r in results.records:
        if r.device is None:
            continue
        if r.device.identity:
            return r.device.identity
        labels.append(r.device.label)
    return labels[0] if labels else None
