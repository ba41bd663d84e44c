"""The history store: runs from results files, idempotent adds, schema refusals, concurrent and killed writers."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from history_support import DEVICE, ab_results, date, sha, stored_results

from perfbudget.history import (
    SCHEMA_VERSION,
    Check,
    CommitError,
    HistoryError,
    HistoryStore,
    Run,
    checks_from_results,
    run_of,
)
from perfbudget.history.store import MAX_ROW_BYTES, _hardened
from perfbudget.results import ABPolicyInfo, ABRunInfo, RunInfo, load_results
from perfbudget.vocabulary import Outcome, RunMode


def run(i: int, *, mode: str = "stored", machine: str | None = None) -> Run:
    return Run(commit=sha(i), parent=sha(i - 1) if i else None, date=date(i),
               machine=machine or str(DEVICE.identity), mode=mode)  # type: ignore[arg-type]


def test_a_stored_run_keeps_values_outcomes_and_intervals(tmp_path: Path) -> None:
    res = stored_results(40.0)
    with HistoryStore(tmp_path / "h.db") as store:
        assert store.add(run(1), checks_from_results(res)) == 2
        points = store.series("encoder-train", "step_ms")
    assert len(points) == 1
    p = points[0]
    assert p.run == run(1)
    assert (p.check.value, p.check.ci, p.check.outcome, p.check.unit) == (40.0, (39.6, 40.4), Outcome.PASS, "ms")
    assert p.check.ratio is None and p.check.log_se is None


def test_an_ab_run_keeps_the_ratio_its_interval_and_its_standard_error(tmp_path: Path) -> None:
    res = ab_results(sha(2), sha(1), [1.02, 1.04, 1.03], sd=0.02)
    run_ = run_of(res, source="ab.json", date=date(2))
    assert (run_.commit, run_.parent, run_.mode, run_.machine) == (sha(2), sha(1), "ab", DEVICE.identity)
    [check] = checks_from_results(res)
    assert check.ratio == pytest.approx(1.03, abs=1e-3) and check.pairs == 3 and check.df == 5.0
    assert check.log_se == pytest.approx(0.02 / 3**0.5)
    lo, hi = check.ratio_ci or (0, 0)
    assert lo < check.ratio < hi


def test_an_ab_run_of_uncommitted_changes_is_refused_unless_given_a_commit() -> None:
    res = ab_results(sha(2) + "-dirty", sha(1), [1.0, 1.01])
    with pytest.raises(CommitError, match=r"ab.json: meta.ab.head_commit '0002a+-dirty': the run measured uncommitted"):
        run_of(res, source="ab.json", date=date(2))
    assert run_of(res, source="ab.json", commit=sha(2), date=date(2)).commit == sha(2)


def test_a_schema_1_record_without_its_sd_gets_its_standard_error_from_its_interval(tmp_path: Path) -> None:
    import json

    res = ab_results(sha(2), sha(1), [1.02, 1.04, 1.03], sd=0.02)
    data = res.as_dict()
    data["schema"] = 1
    base = data["records"][0]["base"]
    data["records"][0]["base"] = {k: base[k] for k in ("value", "ratio", "ratio_ci", "pairs", "pair_ratios")}
    data["records"][0]["extra"] = {"ab": {"compared": True, "tolerance": 0.05, "confidence": 0.95}}
    (tmp_path / "old.json").write_text(json.dumps(data))
    check = Check.from_record(load_results(tmp_path / "old.json").records[0])
    # The made-up interval is +-2 sd/sqrt(n); t(0.975, 5) = 2.571 turns it back into sd/sqrt(n) * 2 / 2.571.
    assert check.log_se == pytest.approx(0.02 / 3**0.5 * 2 / 2.5706, rel=1e-3) and check.df == 5.0


def test_adding_the_same_commit_and_machine_again_replaces_its_rows(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    with HistoryStore(db) as store:
        store.add(run(1), checks_from_results(stored_results(40.0)))
        store.add(run(1), checks_from_results(stored_results(41.0)))
        store.add(run(1, machine="other"), checks_from_results(stored_results(50.0)))
        store.add(run(1, mode="ab"), checks_from_results(stored_results(40.5)))
        values = sorted(p.check.value or 0 for p in store.series("encoder-train", "step_ms"))
        assert values == [40.5, 41.0, 50.0]
        assert len(store.runs()) == 3
        assert store.names() == [("encoder-train", "flops"), ("encoder-train", "step_ms")]
        assert store.resolve(sha(1)[:7]) == [sha(1)]


def test_runs_are_ordered_by_commit_date_whatever_the_order_they_were_added_in(tmp_path: Path) -> None:
    with HistoryStore(tmp_path / "h.db") as store:
        for i in (3, 1, 2):
            store.add(run(i), checks_from_results(stored_results(40.0 + i)))
        assert [p.check.value for p in store.series("encoder-train", "step_ms")] == [41.0, 42.0, 43.0]


def test_a_newer_schema_is_refused_naming_the_file_and_both_versions(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    HistoryStore(db).close()
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 2),))
    with pytest.raises(HistoryError) as err:
        HistoryStore(db)
    assert str(err.value).startswith(f"{db}: schema_version {SCHEMA_VERSION + 2} is newer than this perfbudget "
                                     f"reads ({SCHEMA_VERSION})")


@pytest.mark.parametrize("content", [b"not a database at all, just text\n" * 40, b"SQLite format 3\x00" + b"\xff" * 4000])
def test_a_corrupt_file_is_refused_naming_it(tmp_path: Path, content: bytes) -> None:
    db = tmp_path / "history.db"
    db.write_bytes(content)
    with pytest.raises(HistoryError, match=rf"^{db}: (not a readable history database|corrupt)"):
        HistoryStore(db)
    assert db.read_bytes() == content  # never "repaired" by overwriting


def test_a_database_of_other_tables_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as raw:
        raw.execute("CREATE TABLE t (x)")
    with pytest.raises(HistoryError, match="not a perfbudget history database"):
        HistoryStore(db)


def _writer(db: str, first: int, count: int) -> None:
    with HistoryStore(db, timeout_s=30) as store:
        for i in range(first, first + count):
            store.add(run(i), checks_from_results(stored_results(40.0 + i)))


def test_two_concurrent_writers_lose_no_row(tmp_path: Path) -> None:
    db = str(tmp_path / "h.db")
    ctx = multiprocessing.get_context("fork")  # two processes, each with its own connection: two real writers
    procs = [ctx.Process(target=_writer, args=(db, first, 15)) for first in (0, 100)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with HistoryStore(db) as store:
        assert len(store.runs()) == 30
        assert len(store.series("encoder-train", "step_ms")) == 30
        assert len(store.series("encoder-train", "flops")) == 30


_KILLED_WRITER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from history_support import stored_results
from test_history_store import run
from perfbudget.history import HistoryStore, checks_from_results

def slow_checks():
    for i, c in enumerate(checks_from_results(stored_results(99.0)) * 50):
        yield c.__class__(**{{**c.__dict__, "nodeid": f"n{{i}}"}})
        if i == 10:
            Path({marker!r}).write_text("mid-transaction")
            time.sleep(60)

with HistoryStore({db!r}) as store:
    store.add(run(2), slow_checks())
"""


def test_a_writer_killed_mid_transaction_leaves_every_earlier_row(tmp_path: Path) -> None:
    db, marker = tmp_path / "h.db", tmp_path / "marker"
    with HistoryStore(db) as store:
        store.add(run(1), checks_from_results(stored_results(40.0)))
    code = _KILLED_WRITER.format(tests=str(Path(__file__).parent), marker=str(marker), db=str(db))
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert child.poll() is None, "the writer ended before it was killed"
            assert time.monotonic() < deadline, "the writer never reached mid-transaction"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(10)
    assert child.returncode == -signal.SIGKILL
    with HistoryStore(db) as store:
        assert [r.commit for r in store.runs()] == [sha(1)]
        assert [p.check.value for p in store.series("encoder-train", "step_ms")] == [40.0]
        store.add(run(2), checks_from_results(stored_results(41.0)))  # and it takes writes again
        assert len(store.runs()) == 2


def test_records_as_perfbudget_ab_merges_them_are_kept_with_their_standard_error(tmp_path: Path) -> None:
    """The A/B side of the contract: records made by ``ab.merge.compare_pairs`` (what ``perfbudget ab``
    writes), not by hand."""
    from perfbudget.ab.merge import PairRecords, compare_pairs
    from perfbudget.budgets.loader import BudgetSet
    from perfbudget.results import Record, Results, load_results

    def rec(metric: str, median: float) -> Record:
        samples = tuple(median * f for f in (0.98, 0.99, 1.0, 1.01, 1.02)) if metric == "step_ms" else ()
        return Record(nodeid="perf/test_x.py::test_x", key="x", metric=metric, outcome="pass", value=median,
                      samples=samples, n=len(samples), device=DEVICE, kind="timing" if samples else "exact",
                      unit="ms" if samples else "flop", direction="lower")

    pairs = [PairRecords(head=Results(records=[rec("step_ms", 10.0 * r), rec("flops", 1e9)]),
                         base=Results(records=[rec("step_ms", 10.0), rec("flops", 1e9)]))
             for r in (1.03, 1.01, 1.02)]
    merged = compare_pairs(pairs, budgets=BudgetSet(root=tmp_path / "budgets"), final=True).records
    path = Results(records=merged, meta=RunInfo(mode=RunMode.AB, ab=ABRunInfo(
        head_commit=sha(2), base_commit=sha(1), policy=ABPolicyInfo(prior_df=3.0)))).write(tmp_path / "ab.json")
    results = load_results(path)
    checks = {c.metric: c for c in checks_from_results(results)}
    step = next(r for r in results.records if r.metric == "step_ms")
    info = step.base
    assert step.base is not None and info is not None and info.sd is not None
    assert checks["step_ms"].ratio == pytest.approx(step.base.ratio)
    assert checks["step_ms"].log_se == pytest.approx(info.sd / 3**0.5) and checks["step_ms"].df == 5.0
    assert checks["flops"].log_se is None  # exact: no interval, judged on its values
    with HistoryStore(tmp_path / "h.db") as store:
        assert store.add(run_of(results, source=str(path), date=date(2)), checks.values()) == 2
        [point] = store.series("x", "step_ms")
    assert point.run.mode == "ab" and (point.run.commit, point.run.parent) == (sha(2), sha(1))


def test_a_store_locked_by_another_writer_is_reported_locked_not_corrupt(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    with HistoryStore(db) as store:
        store.add(run(1), checks_from_results(stored_results(40.0)))
    other = sqlite3.connect(db, isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")  # a writer mid-commit: no reader gets in
        for read_only in (False, True):
            with pytest.raises(HistoryError) as err:
                HistoryStore(db, timeout_s=0.05, read_only=read_only)
            assert str(err.value).startswith(f"{db}: cannot open it: database is locked: another process")
            assert "retry when it has finished" in str(err.value) and "move it aside" not in str(err.value)
        other.execute("ROLLBACK")
        with HistoryStore(db, timeout_s=0.05) as store:
            other.execute("BEGIN IMMEDIATE")  # another writer's transaction: reads go on, writes wait
            assert [r.commit for r in store.runs()] == [sha(1)]
            with pytest.raises(HistoryError, match=rf"^{db}: cannot write run {sha(2)[:8]} on .*: database is "
                                                   "locked: another process .* retry"):
                store.add(run(2), checks_from_results(stored_results(41.0)))
    finally:
        other.close()
    with HistoryStore(db) as store:
        assert [r.commit for r in store.runs()] == [sha(1)]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a read-only file")
def test_a_read_only_store_is_read_and_a_write_says_permissions(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    with HistoryStore(db) as store:
        store.add(run(1), checks_from_results(stored_results(40.0)))
    with sqlite3.connect(db) as raw:  # an older schema: a writer would migrate it on open
        raw.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    db.chmod(0o444)
    try:
        with HistoryStore(db, read_only=True) as store:
            assert [r.commit for r in store.runs()] == [sha(1)]
        with pytest.raises(HistoryError) as err:
            HistoryStore(db)
        assert "readonly database: this user may not write the file" in str(err.value)
        assert "move it aside" not in str(err.value)
    finally:
        db.chmod(0o644)


@pytest.mark.parametrize(("sql", "kind", "name"), [
    ("CREATE TRIGGER pwn AFTER INSERT ON runs BEGIN INSERT INTO meta VALUES ('pwned', 'yes'); END", "trigger", "pwn"),
    ("CREATE VIEW checks_view AS SELECT * FROM checks", "view", "checks_view"),
])
@pytest.mark.parametrize("read_only", [False, True])
def test_a_store_holding_sql_of_its_own_is_refused_before_it_runs(
        tmp_path: Path, sql: str, kind: str, name: str, read_only: bool) -> None:
    db = tmp_path / "history.db"
    HistoryStore(db).close()
    with sqlite3.connect(db) as raw:
        raw.execute(sql)
    with pytest.raises(HistoryError, match=rf"^{db}: {kind} '{name}': not one perfbudget creates"), \
            HistoryStore(db, read_only=read_only) as store:
        store.add(run(1), checks_from_results(stored_results(40.0)))
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT count(*) FROM meta WHERE key = 'pwned'").fetchone() == (0,)


def test_the_stores_schema_calls_no_function_that_is_not_innocuous() -> None:
    """Every connection of the store (the file's, a read-only copy's) runs with ``trusted_schema`` off: a
    function registered on it that is not marked innocuous never runs from the store's own schema."""
    db = _hardened(sqlite3.connect(":memory:", isolation_level=None))
    called = []
    db.create_function("side_effect", 0, lambda: called.append(1))
    db.execute("CREATE TABLE runs (source TEXT DEFAULT (side_effect()))")
    with pytest.raises(sqlite3.OperationalError, match=r"unsafe use of side_effect\(\)"):
        db.execute("INSERT INTO runs DEFAULT VALUES")
    assert called == []


@pytest.mark.skipif(sys.version_info < (3, 11), reason="sqlite3 sets limits from Python 3.11")
def test_a_row_longer_than_the_store_writes_is_refused_unread(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    with HistoryStore(db) as store:
        store.add(run(1), checks_from_results(stored_results(40.0)))
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE runs SET source = ?", ("x" * (MAX_ROW_BYTES + 1),))
    with pytest.raises(HistoryError, match=rf"^{db}: cannot read it: string or blob too big: a row longer than "
                                           f"{MAX_ROW_BYTES} bytes"), HistoryStore(db, read_only=True) as store:
        store.runs()
