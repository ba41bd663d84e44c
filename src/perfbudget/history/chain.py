"""The chain of head/parent ratios along first parents, and the cumulative change it gives since any
earlier commit, with its interval.

Method: each A/B run measured ``r_i = head_i / parent_i`` on one machine in one job, with a standard
error ``se_i`` of ``ln r_i`` (the pooled per-pair sd over the square root of its pairs) and its degrees
of freedom. Along a first-parent chain the head of one merge is the parent of the next, so the
change since commit ``R`` is the product of the ratios after ``R``; in log space the ``ln r_i`` add, and
so do the ``se_i^2`` (different jobs: independent errors). The interval is a t interval on the sum,
with the Welch-Satterthwaite degrees of freedom (:func:`perfbudget.history.changepoints.segment_sum`;
links that share one machine's pooled sd count its degrees of freedom once).
Machines may differ from one link to the next: each ratio was measured within one.

A run's own per-pair sd rests on few pairs (a run that decided early stops at 2: one degree of
freedom, a t quantile of 12.7), while the per-pair sd is a property of the check on a machine
identity, not of one commit. :func:`pooled` therefore gives every link the sd pooled over all the
series' runs on its machine identity (the pairs' own sds weighted by their degrees of freedom, as
the within-group mean square of a one-way analysis of variance), with the pooled degrees of freedom.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .changepoints import segment_sum
from .store import Point

__all__ = ["Cumulative", "Link", "chain_of", "cumulative", "cumulative_series", "pooled"]


@dataclass(frozen=True, kw_only=True)
class Link:
    """One merge of the chain: its run and head/parent ratio."""

    point: Point
    log_ratio: float
    log_se: float
    df: float | None
    pooled_over: int = 0
    """Runs whose pairs :attr:`log_se` and :attr:`df` were pooled over (0: the run's own)."""

    @property
    def noise(self) -> str:
        """Where :attr:`log_se`'s variance estimate comes from: the machine identity when pooled
        (its links share it), else the run's own commit."""
        return self.machine if self.pooled_over else self.commit

    @property
    def machine(self) -> str:
        return self.point.run.machine

    @property
    def commit(self) -> str:
        return self.point.run.commit

    @property
    def parent(self) -> str | None:
        return self.point.run.parent


@dataclass(frozen=True, kw_only=True)
class Cumulative:
    """The change from ``since`` to ``until`` along the chain: the product of ``merges`` ratios."""

    since: str
    """The commit the change is measured from (the parent of the first merge)."""
    until: str
    """The last merge."""
    merges: int
    ratio: float
    ci: tuple[float, float]
    confidence: float

    @property
    def change(self) -> float:
        return self.ratio - 1.0


def _link(p: Point) -> Link | None:
    c = p.check
    if c.ratio is None or c.log_se is None or not (c.ratio > 0 and c.log_se > 0 and math.isfinite(c.log_se)):
        return None
    return Link(point=p, log_ratio=math.log(c.ratio), log_se=c.log_se, df=c.df)


def chain_of(points: Sequence[Point]) -> tuple[list[Link], list[str]]:
    """The first-parent chain that ends at the newest A/B point with a ratio, oldest merge first
    (``points``: one check on one machine, oldest first, as :meth:`HistoryStore.series` gives them).

    Walks back from the newest run by its parent; the chain ends where a parent has no A/B run here
    (or no ratio for this check).

    Returns:
        ``(links, gaps)``: the gaps say where the chain stopped while older runs exist
        (``0a1b2c3d: its parent 9f8e7d6c has no A/B ratio for this check``).
    """
    links = {p.run.commit: link for p in points if (link := _link(p)) is not None}
    if not links:
        return [], []
    newest = list(links.values())[-1]  # points come oldest first
    chain = [newest]
    seen = {newest.commit}
    while (parent := chain[-1].parent) is not None and parent in links and parent not in seen:
        chain.append(links[parent])
        seen.add(parent)
    chain.reverse()
    gaps = []
    older = [c for c, link in links.items() if c not in seen and link.point.run.date < chain[0].point.run.date]
    if older:
        gaps.append(f"{chain[0].commit[:8]}: its parent {(chain[0].parent or 'none')[:8]} has no A/B ratio for this "
                    f"check; {len(older)} older run(s) are not chained")
    return chain, gaps


def pooled(links: Sequence[Link], points: Sequence[Point] = ()) -> list[Link]:
    """``links`` with the per-pair sd pooled per machine identity over the A/B runs of ``points``
    (the series' runs, the chain's own when empty) that kept their pairs' sd: each link's standard
    error becomes ``s / sqrt(pairs)`` on ``sum(pairs - 1)`` degrees of freedom, where
    ``s^2 = sum((pairs - 1) * pair_sd^2) / sum(pairs - 1)``. A link whose run kept no pair sd, or
    whose machine has no more degrees of freedom than the link's own run, keeps its own."""
    sums: dict[str, tuple[float, int, int]] = {}
    for c, machine in ((p.check, p.run.machine) for p in (points or [link.point for link in links])):
        if c.pair_sd is not None and c.pairs >= 2 and math.isfinite(c.pair_sd):
            ss, df, runs = sums.get(machine, (0.0, 0, 0))
            sums[machine] = (ss + (c.pairs - 1) * c.pair_sd**2, df + c.pairs - 1, runs + 1)
    out = []
    for link in links:
        ss, df, runs = sums.get(link.machine, (0.0, 0, 0))
        own = link.point.check
        if own.pair_sd is None or runs < 2 or df <= own.pairs - 1 or ss <= 0:
            out.append(link)
            continue
        out.append(replace(link, log_se=math.sqrt(ss / df) / math.sqrt(own.pairs), df=float(df), pooled_over=runs))
    return out


def cumulative(links: Sequence[Link], *, confidence: float = 0.95) -> Cumulative:
    """The change over all of ``links`` (consecutive merges, oldest first).

    Raises:
        ValueError: no links.
    """
    if not links:
        raise ValueError("cumulative needs at least one merge, got none")
    dfs = [link.df for link in links]
    ratio, ci = segment_sum([link.log_ratio for link in links], [link.log_se for link in links],
                            None if any(d is None for d in dfs) else [float(d or 0) for d in dfs], confidence,
                            [link.noise for link in links])
    return Cumulative(since=links[0].parent or "", until=links[-1].commit, merges=len(links), ratio=ratio, ci=ci,
                      confidence=confidence)


def cumulative_series(links: Sequence[Link], *, confidence: float = 0.95) -> list[Cumulative]:
    """The change since the chain's start at every merge: what the history page plots as a band."""
    return [cumulative(links[: i + 1], confidence=confidence) for i in range(len(links))]
