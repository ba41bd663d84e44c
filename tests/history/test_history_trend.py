"""The trend of one machine's values since a ref: the statistics against literal numbers, what the store
keeps for it (each run's own standard error, schema 2 and the migration of schema 1), and ``history
check`` failing on a creep the chained ratios leave inside their interval (issue 25, item 5)."""

from __future__ import annotations

import io
import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from history_support import DEVICE, NODE, ab_results, date, sha, stored_results

from perfbudget.cli import main
from perfbudget.exitcodes import ExitCode
from perfbudget.history import (
    SCHEMA_VERSION,
    Check,
    HistoryError,
    HistoryStore,
    Point,
    Run,
    analyze,
    checks_from_results,
    level_trend,
    machine_trends,
)
from perfbudget.history.analysis import findings_since
from perfbudget.history.trend import Trend
from perfbudget.vocabulary import Outcome

ISSUE_MS = (37.3, 38.3, 41.0, 42.8, 43.1)
"""The A/B heads' medians of the issue's creep on one machine: a no-op, then four commits of ~+2.5 %."""
ISSUE_RATIOS = (1.005, 1.022, 1.068, 1.041, 0.999)
"""Head/parent of each of its A/B runs: chained, +14.1 %."""


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


# ---------------------------------------------------------------- the statistics


def test_the_issues_creep_without_standard_errors_is_a_least_squares_line() -> None:
    t = level_trend(range(5), [math.log(v) for v in ISSUE_MS])
    # ln(ms) on 0..4: slope 0.0400148, residual sd 0.0177123 (3 df), se 0.0177123 / sqrt(10);
    # t(0.975, 3) = 3.18245: the move over 4 commits exp(4 * (0.0400148 +- 3.18245 * 0.00560113)).
    assert (t.n, t.df, t.span, t.tau) == (5, 3, 4.0, 0.0)
    assert t.slope == pytest.approx(0.04001475, rel=1e-6)
    assert t.slope_se == pytest.approx(0.00560113, rel=1e-5)
    assert t.change == pytest.approx(0.173580, abs=1e-6)
    assert t.ci == (pytest.approx(1.092816, abs=1e-6), pytest.approx(1.260313, abs=1e-6))


def test_runs_own_errors_smaller_than_the_scatter_give_the_scatter_and_a_between_run_sd() -> None:
    t = level_trend(range(5), [math.log(v) for v in ISSUE_MS], [0.015] * 5)
    # DerSimonian-Laird: tau^2 = 0.0177123^2 - 0.015^2; equal weights: the least-squares interval.
    assert t.tau == pytest.approx(0.00941945, rel=1e-5)
    assert t.ci == (pytest.approx(1.092816, abs=1e-6), pytest.approx(1.260313, abs=1e-6))


def test_runs_own_errors_larger_than_the_scatter_are_the_floor_of_the_interval() -> None:
    t = level_trend(range(5), [math.log(v) for v in ISSUE_MS], [0.03] * 5)
    # Knapp-Hartung never narrower than the runs' own errors: se 0.03 / sqrt(10).
    assert (t.tau, t.slope_se) == (0.0, pytest.approx(0.03 / math.sqrt(10), rel=1e-9))
    assert t.ci == (pytest.approx(1.040076, abs=1e-6), pytest.approx(1.324221, abs=1e-6))


def test_unequal_errors_and_gaps_weigh_each_run_by_its_error_plus_the_between_run_variance() -> None:
    # Checked against the matrix form: tau^2 = (Q - (n - 2)) / tr(W - W X (X'WX)^-1 X'W), weights
    # 1 / (se^2 + tau^2), cov = max(1, q) (X'W*X)^-1, t(0.975, 4) = 2.77645.
    ms = (40.2, 39.1, 41.5, 40.0, 44.0, 43.2)
    t = level_trend([0, 1, 3, 4, 7, 8], [math.log(v) for v in ms], [0.01, 0.02, 0.015, 0.012, 0.01, 0.03])
    assert (t.df, t.span) == (4, 8.0)
    assert t.tau == pytest.approx(0.0283484, rel=1e-5)
    assert t.slope == pytest.approx(0.01263553, rel=1e-6)
    assert t.slope_se == pytest.approx(0.00473335, rel=1e-5)
    assert t.ci == (pytest.approx(0.995957, abs=1e-6), pytest.approx(1.229023, abs=1e-6))


def test_beyond_is_the_interval_entirely_past_the_tolerance_in_the_bad_direction() -> None:
    up = Trend(n=5, slope=0.04, slope_se=0.005, df=3, span=4, tau=0, confidence=0.95)
    down = Trend(n=5, slope=-0.04, slope_se=0.005, df=3, span=4, tau=0, confidence=0.95)
    assert up.ci[0] > 1.05 and up.beyond(0.05, "lower") and not up.beyond(0.15, "lower")
    assert not up.beyond(0.05, "higher")  # a rate that rose: better
    assert down.beyond(0.05, "higher") and not down.beyond(0.05, "lower")


def test_no_change_with_a_machine_offset_rarely_reads_as_a_move_beyond_the_tolerance() -> None:
    # 4000 no-op series of 5 runs: each run's own se 2 % plus a between-run offset of 4 %.
    rng = np.random.default_rng(3)
    covered = beyond = 0
    for _ in range(4000):
        ys = rng.normal(0, 0.02, 5) + rng.normal(0, 0.04, 5)
        t = level_trend(range(5), list(ys), [0.02] * 5)
        covered += t.ci[0] <= 1.0 <= t.ci[1]
        beyond += t.beyond(0.05, "lower")
    assert 0.94 <= covered / 4000 <= 0.99  # at least its 95 %: never narrower than the runs' own errors
    assert beyond / 4000 < 0.01


@pytest.mark.parametrize(("args", "match"), [
    (([0, 1], [0.0, 0.1]), "at least 3 runs"),
    (([0, 1, 2], [0.0, 0.1]), "3 positions but 2 values"),
    (([1, 1, 1], [0.0, 0.1, 0.2]), "two positions"),
    (([0, 1, 2], [0.0, math.nan, 0.2]), "finite"),
    (([0, 1, 2], [0.0, 0.1, 0.2], [0.01, 0.0, 0.01]), "positive numbers"),
])
def test_level_trend_names_what_it_cannot_fit(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        level_trend(*args)


# ---------------------------------------------------------------- what the store keeps


def test_an_ab_head_keeps_half_the_per_pair_variance_as_its_own_standard_error() -> None:
    [check] = checks_from_results(ab_results(sha(2), sha(1), [1.0] * 6, step_ms=41.0, sd=0.07))
    assert check.log_se == pytest.approx(0.07 / math.sqrt(6))
    assert check.value_se == pytest.approx(0.07 / math.sqrt(6) / math.sqrt(2))


def test_a_stored_value_keeps_its_standard_error_from_its_interval_and_its_coverage() -> None:
    res = stored_results(40.0)
    rec = res.records[0].with_(ci=(39.0, 41.0), ci_confidence=0.95)
    check = Check.from_record(rec)
    assert check.value_se == pytest.approx(math.log(41 / 39) / (2 * 1.959964), rel=1e-6)
    # Without the interval's coverage, or for an exact value, the run does not say.
    assert Check.from_record(rec.with_(ci_confidence=None)).value_se is None
    assert Check.from_record(res.records[1]).value_se is None


_V1_TABLES = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (id INTEGER PRIMARY KEY, commit_sha TEXT NOT NULL, parent_sha TEXT, date_utc TEXT NOT NULL,
    machine TEXT NOT NULL, mode TEXT NOT NULL CHECK (mode IN ('stored', 'ab')), source TEXT NOT NULL DEFAULT '',
    UNIQUE (commit_sha, machine, mode));
CREATE TABLE checks (run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE, nodeid TEXT NOT NULL,
    key TEXT NOT NULL, metric TEXT NOT NULL, unit TEXT NOT NULL, kind TEXT NOT NULL, direction TEXT NOT NULL,
    outcome TEXT NOT NULL, value REAL, ci_low REAL, ci_high REAL, ratio REAL, ratio_low REAL, ratio_high REAL,
    log_se REAL, df REAL, pairs INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (run_id, nodeid, key, metric));
CREATE INDEX checks_by_name ON checks (key, metric);
INSERT INTO meta VALUES ('schema_version', '1');
INSERT INTO runs VALUES (1, '{a}', '{p}', '2026-12-01T00:01:00Z', 'cpu-x', 'ab', 'ab1.json');
INSERT INTO runs VALUES (2, '{b}', '{a}', '2026-12-01T00:02:00Z', 'cpu-x', 'stored', 'r2.json');
INSERT INTO checks VALUES (1, 'n', 'k', 'step_ms', 'ms', 'timing', 'lower', 'pass', 40.0, NULL, NULL,
    1.01, 0.98, 1.04, 0.02, 8.0, 6);
INSERT INTO checks VALUES (2, 'n', 'k', 'step_ms', 'ms', 'timing', 'lower', 'pass', 41.0, 40.5, 41.5,
    NULL, NULL, NULL, NULL, NULL, 0);
"""


def test_a_schema_1_store_is_migrated_keeping_every_row_and_deriving_what_it_can(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    with sqlite3.connect(db) as raw:
        raw.executescript(_V1_TABLES.format(a=sha(1), b=sha(2), p=sha(0)))
    with HistoryStore(db) as store:
        ab, stored = store.series("k", "step_ms")
        assert (ab.run.commit, ab.check.ratio, ab.check.log_se) == (sha(1), 1.01, 0.02)
        assert ab.check.value_se == pytest.approx(0.02 / math.sqrt(2))
        # Schema 1 kept a stored run's interval but not its coverage: its own error stays unknown.
        assert (stored.check.value, stored.check.ci, stored.check.value_se) == (41.0, (40.5, 41.5), None)
        store.add(Run(commit=sha(3), parent=sha(2), date=date(3), machine="cpu-x", mode="ab"),
                  checks_from_results(ab_results(sha(3), sha(2), [1.0, 1.0], step_ms=40.0)))
        assert len(store.runs()) == 3
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (str(SCHEMA_VERSION),)
    with HistoryStore(db) as store:  # 2 -> 3: the pairs' own sd, unknown before, kept from now on
        assert [p.check.pair_sd for p in store.series("k", "step_ms")][:2] == [None, None]
        assert store.series("encoder-train", "step_ms")[0].check.pair_sd == 0.0
    assert SCHEMA_VERSION == 3


# ---------------------------------------------------------------- one machine's series


def _point(i: int, ms: float, machine: str, *, se: float | None = 0.02, kind: str = "timing") -> Point:
    run = Run(commit=sha(i), parent=sha(i - 1), date=date(i), machine=machine, mode="ab")
    check = Check(nodeid=NODE, key="bert-train", metric="step_ms", unit="ms", kind=kind, direction="lower",
                  outcome=Outcome.PASS, value=ms, ratio=1.0, log_se=0.03, df=8.0, pairs=6, value_se=se)
    return Point(run, check)


def test_each_machine_has_its_own_trend_at_its_commits_places_and_too_few_runs_have_none() -> None:
    a = [_point(i, ms, "cpu-a") for i, ms in zip((1, 2, 4, 5, 7), ISSUE_MS, strict=True)]
    b = [_point(i, 60.0 + i, "cpu-b") for i in (3, 6, 8)]  # another machine: 3 runs, no trend
    points = sorted(a + b, key=lambda p: p.run.date)
    analysis = analyze(points)
    [(machine, runs, trend)] = machine_trends(analysis, points)
    assert (machine, [p.run.commit for p in runs]) == ("cpu-a", [p.run.commit for p in a])
    assert trend.span == 6.0  # commits 1..7 of the series, whichever machine measured them
    # An exact metric's changes are change points, not a trend.
    exact = [_point(i, 100.0 + i, "cpu-a", se=None, kind="exact") for i in range(1, 7)]
    assert machine_trends(analyze(exact), exact) == []


# ---------------------------------------------------------------- history check, end to end


def _add_ab(tmp_path: Path, db: Path, values: tuple[float, ...], ratios: tuple[float, ...]) -> None:
    """One A/B run per commit 1..n against its parent on one machine, 6 pairs at a per-pair sd of 7.2 %."""
    spread = (0.07, -0.07, 0.05, -0.05, 0.02, -0.02)
    for i, (ms, r) in enumerate(zip(values, ratios, strict=True), start=1):
        path = ab_results(sha(i), sha(i - 1), [r * math.exp(d) for d in spread], step_ms=ms,
                          sd=0.072).write(tmp_path / f"ab{i}.json")
        code, text = cli("history", "add", str(path), "--db", str(db), "--date", date(i))
        assert code == ExitCode.OK, text


def test_check_fails_on_the_issues_creep_by_the_trend_of_one_machines_values(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    _add_ab(tmp_path, db, ISSUE_MS, ISSUE_RATIOS)
    code, text = cli("history", "check", "--since", sha(0), "--db", str(db), "--tolerance", "0.05")
    assert code == ExitCode.FAILED, text
    # The issue's chain read +14.1 % (-0.1 % to +30.3 %, 95 %) on each run's own sd and degrees of
    # freedom; pooled over the machine's 5 runs (25 df, counted once) it is judged at 99 %, where
    # 6 pairs at 7.2 % per pair still touch no change: the trend of the heads' values finds it.
    assert f"cumulative: encoder-train.step_ms on {DEVICE.identity}: +14.1% (-1.0% to +31.5%, 99%) over 5 merge(s)" in text
    # Each head's own se: 7.2 % / sqrt(6) / sqrt(2) = 2.08 %, above the line's residual sd (1.77 %).
    assert f"trend: encoder-train.step_ms on {DEVICE.identity}: +17.4% (+7.9% to +27.6%, 95%) over 5 runs" in text
    assert (f"REGRESSION encoder-train.step_ms on {DEVICE.identity} (ab): trend beyond 5% +17.4% (+7.9% to +27.6%) "
            f"over 5 runs; commits {sha(0)[:12]}..{sha(5)[:12]} (git bisect start {sha(5)[:12]} {sha(0)[:12]})") in text
    assert text.count("REGRESSION") == 1 and "1 regression(s)" in text


def test_check_passes_no_op_commits_with_the_same_noise(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    _add_ab(tmp_path, db, (40.5, 40.0, 39.3, 36.9, 40.0), (1.012, 0.985, 0.991, 1.004, 1.021))
    code, text = cli("history", "check", "--since", sha(0), "--db", str(db), "--tolerance", "0.05")
    assert code == ExitCode.OK, text
    assert f"trend: encoder-train.step_ms on {DEVICE.identity}: " in text and "over 5 runs of this machine" in text
    assert "no change point, drift, cumulative change or trend for the worse" in text


def test_a_stored_history_of_one_machine_has_a_trend_too(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    with HistoryStore(db) as store:
        for i, ms in enumerate(ISSUE_MS, start=1):
            rec = stored_results(ms).records[0].with_(ci=(ms * 0.98, ms * 1.02), ci_confidence=0.95)
            store.add(Run(commit=sha(i), parent=sha(i - 1), date=date(i), machine="cpu-x", mode="stored"),
                      [Check.from_record(rec)])
        [analysis] = [analyze(p) for p in [store.series("encoder-train", "step_ms")]]
    found, lines = findings_since(analysis, date(0), since_commit=sha(0))
    assert [f.what for f in found] == ["trend beyond 5%"] and found[0].machine == "cpu-x"
    assert lines[0].startswith("trend: encoder-train.step_ms on cpu-x: +17.4% (+9.3% to +26.0%, 95%)")


def test_readers_read_an_older_store_as_migrated_and_write_nothing(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    with sqlite3.connect(db) as raw:
        raw.executescript(_V1_TABLES.format(a=sha(1), b=sha(2), p=sha(0)))
    before = db.read_bytes()
    with HistoryStore(db, read_only=True) as store:
        ab, stored = store.series("k", "step_ms")
        assert ab.check.value_se == pytest.approx(0.02 / math.sqrt(2)) and stored.check.value_se is None
        assert (ab.check.pair_sd, stored.check.pair_sd) == (None, None)
        with pytest.raises(HistoryError, match=rf"^{db}: opened read-only: cannot add run"):
            store.add(Run(commit=sha(3), parent=sha(2), date=date(3), machine="cpu-x", mode="ab"), [])
    for argv in (["show", "k.step_ms"], ["report", "-o", str(tmp_path / "h.html")], ["check", "--since", sha(1)]):
        code, text = cli("history", *argv, "--db", str(db))
        assert code in (ExitCode.OK, ExitCode.FAILED), text
    assert db.read_bytes() == before  # still schema 1: `history add` migrates it
    with HistoryStore(db) as store:  # as the migrated store reads
        migrated = store.series("k", "step_ms")
    assert [p.check for p in migrated] == [ab.check, stored.check]
    with pytest.raises(HistoryError, match=rf"^{tmp_path / 'none.db'}: no history database"):
        HistoryStore(tmp_path / "none.db", read_only=True)
    assert not (tmp_path / "none.db").exists()
