"""``perfbudget history add|show|report|check`` end to end on results files, with their exit codes."""

from __future__ import annotations

import io
import math
import re
import shutil
import sqlite3
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from history_support import ab_results, date, sha, stored_results

from perfbudget.cli import main
from perfbudget.exitcodes import ExitCode


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


@pytest.fixture(scope="module")
def built_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """30 stored runs of one machine, +10 % from commit 15 on (built once; tests take a copy)."""
    tmp_path = tmp_path_factory.mktemp("stored")
    db = tmp_path / "history.db"
    noise = np.random.default_rng(2).normal(0, 0.02, 30)
    for i in range(30):
        ms = 40.0 * math.exp((math.log(1.1) if i >= 15 else 0.0) + noise[i])
        path = stored_results(ms).write(tmp_path / f"r{i}.json")
        parent = ["--parent", sha(i - 1)] if i else []
        code, _ = cli("history", "add", str(path), "--db", str(db), "--commit", sha(i), *parent, "--date", date(i))
        assert code == ExitCode.OK
    return db


@pytest.fixture
def stored_db(built_db: Path, tmp_path: Path) -> Path:
    db = tmp_path / "history.db"
    shutil.copyfile(built_db, db)
    return db


def test_add_is_idempotent_per_commit_machine_and_mode(tmp_path: Path, stored_db: Path) -> None:
    path = stored_results(40.0).write(tmp_path / "again.json")
    code, text = cli("history", "add", str(path), "--db", str(stored_db), "--commit", sha(3), "--date", date(3))
    assert code == ExitCode.OK and "30 run(s) in all" in text
    ab = ab_results(sha(30), sha(29), [1.01, 1.0]).write(tmp_path / "ab.json")
    code, text = cli("history", "add", str(ab), "--db", str(stored_db), "--date", date(30))
    assert code == ExitCode.OK and f"kept 1 check(s) of {sha(30)[:8]} (ab," in text and "31 run(s)" in text


def test_add_takes_the_commit_its_parent_and_date_from_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for msg in ("one", "two"):
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", msg], check=True,
                       env={"GIT_COMMITTER_DATE": "2026-11-30T10:00:00+01:00", "PATH": "/usr/bin:/bin"})
    head, parent = (subprocess.run([*git, "rev-parse", r], capture_output=True, text=True, check=True).stdout.strip()
                    for r in ("HEAD", "HEAD~1"))
    monkeypatch.chdir(repo)
    path = stored_results(40.0).write(tmp_path / "r.json")
    code, text = cli("history", "add", str(path), "--db", str(tmp_path / "h.db"))
    assert code == ExitCode.OK, text
    from perfbudget.history import HistoryStore

    with HistoryStore(tmp_path / "h.db") as store:
        [run] = store.runs()
    assert (run.commit, run.parent, run.date) == (head, parent, "2026-11-30T09:00:00Z")


def test_add_outside_git_without_a_commit_says_what_to_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = stored_results(40.0).write(tmp_path / "r.json")
    code, _ = cli("history", "add", str(path), "--db", str(tmp_path / "h.db"))
    assert code == ExitCode.USAGE


def test_show_prints_the_series_with_its_change_point(stored_db: Path) -> None:
    code, text = cli("history", "show", "encoder-train.step_ms", "--db", str(stored_db))
    assert code == ExitCode.OK
    assert re.search(r"---- change point: [\d.]+ -> [\d.]+ ms \(\+\d+\.\d%\) WORSE\n  " + sha(15)[:8], text), text
    code, _ = cli("history", "show", "encoder-train.step_mss", "--db", str(stored_db))
    assert code == ExitCode.USAGE


def test_check_fails_naming_the_commits_to_bisect_and_passes_after_them(stored_db: Path) -> None:
    code, text = cli("history", "check", "--since", sha(5)[:10], "--db", str(stored_db))
    assert code == ExitCode.FAILED
    assert "change point +" in text and f"commits {sha(14)[:12]}..{sha(15)[:12]}" in text
    assert f"git bisect start {sha(15)[:12]} {sha(14)[:12]}" in text
    code, text = cli("history", "check", "--since", sha(20), "--db", str(stored_db))
    assert code == ExitCode.OK and "no change point, drift, cumulative change or trend" in text


def test_check_fails_on_a_cumulative_drift_beyond_the_tolerance(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    rng = np.random.default_rng(8)
    for i in range(1, 13):
        step = 1.025 if i > 4 else 1.0  # eight merges of +2.5 %: each passes its pull request at 5 %
        pairs = list(np.exp(math.log(step) + rng.normal(0, 0.004, 4)))
        path = ab_results(sha(i), sha(i - 1), pairs, sd=0.004).write(tmp_path / f"ab{i}.json")
        assert cli("history", "add", str(path), "--db", str(db), "--date", date(i))[0] == ExitCode.OK
    code, text = cli("history", "check", "--since", sha(4), "--db", str(db), "--tolerance", "0.05")
    assert code == ExitCode.FAILED
    assert "cumulative beyond 5%" in text and f"commits {sha(4)[:12]}..{sha(12)[:12]}" in text
    code, text = cli("history", "check", "--since", sha(4), "--db", str(db), "--tolerance", "0.3")
    assert "cumulative beyond" not in text


def test_check_finds_what_came_after_the_ref_when_commits_share_a_date(tmp_path: Path) -> None:
    # Commits made within one second (a scripted series, a fast-forward) carry one date: the
    # history's order, not the date, says what came after --since.
    db = tmp_path / "h.db"
    rng = np.random.default_rng(8)
    for i in range(1, 13):
        step = 1.025 if i > 4 else 1.0
        pairs = list(np.exp(math.log(step) + rng.normal(0, 0.004, 4)))
        path = ab_results(sha(i), sha(i - 1), pairs, sd=0.004).write(tmp_path / f"ab{i}.json")
        assert cli("history", "add", str(path), "--db", str(db), "--date", date(0))[0] == ExitCode.OK
    code, text = cli("history", "check", "--since", sha(4), "--db", str(db), "--tolerance", "0.05")
    assert code == ExitCode.FAILED, text
    assert "8 run(s)" in text and "cumulative beyond 5%" in text and f"commits {sha(4)[:12]}..{sha(12)[:12]}" in text
    # A ref with no run of its own (the first commit, only ever a parent) starts at its child's run.
    code, text = cli("history", "check", "--since", sha(0), "--db", str(db), "--tolerance", "0.05")
    assert code == ExitCode.FAILED and "12 run(s)" in text, text


def test_report_writes_one_self_contained_page(tmp_path: Path, stored_db: Path) -> None:
    page = tmp_path / "history.html"
    code, _ = cli("history", "report", "--db", str(stored_db), "-o", str(page))
    assert code == ExitCode.OK
    text = page.read_text()
    assert text.count("<svg") == 2  # step_ms and flops
    assert "step_ms (ms)" in text and re.search(r">\+(9|10|11)\.\d%<", text)  # the change point's label
    assert sha(15)[:8] in text and "commit (oldest to newest" in text
    # Nothing fetched: no script, no stylesheet or image from elsewhere.
    assert "<script" not in text and not re.search(r"(src|href)=['\"]?https?:", text)


def test_the_page_shows_what_moved_first_and_folds_series_with_one_run(tmp_path: Path, stored_db: Path) -> None:
    ab = ab_results(sha(30), sha(29), [1.01, 1.0]).write(tmp_path / "ab.json")  # one A/B run: one point
    assert cli("history", "add", str(ab), "--db", str(stored_db), "--date", date(30))[0] == ExitCode.OK
    page = tmp_path / "history.html"
    assert cli("history", "report", "--db", str(stored_db), "-o", str(page))[0] == ExitCode.OK
    text = page.read_text()
    # step_ms has a change point for the worse: linked at the top, plotted before flops (no change).
    assert re.search(r"Moved for the worse:</b> <a href='#encoder-train\.step_ms-[^']+'>encoder-train\.step_ms</a>", text)
    assert text.index("<h2 id='encoder-train.step_ms") < text.index("<h2 id='encoder-train.flops")
    # Several series of one run each would be as many empty headings: one folded table instead.
    assert "<details><summary>1 series with one run or none" in text
    assert text.count("<h2") == 2


@pytest.mark.parametrize("case", ["missing", "corrupt", "newer"])
def test_a_database_that_cannot_be_read_exits_2_naming_it(tmp_path: Path, stored_db: Path, case: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "other.db"
    if case == "corrupt":
        db.write_bytes(b"garbage" * 600)
    elif case == "newer":
        db = stored_db
        with sqlite3.connect(db) as raw:
            raw.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    code, _ = cli("history", "check", "--since", sha(1), "--db", str(db))
    assert code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"perfbudget history check: error: {db}")
    if case == "newer":
        assert "schema_version 99 is newer than this perfbudget reads (3)" in err


def test_an_unknown_ref_exits_2(stored_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = cli("history", "check", "--since", "no-such-ref", "--db", str(stored_db))
    assert code == ExitCode.USAGE and "--since no-such-ref: not a commit" in capsys.readouterr().err


def test_without_ruptures_history_says_how_to_install_it_and_the_rest_imports(
        stored_db: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # A GPU runner set up without a registry installs perfbudget with --no-deps and may lack ruptures.
    monkeypatch.setitem(sys.modules, "ruptures", None)  # `import ruptures` raises ImportError
    code, _ = cli("history", "show", "encoder-train.step_ms", "--db", str(stored_db))
    assert code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "perfbudget history show: error: change points need the package ruptures" in err
    assert "pip install 'ruptures>=1.1.9'" in err
    code, text = cli("show", "--budgets-dir", str(stored_db.parent))
    assert code == ExitCode.OK, text


def _git(repo: Path, *args: str, date: str = "2026-11-30T10:00:00+01:00") -> str:
    env = {"GIT_COMMITTER_DATE": date, "GIT_AUTHOR_DATE": date, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo), *args],
                          capture_output=True, text=True, check=True, env=env)
    return done.stdout.strip()


def test_check_since_an_annotated_tag_takes_the_commit_it_tags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    commits = []
    for i in range(4):
        _git(repo, "commit", "-q", "--allow-empty", "-m", f"c{i}", date=f"2026-11-30T10:0{i}:00+01:00")
        commits.append(_git(repo, "rev-parse", "HEAD"))
        if i == 1:
            _git(repo, "tag", "-a", "v1", "-m", "release one")  # a tag object: `git show v1` prints its header
    monkeypatch.chdir(repo)
    from perfbudget.history import git_commit_info

    assert git_commit_info("v1") == (commits[1], commits[0], "2026-11-30T09:01:00Z")
    db = tmp_path / "h.db"
    for i in (1, 2, 3):
        path = ab_results(commits[i], commits[i - 1], [1.0, 1.001, 0.999]).write(tmp_path / f"ab{i}.json")
        assert cli("history", "add", str(path), "--db", str(db))[0] == ExitCode.OK
    code, text = cli("history", "check", "--since", "v1", "--db", str(db))
    assert code == ExitCode.OK, text
    assert f"since {commits[1][:12]} (2026-11-30T09:01:00Z): 2 run(s)" in text


def test_a_ref_whose_date_git_gives_unreadable_is_an_input_error(stored_db: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from perfbudget.history import cli as history_cli

    def garbled(ref: str) -> None:
        raise ValueError("expected an ISO 8601 date such as 2026-12-02T05:26:29+01:00, got 'Tagger: t'")

    monkeypatch.setattr(history_cli, "git_commit_info", garbled)
    code, _ = cli("history", "check", "--since", "v1", "--db", str(stored_db))
    assert code == ExitCode.USAGE
    assert "perfbudget history check: error: --since v1: expected an ISO 8601 date" in capsys.readouterr().err


def test_check_prints_the_chains_gaps_and_warns_that_it_does_not_reach_back_to_the_ref(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    rng = np.random.default_rng(3)
    for i in (1, 2, 3, 4, 7, 8, 9):  # commits 5 and 6 never measured: a push of three compared with HEAD~1
        pairs = list(np.exp(rng.normal(0, 0.004, 4)))
        path = ab_results(sha(i), sha(i - 1), pairs, sd=0.004).write(tmp_path / f"ab{i}.json")
        assert cli("history", "add", str(path), "--db", str(db), "--date", date(i))[0] == ExitCode.OK
    code, text = cli("history", "check", "--since", sha(2), "--db", str(db))
    assert code == ExitCode.OK, text  # a warning, not a failure
    assert f"over 3 merge(s) since {sha(6)[:12]} only: the chain does not reach back to {sha(2)[:12]}" in text
    assert (f"  gap: encoder-train.step_ms: {sha(7)[:8]}: its parent {sha(6)[:8]} has no A/B ratio for this check: "
            f"the chain cannot reach back over {sha(4)[:8]}..{sha(6)[:8]}") in text
    assert "no change point, drift, cumulative change or trend for the worse since" not in text
    assert text.rstrip().endswith(f"warning: the A/B chain of 1 series (encoder-train.step_ms) does not reach back "
                                  f"to {sha(2)[:12]} (gaps above): its cumulative change covers only the merges "
                                  "after the gap")
    code, text = cli("history", "check", "--since", sha(6), "--db", str(db))  # the chain's first parent
    assert code == ExitCode.OK and "gap" not in text
    assert "no change point, drift, cumulative change or trend for the worse since" in text


def test_check_help_states_the_cumulative_rule_the_code_applies(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", "check", "--help"], out=io.StringIO()) == ExitCode.OK
    help_text = " ".join(capsys.readouterr().out.split())
    assert "worse than 1 with its whole 99 % interval and beyond 1 +- this on its estimate" in help_text
    assert "a gap in the A/B chain is a warning" in help_text
    assert "interval, or the trend of one machine's values, fails when its interval lies entirely" not in help_text


def test_show_selects_one_machine_of_an_ab_history(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    for i in range(1, 10):
        path = ab_results(sha(i), sha(i - 1), [1.0, 1.002]).write(tmp_path / f"ab{i}.json")
        code, _ = cli("history", "add", str(path), "--db", str(db), "--date", date(i), "--machine", f"cpu-kind-{i % 3}")
        assert code == ExitCode.OK
    code, text = cli("history", "show", "encoder-train.step_ms", "--db", str(db), "--machine", "cpu-kind-1")
    assert code == ExitCode.OK, text
    assert text.startswith("encoder-train.step_ms on cpu-kind-1 (lockstep A/B;")
    shown = {sha(i)[:8] for i in range(1, 10) if re.search(rf"^  {sha(i)[:8]} ", text, re.M)}
    assert shown == {sha(1)[:8], sha(4)[:8], sha(7)[:8]}
    code, _ = cli("history", "show", "encoder-train.step_ms", "--db", str(db), "--machine", "cpu-kind-9")
    assert code == ExitCode.USAGE


@pytest.mark.parametrize("argv", [["show", "encoder-train.step_ms"], ["show", "encoder-train.flop"],
                                  ["check", "--since", sha(0)]])
def test_no_control_character_of_a_store_reaches_the_terminal(
        stored_db: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    hostile = "m\x1b]0;PWN\x07\rFAKE\u202e"
    with sqlite3.connect(stored_db) as db:
        db.execute("UPDATE runs SET machine = ?", (hostile,))
        db.execute("UPDATE checks SET key = ? WHERE metric = 'flops'", (f"encoder-train{hostile}",))
    _, text = cli("history", argv[0], "--db", str(stored_db), *argv[1:])
    said = text + capsys.readouterr().err
    assert "PWN" in said and "FAKE" in said  # shown, inert
    assert [c for c in said if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")] == []
