"""A self-contained HTML page of results with matplotlib plots inlined as SVG."""

from __future__ import annotations

import html
import io
import math
import statistics
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .report import (
    REGRESSION_OUTCOMES,
    FailingTest,
    bucket_rows,
    device_label,
    failing_tests,
    fmt_value,
    op_rows,
    regressions,
)
from .results import Record, Results

__all__ = ["render_html", "write_html"]

_COLOR = {
    "fail": "#cf222e",
    "error": "#8250df",
    "stale": "#bf8700",
    "pass": "#1a7f37",
    "unbudgeted": "#8c959f",
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


# --------------------------------------------------------------------------- plotting


def _figure(width_in: float, height_in: float, *, ylabels: Sequence[str] = (), xlabel_lines: int = 1,
            legend_in: float = 0.0) -> Any:
    """A figure with one axes and margins sized for its labels.

    Fixed margins instead of a layout engine: constrained layout triples the time a
    figure takes, and a suite's page has dozens.
    """
    from matplotlib.figure import Figure

    # Figure without pyplot: no global state, no GUI backend, safe in workers.
    fig = Figure(figsize=(width_in, height_in), dpi=100)
    left_in = 0.75 if not ylabels else 0.25 + 0.064 * max(len(str(x)) for x in ylabels)
    fig.subplots_adjust(left=min(left_in, width_in * 0.5) / width_in, right=1 - (0.2 + legend_in) / width_in,
                        top=1 - 0.32 / height_in, bottom=(0.3 + 0.2 * xlabel_lines) / height_in)
    return fig


def _svg(fig: Any) -> str:
    """The figure as an inline ``<svg>`` element: text kept as text, output deterministic.

    matplotlib hashes each definition's content into its id, so a fixed salt keeps ids
    unique between figures and identical between renders; the date is left out.
    """
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "perfbudget"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    start = text.find("<svg")
    return text[start:] if start >= 0 else text


def _f(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def plot_budgets(records: Sequence[Record]) -> str | None:
    """Measured / budget per metric, with the tolerance band, the CI and the verdict colour.

    Every metric is normalised by its budget so one axis holds them all: 1.0 is the
    budget, the green band is budget ± tolerance, points right of it are worse for
    lower-is-better metrics (left of it for higher-is-better ones).
    """
    rows = []
    for r in records:
        v = _f(r.value)
        b = _f(r.budget.get("value")) if r.budget else None
        if v is None or not b:
            continue
        tol = float(r.budget["tolerance"]) if r.budget else 0.0
        ci_ratio = [x / b for x in map(_f, r.ci or []) if x is not None]
        rows.append((r, v / b, tol, ci_ratio if len(ci_ratio) == 2 else None))
    if not rows:
        return None
    fig = _figure(7.5, 1.0 + 0.4 * len(rows), ylabels=[r.metric for r, *_ in rows])
    ax = fig.subplots()
    ys = list(range(len(rows)))[::-1]
    xs: list[float] = [1.0]
    for y, (r, ratio, tol, ci) in zip(ys, rows, strict=True):
        if tol:  # exact budgets (tolerance 0) have no band, only the budget line
            ax.barh(y, 2 * tol, left=1 - tol, height=0.7, color=_BAND, alpha=0.18, linewidth=0)
        color = _COLOR.get(r.outcome, "#57606a")
        if ci is not None:
            ax.plot(ci, [y, y], color=color, linewidth=2.2, solid_capstyle="butt")
            xs.extend(ci)
        ax.plot([ratio], [y], "o", color=color, markersize=7, zorder=3)
        label = f"{fmt_value(r.value, r.unit)} vs {fmt_value(r.budget['value'] if r.budget else None, r.unit)}"
        ax.annotate(f"{label} ({ratio - 1:+.1%})", (max([ratio, *(ci or [])]), y), xytext=(6, 0),
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
    ax.set_xlabel("measured / budget  (1 = budget; green band = ± tolerance)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title("measured vs budget", fontsize=10, loc="left")
    return _svg(fig)


def plot_samples(r: Record) -> str | None:
    """Raw samples of a statistical record against its budget, limit and the median's CI."""
    samples = [x for x in map(_f, r.samples) if x is not None]
    if len(samples) < 3:
        return None
    fig = _figure(8.5, 2.4, legend_in=1.75)
    ax = fig.subplots()
    ax.plot(range(len(samples)), samples, ".", color="#57606a", markersize=3, label="samples")
    med = statistics.median(samples)
    ci = [x for x in map(_f, r.ci or []) if x is not None]
    if len(ci) == 2:
        ax.axhspan(ci[0], ci[1], color="#0969da", alpha=0.18, linewidth=0, label="CI of the median")
    ax.axhline(med, color="#0969da", linewidth=1.2, label=f"median {fmt_value(med, r.unit)}")
    b = _f(r.budget.get("value")) if r.budget else None
    if b is not None:
        ax.axhline(b, color="#1f2328", linewidth=1.2, label=f"budget {fmt_value(b, r.unit)}")
    lim = _f(r.limit)
    if lim is not None:
        ax.axhline(lim, color=_COLOR["fail"], linestyle="--", linewidth=1.2, label=f"limit {fmt_value(lim, r.unit)}")
    ax.set_xlabel(f"sample ({r.rounds} round{'s' if r.rounds != 1 else ''})")
    ax.set_ylabel(r.unit if r.unit and r.unit != "1" else "value")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(alpha=0.3)
    ax.set_title(f"{r.metric} samples (n={len(samples)})", fontsize=10, loc="left")
    return _svg(fig)


def plot_operators(records: Sequence[Record]) -> str | None:
    """Per-operator self time: measured (verdict colour) beside its budget and tolerance.

    Operators come from ``op_self_ms[...]`` records and from any record's
    ``extra["ops"]`` table (measured only, grey, when no budget covers the operator).
    """
    ops: dict[str, dict[str, Any]] = {}
    for r in records:
        for o in op_rows(r.extra):
            ops.setdefault(str(o["name"]), {"measured": float(o["self_ms"])})
    for r in records:
        if not r.metric.startswith("op_self_ms[") or _f(r.value) is None:
            continue
        name = r.metric[len("op_self_ms["):-1]
        d = ops.setdefault(name, {})
        d["measured"] = float(r.value)  # type: ignore[arg-type]
        d["outcome"] = r.outcome
        if r.budget:
            d["budget"] = float(r.budget["value"])
            d["tolerance"] = float(r.budget["tolerance"])
    ops = {n: d for n, d in ops.items() if "measured" in d}
    if not ops:
        return None
    top = sorted(ops.items(), key=lambda kv: -max(kv[1]["measured"], kv[1].get("budget", 0.0)))[:_MAX_OPS]
    fig = _figure(7.5, 1.0 + 0.36 * len(top), ylabels=[n for n, _ in top])
    ax = fig.subplots()
    ys = list(range(len(top)))[::-1]
    h = 0.38
    for y, (_, d) in zip(ys, top, strict=True):
        color = _COLOR.get(d.get("outcome", ""), "#8c959f")
        ax.barh(y - h / 2, d["measured"], height=h, color=color)
        if "budget" in d:
            ax.barh(y + h / 2, d["budget"], height=h, color="#d0d7de")
            ax.errorbar([d["budget"]], [y + h / 2], xerr=[[0], [d["budget"] * d["tolerance"]]], fmt="none",
                        ecolor="#1f2328", capsize=3, linewidth=1)
    ax.set_yticks(ys, [n for n, _ in top], fontsize=8)
    ax.set_xlabel("self time per step (ms); grey = budget with its tolerance")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title("per-operator breakdown", fontsize=10, loc="left")
    return _svg(fig)


def plot_padding(records: Sequence[Record]) -> str | None:
    """Padding rate per length bucket, with the budget and the sorted-batching lower bound."""
    src = next((r for r in records if bucket_rows(r.extra)), None)
    if src is None:
        return None
    rows = bucket_rows(src.extra)
    fig = _figure(8.5, 2.8, xlabel_lines=2, legend_in=1.75)
    ax = fig.subplots()
    labels = [str(b["bucket"]) for b in rows]
    rates = [100 * float(b["padding_rate"]) for b in rows]
    color = _COLOR.get(src.outcome, "#0969da") if src.metric.startswith("padding_rate") else "#0969da"
    ax.bar(range(len(rows)), rates, color=color, alpha=0.85)
    pad = next((r for r in records if r.metric == "padding_rate"), None)
    if pad is not None and _f(pad.value) is not None:
        ax.axhline(100 * float(pad.value), color="#0969da", linewidth=1.2,  # type: ignore[arg-type]
                   label=f"overall {100 * float(pad.value):.1f} %")  # type: ignore[arg-type]
        if pad.budget:
            ax.axhline(100 * float(pad.budget["value"]), color="#1f2328", linewidth=1.2,
                       label=f"budget {100 * float(pad.budget['value']):.1f} %")
    lower = _f(src.extra.get("sorted_padding_rate"))
    if lower is not None:
        ax.axhline(100 * lower, color="#8c959f", linestyle="--", linewidth=1.2,
                   label=f"sorted batching {100 * lower:.1f} %")
    ax.set_xticks(range(len(rows)), labels, fontsize=8, rotation=30 if len(rows) > 8 else 0)
    ax.set_xlabel("length bucket")
    ax.set_ylabel("padding (%)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title("padding by bucket", fontsize=10, loc="left")
    return _svg(fig)


# --------------------------------------------------------------------------- page


def _e(x: Any) -> str:
    return html.escape(str(x))


def _budget_cell(r: Record) -> str:
    return f"{fmt_value(r.budget['value'], r.unit)} ± {r.budget['tolerance']:.0%}" if r.budget else "-"


def _change(r: Record) -> str:
    v = _f(r.value)
    b = _f(r.budget.get("value")) if r.budget else None
    return f"{v / b - 1:+.1%}" if v is not None and b else ""


def _source(r: Record) -> str:
    if not r.budget or not r.budget.get("source"):
        return ""
    return f"{r.budget['source']}:{r.budget['line']}" if r.budget.get("line") else str(r.budget["source"])


def _badge(outcome: str, text: str) -> str:
    return f'<span class="badge" style="background:{_COLOR.get(outcome, "#57606a")}">{_e(text)}</span>'


def _table(records: Sequence[Record]) -> str:
    head = ["verdict", "metric", "budget", "limit", "measured", "change", "CI", "n", "cv", "budget file"]
    out = ["<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for r in records:
        ci = f"{fmt_value(r.ci[0])}–{fmt_value(r.ci[1])}" if r.ci else "-"
        cv = f"{r.cv:.1%}" if isinstance(r.cv, (int, float)) else "-"
        cells = [
            f'<td style="color:{_COLOR.get(r.outcome, "")};font-weight:600">{_e(r.outcome.upper())}</td>',
            f"<td><code>{_e(r.metric)}</code></td>",
            f'<td class="num">{_e(_budget_cell(r))}</td>',
            f'<td class="num">{_e(fmt_value(r.limit, r.unit))}</td>',
            f'<td class="num">{_e(fmt_value(r.value, r.unit))}</td>',
            f'<td class="num">{_e(_change(r))}</td>',
            f'<td class="num">{_e(ci)}</td>',
            f'<td class="num">{r.n}</td>',
            f'<td class="num">{_e(cv)}</td>',
            f'<td class="muted">{_e(_source(r))}</td>',
        ]
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _plots(*svgs: str | None) -> str:
    got = [s for s in svgs if s]
    return f'<div class="plots">{"".join(got)}</div>' if got else ""


def _regression_card(t: FailingTest) -> Iterator[str]:
    worst = "error" if any(r.outcome == "error" for r in t.bad) else "fail"
    yield '<div class="card bad">'
    yield f"<h3>{_badge(worst, worst.upper())}<code>{_e(t.key)}</code> · <code>{_e(t.nodeid)}</code></h3>"
    yield f'<div class="muted">on {_e(t.device)}</div>'
    yield _table(t.bad)
    for r in t.bad:
        if r.reason:
            yield f'<div class="reason"><code>{_e(r.metric)}</code>: {_e(r.reason)}</div>'
    if t.moves:
        yield "<div><b>Top moved operators</b></div><table><tr><th>operator</th><th>metric</th><th>budget</th>" \
              "<th>measured</th><th>change</th><th>verdict</th></tr>"
        for m in t.moves:
            ch = f"{m.change:+.1%}" if math.isfinite(m.change) else "new"
            yield (f"<tr><td><code>{_e(m.op)}</code></td><td>{_e(m.family)}</td>"
                   f'<td class="num">{_e(fmt_value(m.budget, m.unit))}</td>'
                   f'<td class="num">{_e(fmt_value(m.measured, m.unit))}</td><td class="num">{_e(ch)}</td>'
                   f'<td style="color:{_COLOR.get(m.outcome, "")}">{_e(m.outcome)}</td></tr>')
        yield "</table>"
    if t.attribution:
        yield "<div><b>Attribution</b></div><ul>" + "".join(f"<li><code>{_e(a)}</code></li>"
                                                           for a in t.attribution) + "</ul>"
    if t.artifacts:
        yield "<div><b>Artifacts</b>: " + ", ".join(f"{_e(k)} <code>{_e(v)}</code>" for k, v in t.artifacts.items()) \
              + ' <span class="muted">(chrome traces open in ui.perfetto.dev; flame graphs in a browser)</span></div>'
    statistical = [r for r in t.bad if r.kind in ("timing", "rate", "energy")][:3]
    has_ops = bool(t.moves) or any(op_rows(r.extra) for r in t.records)
    yield _plots(*(plot_samples(r) for r in statistical), plot_operators(t.records) if has_ops else None)
    yield "</div>"


def render_html(results: Results | Iterable[Record], *, title: str = "perf budgets") -> str:
    """The whole report as one HTML string: no external files, scripts or fonts.

    Sections: verdict counts and devices; each regression with its numbers, reason,
    moved operators, artifacts, samples plot and operator plot; then one section per
    test with measured-vs-budget, per-operator and padding-by-bucket plots and its table.
    """
    recs = results.records if isinstance(results, Results) else list(results)
    records = sorted(recs, key=lambda r: (device_label(r), r.nodeid, r.key, r.metric))
    counts: dict[str, int] = {}
    for r in records:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    bad = regressions(records)
    state = f"{len(bad)} regression{'s' if len(bad) != 1 else ''}" if bad else "all budgets hold"
    if not records:
        state = "no perf records"
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        f"<title>{_e(title)}: {_e(state)}</title><style>{_CSS}</style></head><body><main>",
        f"<h1>{_e(title)}: {_e(state)}</h1>",
        "<div>" + "".join(_badge(o, f"{n} {o}") for o, n in sorted(counts.items(), key=lambda kv: (
            kv[0] not in REGRESSION_OUTCOMES, kv[0]))) + "</div>",
        '<p class="muted">Devices: ' + ", ".join(f"<code>{_e(d)}</code>" for d in sorted({device_label(r) for r in records}))
        + "</p>",
    ]
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
    rank = {o: i for i, o in enumerate(("error", "fail", "stale", "unbudgeted", "unmeasurable", "pass"))}
    worst_of = {k: min(g, key=lambda r: rank.get(r.outcome, 9)) for k, g in groups.items()}
    for (dev, nodeid), group in sorted(groups.items(), key=lambda kv: (rank.get(worst_of[kv[0]].outcome, 9), kv[0])):
        worst = worst_of[(dev, nodeid)]
        out.append(f'<div class="card"><h3>{_badge(worst.outcome, worst.outcome.upper())}<code>{_e(nodeid)}</code>'
                   f' <span class="muted">{_e(dev)} · key <code>{_e(group[0].key)}</code></span></h3>')
        out.append(_plots(plot_budgets(group), plot_operators(group), plot_padding(group)))
        out.append(_table(group))
        out.append("</div>")
    out.append('<p class="muted">Generated by perfbudget from the results JSON; '
               "<code>perfbudget report RESULTS --format html</code> rebuilds it.</p>")
    out.append("</main></body></html>")
    return "\n".join(out)


def write_html(results: Results | Iterable[Record], path: str | Path, *, title: str = "perf budgets") -> Path:
    """Render and write the page; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(results, title=title), encoding="utf-8")
    return path
