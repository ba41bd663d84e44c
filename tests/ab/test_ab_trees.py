"""The base worktree and the per-side import shims, in scratch git repositories."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from ab_support import git, write_tree

from perfbudget.ab.trees import (
    GitError,
    build_shim,
    head_commit,
    instrument_dir,
    prepare_base,
    side_env,
)

WHICH = "import perfbudget, torchlevers, solo; print(perfbudget.WHO, torchlevers.SIDE, solo.SIDE)"


def sides(who: str, side: str) -> dict[str, str]:
    return {
        "src/perfbudget/__init__.py": f"WHO = {who!r}\n",
        "src/torchlevers/__init__.py": f"SIDE = {side!r}\n",
        "src/solo.py": f"SIDE = {side!r}\n",
        "src/notes.txt": "not a package\n",
        "tests/test_which.py": (
            "import pathlib, perfbudget, torchlevers\n\n"
            "def test_which():\n"
            "    pathlib.Path('which.txt').write_text(f'{perfbudget.WHO} {torchlevers.SIDE}')\n"
        ),
    }


def test_each_side_imports_its_own_library_and_this_checkouts_instrument(make_repo: Callable[..., Path]) -> None:
    repo = make_repo(sides("base instrument", "base"), sides("head instrument", "head"))
    base = prepare_base(repo, "HEAD")
    assert base.path == repo / ".perfbudget" / "ab" / "base" and base.commit == git(repo, "rev-parse", "HEAD")
    assert head_commit(repo) == f"{base.commit}-dirty"  # the working tree differs from HEAD
    instrument = instrument_dir(repo)
    assert instrument == repo / "src" / "perfbudget"
    for side, tree in (("base", base.path), ("head", repo)):
        shim = build_shim(repo / ".perfbudget" / "ab" / f"shim-{side}", tree=tree, instrument=instrument)
        assert sorted(p.name for p in shim.iterdir()) == ["perfbudget", "solo.py", "torchlevers"]
        done = subprocess.run([sys.executable, "-c", WHICH], cwd=tree, env=side_env(shim),
                              capture_output=True, text=True, timeout=60)
        assert done.stdout.split() == ["head", "instrument", side, side], done.stderr
    # Under pytest too: its rootdir and conftest path entries must not win over the shim.
    shim = repo / ".perfbudget" / "ab" / "shim-base"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:perfbudget", "-p", "no:cacheprovider", "tests/test_which.py"],
        cwd=base.path, env=side_env(shim), capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (base.path / "which.txt").read_text() == "head instrument base"


def test_without_an_instrument_in_the_checkout_the_running_one_is_used(make_repo: Callable[..., Path]) -> None:
    import perfbudget

    repo = make_repo({"src/torchlevers/__init__.py": "SIDE = 'base'\n"})
    assert instrument_dir(repo) == Path(perfbudget.__file__).resolve().parent


def test_merge_base_measures_the_commit_the_branch_started_from(make_repo: Callable[..., Path]) -> None:
    repo = make_repo({"a.txt": "a\n"})
    git(repo, "branch", "-M", "main")
    start = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "feature")
    write_tree(repo, {"b.txt": "feature\n"})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "feature")
    git(repo, "checkout", "-q", "main")
    write_tree(repo, {"c.txt": "main moved on\n"})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "main")
    tip = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "feature")
    assert prepare_base(repo, "main").commit == tip
    merged = prepare_base(repo, "main", merge_base=True)
    assert merged.commit == start and merged.merge_base
    assert not (merged.path / "c.txt").exists() and not (merged.path / "b.txt").exists()


def test_the_worktree_is_refreshed_on_every_run(make_repo: Callable[..., Path]) -> None:
    repo = make_repo({"a.txt": "a\n"})
    first = prepare_base(repo, "HEAD")
    (first.path / "left-over.txt").write_text("from an earlier run\n")
    again = prepare_base(repo, "HEAD")
    assert not (again.path / "left-over.txt").exists() and (again.path / "a.txt").is_file()
    # A plain folder where the worktree should be (say, restored from a CI cache) is replaced too.
    git(repo, "worktree", "remove", "--force", str(again.path))
    write_tree(again.path, {"junk.txt": "x\n"})
    third = prepare_base(repo, "HEAD")
    assert not (third.path / "junk.txt").exists() and (third.path / "a.txt").is_file()


def test_a_base_that_is_not_a_commit_names_the_ref_and_the_fix(make_repo: Callable[..., Path]) -> None:
    repo = make_repo({"a.txt": "a\n"})
    with pytest.raises(GitError, match=r"--base 'no-such-ref': not a commit in .*fetch-depth: 0"):
        prepare_base(repo, "no-such-ref")


def test_side_env_puts_the_shim_first_and_keeps_the_rest(tmp_path: Path) -> None:
    env = side_env(tmp_path / "shim", base_env={"PYTHONPATH": "/x:/y", "KEEP": "1"}, PERFBUDGET_AB_SPEC="base.spec.json")
    assert env == {"PYTHONPATH": f"{tmp_path / 'shim'}:/x:/y", "KEEP": "1", "PERFBUDGET_AB_SPEC": "base.spec.json"}
    assert side_env(tmp_path / "s", base_env={})["PYTHONPATH"] == str(tmp_path / "s")


@pytest.mark.parametrize("link", [".perfbudget", ".perfbudget/ab"])
def test_a_checked_in_link_on_the_way_to_the_base_worktree_is_refused_and_what_it_leads_to_survives(
        make_repo: Callable[..., Path], tmp_path: Path, link: str) -> None:
    # A pull request commits the link: the old clean-up removed the folder it led to.
    outside = tmp_path / "outside"
    marker = outside / "ab" / "base" / "marker.txt" if link == ".perfbudget" else outside / "base" / "marker.txt"
    write_tree(marker.parent, {marker.name: "keep me\n"})
    repo = make_repo({"a.txt": "a\n"})
    (repo / link).parent.mkdir(parents=True, exist_ok=True)
    (repo / link).symlink_to(outside, target_is_directory=True)
    with pytest.raises(GitError, match=rf"{link}: a symbolic link \(to {outside}\).*remove the link"):
        prepare_base(repo, "HEAD")
    assert marker.read_text() == "keep me\n"
    assert not any(p.name == "worktrees.lock" for p in outside.rglob("*"))  # nor was the lock opened there
