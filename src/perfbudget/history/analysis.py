"""One check's history analysed (level shifts, the chain of A/B ratios, drifts) and what it finds since a commit."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..metrics import Direction
from ..report.common import fmt_tolerance
from ..verdict.rule import SERIES_TOLERANCE, Limits, settle
from .chain import Cumulative, Gap, Link, chain_of, cumulative, cumulative_series, pooled
from .changepoints import ChangeConfig, Drift, Shift, chained_drifts, level_shifts
from .store import HistoryStore, Mode, Point, Run, by_machine
from .trend import MIN_TREND_POINTS, TREND_KINDS, Trend, level_trend

__all__ = ["Finding", "SeriesAnalysis", "analyze", "analyze_store", "chain_gaps_since", "findings_since",
           "machine_trends"]


@dataclass(frozen=True, kw_only=True)
class SeriesAnalysis:
    """One check on one machine in one mode, analysed."""

    key: str
    metric: str
    machine: str
    """The machine identity; for A/B history, the one machine or ``N machines``."""
    mode: Mode
    unit: str
    direction: str
    points: list[Point]
    """Points with a value, oldest first: what :attr:`shifts` index."""
    shifts: list[Shift]
    """Level shifts of the values (meaningful for stored runs on a stable machine, and for exact metrics)."""
    links: list[Link] = field(default_factory=list)
    """A/B: the chain of head/parent ratios, oldest merge first."""
    cumulative: list[Cumulative] = field(default_factory=list)
    """A/B: the change since the chain's start at each link."""
    drifts: list[Drift] = field(default_factory=list)
    """A/B: runs of merges in :attr:`links` that changed the level."""
    gaps: list[str] = field(default_factory=list)
    """What was not searched or chained, as notes: each of :attr:`chain_gaps`, values of several machines."""
    chain_gaps: list[Gap] = field(default_factory=list)
    """A/B: where the chain stops at unmeasured commits, newest first (:attr:`links` start at the first)."""

    @property
    def name(self) -> str:
        return f"{self.key}.{self.metric}"

    def worse(self, change: float) -> bool:
        """Whether a relative change is a regression for this metric (either way when its direction is unknown)."""
        if self.direction == "lower":
            return change > 0
        if self.direction == "higher":
            return change < 0
        return change != 0


def analyze(points: Sequence[Point], *, config: ChangeConfig | None = None, confidence: float = 0.95) -> SeriesAnalysis:
    """Analyse one check's points of one machine and mode (oldest first): level shifts of stored runs'
    values; for A/B runs, drifts of the chained head/parent ratios (sd pooled per machine identity), as
    their absolute values are mostly noise, except for exact checks, which have no interval.

    Raises:
        ValueError: points of two series (:func:`~perfbudget.history.store.by_machine`), or none.
    """
    if not points:
        raise ValueError("analyze needs at least one point, got none")
    groups = by_machine(points)
    if len(groups) != 1:
        raise ValueError(f"analyze takes one series (stored runs of one machine, or A/B runs), got {sorted(groups)}")
    config = config or ChangeConfig()
    first = points[0]
    valued = [p for p in points if p.check.value is not None and p.check.value >= 0]
    links, chain_gaps = chain_of(points) if first.run.mode == "ab" else ([], [])
    gaps = [str(g) for g in chain_gaps]
    links = pooled(links, points)
    machines = sorted({p.run.machine for p in points})
    shifts: list[Shift] = []
    if not links and len(machines) == 1:
        shifts = level_shifts([p.check.value or 0.0 for p in valued], se=[p.check.value_se for p in valued],
                              config=config)
    elif not links:
        gaps = [*gaps, f"values from {len(machines)} machines and no head/parent intervals: not searched"]
    drifts = chained_drifts([link.log_ratio for link in links], [link.log_se for link in links],
                            None if any(link.df is None for link in links) else [link.df or 0.0 for link in links],
                            config=config, sources=[link.noise for link in links],
                            shared_dfs=[link.shared_df for link in links]) if links else []
    machine = machines[0] if len(machines) == 1 else f"{len(machines)} machines"
    return SeriesAnalysis(key=first.check.key, metric=first.check.metric, machine=machine,
                          mode=first.run.mode, unit=first.check.unit, direction=first.check.direction,
                          points=valued, shifts=shifts, links=links,
                          cumulative=cumulative_series(links, confidence=confidence), drifts=drifts, gaps=gaps,
                          chain_gaps=chain_gaps)


def analyze_store(store: HistoryStore, *, config: ChangeConfig | None = None, confidence: float = 0.95,
                  names: Sequence[tuple[str, str]] | None = None, machine: str | None = None) -> list[SeriesAnalysis]:
    """Every check of the store (or of ``names``; ``machine``'s runs only), analysed per machine and mode."""
    out = []
    for key, metric in names if names is not None else store.names():
        points = [p for p in store.series(key, metric) if machine is None or p.run.machine == machine]
        for (_, _), series in sorted(by_machine(points).items()):
            out.append(analyze(series, config=config, confidence=confidence))
    return out


@dataclass(frozen=True, kw_only=True)
class Finding:
    """A regression ``history check`` reports: which check, what changed, which commits to bisect."""

    check: str
    """``encoder-train.step_ms``."""
    machine: str
    mode: Mode
    what: str
    """``change point``, ``drift`` or ``cumulative``."""
    change: float
    """Relative change (0.1: +10 %); infinite from a level of 0."""
    ci: tuple[float, float] | None
    """Its interval as a ratio, where it has one."""
    good: str
    """The last commit before the change (``git bisect good``)."""
    bad: str
    """The first commit at the new level, or the last of a drift (``git bisect bad``)."""
    merges: int = 1
    over: str = "merges"
    """What :attr:`merges` counts: ``merges``, or ``runs`` of one machine for a trend."""

    def describe(self) -> str:
        ci = f" ({self.ci[0] - 1:+.1%} to {self.ci[1] - 1:+.1%})" if self.ci else ""
        span = f" over {self.merges} {self.over}" if self.merges > 1 else ""
        change = f"{self.change:+.1%}" if math.isfinite(self.change) else f"from 0 ({self.change:+})"
        return (f"{self.check} on {self.machine} ({self.mode}): {self.what} {change}{ci}{span}; "
                f"commits {self.good[:12]}..{self.bad[:12]} (git bisect start {self.bad[:12]} {self.good[:12]})")


def first_after(runs: Sequence[Run], commit: str) -> int | None:
    """Index of the first run after ``commit``'s last run, else of its first child run, else ``None``."""
    own = [i for i, r in enumerate(runs) if r.commit == commit]
    if own:
        return own[-1] + 1
    return next((i for i, r in enumerate(runs) if r.parent == commit), None)


def machine_trends(analysis: SeriesAnalysis, window: Sequence[Point], *,
                   confidence: float = 0.95) -> list[tuple[str, list[Point], Trend]]:
    """``(machine, its points, trend)`` of each machine's values among ``window`` (points of ``analysis``,
    oldest first), for :data:`~perfbudget.history.trend.TREND_KINDS` and machines with enough runs > 0.
    Positions count every commit of the series, so commits another machine measured are gaps."""
    if not analysis.points or analysis.points[0].check.kind not in TREND_KINDS:
        return []
    position: dict[str, int] = {}
    for p in analysis.points:
        position.setdefault(p.run.commit, len(position))
    machines: dict[str, list[Point]] = {}
    for p in window:
        machines.setdefault(p.run.machine, []).append(p)
    out = []
    for machine, points in sorted(machines.items()):
        if len(points) < MIN_TREND_POINTS or not all((p.check.value or 0) > 0 for p in points):
            continue
        xs = [float(position[p.run.commit]) for p in points]
        if max(xs) == min(xs):
            continue
        ses = [p.check.value_se for p in points]
        trend = level_trend(xs, [math.log(p.check.value or 1.0) for p in points],
                            None if any(s is None or not s > 0 for s in ses) else [float(s or 0) for s in ses],
                            confidence=confidence)
        out.append((machine, points, trend))
    return out


CUMULATIVE_CONFIDENCE = 0.99
"""Two-sided coverage of the cumulative chained ratio ``history check`` judges: false alarms near 1 %
beside the drifts and the trend (``benchmarks/history-sim.md``)."""


def _judged_direction(direction: str, change: float) -> Direction:
    """The metric's direction, else (unknown) the one that makes the change's own side the worse."""
    if direction in ("lower", "higher"):
        return "lower" if direction == "lower" else "higher"
    return "higher" if change < 0 else "lower"


def _after(analysis: SeriesAnalysis, since_date: str, since_commit: str | None) -> Callable[[Run], bool]:
    """Whether a run came after the ref: by :func:`first_after`, else dated after ``since_date``."""
    pts = analysis.points
    first = first_after([p.run for p in pts], since_commit) if since_commit else None
    later_commits = {p.run.commit for p in pts[first:]} if first is not None else None

    def after(run: Run) -> bool:
        return run.commit in later_commits if later_commits is not None else run.date > since_date

    return after


def _unreached(analysis: SeriesAnalysis, after: Callable[[Run], bool], since_commit: str | None) -> list[str]:
    links = analysis.links
    later = [link for link in links if after(link.point.run)]
    if not later or later[0] is not links[0] or (since_commit is not None and links[0].parent == since_commit):
        return []  # nothing after the ref, or the chain holds the ref's run or starts right after it
    gaps = [g for g in analysis.chain_gaps if after(g.run) and g.parent != since_commit]
    if gaps:
        return [f"gap: {analysis.name}: {g}" for g in gaps]
    if since_commit is None:
        return []  # by date alone: whether the chain's first parent came after the ref is not known
    return [f"gap: {analysis.name}: the chain starts at {links[0].commit[:8]} (against {(links[0].parent or 'none')[:8]}), "
            f"after {since_commit[:8]}: no A/B run of this check reaches back to it"]


def chain_gaps_since(analysis: SeriesAnalysis, since_date: str, *, since_commit: str | None = None) -> list[str]:
    """Why the A/B chain does not reach back to the ref (``since_commit``, else ``since_date``), one
    ``gap: CHECK: ...`` line each; empty when it does, or nothing after the ref is chained."""
    return _unreached(analysis, _after(analysis, since_date, since_commit), since_commit)


def findings_since(analysis: SeriesAnalysis, since_date: str, *, since_commit: str | None = None,
                   tolerance: float = SERIES_TOLERANCE, confidence: float = 0.95,
                   cumulative_confidence: float = CUMULATIVE_CONFIDENCE) -> tuple[list[Finding], list[str]]:
    """Regressions after the ``since_commit`` run (else after ``since_date``, UTC): level shifts and
    drifts for the worse, a cumulative chained ratio whose whole interval is worse than no change and
    whose estimate is beyond the tolerance (a creep of merges that each passed), and a machine's trend
    (:func:`machine_trends`) whose interval lies entirely beyond it.

    The series' order places the commit, not its date: commits within one second share a date.

    Returns:
        ``(findings, lines)``: lines of the cumulative change, its gaps and each machine's trend.
    """
    out = []
    base = dict(check=analysis.name, machine=analysis.machine, mode=analysis.mode)
    pts = analysis.points
    after = _after(analysis, since_date, since_commit)
    lines: list[str] = []
    for s in analysis.shifts:
        if after(pts[s.index].run) and analysis.worse(s.change):
            out.append(Finding(**base, what="change point", change=s.change, ci=None,  # type: ignore[arg-type]
                               good=pts[s.index - 1].run.commit, bad=pts[s.index].run.commit))
    links = analysis.links
    for d in analysis.drifts:
        if after(links[d.last].point.run) and analysis.worse(d.change):
            out.append(Finding(**base, what="drift", change=d.change, ci=d.ci,  # type: ignore[arg-type]
                               good=links[d.first].parent or links[d.first].commit, bad=links[d.last].commit,
                               merges=d.last - d.first + 1))
    later = [link for link in links if after(link.point.run)]
    if later:
        cum = cumulative(later, confidence=cumulative_confidence)
        lo, hi = cum.ci
        direction = _judged_direction(analysis.direction, cum.change)
        limits = Limits.around(1.0, tolerance, direction)
        beyond = settle(lo, hi, limits, evidence="history", estimate=cum.ratio) == "fail"
        gaps = _unreached(analysis, after, since_commit)
        ref = since_commit[:12] if since_commit else since_date
        reach = (f" only: the chain does not reach back to {ref} (gap below); the merges before the gap are not in it"
                 if gaps else "")
        lines.append(f"cumulative: {analysis.name} on {analysis.machine}: {cum.change:+.1%} ({lo - 1:+.1%} to "
                     f"{hi - 1:+.1%}, {cumulative_confidence:.0%}) over {cum.merges} merge(s) since {cum.since[:12]}"
                     f"{reach}")
        lines += gaps
        if beyond:
            out.append(Finding(**base, what=f"cumulative beyond {fmt_tolerance(tolerance)}", change=cum.change,  # type: ignore[arg-type]
                               ci=cum.ci, good=cum.since, bad=cum.until, merges=cum.merges))
    window = [p for p in pts if after(p.run) or (since_commit is not None and p.run.commit == since_commit)]
    for machine, points, trend in machine_trends(analysis, window, confidence=confidence):
        lo, hi = trend.ci
        good = since_commit or points[0].run.parent or points[0].run.commit
        lines.append(f"trend: {analysis.name} on {machine}: {trend.change:+.1%} ({lo - 1:+.1%} to {hi - 1:+.1%}, "
                     f"{confidence:.0%}) over {trend.n} runs of this machine since {good[:12]}")
        if trend.beyond(tolerance, _judged_direction(analysis.direction, trend.change)):
            out.append(Finding(**{**base, "machine": machine}, what=f"trend beyond {fmt_tolerance(tolerance)}",  # type: ignore[arg-type]
                               change=trend.change, ci=trend.ci, good=good, bad=points[-1].run.commit,
                               merges=trend.n, over="runs"))
    return out, lines
