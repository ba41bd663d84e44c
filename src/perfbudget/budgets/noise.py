"""Each check's measured A/B noise, kept beside the budgets: ``budgets/noise/<identity>.yaml``."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from ..fileio import atomic_write, shown_path
from ..measure.stats import t_quantile
from .loader import _Doc, _finite, read_text, subfolder
from .schema import BudgetError

__all__ = [
    "COUNT_TOLERANCE_FLOOR",
    "NOISE_DIR",
    "NOISE_SCHEMA",
    "CheckNoise",
    "NoiseTable",
    "load_noise",
    "noise_path",
]

NOISE_SCHEMA = 1
#: The folder of noise files inside a budgets folder (budget loading reads only ``*.yaml`` at its top).
NOISE_DIR = "noise"
#: A calibrated count tolerance never goes below this (0.01 %): the counts' own rounding.
COUNT_TOLERANCE_FLOOR = 1e-4
#: Confidence of a calibrated count tolerance: an A/A pair of counts exceeds it 1 time in 200.
COUNT_TOLERANCE_CONFIDENCE = 0.995


@dataclass(frozen=True, kw_only=True)
class CheckNoise:
    """One check's measured spread of ``ln(head/base)``.

    Attributes:
        ss: sum of squared deviations (about each run's mean for ``pairs``, about 0 for ``runs``).
        runs: results files that contributed.
        spread: ``pairs`` (within runs: statistical checks) or ``runs`` (one ratio per A/A run: counts).
    """

    ss: float
    df: float
    runs: int
    spread: str = "pairs"

    @property
    def sd(self) -> float:
        return math.sqrt(self.ss / self.df) if self.df > 0 else math.nan

    def pooled(self, other: CheckNoise) -> CheckNoise:
        return CheckNoise(ss=self.ss + other.ss, df=self.df + other.df, runs=self.runs + other.runs,
                          spread=self.spread)

    def count_tolerance(self) -> float | None:
        """A count's tolerance against its base at :data:`COUNT_TOLERANCE_CONFIDENCE` (``None``: df < 2)."""
        if self.spread != "runs" or self.df < 2:
            return None
        half = t_quantile(0.5 + COUNT_TOLERANCE_CONFIDENCE / 2.0, self.df) * self.sd
        return max(COUNT_TOLERANCE_FLOOR, math.expm1(half))


@dataclass(frozen=True, kw_only=True)
class NoiseTable:
    """The measured noise of one machine identity's checks."""

    identity: str
    checks: Mapping[tuple[str, str], CheckNoise] = field(default_factory=dict)
    """``(key, metric)`` -> its noise."""
    provenance: tuple[Mapping[str, Any], ...] = ()
    """One entry per results file pooled: its commits, date, pairs and whether it was an A/A."""
    path: Path | None = None

    @property
    def where(self) -> str:
        return shown_path(self.path) if self.path is not None else f"{NOISE_DIR}/{self.identity}.yaml"

    def get(self, key: str, metric: str) -> CheckNoise | None:
        return self.checks.get((key, metric))

    @property
    def bursts_ms(self) -> frozenset[float]:
        """The turn lengths pooled here: a check's spread depends on it (benchmarks/burst-length-cpu.md)."""
        return frozenset(float(p["burst_ms"]) for p in self.provenance if p.get("burst_ms") is not None)

    @property
    def turns_text(self) -> str:
        """``100 ms`` (``100 ms and 400 ms`` for a file that pools both): :attr:`bursts_ms` in words."""
        return " and ".join(f"{b:g} ms" for b in sorted(self.bursts_ms))

    def pooled(self, other: NoiseTable) -> NoiseTable:
        if other.identity != self.identity:
            raise ValueError(f"cannot pool noise of {other.identity} into {self.identity}")
        if self.bursts_ms and other.bursts_ms and self.bursts_ms != other.bursts_ms:
            raise ValueError(f"{self.where}: measured in turns of {self.turns_text}, the new runs in turns of "
                             f"{other.turns_text}: a spread holds for its turn length; start the file over "
                             "(--replace) with runs of one length")
        checks = dict(self.checks)
        for cid, n in other.checks.items():
            checks[cid] = checks[cid].pooled(n) if cid in checks else n
        return replace(self, checks=checks, provenance=(*self.provenance, *other.provenance))

    def to_yaml(self) -> str:
        checks: dict[str, dict[str, dict[str, Any]]] = {}
        for (key, metric), n in sorted(self.checks.items()):
            checks.setdefault(key, {})[metric] = {
                "sd": float(f"{n.sd:.6g}"), "df": n.df, "ss": float(f"{n.ss:.10g}"), "runs": n.runs,
                "spread": n.spread}
        doc = {"schema": NOISE_SCHEMA, "identity": self.identity, "checks": checks,
               "provenance": [dict(p) for p in self.provenance]}
        head = ("# perfbudget measured noise (schema 1): each check's spread of ln(head/base) on this machine\n"
                "# identity, written by `perfbudget calibrate` from A/B results files; never edit by hand.\n")
        return head + yaml.safe_dump(doc, sort_keys=False, width=120)

    def write(self, budgets_dir: str | Path) -> Path:
        """Write the table to ``<budgets_dir>/noise/<identity>.yaml``; returns the path.

        Raises:
            BudgetError: ``noise`` is a symbolic link or leads out of ``budgets_dir`` (:func:`~.loader.subfolder`).
        """
        path = noise_path(budgets_dir, self.identity)
        path.parent.mkdir(parents=True, exist_ok=True)
        return atomic_write(path, self.to_yaml())


def noise_path(budgets_dir: str | Path, identity: str) -> Path:
    """Where the noise of ``identity`` is kept (its folder checked by :func:`~.loader.subfolder`)."""
    return subfolder(budgets_dir, NOISE_DIR) / f"{identity}.yaml"


def load_noise(budgets_dir: str | Path) -> dict[str, NoiseTable]:
    """Every noise file of ``budgets_dir``, by identity (none when the folder has no ``noise/``).

    Raises:
        BudgetError: a ``noise`` folder or file refused as budget files are, or a bad entry
            (naming file, line, key, value).
    """

    folder = subfolder(budgets_dir, NOISE_DIR)
    tables: dict[str, NoiseTable] = {}
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]) if folder.is_dir() else ():
        table = _parse(path, budgets_dir)
        if table.identity in tables:
            raise BudgetError(f"a second noise file for {table.identity} (the first is {tables[table.identity].where})",
                              path=path, keypath=("identity",), value=table.identity)
        tables[table.identity] = table
    return tables


def _parse(path: Path, budgets_dir: str | Path) -> NoiseTable:
    """One noise file, read and parsed as budget files are (:func:`~.loader.read_text`, the loader's YAML)."""
    doc = _Doc(read_text(path, budgets_dir), path)

    def fail(message: str, keypath: tuple[str, ...], value: Any) -> BudgetError:
        return BudgetError(message, path=path, line=doc.line(keypath), keypath=keypath, value=value)

    data = doc.data
    if not isinstance(data, dict):
        raise fail("expected a mapping with schema, identity and checks", (), data)
    if data.get("schema") != NOISE_SCHEMA:
        raise fail(f"expected schema {NOISE_SCHEMA}", ("schema",), data.get("schema"))
    identity = data.get("identity")
    if not isinstance(identity, str) or not identity or identity != path.stem:
        raise fail(f"expected the identity the file is named after ({path.stem!r})", ("identity",), identity)
    raw = data.get("checks") or {}
    if not isinstance(raw, dict):
        raise fail("expected a mapping of key -> metric -> noise", ("checks",), raw)
    checks: dict[tuple[str, str], CheckNoise] = {}
    for key, metrics in raw.items():
        if not isinstance(metrics, dict):
            raise fail("expected a mapping of metric -> noise", ("checks", key), metrics)
        for metric, entry in metrics.items():
            kp = ("checks", key, metric)
            if not isinstance(entry, dict):
                raise fail("expected a mapping with ss, df, runs", kp, entry)
            got: dict[str, Any] = {"spread": "pairs", **entry}
            for name, (want, ok) in _WANTS.items():
                if not ok(got.get(name)):
                    raise fail(f"expected {want}", (*kp, name), got.get(name))
            checks[(key, metric)] = CheckNoise(ss=float(got["ss"]), df=float(got["df"]), runs=int(got["runs"]),
                                               spread=str(got["spread"]))
    prov = data.get("provenance") or []
    if not isinstance(prov, list) or not all(isinstance(p, dict) for p in prov):
        raise fail("expected a list of mappings", ("provenance",), prov)
    for i, p in enumerate(prov):
        if p.get("burst_ms") is not None and not (_finite(p["burst_ms"]) and p["burst_ms"] > 0):
            raise fail("expected a number of milliseconds > 0", ("provenance", str(i), "burst_ms"), p["burst_ms"])
    return NoiseTable(identity=identity, checks=checks, provenance=tuple(prov), path=path)


#: Each field of a check's noise: what it must be, and the test.
_WANTS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "ss": ("a number >= 0", lambda v: _finite(v) and v >= 0),
    "df": ("a number > 0", lambda v: _finite(v) and v > 0),
    "runs": ("an integer > 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0),
    "spread": ("'pairs' or 'runs'", lambda v: v in ("pairs", "runs")),
}
