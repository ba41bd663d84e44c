"""Fixtures for the A/B tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from ab_support import git, write_tree


@pytest.fixture
def make_repo(tmp_path: Path) -> Callable[..., Path]:
    """``make_repo(base_files, head_files)``: a repository whose HEAD commit holds ``base_files``,
    with ``head_files`` written over the working tree (uncommitted: the checkout under test)."""

    def make(base: Mapping[str, str], head: Mapping[str, str] | None = None) -> Path:
        repo = tmp_path / "repo"
        repo.mkdir()
        git(repo, "init", "-q")
        write_tree(repo, {".gitignore": "/.perfbudget/\n__pycache__/\n", **base})
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "base")
        write_tree(repo, head or {})
        return repo

    return make


@pytest.fixture
def sock() -> Iterator[Path]:
    """A Unix socket path in a short temporary folder (the kernel limit is ~107 bytes; tmp_path can be longer)."""
    folder = Path(tempfile.mkdtemp(prefix="pb-turns-"))
    yield folder / "s"
    shutil.rmtree(folder, ignore_errors=True)
