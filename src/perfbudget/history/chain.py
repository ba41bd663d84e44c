"""The chain of head/parent ratios along first parents, and the cumulative change it gives since any
earlier commit, with its interval.

Method: each A/B run measured ``r_i = head_i / parent_i`` on one machine in one job, with a standard
error ``se_i`` of ``ln r_i`` (the pooled per-pair sd over the square root of its pairs) and its degrees
of freedom. Along a first-parent chain the head of one merge is the parent of the next, so the
change since commit ``R`` is the product of the ratios after ``R``; in log space the ``ln r_i`` add, and
so do the ``se_i^2`` (different jobs: independent errors). The interval is a t interval on the sum,
with the Welch-Satterthwaite degrees of freedom (:func:`perfbudget.history.changepoints.segment_sum`).
Machines may differ from one link to the next: each ratio was measured within one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .changepoints import segment_sum
from .store import Point

__all__ = ["Cumulative", "Link", "chain_of", "cumulative", "cumulative_series"]


@dataclass(frozen=True, kw_only=True)
class Link:
    """One merge of the chain: its run and head/parent ratio."""

    point: Point
    log_ratio: float
    log_se: float
    df: float | None

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


def cumulative(links: Sequence[Link], *, confidence: float = 0.95) -> Cumulative:
    """The change over all of ``links`` (consecutive merges, oldest first).

    Raises:
        ValueError: no links.
    """
    if not links:
        raise ValueError("cumulative needs at least one merge, got none")
    dfs = [link.df for link in links]
    ratio, ci = segment_sum([link.log_ratio for link in links], [link.log_se for link in links],
                            None if any(d is None for d in dfs) else [float(d or 0) for d in dfs], confidence)
    return Cumulative(since=links[0].parent or "", until=links[-1].commit, merges=len(links), ratio=ratio, ci=ci,
                      confidence=confidence)


def cumulative_series(links: Sequence[Link], *, confidence: float = 0.95) -> list[Cumulative]:
    """The change since the chain's start at every merge: what the history page plots as a band."""
    return [cumulative(links[: i + 1], confidence=confidence) for i in range(len(links))]
