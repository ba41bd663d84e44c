"""The chain of A/B head/parent ratios along first parents, and the cumulative change it gives."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .changepoints import segment_sum
from .store import Point, Run

__all__ = ["Cumulative", "Gap", "Link", "chain_of", "cumulative", "cumulative_series", "pooled"]

PRIOR_NOISE = "prior"
"""The :attr:`Link.noise` of every unpooled link whose run pooled its pairs with a prior: counted as one
estimate shared by them all, as the store does not say whose prior it was (the cautious side)."""


@dataclass(frozen=True, kw_only=True)
class Link:
    """One merge of the chain: its run and head/parent ratio."""

    point: Point
    log_ratio: float
    log_se: float
    df: float | None
    pooled_over: int = 0
    """Runs whose pairs :attr:`log_se` and :attr:`df` were pooled over (0: the run's own)."""
    prior_df: float = 0.0
    """Of an unpooled link's :attr:`df`, its run's prior's (``df - (pairs - 1)``); 0 when pooled."""

    @property
    def noise(self) -> str:
        """The variance estimate :attr:`shared_df` belongs to: ``pooled:MACHINE``, :data:`PRIOR_NOISE`,
        or ``own:COMMIT`` (nothing shared)."""
        if self.pooled_over:
            return f"pooled:{self.machine}"
        return PRIOR_NOISE if self.prior_df > 0 else f"own:{self.commit}"

    @property
    def shared_df(self) -> float:
        """The degrees of freedom of :attr:`noise`'s shared estimate: all of :attr:`df` when pooled,
        else the prior's.

        Every run takes the same prior, so its degrees of freedom count once over the links: per link,
        five 2-pair links on a 3-df prior would read as 20 df where they hold 5 (t(0.975) 2.09, not 2.57)."""
        if self.pooled_over:
            return float(self.df or 0.0)
        return self.prior_df

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
class Gap:
    """Where the chain cannot reach back: :attr:`run`'s parent has no A/B ratio for this check, while
    :attr:`older` (the newest run before it) and :attr:`unchained` runs in all are older; what changed
    from :attr:`older` to that parent was never measured."""

    run: Run
    older: Run
    unchained: int

    @property
    def commit(self) -> str:
        return self.run.commit

    @property
    def parent(self) -> str | None:
        return self.run.parent

    def __str__(self) -> str:
        parent = (self.parent or "none")[:8]
        return (f"{self.commit[:8]}: its parent {parent} has no A/B ratio for this check: the chain cannot reach "
                f"back over {self.older.commit[:8]}..{parent} (not measured); {self.unchained} older run(s) are "
                "not chained")


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
    prior_df = c.df - (c.pairs - 1) if c.df is not None and c.pairs >= 1 else 0.0
    return Link(point=p, log_ratio=math.log(c.ratio), log_se=c.log_se, df=c.df,
                prior_df=min(max(prior_df, 0.0), c.df or 0.0))


def chain_of(points: Sequence[Point]) -> tuple[list[Link], list[Gap]]:
    """The first-parent chain that ends at the newest A/B point with a ratio, oldest merge first.

    ``points`` are one check's, oldest first. The walk back by parents stops where a parent has no
    ratio, then goes on from the newest run older than that, to find every gap further back.

    Returns:
        ``(links, gaps)``: the gaps newest first, each where a walk stopped while older runs exist
        (the first is where ``links`` start; :class:`Gap`).
    """
    links = {p.run.commit: link for p in points if (link := _link(p)) is not None}
    if not links:
        return [], []
    order = list(links)  # points come oldest first
    position = {commit: i for i, commit in enumerate(order)}
    seen: set[str] = set()
    walks: list[list[Link]] = []
    end = len(order)
    while end > 0:
        walk = [links[order[end - 1]]]
        seen.add(walk[0].commit)
        while (parent := walk[-1].parent) is not None and parent in links and parent not in seen:
            walk.append(links[parent])
            seen.add(parent)
        walk.reverse()
        walks.append(walk)
        end = position[walk[0].commit]
        while end > 0 and order[end - 1] in seen:
            end -= 1
    gaps = []
    for walk, older in itertools.pairwise(walks):
        chained = {link.commit for link in walk}
        gaps.append(Gap(run=walk[0].point.run, older=older[-1].point.run,
                        unchained=sum(c not in chained for c in order[:position[walk[0].commit]])))
    return walks[0], gaps


def pooled(links: Sequence[Link], points: Sequence[Point] = ()) -> list[Link]:
    """``links`` with the per-pair sd pooled per machine identity over the runs of ``points`` (default:
    the chain's): a run's sd rests on few pairs, while the spread belongs to the check on a machine.

    Each link's standard error becomes ``s / sqrt(pairs)`` on ``sum(pairs - 1)`` degrees of freedom,
    ``s^2 = sum((pairs - 1) * pair_sd^2) / sum(pairs - 1)``; a link whose run kept no pair sd, or whose
    machine has no more degrees of freedom than its own run, keeps its own."""
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
        out.append(replace(link, log_se=math.sqrt(ss / df) / math.sqrt(own.pairs), df=float(df), pooled_over=runs,
                           prior_df=0.0))
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
                            [link.noise for link in links], [link.shared_df for link in links])
    return Cumulative(since=links[0].parent or "", until=links[-1].commit, merges=len(links), ratio=ratio, ci=ci,
                      confidence=confidence)


def cumulative_series(links: Sequence[Link], *, confidence: float = 0.95) -> list[Cumulative]:
    """The change since the chain's start at every merge: what the history page plots as a band."""
    return [cumulative(links[: i + 1], confidence=confidence) for i in range(len(links))]
