"""The history page: one self-contained HTML file (inline SVG, no script) with a plot per check over commits."""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from ..verdict.rule import SERIES_TOLERANCE, Limits
from .analysis import SeriesAnalysis

__all__ = ["render_history"]

_W, _H = 960, 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 78, 64, 26, 78
_BAD, _GOOD, _INK, _GRID, _BAND, _POINT = "#c62828", "#2e7d32", "#222", "#e3e3e3", "#90caf9", "#1565c0"

_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222; margin: 24px auto;
       max-width: 1000px; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin: 30px 0 2px; font-family: monospace; }
.meta, .note { color: #555; } .note { font-size: 13px; }
.bad { color: #c62828; font-weight: 600; } .good { color: #2e7d32; }
svg { display: block; margin: 6px 0; } svg text { font: 12px system-ui, sans-serif; fill: #222; }
svg .tick { fill: #555; } svg .sha { font: 11px monospace; fill: #444; }
table { border-collapse: collapse; margin: 8px 0; } td, th { padding: 2px 10px 2px 0; text-align: left; }
.legend span { display: inline-block; margin-right: 16px; }
"""


def _nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering ``lo..hi``."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        hi = lo + (abs(lo) * 0.1 or 1.0)
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [round(first + i * step, 12) for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6 or a < 1e-3:
        return f"{v:.3g}"
    return f"{v:.4g}"


@dataclass
class _Plot:
    """One SVG chart: commits along x, one quantity along y."""

    labels: Sequence[str]
    """Short SHA of each commit, oldest first."""
    tips: Sequence[str]
    """Hover text of each commit (SHA and date)."""
    y_lo: float
    y_hi: float
    y_label: str
    percent: bool = False
    """Y ticks as changes from 1 (``+5 %``) instead of values."""

    def __post_init__(self) -> None:
        pad = (self.y_hi - self.y_lo) * 0.08 or abs(self.y_hi) * 0.05 or 1.0
        self.y_lo, self.y_hi = self.y_lo - pad, self.y_hi + pad
        self.parts: list[str] = []

    def x(self, i: float) -> float:
        n = max(len(self.labels) - 1, 1)
        return _LEFT + (i / n) * (_W - _LEFT - _RIGHT)

    def y(self, v: float) -> float:
        return _TOP + (self.y_hi - v) / (self.y_hi - self.y_lo) * (_H - _TOP - _BOTTOM)

    def axes(self) -> None:
        x0, x1, y0, y1 = _LEFT, _W - _RIGHT, _TOP, _H - _BOTTOM
        for t in _nice_ticks(self.y_lo, self.y_hi):
            yy = self.y(t)
            label = f"{(t - 1) * 100:+.0f} %" if self.percent else _fmt(t)
            if self.percent and abs(t - 1) < 1e-9:
                label = "0 %"
            self.parts.append(f'<line x1="{x0}" x2="{x1}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="{_GRID}"/>'
                              f'<text class="tick" x="{x0 - 6}" y="{yy + 4:.1f}" text-anchor="end">{label}</text>')
        n = len(self.labels)
        every = max(1, math.ceil(n / 40))
        for i, (label, tip) in enumerate(zip(self.labels, self.tips, strict=True)):
            xx = self.x(i)
            self.parts.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{y1}" y2="{y1 + 4}" stroke="{_INK}"/>')
            if i % every == 0 or i == n - 1:
                self.parts.append(f'<text class="sha" transform="translate({xx + 4:.1f},{y1 + 8}) rotate(60)">'
                                  f'<title>{html.escape(tip)}</title>{html.escape(label)}</text>')
        self.parts.append(f'<line x1="{x0}" x2="{x0}" y1="{y0}" y2="{y1}" stroke="{_INK}"/>'
                          f'<line x1="{x0}" x2="{x1}" y1="{y1}" y2="{y1}" stroke="{_INK}"/>')
        self.parts.append(f'<text transform="translate(16,{(y0 + y1) / 2:.0f}) rotate(-90)" text-anchor="middle">'
                          f'{html.escape(self.y_label)}</text>')
        self.parts.append(f'<text x="{(x0 + x1) / 2:.0f}" y="{_H - 6}" text-anchor="middle">commit (oldest to newest, '
                          'first parents of main)</text>')

    def hline(self, v: float, color: str, dash: str = "", label: str = "") -> None:
        yy = self.y(v)
        self.parts.append(f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="{color}" '
                          f'stroke-dasharray="{dash}"/>')
        if label:
            self.parts.append(f'<text x="{_LEFT + 4}" y="{yy - 4:.1f}" style="fill:{color}">{html.escape(label)}</text>')

    def change_point(self, i: float, label: str, color: str) -> None:
        xx = self.x(i)
        self.parts.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{_TOP}" y2="{_H - _BOTTOM}" stroke="{color}" '
                          f'stroke-width="2" stroke-dasharray="6 3"/>'
                          f'<text x="{xx + 4:.1f}" y="{_TOP + 12}" style="fill:{color};font-weight:600">'
                          f'{html.escape(label)}</text>')

    def span(self, i0: float, i1: float, label: str, color: str) -> None:
        a, b = self.x(i0) - 4, self.x(i1) + 4
        self.parts.append(f'<rect x="{a:.1f}" y="{_TOP}" width="{b - a:.1f}" height="{_H - _TOP - _BOTTOM}" '
                          f'fill="{color}" fill-opacity="0.12" stroke="{color}" stroke-dasharray="4 3"/>'
                          f'<text x="{a + 3:.1f}" y="{_TOP + 12}" style="fill:{color};font-weight:600">'
                          f'{html.escape(label)}</text>')

    def band(self, lows: Sequence[float], highs: Sequence[float]) -> None:
        pts = [f"{self.x(i):.1f},{self.y(v):.1f}" for i, v in enumerate(lows)]
        pts += [f"{self.x(i):.1f},{self.y(v):.1f}" for i, v in reversed(list(enumerate(highs)))]
        self.parts.append(f'<polygon points="{" ".join(pts)}" fill="{_BAND}" fill-opacity="0.55" stroke="none"/>')

    def line(self, values: Sequence[float], color: str, width: float = 1.5) -> None:
        pts = " ".join(f"{self.x(i):.1f},{self.y(v):.1f}" for i, v in enumerate(values))
        self.parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="{width}"/>')

    def point(self, i: float, v: float, tip: str, ci: tuple[float, float] | None = None, color: str = _POINT) -> None:
        xx, yy = self.x(i), self.y(v)
        if ci is not None:
            self.parts.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{self.y(ci[0]):.1f}" y2="{self.y(ci[1]):.1f}" '
                              f'stroke="{color}" stroke-opacity="0.5"/>')
        self.parts.append(f'<circle cx="{xx:.1f}" cy="{yy:.1f}" r="3" fill="{color}"><title>{html.escape(tip)}</title>'
                          '</circle>')

    def svg(self, title: str) -> str:
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
                f'role="img" aria-label="{html.escape(title)}">' + "".join(self.parts) + "</svg>")


def _values_plot(a: SeriesAnalysis) -> str:
    pts = a.points
    values = [p.check.value or 0.0 for p in pts]
    lows = [min(v, p.check.ci[0]) if p.check.ci else v for v, p in zip(values, pts, strict=True)]
    geometric = all(v > 0 for v in values)
    highs = [max(v, p.check.ci[1]) if p.check.ci else v for v, p in zip(values, pts, strict=True)]
    unit = f" ({a.unit})" if a.unit else ""
    plot = _Plot([p.run.short for p in pts], [f"{p.run.commit} {p.run.date}" for p in pts], min(lows), max(highs),
                 f"{a.metric}{unit}")
    plot.axes()
    # Segment levels between change points: the fit the change points come from.
    bounds = [0, *(s.index for s in a.shifts), len(pts)]
    for lo, hi in itertools.pairwise(bounds):
        part = values[lo:hi]
        level = math.exp(sum(math.log(v) for v in part) / len(part)) if geometric else sum(part) / len(part)
        plot.parts.append(f'<line x1="{plot.x(lo):.1f}" x2="{plot.x(hi - 1):.1f}" y1="{plot.y(level):.1f}" '
                          f'y2="{plot.y(level):.1f}" stroke="#555" stroke-width="2"/>')
    for s in a.shifts:
        plot.change_point(s.index - 0.5, s.label, _BAD if a.worse(s.change) else _GOOD)
    for i, (p, v) in enumerate(zip(pts, values, strict=True)):
        plot.point(i, v, f"{p.run.short} {p.run.date}: {_fmt(v)} {a.unit} ({p.check.outcome})", p.check.ci)
    return plot.svg(f"{a.name} values")


def _chain_plot(a: SeriesAnalysis, tolerance: float) -> str:
    links = a.links
    labels = [(links[0].parent or "start")[:8], *(link.point.run.short for link in links)]
    tips = [f"{links[0].parent or 'start'} (the chain's start: 1.0)",
            *(f"{link.commit} {link.point.run.date}" for link in links)]
    ratios = [1.0, *(c.ratio for c in a.cumulative)]
    lows = [1.0, *(c.ci[0] for c in a.cumulative)]
    highs = [1.0, *(c.ci[1] for c in a.cumulative)]
    lo = min(*lows, 1 - tolerance)
    hi = max(*highs, 1 + tolerance)
    plot = _Plot(labels, tips, lo, hi, f"change since {labels[0]}", percent=True)
    plot.axes()
    plot.band(lows, highs)
    plot.hline(1.0, _INK)
    worse_limit = Limits.around(1.0, tolerance, "higher" if a.direction == "higher" else "lower").bad
    plot.hline(worse_limit, _BAD, "3 3", f"tolerance {worse_limit - 1:+.0%}")
    for d in a.drifts:
        color = _BAD if a.worse(d.change) else _GOOD
        plot.span(d.first + 1, d.last + 1, f"{d.change:+.1%} over {d.last - d.first + 1}", color)
    plot.line(ratios, _POINT, width=2)
    for i, link in enumerate(links, start=1):
        c = a.cumulative[i - 1]
        r = link.point.check.ratio or 1.0
        plot.point(i, c.ratio, f"{link.point.run.short}: this merge {r - 1:+.1%} vs its parent; since "
                               f"{labels[0]}: {c.change:+.1%} ({c.ci[0] - 1:+.1%} to {c.ci[1] - 1:+.1%})")
    return plot.svg(f"{a.name} cumulative ratio")


def _summary(a: SeriesAnalysis) -> str:
    bits = []
    for s in a.shifts:
        cls = "bad" if a.worse(s.change) else "good"
        bits.append(f'<span class="{cls}">change point at {html.escape(a.points[s.index].run.short)}: '
                    f"{_fmt(s.before)} → {_fmt(s.after)} {html.escape(a.unit)} ({html.escape(s.label)})</span>")
    for d in a.drifts:
        cls = "bad" if a.worse(d.change) else "good"
        first, last = a.links[d.first].point.run.short, a.links[d.last].point.run.short
        span = first if d.first == d.last else f"{first}..{last}"
        bits.append(f'<span class="{cls}">drift {span} ({d.last - d.first + 1} merge(s)): {d.change:+.1%} '
                    f"({d.ci[0] - 1:+.1%} to {d.ci[1] - 1:+.1%})</span>")
    if a.cumulative:
        c = a.cumulative[-1]
        bits.append(f"since {html.escape(c.since[:8])}: {c.change:+.1%} ({c.ci[0] - 1:+.1%} to {c.ci[1] - 1:+.1%}, "
                    f"{c.confidence:.0%}) over {c.merges} merge(s)")
    if not bits:
        bits.append("no change point")
    return "; ".join(bits)


def _worse(a: SeriesAnalysis) -> bool:
    """Whether the series has a change point or drift for the worse: what the page shows first."""
    return any(a.worse(s.change) for s in a.shifts) or any(a.worse(d.change) for d in a.drifts)


def _anchor(a: SeriesAnalysis) -> str:
    return html.escape(f"{a.name}-{a.machine}-{a.mode}", quote=True)


def render_history(analyses: Sequence[SeriesAnalysis], *, title: str = "perf history", tolerance: float = SERIES_TOLERANCE,
                   source: str = "") -> str:
    """The history page: per series, its values with the change points and, for A/B history, the
    cumulative ratio with its band and the drifts; those that moved for the worse first.

    Args:
        analyses: from :func:`perfbudget.history.analysis.analyze_store`.
        title: the page's heading.
        tolerance: drawn as the line a cumulative ratio is judged against.
        source: the database, named under the heading.
    """
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
           f"<style>{_STYLE}</style></head><body>",
           f"<h1>{html.escape(title)}</h1>",
           f"<p class='meta'>{len(analyses)} series from {html.escape(source or 'the history')}, rendered {now}.</p>",
           "<p class='legend note'><span>● a commit's value (bar: its interval)</span>"
           "<span>— level between change points</span>"
           f"<span style='color:{_BAD}'>┆ change point for the worse</span>"
           f"<span style='color:{_GOOD}'>┆ for the better</span>"
           "<span>A/B: line = cumulative head/parent ratio since the first merge shown, band = its 95 % interval "
           "(<code>history check</code> judges it at 99 %), boxes = drifts (runs of merges that changed the "
           "level)</span></p>"]
    if not analyses:
        out.append("<p>The history is empty: add results with <code>perfbudget history add</code>.</p>")
    plotted = sorted((a for a in analyses if len(a.points) >= 2 or len(a.links) >= 2 or _worse(a)),
                     key=lambda a: (not _worse(a), a.name))
    flagged = [a for a in plotted if _worse(a)]
    if flagged:
        out.append("<p><b>Moved for the worse:</b> " + ", ".join(
            f"<a href='#{_anchor(a)}'>{html.escape(a.name)}</a> ({html.escape(a.machine)})" for a in flagged) + "</p>")
    for a in plotted:
        out.append(f"<h2 id='{_anchor(a)}'>{html.escape(a.name)}</h2>")
        kind = "lockstep A/B, head/parent per merge" if a.mode == "ab" else "stored mode, absolute values"
        out.append(f"<p class='meta'>{html.escape(a.machine)} · {kind} · {len(a.points)} commit(s) · "
                   f"{'lower' if a.direction == 'lower' else 'higher' if a.direction == 'higher' else 'either'} is better"
                   f"</p><p>{_summary(a)}</p>")
        for gap in a.gaps:
            out.append(f"<p class='note'>chain: {html.escape(gap)}</p>")
        if a.links:
            out.append(f"<p class='note'>Cumulative head/parent ratio along the chain of merges, as a change since "
                       f"{html.escape((a.links[0].parent or 'the start')[:8])} (band: {a.cumulative[-1].confidence:.0%} "
                       "interval; boxes: drifts; dashed: the tolerance):</p>")
            out.append(_chain_plot(a, tolerance))
            out.append("<p class='note'>Absolute values of the same runs, for reference (not searched for change "
                       "points: each run may be another machine):</p>")
        elif a.points:
            out.append(f"<p class='note'>{html.escape(a.metric)} per commit, in {html.escape(a.unit or 'its unit')} "
                       "(dot: the value; bar: its interval; grey: the level between change points):</p>")
        if a.points:
            out.append(_values_plot(a))
    single = sorted((a for a in analyses if a not in plotted), key=lambda a: a.name)
    if single:
        rows = "".join(f"<tr><td><code>{html.escape(a.name)}</code></td><td>{html.escape(a.machine)}</td>"
                       f"<td>{_fmt(a.points[0].check.value or 0.0) + ' ' + html.escape(a.unit) if a.points else '-'}"
                       f"</td></tr>" for a in single)
        out.append(f"<details><summary>{len(single)} series with one run or none (nothing to plot yet)</summary>"
                   f"<table><tr><th>check</th><th>machine</th><th>value</th></tr>{rows}</table></details>")
    out.append("</body></html>\n")
    return "\n".join(out)
