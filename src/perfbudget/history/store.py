"""The history store: every run's checks by commit, machine and mode, in one versioned SQLite file."""

from __future__ import annotations

import contextlib
import math
import sqlite3
import statistics
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Literal
from urllib.parse import quote

from ..results import Record, Results
from ..vocabulary import Outcome, RunMode

__all__ = [
    "SCHEMA_VERSION",
    "Check",
    "HistoryError",
    "HistoryStore",
    "Mode",
    "Point",
    "Run",
    "by_machine",
    "checks_from_results",
    "mode_of",
    "utc_date",
]

SCHEMA_VERSION = 3
"""Version of the store's tables: bump it, with a step in :data:`_MIGRATIONS`, when they change in a
way this version would misread."""

_HEAD_SHARE = math.sqrt(0.5)
"""An A/B head's share of its per-pair standard error: a pair's ln(head/base) has both sides' variance,
equal in a lockstep run, so the head has half of it."""


def _add_value_se(db: sqlite3.Connection) -> None:
    """1 -> 2: the ``value_se`` column; an A/B row's from its ratio's standard error (what version 2
    computes for it), a stored row's left unknown (version 1 kept its interval, not the interval's coverage)."""
    db.execute("ALTER TABLE checks ADD COLUMN value_se REAL")
    db.execute("UPDATE checks SET value_se = log_se * ? WHERE log_se IS NOT NULL AND log_se > 0 AND value > 0",
               (_HEAD_SHARE,))


def _add_pair_sd(db: sqlite3.Connection) -> None:
    """2 -> 3: the ``pair_sd`` column, unknown for older rows (they kept the verdict's sd, pooled with
    its prior, not the pairs' own): their links keep their own standard error in the chain."""
    db.execute("ALTER TABLE checks ADD COLUMN pair_sd REAL")


_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _add_value_se, 2: _add_pair_sd}
"""``version -> step`` to ``version + 1``, run inside the write transaction."""

Mode = Literal["stored", "ab"]
"""How a run judged timing: against stored budgets (absolute values) or lockstep A/B (head/parent ratios)."""

BUSY_TIMEOUT_S = 60.0
"""How long a writer waits for another writer's transaction before giving up."""

MAX_ROW_BYTES = 1 << 20
"""The longest row read or written (perfbudget's hold a few short names): a crafted store's 100 MB row
is refused before it is read into memory (Python 3.11 and later, whose ``sqlite3`` sets the limit)."""

_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    commit_sha TEXT NOT NULL,
    parent_sha TEXT,
    date_utc TEXT NOT NULL,
    machine TEXT NOT NULL,
    mode TEXT NOT NULL CHECK (mode IN ('stored', 'ab')),
    source TEXT NOT NULL DEFAULT '',
    UNIQUE (commit_sha, machine, mode)
);
CREATE TABLE IF NOT EXISTS checks (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    nodeid TEXT NOT NULL,
    key TEXT NOT NULL,
    metric TEXT NOT NULL,
    unit TEXT NOT NULL,
    kind TEXT NOT NULL,
    direction TEXT NOT NULL,
    outcome TEXT NOT NULL,
    value REAL,
    ci_low REAL,
    ci_high REAL,
    ratio REAL,
    ratio_low REAL,
    ratio_high REAL,
    log_se REAL,
    df REAL,
    pairs INTEGER NOT NULL DEFAULT 0,
    value_se REAL,
    pair_sd REAL,
    PRIMARY KEY (run_id, nodeid, key, metric)
);
CREATE INDEX IF NOT EXISTS checks_by_name ON checks (key, metric);
"""

_TABLE_NAMES = ("meta", "runs", "checks")


class HistoryError(Exception):
    """The store cannot be read or written; the message names the file (and the key and value)."""


@dataclass(frozen=True, kw_only=True)
class Run:
    """One run kept in the history: which commit, measured where, how."""

    commit: str
    """Full SHA of the commit measured (the head of an A/B run)."""
    parent: str | None
    """Its first parent (the base of an A/B run), when known."""
    date: str
    """Commit date, UTC, ``2026-12-02T04:26:29Z``: the history's order."""
    machine: str
    """Machine identity (:attr:`perfbudget.device.DeviceInfo.identity`) the run was measured on."""
    mode: Mode
    """``stored`` (absolute values) or ``ab`` (head/parent ratios measured in one job)."""
    source: str = ""
    """The results file it came from."""

    def __post_init__(self) -> None:
        if self.mode not in ("stored", "ab"):
            raise ValueError(f"mode: expected 'stored' or 'ab', got {self.mode!r}")
        if not self.commit:
            raise ValueError("commit: expected a commit SHA, got an empty string")

    @property
    def short(self) -> str:
        """The commit's first 8 hex digits, for labels."""
        return self.commit[:8]


@dataclass(frozen=True, kw_only=True)
class Check:
    """One check of one run, as the history keeps it (a results :class:`~perfbudget.results.Record`, reduced)."""

    nodeid: str
    key: str
    metric: str
    unit: str = ""
    kind: str = ""
    direction: str = ""
    """``lower`` (times: up is worse) or ``higher`` (rates); empty when the metric is unknown."""
    outcome: Outcome
    value: float | None = None
    """The head's value, in ``unit``."""
    ci: tuple[float, float] | None = None
    """Interval of ``value`` (stored mode: the median's CI)."""
    ratio: float | None = None
    """A/B: head / parent."""
    ratio_ci: tuple[float, float] | None = None
    """A/B: the ratio's CI."""
    log_se: float | None = None
    """A/B: standard error of ln(ratio) (per-pair sd / sqrt(pairs)); what chaining adds up."""
    df: float | None = None
    """A/B: degrees of freedom behind ``log_se``."""
    pairs: int = 0
    """A/B: process pairs behind the ratio."""
    value_se: float | None = None
    """The run's own standard error of ln(``value``) (an A/B head's: ``log_se / sqrt(2)``); ``None``
    when the run does not say (an exact metric, a value of 0, an older store)."""
    pair_sd: float | None = None
    """A/B: the sample sd of the pairs' own ln(head/base), which :func:`~perfbudget.history.chain.pooled`
    pools over a machine's runs; ``None`` with fewer than 2 pairs or from an older store."""

    @property
    def name(self) -> str:
        """``encoder-train.step_ms``: what ``history show`` takes."""
        return f"{self.key}.{self.metric}"

    @classmethod
    def from_record(cls, r: Record) -> Check:
        """Reduce a results record, its A/B comparison as :class:`perfbudget.results.BaseSide` keeps it."""
        ratio = ratio_ci = log_se = df = pair_sd = None
        pairs = 0
        b = r.vs_base
        if b is not None and b.ratio is not None and _positive(b.ratio):
            ratio, pairs, df, log_se = b.ratio, b.pairs, b.df, b.log_se
            logs = [math.log(x) for x in b.pair_ratios if _positive(x)]
            if len(logs) >= 2 and len(logs) == len(b.pair_ratios):
                pair_sd = statistics.stdev(logs)
            if b.ratio_ci is not None and all(_positive(x) for x in b.ratio_ci):
                ratio_ci = b.ratio_ci
        value = r.value if r.value is not None and math.isfinite(r.value) else None
        ci = r.ci if r.ci is not None and all(math.isfinite(x) for x in r.ci) else None
        value_se = None
        if value is not None and value > 0:
            value_se = log_se * _HEAD_SHARE if log_se is not None else r.value_log_se
        return cls(nodeid=r.nodeid, key=r.key, metric=r.metric, unit=r.unit, kind=r.kind, direction=r.direction,
                   outcome=Outcome(r.outcome), value=value, ci=ci, ratio=ratio, ratio_ci=ratio_ci, log_se=log_se,
                   df=df, pairs=pairs, value_se=value_se, pair_sd=pair_sd)


def _positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


@dataclass(frozen=True)
class Point:
    """One check of one run: a point of a series."""

    run: Run
    check: Check


def mode_of(results: Results) -> Mode:
    """``ab`` for the results of ``perfbudget ab``, else ``stored``."""
    return "ab" if results.meta.mode == RunMode.AB else RunMode.STORED.value


def checks_from_results(results: Results) -> list[Check]:
    """Every record of ``results`` as a :class:`Check` (records of one check on several nodeids are kept apart)."""
    return [Check.from_record(r) for r in results.records]


def utc_date(text: str) -> str:
    """An ISO 8601 date (``2026-12-02T05:26:29+01:00``) as UTC with a ``Z``; a date without an offset is UTC.

    Raises:
        ValueError: naming the text.
    """
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"expected an ISO 8601 date such as 2026-12-02T05:26:29+01:00, got {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class HistoryStore:
    """The history in one SQLite file: opened (created when missing), checked, read and written.

    Each write is one ``BEGIN IMMEDIATE`` transaction, so writers queue instead of failing half-way;
    the default rollback journal (not WAL) keeps it atomic and the store one file, as a branch keeps it.

    Args:
        path: the database file; created with its folder when missing, unless ``read_only``.
        timeout_s: how long to wait for another writer.
        read_only: the file must exist and hold a history; an older schema is migrated in a copy in
            memory, the file left as it is.

    Raises:
        HistoryError: not a history store, corrupt, newer than :data:`SCHEMA_VERSION`, or locked or
            unwritable now, saying which.
    """

    def __init__(self, path: str | Path, *, timeout_s: float = BUSY_TIMEOUT_S, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self._timeout_s = timeout_s
        if self.path.is_dir():
            raise HistoryError(f"{self.path}: is a folder, not a history database")
        if read_only and not self.path.is_file():
            raise HistoryError(f"{self.path}: no history database")
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # isolation_level=None: this class opens and ends every transaction itself.
            where, uri = (f"file:{quote(str(self.path.resolve()))}?mode=ro", True) if read_only else (str(self.path), False)
            self._db = _hardened(sqlite3.connect(where, timeout=timeout_s, isolation_level=None, uri=uri))
        except sqlite3.Error as exc:
            raise HistoryError(f"{self.path}: cannot open: {exc}") from None
        try:
            self._db.execute("PRAGMA foreign_keys = ON")
            self._open()
        except sqlite3.OperationalError as exc:  # locked, read-only, unreachable: nothing says it is corrupt
            self._db.close()
            raise HistoryError(_cannot(self.path, "open it", exc, timeout_s)) from None
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise HistoryError(f"{self.path}: not a readable history database ({exc}); restore it from "
                               "the history branch or move it aside to start a new one") from None
        except BaseException:
            self._db.close()
            raise

    # ------------------------------------------------------------------ schema

    def _open(self) -> None:
        # The store comes from a branch anyone with push access may write: SQL of its own (a trigger
        # runs on each write, a view on each read) is refused before anything is read or written.
        found = self._db.execute("SELECT type, name FROM sqlite_master WHERE type IN ('trigger', 'view') "
                                 "ORDER BY type, name").fetchone()
        if found is not None:
            raise HistoryError(f"{self.path}: {found[0]} {found[1]!r}: not one perfbudget creates (it would run "
                               "SQL of its own on the store): refused; restore the store from the history branch "
                               "or move it aside to start a new one")
        check = self._db.execute("PRAGMA quick_check").fetchone()
        if check is None or check[0] != "ok":
            raise HistoryError(f"{self.path}: corrupt database: {check[0] if check else 'no answer'}; restore it "
                               "from the history branch or move it aside to start a new one")
        version = self._version()
        if version == SCHEMA_VERSION:
            return
        if self.read_only:
            if version is None:
                raise HistoryError(f"{self.path}: an empty database, no history yet: keep a run first "
                                   f"(perfbudget history add RESULTS.json --db {self.path})")
            # Read as migrated: the same migrations, on a copy in memory; the file stays as it is.
            memory = _hardened(sqlite3.connect(":memory:", isolation_level=None))
            self._db.backup(memory)
            self._db.close()
            self._db = memory
        with self._write():
            version = self._version()  # another process may have created or migrated it meanwhile
            if version is None:
                for statement in _TABLES.split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                                 (str(SCHEMA_VERSION),))
                return
            while version < SCHEMA_VERSION:
                _MIGRATIONS[version](self._db)
                version += 1
                self._db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),))

    def _version(self) -> int | None:
        """The stored schema version; ``None`` for a new (empty) database.

        Raises:
            HistoryError: a database of other tables, a missing or bad version, or a newer one.
        """
        tables = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            return None
        if "meta" not in tables:
            raise HistoryError(f"{self.path}: not a perfbudget history database (no meta table; tables: "
                               f"{', '.join(sorted(tables))})")
        row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        raw = None if row is None else row[0]
        if raw is None or not str(raw).isdigit() or int(raw) < 1:
            raise HistoryError(f"{self.path}: schema_version: expected a positive integer, got {raw!r}")
        version = int(raw)
        if version > SCHEMA_VERSION:
            raise HistoryError(f"{self.path}: schema_version {version} is newer than this perfbudget reads "
                               f"({SCHEMA_VERSION}); upgrade perfbudget to read it")
        missing = [t for t in _TABLE_NAMES if t not in tables]
        if missing and (version == SCHEMA_VERSION or self.read_only):
            raise HistoryError(f"{self.path}: schema_version {version} but no {', '.join(missing)} table")
        return version

    # ------------------------------------------------------------------ writing

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        """One write transaction: the write lock first (``BEGIN IMMEDIATE``), all or nothing."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def add(self, run: Run, checks: Iterable[Check]) -> int:
        """Keep ``run`` and its checks in one transaction, replacing the same commit, machine and mode's.

        Returns:
            The number of checks written.

        Raises:
            HistoryError: opened read-only, or the write failed (locked, no permission, a full disk).
        """
        if self.read_only:
            raise HistoryError(f"{self.path}: opened read-only: cannot add run {run.short}")
        written = 0
        try:
            with self._write():
                self._db.execute("DELETE FROM runs WHERE commit_sha = ? AND machine = ? AND mode = ?",
                                 (run.commit, run.machine, run.mode))
                cur = self._db.execute(
                    "INSERT INTO runs (commit_sha, parent_sha, date_utc, machine, mode, source) VALUES (?, ?, ?, ?, ?, ?)",
                    (run.commit, run.parent, utc_date(run.date), run.machine, run.mode, run.source))
                run_id = cur.lastrowid
                for c in checks:
                    self._db.execute(
                        f"INSERT OR REPLACE INTO checks (run_id, {_CHECK_COLUMNS}) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (run_id, c.nodeid, c.key, c.metric, c.unit, c.kind, c.direction, str(c.outcome), c.value,
                         *(c.ci or (None, None)), c.ratio, *(c.ratio_ci or (None, None)), c.log_se, c.df, c.pairs,
                         c.value_se, c.pair_sd))
                    written += 1
        except (sqlite3.OperationalError, sqlite3.DataError) as exc:  # locked past the busy timeout, a full disk
            raise HistoryError(_cannot(self.path, f"write run {run.short} on {run.machine}", exc,
                                       self._timeout_s)) from None
        return written

    # ------------------------------------------------------------------ reading

    def _read(self, sql: str, params: Sequence[object] = ()) -> list[tuple[object, ...]]:
        """The rows of one query; a writer's lock held past the busy timeout is a :class:`HistoryError`."""
        try:
            return self._db.execute(sql, params).fetchall()
        except (sqlite3.OperationalError, sqlite3.DataError) as exc:  # DataError: a row past MAX_ROW_BYTES
            raise HistoryError(_cannot(self.path, "read it", exc, self._timeout_s)) from None

    def runs(self) -> list[Run]:
        """Every run, oldest commit first."""
        return [_run(row) for row in self._read(f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY date_utc, id")]

    def names(self) -> list[tuple[str, str]]:
        """``(key, metric)`` of every check kept, sorted."""
        return [(str(k), str(m)) for k, m in self._read("SELECT DISTINCT key, metric FROM checks ORDER BY key, metric")]

    def series(self, key: str, metric: str) -> list[Point]:
        """Every point of one check, oldest commit first, all machines and modes (see :func:`by_machine`)."""
        rows = self._read(
            f"SELECT {_RUN_COLUMNS}, {_CHECK_COLUMNS} FROM checks JOIN runs ON runs.id = checks.run_id "
            "WHERE key = ? AND metric = ? ORDER BY date_utc, runs.id, nodeid", (key, metric))
        return [Point(_run(row[:6]), _check(row[6:])) for row in rows]

    def resolve(self, ref: str) -> list[str]:
        """Stored commits whose SHA starts with ``ref``."""
        like = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        return [str(c) for (c,) in self._read(
            "SELECT DISTINCT commit_sha FROM runs WHERE commit_sha LIKE ? ESCAPE '\\'", (like,))]

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, tp: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _hardened(db: sqlite3.Connection) -> sqlite3.Connection:
    """``db`` trusting no function of the store's schema, its rows bounded by :data:`MAX_ROW_BYTES`."""
    db.execute("PRAGMA trusted_schema = OFF")
    if sys.version_info >= (3, 11):  # sqlite3 sets limits since
        db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_ROW_BYTES)
    return db


def _cannot(path: Path, doing: str, exc: sqlite3.OperationalError | sqlite3.DataError, timeout_s: float) -> str:
    """What an operational error (no corruption) means for the history, which it leaves intact."""
    text = str(exc)
    if isinstance(exc, sqlite3.DataError):
        return (f"{path}: cannot {doing}: {text}: a row longer than {MAX_ROW_BYTES} bytes, which perfbudget never "
                "writes; restore the store from the history branch or move it aside")
    if "locked" in text or "busy" in text:
        return (f"{path}: cannot {doing}: {text}: another process (a `perfbudget history add`?) held it for more "
                f"than the {timeout_s:g} s busy timeout; retry when it has finished")
    if "readonly" in text or "read-only" in text:
        return (f"{path}: cannot {doing}: {text}: this user may not write the file, or its folder (a writer's "
                "journal goes there); check their permissions")
    return f"{path}: cannot {doing}: {text}"


_RUN_COLUMNS = "commit_sha, parent_sha, date_utc, machine, mode, source"
_CHECK_COLUMNS = ("nodeid, key, metric, unit, kind, direction, outcome, value, ci_low, ci_high, ratio, ratio_low, "
                  "ratio_high, log_se, df, pairs, value_se, pair_sd")


def _run(row: Sequence[object]) -> Run:
    commit, parent, date, machine, mode, source = row
    return Run(commit=str(commit), parent=None if parent is None else str(parent), date=str(date),
               machine=str(machine), mode="ab" if mode == "ab" else "stored", source=str(source))


def _float(x: object) -> float | None:
    return None if x is None else float(x)  # type: ignore[arg-type]


def _pair(lo: object, hi: object) -> tuple[float, float] | None:
    low, high = _float(lo), _float(hi)
    return None if low is None or high is None else (low, high)


def _check(row: Sequence[object]) -> Check:
    (nodeid, key, metric, unit, kind, direction, outcome, value, ci_low, ci_high, ratio, ratio_low, ratio_high,
     log_se, df, pairs, value_se, pair_sd) = row
    return Check(nodeid=str(nodeid), key=str(key), metric=str(metric), unit=str(unit), kind=str(kind),
                 direction=str(direction), outcome=Outcome(outcome), value=_float(value), ci=_pair(ci_low, ci_high),
                 ratio=_float(ratio), ratio_ci=_pair(ratio_low, ratio_high), log_se=_float(log_se), df=_float(df),
                 pairs=int(pairs), value_se=_float(value_se), pair_sd=_float(pair_sd))  # type: ignore[call-overload]


def by_machine(points: Iterable[Point]) -> dict[tuple[str, Mode], list[Point]]:
    """Points grouped into series, each in the order given: stored runs by ``(machine, "stored")``
    (absolute values of two machines are not one series), A/B runs all in ``("", "ab")``: each
    head/parent ratio was measured within one machine, so the chain runs across machines."""
    out: dict[tuple[str, Mode], list[Point]] = {}
    for p in points:
        out.setdefault((p.run.machine if p.run.mode == "stored" else "", p.run.mode), []).append(p)
    return out
