"""The two trees of an A/B run: a git worktree of the base commit, and per-side import shims."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..fileio import lock

__all__ = [
    "AB_DIR",
    "BaseTree",
    "GitError",
    "build_shim",
    "git",
    "head_commit",
    "instrument_dir",
    "prepare_base",
    "repo_root",
    "side_env",
]

AB_DIR = Path(".perfbudget") / "ab"
"""Where an A/B run keeps its trees, shims and results, relative to the repository root."""

_INSTRUMENT = "perfbudget"


class GitError(RuntimeError):
    """A git command failed; the message names the command, the folder and git's own words."""


@dataclass(frozen=True, kw_only=True)
class BaseTree:
    """The base side's checkout."""

    path: Path
    """The worktree (``<root>/.perfbudget/ab/base``)."""
    ref: str
    """The ref the user named (``--base``)."""
    commit: str
    """The commit checked out: ``ref`` resolved, or its merge-base with HEAD."""
    merge_base: bool
    """Whether ``commit`` is the merge-base of HEAD and ``ref``."""


def git(*args: str, cwd: Path) -> str:
    """Run git in ``cwd`` and return its stripped standard output.

    Raises:
        GitError: naming the command, the folder and git's error output.
    """
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GitError(f"git {' '.join(args)} (in {cwd}): {exc}") from None
    if done.returncode != 0:
        raise GitError(f"git {' '.join(args)} (in {cwd}): {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip()


def repo_root(start: Path) -> Path:
    """The top of the git checkout holding ``start``."""
    return Path(git("rev-parse", "--show-toplevel", cwd=start))


def head_commit(root: Path) -> str:
    """HEAD's commit, with ``-dirty`` when the working tree differs from it (it is what is measured)."""
    sha = git("rev-parse", "HEAD", cwd=root)
    dirty = git("status", "--porcelain", "--untracked-files=no", cwd=root)
    return f"{sha}-dirty" if dirty else sha


def prepare_base(root: Path, ref: str, *, merge_base: bool = False, path: Path | None = None) -> BaseTree:
    """Check out the base commit, fresh, as a detached worktree (``<root>/.perfbudget/ab/base``).

    Args:
        root: the repository root (this checkout).
        ref: any commit-ish (``origin/main``, a SHA).
        merge_base: use ``git merge-base HEAD ref`` instead of ``ref`` itself.
        path: where the worktree goes (default ``<root>/.perfbudget/ab/base``).

    Raises:
        GitError: ``ref`` is not a commit here, the worktree cannot be made, or ``path`` or its
            lock would be reached through a symbolic link.
    """
    try:
        commit = git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=root)
    except GitError:
        raise GitError(f"--base {ref!r}: not a commit in {root} (fetch it first, e.g. "
                       "actions/checkout with fetch-depth: 0)") from None
    if merge_base:
        commit = git("merge-base", "HEAD", commit, cwd=root)
    path = root / AB_DIR / "base" if path is None else path
    worktrees_lock = root / AB_DIR / "worktrees.lock"
    for folder in (path, worktrees_lock.parent):
        _real_folders(root, folder)
    if worktrees_lock.is_symlink():
        raise GitError(f"{worktrees_lock}: a symbolic link (to {os.readlink(worktrees_lock)}); remove it")
    # git's own files are not safe against two `worktree add/remove/prune` at once.

    with lock(worktrees_lock):
        # Refresh: a worktree left by an earlier run may hold another commit or build outputs.
        if path.exists():
            try:
                git("worktree", "remove", "--force", str(path), cwd=root)
            except GitError:
                shutil.rmtree(path)  # not a registered worktree (or a broken one): just a folder
        git("worktree", "prune", cwd=root)
        path.parent.mkdir(parents=True, exist_ok=True)
        git("worktree", "add", "--detach", "--force", str(path), commit, cwd=root)
    return BaseTree(path=path, ref=ref, commit=commit, merge_base=merge_base)


def _real_folders(root: Path, path: Path) -> None:
    """Raise ``GitError`` (naming the part) unless every existing part of ``path`` below ``root`` is a
    real folder and ``path`` resolves inside ``root``."""
    # A pull request can commit `.perfbudget` as a link: the worktree's clean-up would delete its target.
    try:
        parts = Path(os.path.abspath(path)).relative_to(os.path.abspath(root)).parts
    except ValueError:
        raise GitError(f"{path}: not inside the repository {root}") from None
    here = Path(os.path.abspath(root))
    for part in parts:
        here /= part
        try:
            mode = here.lstat().st_mode
        except FileNotFoundError:
            break
        if stat.S_ISLNK(mode):
            raise GitError(f"{here}: a symbolic link (to {os.readlink(here)}), where an A/B run keeps its "
                           "base worktree; it must be a plain folder of this checkout: remove the link")
        if not stat.S_ISDIR(mode):
            raise GitError(f"{here}: not a folder, where an A/B run keeps its base worktree; remove it")
    if not path.resolve().is_relative_to(root.resolve()):
        raise GitError(f"{path}: leads outside the repository {root}")


def instrument_dir(root: Path) -> Path:
    """The instrument both sides run: this checkout's ``src/perfbudget``, else the running one."""
    here = root / "src" / _INSTRUMENT
    if (here / "__init__.py").is_file():
        return here
    return Path(__file__).resolve().parents[1]


def build_shim(shim: Path, *, tree: Path, instrument: Path) -> Path:
    """(Re)create ``shim``: ``perfbudget`` -> ``instrument``, every other package of ``tree/src`` -> its own."""

    if shim.is_symlink() or shim.is_file():
        shim.unlink()
    elif shim.exists():
        shutil.rmtree(shim)
    shim.mkdir(parents=True)
    (shim / _INSTRUMENT).symlink_to(instrument, target_is_directory=True)
    src = tree / "src"
    if src.is_dir():
        for entry in sorted(src.iterdir()):
            name = entry.name
            if name == _INSTRUMENT or name.startswith(".") or name == "__pycache__" or name.endswith(".egg-info"):
                continue
            if entry.is_dir() and (entry / "__init__.py").is_file():
                (shim / name).symlink_to(entry.resolve(), target_is_directory=True)
            elif entry.is_file() and entry.suffix == ".py":
                (shim / name).symlink_to(entry.resolve())
    return shim


def side_env(shim: Path, *, base_env: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment of one side: ``PYTHONPATH`` led by ``shim``, plus ``extra`` variables."""
    env = dict(os.environ if base_env is None else base_env)
    rest = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(shim) + (os.pathsep + rest if rest else "")
    env.update(extra)
    return env
