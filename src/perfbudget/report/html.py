"""A self-contained HTML page of results with matplotlib plots inlined as SVG."""

from __future__ import annotations

import html
import io
import statistics
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..extras import OperatorTable, PaddingByWidth
from ..fileio import atomic_write
from ..results import Record, Results
from .common import (
    DECIDING_COLUMNS,
    OUTCOME_ORDER,
    FailingTest,
    cv_text,
    deciding_cells,
    device_label,
    devices,
    failing_tests,
    finite,
    fmt_ratio,
    fmt_value,
    has_base,
    headline,
    move_change_text,
    ordered,
    outcome_counts,
    outcome_text,
    ratio_ci_text,
    ratio_text,
    regressions,
    tolerance_of,
)

__all__ = [
    "plot_base_vs_head",
    "plot_budgets",
    "plot_operators",
    "plot_padding",
    "plot_samples",
    "plot_vs_base",
    "render_html",
    "write_html",
]

_COLOR = {
    "fail": "#cf222e",
    "error": "#8250df",
    "stale": "#bf8700",
    "inconclusive": "#9a6700",
    "advisory": "#bc4c00",
    "pass": "#1a7f37",
    "unbudgeted": "#8c959f",
    "not_judged": "#8c959f",
    "not_measured": "#6e7781",
    "unmeasurable": "#8c959f",
}
_BAND = "#2da44e"
_MAX_OPS = 15

_CSS = """
body{font:14px/1.45 -apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
main{max-width:1100px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px} code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;background:#eff1f3;padding:1px 4px;border-radius:4px}
.card{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:12px 16px;margin:12px 0}
.card.bad{border-left:4px solid #cf222e}
.badge{display:inline-block;padding:2px 10px;border-radius:12px;color:#fff;font-weight:600;margin-right:6px}
table{border-collapse:collapse;margin:6px 0;font-size:13px;background:#fff}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top} th{background:#f6f8fa}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.plots{display:flex;flex-wrap:wrap;gap:8px} .plots svg{max-width:100%;height:auto;background:#fff}
.muted{color:#656d76} .reason{margin:6px 0;padding:4px 10px;border-left:3px solid #d0d7de;color:#3d444d}
"""


def _figure(width_in: float, height_in: float, *, ylabels: Sequence[str] = (), xlabel_lines: int = 1,
            legend_in: float = 0.0) -> Any:
    """The axes of a figure with margins sized for its labels (fixed: constrained layout triples the
    time a figure takes, and a suite's page has dozens)."""
    from matplotlib.figure import Figure

    # Figure without pyplot: no global state, no GUI backend, safe in workers.
    fig = Figure(figsize=(width_in, height_in), dpi=100)
    left_in = 0.75 if not ylabels else 0.25 + 0.064 * max(len(str(x)) for x in ylabels)
    fig.subplots_adjust(left=min(left_in, width_in * 0.5) / width_in, right=1 - (0.2 + legend_in) / width_in,
                        top=1 - 0.32 / height_in, bottom=(0.3 + 0.2 * xlabel_lines) / height_in)
    return fig.subplots()


def _svg(ax: Any, title: str, *, grid: str = "both", legend: bool = False) -> str:
    """The plot of ``ax``, with its grid, title and a legend beside it, as an inline ``<svg>`` element:
    text kept as text, output deterministic (a fixed salt for the ids matplotlib hashes, no date)."""
    import matplotlib

    if legend:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(axis=grid, alpha=0.3)
    ax.set_title(title, fontsize=10, loc="left")
    fig = ax.figure

    buf = io.StringIO()
    for text in fig.findobj(matplotlib.text.Text):  # names from a results file: '$x$' is no formula
        text.set_parse_math(False)
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "perfbudget"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    start = text.find("<svg")
    return text[start:] if start >= 0 else text


def _normalised(rows: Sequence[tuple[Record, float, float, tuple[float, float] | None, str]], *, xlabel: str,
                title: str) -> str:
    """One point per record on a shared axis where 1.0 is the reference (budget or base):
    the green band is 1 ± tolerance, the line the CI, the colour the verdict."""
    ax = _figure(7.5, 1.0 + 0.4 * len(rows), ylabels=[r.metric for r, *_ in rows])
    ys = list(range(len(rows)))[::-1]
    xs: list[float] = [1.0]
    for y, (r, ratio, tol, ci, label) in zip(ys, rows, strict=True):
        if tol:  # exact budgets (tolerance 0) have no band, only the reference line
            ax.barh(y, 2 * tol, left=1 - tol, height=0.7, color=_BAND, alpha=0.18, linewidth=0)
        color = _COLOR.get(r.outcome, "#57606a")
        if ci is not None:
            ax.plot(list(ci), [y, y], color=color, linewidth=2.2, solid_capstyle="butt")
            xs.extend(ci)
        ax.plot([ratio], [y], "o", color=color, markersize=7, zorder=3)
        ax.annotate(f"{label} ({ratio - 1:+.1%})", (max([ratio, *(ci or ())]), y), xytext=(6, 0),
                    textcoords="offset points", va="center", fontsize=8, color=color)
        xs.extend([ratio, 1 - tol, 1 + tol])
    ax.axvline(1.0, color="#1f2328", linewidth=1)
    lo, hi = min(xs), max(xs)
    if hi / max(lo, 1e-9) > 4 and lo > 0:
        ax.set_xscale("log")
        ax.set_xlim(lo / 1.3, hi * 2.2)
    else:
        span = max(hi - lo, 0.1)
        ax.set_xlim(lo - 0.1 * span, hi + 0.55 * span)
    ax.set_yticks(ys, [r.metric for r, *_ in rows], fontsize=8)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel(xlabel)
    return _svg(ax, title, grid="x")


def _ratio_ci(ci: tuple[float, float] | None, ref: float) -> tuple[float, float] | None:
    if ci is None or finite(ci[0]) is None or finite(ci[1]) is None:
        return None
    return (ci[0] / ref, ci[1] / ref)


def plot_budgets(records: Sequence[Record]) -> str | None:
    """Measured / budget per metric on one axis (1.0: the budget), with the tolerance band, the CI and
    the verdict colour."""
    rows = []
    for r in records:
        v = finite(r.value)
        b = finite(r.budget.value) if r.budget else None
        if v is None or not b or r.budget is None:
            continue
        label = f"{fmt_value(r.value, r.unit)} vs {fmt_value(b, r.unit)}"
        rows.append((r, v / b, r.budget.tolerance, _ratio_ci(r.ci, b), label))
    if not rows:
        return None
    return _normalised(rows, xlabel="measured / budget  (1 = budget; green band = ± tolerance)",
                       title="measured vs budget")


def plot_vs_base(records: Sequence[Record]) -> str | None:
    """head / base per metric of a lockstep A/B run, with the ratio's CI and the tolerance band."""
    rows = []
    for r in records:
        b = r.vs_base
        ratio = finite(b.ratio) if b else None
        if b is None or ratio is None:
            continue
        ci = b.ratio_ci if b.ratio_ci and all(finite(x) is not None for x in b.ratio_ci) else None
        rows.append((r, ratio, tolerance_of(r), ci, f"{fmt_value(r.value, r.unit)} vs {fmt_value(b.value, r.unit)}"))
    if not rows:
        return None
    pairs = max(r.vs_base.pairs for r, *_ in rows if r.vs_base is not None)
    return _normalised(rows, xlabel="head / base  (1 = base commit; green band = ± tolerance)",
                       title=f"head vs base commit (up to {pairs} process pair{'s' if pairs != 1 else ''})")


def plot_samples(r: Record) -> str | None:
    """Raw samples of a statistical record against its budget, limit and the median's CI."""
    samples = [x for x in r.samples if finite(x) is not None]
    if len(samples) < 3:
        return None
    ax = _figure(8.5, 2.4, legend_in=1.75)
    ax.plot(range(len(samples)), samples, ".", color="#57606a", markersize=3, label="samples")
    shown = finite(r.value)
    med = shown if shown is not None else statistics.median(samples)  # the value the table shows
    if r.ci and finite(r.ci[0]) is not None and finite(r.ci[1]) is not None:
        ax.axhspan(r.ci[0], r.ci[1], color="#0969da", alpha=0.18, linewidth=0, label="CI of the median")
    ax.axhline(med, color="#0969da", linewidth=1.2, label=f"measured {fmt_value(med, r.unit)}")
    b = finite(r.budget.value) if r.budget else None
    if b is not None:
        ax.axhline(b, color="#1f2328", linewidth=1.2, label=f"budget {fmt_value(b, r.unit)}")
    lim = finite(r.limit)
    if lim is not None:
        ax.axhline(lim, color=_COLOR["fail"], linestyle="--", linewidth=1.2, label=f"limit {fmt_value(lim, r.unit)}")
    ax.set_xlabel(f"sample ({r.rounds} round{'s' if r.rounds != 1 else ''})")
    ax.set_ylabel(r.unit if r.unit and r.unit != "1" else "value")
    return _svg(ax, f"{r.metric} samples (n={len(samples)})", legend=True)


def plot_base_vs_head(r: Record) -> str | None:
    """The base commit's samples beside the head's for one A/B check; head/base and its CI in the title."""
    b = r.vs_base
    if b is None:
        return None
    # Exact and bytes checks have one value per side: shown as one point each.
    head = [x for x in r.samples if finite(x) is not None] or [x for x in (finite(r.value),) if x is not None]
    base = [x for x in b.samples if finite(x) is not None] or [x for x in (finite(b.value),) if x is not None]
    if not head or not base:
        return None
    ax = _figure(8.5, 2.0, ylabels=["base", "head"], legend_in=1.75)
    # The line drawn is the value the tables show (for A/B, the median of the per-pair
    # statistics), never a second statistic of the pooled samples: one quantity, one definition.
    sides = (("base", base, "#8c959f", finite(b.value)), ("head", head, _COLOR.get(r.outcome, "#0969da"), finite(r.value)))
    for y, (name, xs, color, shown) in enumerate(sides):
        # Golden-ratio offsets spread the points vertically, the same way on every render.
        jitter = [y + 0.3 * (((i * 0.6180339887) % 1.0) - 0.5) for i in range(len(xs))]
        ax.plot(xs, jitter, ".", color=color, markersize=3, alpha=0.8)
        med = shown if shown is not None else statistics.median(xs)
        ax.plot([med, med], [y - 0.3, y + 0.3], color=color, linewidth=2.2,
                label=f"{name} {fmt_value(med, r.unit)} (as measured)")
    ax.set_yticks([0, 1], ["base", "head"], fontsize=8)
    ax.set_ylim(-0.6, 1.6)
    ax.set_xlabel(r.unit if r.unit and r.unit != "1" else "value")
    if b.pair_ratios:
        ax.set_xlabel(f"{ax.get_xlabel()}   (head/base per pair: {', '.join(fmt_ratio(x) for x in b.pair_ratios)})")
    ci = f", CI {ratio_ci_text(b)}" if b.ratio_ci else ""
    return _svg(ax, f"{r.metric}: head/base {ratio_text(b)}{ci}, {b.pairs} pair{'s' if b.pairs != 1 else ''}",
                grid="x", legend=True)


def plot_operators(records: Sequence[Record]) -> str | None:
    """Per-operator self time, from ``op_self_ms[...]`` records and operator tables: measured (verdict
    colour) beside its reference (the base commit's, else the budget) and tolerance."""
    ops: dict[str, dict[str, Any]] = {}
    for r in records:
        table = OperatorTable.from_extra(r.extra)
        for row in table.rows if table else ():
            ops.setdefault(row.name, {"measured": row.self_ms})
    vs_base = False
    for r in records:
        value = finite(r.value)
        if not r.metric.startswith("op_self_ms[") or value is None:
            continue
        d = ops.setdefault(r.metric[len("op_self_ms["):-1], {})
        d["measured"] = value
        d["outcome"] = r.outcome
        base = finite(r.vs_base.value) if r.vs_base else None
        reference = base if base is not None else (finite(r.budget.value) if r.budget else None)
        if reference is not None:
            d["reference"] = reference
            d["tolerance"] = tolerance_of(r)
            vs_base = vs_base or base is not None
    ops = {n: d for n, d in ops.items() if finite(d.get("measured")) is not None}
    if not ops:
        return None
    top = sorted(ops.items(), key=lambda kv: (-max(kv[1]["measured"], kv[1].get("reference", 0.0)), kv[0]))[:_MAX_OPS]
    ax = _figure(7.5, 1.0 + 0.36 * len(top), ylabels=[n for n, _ in top])
    ys = list(range(len(top)))[::-1]
    h = 0.38
    for y, (_, d) in zip(ys, top, strict=True):
        ax.barh(y - h / 2, d["measured"], height=h, color=_COLOR.get(d.get("outcome", ""), "#8c959f"))
        if "reference" in d:
            ax.barh(y + h / 2, d["reference"], height=h, color="#d0d7de")
            ax.errorbar([d["reference"]], [y + h / 2], xerr=[[0], [d["reference"] * d["tolerance"]]], fmt="none",
                        ecolor="#1f2328", capsize=3, linewidth=1)
    ax.set_yticks(ys, [n for n, _ in top], fontsize=8)
    grey = "base commit" if vs_base else "budget"
    ax.set_xlabel(f"self time per step (ms); grey = {grey} with its tolerance")
    return _svg(ax, "per-operator breakdown", grid="x")


def plot_padding(records: Sequence[Record]) -> str | None:
    """Padding rate per padded width, with the overall rate, its budget and the length-sorted lower bound."""
    found = next(((r, p) for r in records if (p := PaddingByWidth.from_extra(r.extra)) is not None and p.widths), None)
    if found is None:
        return None
    src, padding = found
    ax = _figure(8.5, 2.8, xlabel_lines=2, legend_in=1.75)
    color = _COLOR.get(src.outcome, "#0969da") if src.metric == "padding_rate" else "#0969da"
    ax.bar(range(len(padding.widths)), [100 * x for x in padding.rates], color=color, alpha=0.85)
    pad = src if src.metric == "padding_rate" else next((r for r in records if r.metric == "padding_rate"), None)
    overall = finite(pad.value) if pad is not None else None
    if pad is not None and overall is not None:
        ax.axhline(100 * overall, color="#0969da", linewidth=1.2, label=f"overall {100 * overall:.1f} %")
        if pad.budget:
            ax.axhline(100 * pad.budget.value, color="#1f2328", linewidth=1.2,
                       label=f"budget {100 * pad.budget.value:.1f} %")
    if padding.sorted_rate is not None:
        ax.axhline(100 * padding.sorted_rate, color="#8c959f", linestyle="--", linewidth=1.2,
                   label=f"sorted batching {100 * padding.sorted_rate:.1f} %")
    ax.set_xticks(range(len(padding.widths)), [str(w) for w in padding.widths], fontsize=8,
                  rotation=30 if len(padding.widths) > 8 else 0)
    ax.set_xlabel("padded width (tokens)")
    ax.set_ylabel("padding (%)")
    return _svg(ax, "padding by width", grid="y", legend=bool(ax.get_legend_handles_labels()[0]))


def _e(x: Any) -> str:
    return html.escape(str(x))


def _badge(outcome: str, text: str) -> str:
    return f'<span class="badge" style="background:{_COLOR.get(outcome, "#57606a")}">{_e(text)}</span>'


def _table(records: Sequence[Record]) -> str:
    """One row per check with the one comparison that decided it (:func:`deciding_cells`)."""
    head = ["verdict", "metric", "measured", *DECIDING_COLUMNS, "n", "cv"]
    out = ["<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for r in records:
        nums = [fmt_value(r.value, r.unit), *deciding_cells(r, md=False), str(r.n), cv_text(r)]
        cells = [
            f'<td style="color:{_COLOR.get(r.outcome, "")};font-weight:600">{_e(outcome_text(r))}</td>',
            f"<td><code>{_e(r.metric)}</code></td>",
            *(f'<td class="num">{_e(x)}</td>' for x in nums),
        ]
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _plots(*svgs: str | None) -> str:
    got = [s for s in svgs if s]
    return f'<div class="plots">{"".join(got)}</div>' if got else ""


def _regression_card(t: FailingTest) -> Iterator[str]:
    yield '<div class="card bad">'
    yield f"<h3>{_badge(t.worst, t.worst.upper())}<code>{_e(t.key)}</code> · <code>{_e(t.nodeid)}</code></h3>"
    yield f'<div class="muted">on {_e(t.device)}</div>'
    yield _table(t.bad)
    for r in t.bad:
        if r.reason:
            yield f'<div class="reason"><code>{_e(r.metric)}</code>: {_e(r.reason)}</div>'
    if t.moves:
        note = f' <span class="muted">({_e(t.moves_note)})</span>' if t.moves_note else ""
        yield (f"<div><b>Top moved operators</b>{note}</div><table><tr><th>operator</th><th>metric</th>"
               f"<th>{_e(t.moves[0].against)}</th><th>measured</th><th>change</th><th>verdict</th></tr>")
        for m in t.moves:
            yield (f"<tr><td><code>{_e(m.op)}</code></td><td>{_e(m.family)}</td>"
                   f'<td class="num">{_e(fmt_value(m.before, m.unit))}</td>'
                   f'<td class="num">{_e(fmt_value(m.after, m.unit))}</td>'
                   f'<td class="num">{_e(move_change_text(m))}</td>'
                   f'<td style="color:{_COLOR.get(m.outcome, "")}">{_e(m.outcome or "-")}</td></tr>')
        yield "</table>"
    if t.attribution:
        yield "<div><b>Attribution</b></div><ul>" + "".join(f"<li><code>{_e(a)}</code></li>"
                                                           for a in t.attribution) + "</ul>"
    if t.artifacts:
        yield "<div><b>Artifacts</b>: " + ", ".join(f"{_e(k)} <code>{_e(v)}</code>" for k, v in t.artifacts.items()) \
              + ' <span class="muted">(chrome traces open in ui.perfetto.dev; flame graphs in a browser)</span></div>'
    # Per failing check: base vs head where the base commit was measured, else the samples.
    ab = [plot_base_vs_head(r) for r in t.bad if r.vs_base is not None][:6]
    statistical = [r for r in t.bad if r.vs_base is None and r.kind in ("timing", "rate", "energy")][:3]
    has_ops = bool(t.moves) or any(OperatorTable.from_extra(r.extra) for r in t.records)
    yield _plots(*ab, *(plot_samples(r) for r in statistical), plot_operators(t.records) if has_ops else None)
    yield "</div>"


def render_html(results: Results | Iterable[Record], *, title: str = "perf budgets") -> str:
    """The whole report as one HTML string, no external files, scripts or fonts: verdict counts and
    devices, each regression explained with its plots, then one section per test.

    Raises:
        perfbudget.extras.ExtraError: a record's ``extra`` holds a known key with a bad value.
    """
    records = ordered(results.records if isinstance(results, Results) else results)
    bad = regressions(records)
    _, state = headline(records)
    counts = outcome_counts(records).items()
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        f"<title>{_e(title)}: {_e(state)}</title><style>{_CSS}</style></head><body><main>",
        f"<h1>{_e(title)}: {_e(state)}</h1>",
        "<div>" + "".join(_badge(o, f"{n} {o}") for o, n in counts) + "</div>",
        '<p class="muted">Devices: ' + ", ".join(f"<code>{_e(d)}</code>" for d in devices(records)) + "</p>",
    ]
    if has_base(records):
        out.append('<p class="muted">Compared with the base commit (lockstep A/B): head/base per check, '
                   "with its CI from the process pairs.</p>")
    if not records:
        out.append("<p>No perf records were produced.</p>")
    groups: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        groups.setdefault((device_label(r), r.nodeid), []).append(r)
    if bad:
        out.append("<h2>Regressions</h2>")
        for t in failing_tests(records):
            out.extend(_regression_card(t))
    out.append("<h2>Tests</h2>")
    worst_of = {k: min(g, key=lambda r: OUTCOME_ORDER.get(r.outcome, 9)) for k, g in groups.items()}
    for (dev, nodeid), group in sorted(groups.items(), key=lambda kv: (OUTCOME_ORDER.get(worst_of[kv[0]].outcome, 9), kv[0])):
        worst = worst_of[(dev, nodeid)]
        out.append(f'<div class="card"><h3>{_badge(worst.outcome, worst.outcome.upper())}<code>{_e(nodeid)}</code>'
                   f' <span class="muted">{_e(dev)} · key <code>{_e(group[0].key)}</code></span></h3>')
        out.append(_plots(plot_budgets(group), plot_vs_base(group), plot_operators(group), plot_padding(group)))
        out.append(_table(group))
        out.append("</div>")
    out.append('<p class="muted">Generated by perfbudget from the results JSON; '
               "<code>perfbudget report RESULTS --format html</code> rebuilds it.</p>")
    out.append("</main></body></html>")
    return "\n".join(out)


def write_html(results: Results | Iterable[Record], path: str | Path, *, title: str = "perf budgets") -> Path:
    """Render and write the page; returns the path."""
    return atomic_write(path, render_html(results, title=title))
