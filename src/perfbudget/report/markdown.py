"""Markdown of a run for a CI step summary: verdicts first, each regression explained, then the rest."""

from __future__ import annotations

from collections.abc import Iterable

from ..results import Record, Results
from ..vocabulary import Outcome
from .common import (
    DECIDING_COLUMNS,
    FailingTest,
    base_cells,
    budget_text,
    change_text,
    ci_text,
    cv_text,
    deciding_cells,
    device_label,
    devices,
    failing_tests,
    fmt_value,
    has_base,
    headline,
    md_fit,
    md_run_problems,
    md_table,
    md_text,
    move_change_text,
    ordered,
    outcome_counts,
    regressions,
    sort_key,
)
from .terminal import gpu_steps

__all__ = ["markdown_report"]

ICON: dict[str, str] = {Outcome.FAIL: "❌", Outcome.ERROR: "⛔", Outcome.INCONCLUSIVE: "❔", Outcome.STALE: "🟡",
        Outcome.ADVISORY: "🔶", Outcome.UNBUDGETED: "⚪", Outcome.NOT_JUDGED: "⏸️", Outcome.NOT_MEASURED: "🔲",
        Outcome.UNMEASURABLE: "➖", Outcome.PASS: "✅"}

#: Records measured (or budgeted) but not judged, listed in a section of their own.
_NOT_JUDGED = (Outcome.UNBUDGETED, Outcome.NOT_JUDGED, Outcome.NOT_MEASURED, Outcome.UNMEASURABLE)

#: GitHub caps one step summary at 1 MiB; stay well under it.
_MARKDOWN_MAX_ROWS = 400
#: Failing tests explained one by one, and failing records of one test shown, in the Regressions section.
_MAX_FAILING = 50
_MAX_BAD = 25
MAX_SUMMARY_BYTES = 1_000_000
"""The longest summary written (UTF-8 bytes), below GitHub's 1 MiB (1,048,576 bytes) for one step's."""
#: Room kept for what a cut summary says of the cut (and the ``</details>`` it closes).
_CUT_NOTE = 500


def markdown_report(results: Results | Iterable[Record], *, title: str = "perf budgets") -> str:
    """Markdown for a CI step summary: verdicts, each regression explained, the stale, inconclusive,
    advisory and unjudged checks, then every record in a folded table."""
    records = ordered(results.records if isinstance(results, Results) else results)
    problems = md_run_problems(results) if isinstance(results, Results) else []
    if not records:
        return "\n".join([f"## ⚠️ {title}: no perf records", "", *problems, "No perf records were produced.", ""])
    bad = regressions(records)
    icon, words = headline(records)
    lines = [f"## {icon} {title}: {words}", "", *problems,
             " · ".join(f"{ICON.get(o, '')} **{n}** {o}" for o, n in outcome_counts(records).items()), "",
             "Devices: " + ", ".join(md_text(d, code=True) for d in devices(records)), ""]
    steps = gpu_steps(records)
    if steps:
        lines += [*md_table(["GPU step", "kernels/step", "GPU idle", "TFLOP/s", "bound by", "device"], (
            [md_text(s.key, code=True), "-" if s.kernels is None else f"{s.kernels:.0f}", f"{s.idle_share * 100:.0f} %",
             "-" if s.tflops_per_s is None else f"{s.tflops_per_s:.0f}", "launch" if s.launch_bound else "GPU",
             md_text(s.device)] for s in steps)), ""]
    vs_base = has_base(records)
    if vs_base:
        compared = [r for r in records if r.vs_base is not None]
        pairs = max(r.vs_base.pairs for r in compared if r.vs_base is not None)
        lines += [f"Compared with the base commit (lockstep A/B): {len(compared)} of {len(records)} checks, "
                  f"up to {pairs} process pair{'s' if pairs != 1 else ''}.", ""]
    if bad:
        lines += ["### Regressions", ""]
        failing = failing_tests(records)
        for t in failing[:_MAX_FAILING]:
            lines.extend(_regression(t))
        if len(failing) > _MAX_FAILING:
            lines += [f"… {len(failing) - _MAX_FAILING} more failing tests: every one is in the HTML report and "
                      "the results JSON.", ""]
    lines += _section("Stale budgets (better than budget beyond tolerance)",
                      "The code got faster or leaner: ratchet them with `pytest perf_tests --update-budgets` or "
                      "`perfbudget update results.json`.",
                      ["key", "metric", "budget", "measured", "change", "device"],
                      [[md_text(r.key, code=True), md_text(r.metric, code=True), budget_text(r), fmt_value(r.value, r.unit),
                        change_text(r), md_text(device_label(r))] for r in records if r.outcome == Outcome.STALE])
    lines += _section("Inconclusive (the interval still straddles the tolerance after the last pair)",
                      "Not a failure (a failure under `--perf-strict`): this run could not tell. The reason names the "
                      "smallest change it could have resolved; more pairs (`--max-pairs`) narrow it.",
                      ["key", "metric", "head/base", "why", "test"],
                      [[md_text(r.key, code=True), md_text(r.metric, code=True), base_cells(r)[1] if r.vs_base else "-",
                        md_text(r.reason), md_text(r.nodeid, code=True)]
                       for r in records if r.outcome == Outcome.INCONCLUSIVE])
    lines += _section("Advisory (stored timing budgets on a machine not declared stable for them)",
                      "Shown, never a failure: stored timing budgets gate only on a machine declared stable "
                      "(`PERFBUDGET_STABLE_MACHINE`) with budgets keyed by its identity. Judge timing on this machine "
                      "with `perfbudget ab --base <ref>`.",
                      ["would be", "key", "metric", "budget", "measured", "change", "device"],
                      [[md_text(r.advice) or "-", md_text(r.key, code=True), md_text(r.metric, code=True), budget_text(r),
                        fmt_value(r.value, r.unit), change_text(r), md_text(device_label(r))]
                       for r in records if r.outcome == Outcome.ADVISORY])
    lines += _section("Unbudgeted, set aside (not judged), not measured or unmeasurable", "",
                      ["verdict", "key", "metric", "measured", "why", "test"],
                      [[r.outcome, md_text(r.key, code=True), md_text(r.metric, code=True), fmt_value(r.value, r.unit),
                        md_text(r.reason), md_text(r.nodeid, code=True)] for r in records if r.outcome in _NOT_JUDGED])
    lines += _all_records(records, vs_base=vs_base)
    return _capped(lines)


def _all_records(records: list[Record], *, vs_base: bool) -> list[str]:
    """Every record in a folded table (the first :data:`_MARKDOWN_MAX_ROWS`)."""
    header = ["verdict", "key", "metric", "budget", "measured", "CI", "n", *(("base", "head/base") if vs_base else ()),
              "device"]
    rows = []
    for r in sorted(records, key=lambda r: (device_label(r), sort_key(r)))[:_MARKDOWN_MAX_ROWS]:
        row = [ICON.get(r.outcome, "") + " " + r.outcome, md_text(r.key, code=True), md_text(r.metric, code=True), budget_text(r),
               fmt_value(r.value, r.unit), ci_text(r.ci), str(r.n)]
        if vs_base:
            row += base_cells(r)[:2]
        rows.append([*row, md_text(device_label(r))])
    more = len(records) - _MARKDOWN_MAX_ROWS
    return [f"<details><summary>All {len(records)} records</summary>", "", *md_table(header, rows),
            *(["", f"… {more} more in the results JSON and the HTML report."] if more > 0 else []), "", "</details>", ""]


def _section(title: str, intro: str, header: list[str], rows: list[list[str]]) -> list[str]:
    """A heading, its intro and its table, when it has rows (none: nothing)."""
    if not rows:
        return []
    return [f"### {title}", "", *([intro, ""] if intro else []), *md_table(header, rows), ""]


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def _capped(lines: list[str]) -> str:
    """The summary's lines up to :data:`MAX_SUMMARY_BYTES`, whole ones only (a ``<details>`` left open
    closed); a cut says so, and where the rest is."""
    text = "\n".join(lines)
    if _size(text) <= MAX_SUMMARY_BYTES:
        return text
    kept = md_fit(lines, MAX_SUMMARY_BYTES - _CUT_NOTE, size=_size)
    shown = _size("\n".join(kept))
    return "\n".join([*kept, "", f"… the summary is cut here, at {shown:,} of {_size(text):,} bytes (GitHub shows "
                      "1 MiB): every record is in the HTML report and the results JSON.", ""])


def _regression(t: FailingTest) -> list[str]:
    lines = [f"#### {ICON[t.worst]} {md_text(t.key, code=True)} — {md_text(t.nodeid, code=True)}", "",
             f"on {md_text(t.device, code=True)}", ""]
    bad = t.bad[:_MAX_BAD]
    rows = [[md_text(r.metric, code=True), r.outcome, f"**{fmt_value(r.value, r.unit)}**", *deciding_cells(r), str(r.n),
             cv_text(r)] for r in bad]
    lines += [*md_table(["metric", "verdict", "measured", *DECIDING_COLUMNS, "n", "cv"], rows), ""]
    if len(t.bad) > _MAX_BAD:
        lines += [f"… and {len(t.bad) - _MAX_BAD} more failing checks of this test in the HTML report.", ""]
    for r in bad:
        if r.reason:
            lines.append(f"> {md_text(r.metric, code=True)}: {md_text(r.reason)}  ")
    lines.append("")
    if t.moves:
        # Moves and their note come from a record's extra (a results file): every field through the door.
        lines += [f"Top moved operators ({md_text(t.moves_note)}):" if t.moves_note else "Top moved operators:", "",
                  *md_table(["operator", "metric", md_text(t.moves[0].against), "measured", "change", "verdict"],
                            ([md_text(m.op, code=True), md_text(m.family), md_text(fmt_value(m.before, m.unit)),
                              md_text(fmt_value(m.after, m.unit)), move_change_text(m), md_text(m.outcome or "-")]
                             for m in t.moves)), ""]
    if t.attribution:
        lines += ["Attribution:", "", *(f"- {md_text(a, code=True)}" for a in t.attribution), ""]
    if t.artifacts:
        lines += ["Artifacts: " + ", ".join(f"{md_text(k)} {md_text(v, code=True)}" for k, v in t.artifacts.items()), ""]
    return lines
