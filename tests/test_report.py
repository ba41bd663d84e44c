"""Reports from results: terminal, Markdown, JUnit, HTML; a planted regression end to end; shards = one run."""

from __future__ import annotations

import json
import math
import re
import shutil
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

# Loaded here so in-process runs find matplotlib already imported (see the note below).
import matplotlib.backends.backend_svg
import matplotlib.figure  # noqa: F401
import numpy as np
import pytest
import torch

from perfbudget.artifacts import chrome_trace
from perfbudget.device import DeviceInfo
from perfbudget.extras import OperatorMoves, PaddingByWidth
from perfbudget.measure.operators import OpMove
from perfbudget.measure.padding import padding_rate, sorted_batching_padding_rate
from perfbudget.report import (
    failing_tests,
    fmt_value,
    junit_properties,
    junit_xml,
    markdown_report,
    move_line,
    moved_operators,
    records_table,
    render_html,
    terminal_report,
)
from perfbudget.report.html import plot_padding
from perfbudget.results import BudgetRef, Record, Results, load_results, merge_results
from torchlevers import BucketFitConfig, fit_buckets, plan_bucketed, plan_sorted
from torchlevers.bucketing import query_lengths

DATA = Path(__file__).parent / "data" / "results"

# In-process pytester runs restore sys.modules afterwards, and torch's modules cannot be
# imported twice in one process. A profiled step imports ~900 of them (torch._dynamo...):
# import them all now, at collection, before any in-process run can drop and re-import them.
with tempfile.TemporaryDirectory() as _tmp:
    chrome_trace(lambda: torch.ones(2).relu_(), Path(_tmp) / "warm.json", steps=1)


CPU = DeviceInfo(type="cpu", model="Test CPU", count=1, threads=1)


@pytest.fixture(scope="module")
def regression() -> Results:
    return load_results(DATA / "regression.json")


@pytest.fixture(scope="module")
def ab() -> Results:
    """``regression.json`` judged in lockstep against ``base.json`` as the base commit."""
    return load_results(DATA / "ab.json")


def rec(metric: str, value: float, budget: float | None, outcome: str, *, tol: float = 0.05, unit: str = "ms",
        nodeid: str = "t.py::test_a", key: str = "k", **kw: object) -> Record:
    return Record(
        nodeid=nodeid, key=key, metric=metric, outcome=outcome, value=value, n=30, cv=0.01,
        budget=None if budget is None else BudgetRef(value=budget, tolerance=tol, source="budgets/cpu.yaml", line=3),
        limit=None if budget is None else budget * (1 + tol), device=CPU, unit=unit, kind="timing",
        direction="lower", **kw,  # type: ignore[arg-type]
    )


# --------------------------------------------------------------------------- building blocks


def test_fmt_value_and_records_table_keep_their_shape() -> None:
    assert fmt_value(38.2123, "ms") == "38.21 ms" and fmt_value(6, "1") == "6" and fmt_value(None) == "-"
    assert fmt_value(2.416e9) == "2.416e+09" and fmt_value(math.inf, "ms") == "inf ms" and fmt_value(math.nan) == "nan"
    table = records_table([rec("step_ms", 41.0, 38.2, "fail"), rec("flops", 10, 10, "pass", unit="1")])
    lines = table.splitlines()
    assert lines[0].split() == ["metric", "budget", "tol", "measured", "CI", "n", "cv", "verdict"]
    assert lines[2].split()[0] == "step_ms" and lines[2].split()[-1] == "FAIL"  # failures sort first


def test_moved_operators_are_those_beyond_tolerance_failing_first() -> None:
    def check(op: str, before: float, after: float, outcome: str, *, family: str = "op_self_ms",
              tol: float = 0.05, unit: str = "ms") -> OpMove:
        return OpMove(op=op, family=family, before=before, after=after, unit=unit, tolerance=tol,
                      failing=outcome == "fail", outcome=outcome)

    moved = OperatorMoves.of([
        check("aten::mm", 8.0, 12.0, "fail"),
        check("aten::gelu", 3.0, 3.02, "pass"),  # +0.7 %: noise, not a move
        check("aten::add", 0.8, 0.5, "stale"),  # -37.5 %: moved (better)
        check("aten::mm", 6, 7, "fail", family="op_count", tol=0.0, unit="1"),
    ])
    assert [(m.op, m.family) for m in moved.moves] == [("aten::mm", "op_self_ms"), ("aten::mm", "op_count"),
                                                       ("aten::add", "op_self_ms")]
    # The reports render what the failing records carry, each operator once, never recomputed.
    recs = [rec("step_ms", 41.0, 38.0, "fail", extra=moved.to_extra()),
            rec("op_self_ms[aten::mm]", 12.0, 8.0, "fail", extra=moved.to_extra()),
            rec("op_self_ms[aten::gelu]", 3.02, 3.0, "pass")]
    assert moved_operators(recs) == list(moved.moves)
    assert move_line(moved.moves[0]) == "aten::mm op_self_ms: 12 ms vs budget 8 ms (+50.0%, fail)"
    (t,) = failing_tests(recs)
    assert t.moves == list(moved.moves) and t.attribution == []
    assert "aten::add op_self_ms: 0.5 ms vs budget 0.8 ms (-37.5%, stale)" in terminal_report(recs)
    assert "| `aten::mm` | op_count | 6 | 7 | +16.7% | fail |" in markdown_report(recs)


def test_moves_without_a_reference_or_a_measurement_read_as_such() -> None:
    new = OpMove(op="aten::bmm", family="op_self_ms", before=None, after=2.0, unit="ms", against="base")
    unbudgeted = OpMove(op="aten::bmm", family="op_self_ms", before=None, after=2.0, unit="ms")
    gone = OpMove(op="aten::mm", family="op_self_ms", before=1.5, after=None, unit="ms", against="base")
    assert move_line(new) == "aten::bmm op_self_ms: 2 ms (new)"
    assert move_line(unbudgeted) == "aten::bmm op_self_ms: 2 ms (not budgeted)"
    assert move_line(gone) == "aten::mm op_self_ms: was 1.5 ms (gone)"


# --------------------------------------------------------------------------- the sample regression


def test_terminal_report_explains_each_failing_test(regression: Results) -> None:
    text = terminal_report(regression)
    assert text.splitlines()[0] == "perf budgets on cpu AMD EPYC 7763 64-Core Processor (1 thread)"
    assert "3 fail, 1 unbudgeted, 2 stale, 1 unmeasurable, 6 pass" in text
    tail = text.split("regressions:", 1)[1]
    assert "encoder-train  perf_tests/test_encoder.py::test_encoder_train_step" in tail
    assert re.search(r"step_ms: FAIL: budget 38\.2 ms ± 5%, limit 40\.11 ms, measured 4\d\.\d+ ms \(\+\d", tail)
    assert "budgets/cpu-amd-epyc-7763-64-core-processor.yaml:5" in tail
    assert "aten::addmm op_self_ms: 11.68 ms vs budget 8.1 ms (+44.2%, fail)" in tail
    assert "aten::gelu" not in tail  # within its tolerance: not named as moved


def test_markdown_puts_verdicts_first_then_regressions_then_the_rest(regression: Results) -> None:
    md = markdown_report(regression)
    lines = md.splitlines()
    assert lines[0] == "## ❌ perf budgets: 3 fail, 1 unbudgeted, 2 stale, 1 unmeasurable, 6 pass"
    assert "❌ **3** fail" in lines[2] and "✅ **6** pass" in lines[2]
    order = [md.index(s) for s in ("### Regressions", "### Stale budgets", "### Unbudgeted", "<details>")]
    assert order == sorted(order)
    regress = md[md.index("### Regressions"):md.index("### Stale budgets")]
    assert "#### ❌ `encoder-train` — `perf_tests/test_encoder.py::test_encoder_train_step`" in regress
    row = next(line for line in regress.splitlines() if line.startswith("| `step_ms`"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # One comparison per check, the one that decided: here the stored budget, with its file and line.
    assert cells[:4] == ["`step_ms`", "fail", "**41.26 ms**", "budget `budgets/cpu-amd-epyc-7763-64-core-processor.yaml:5`"]
    assert cells[4] == "**+8.0%** (41.26 ms vs 38.2 ms)" and cells[5] == "+7.2% to +8.8%" and cells[7] == "5%"
    assert "Top moved operators:" in regress
    assert "| `aten::addmm` | op_self_ms | 8.1 ms | 11.68 ms | +44.2% | fail |" in regress
    assert "aten::gelu" not in regress
    assert "Attribution:" not in regress  # the recorder's lines are the operator table already


def test_markdown_of_a_clean_run_and_of_nothing() -> None:
    assert markdown_report([rec("step_ms", 38.0, 38.2, "pass")]).startswith("## ✅ perf budgets: 1 pass")
    assert markdown_report(Results()).startswith("## ⚠️ perf budgets: no perf records")


def test_junit_properties_carry_numbers_and_moved_operators(regression: Results) -> None:
    enc = [r for r in regression.records if r.key == "encoder-train"]
    props = dict(junit_properties(enc))
    assert props["perf.encoder-train.step_ms"] == "fail"
    assert props["perf.encoder-train.step_ms.budget"] == "38.2"
    assert props["perf.encoder-train.step_ms.limit"] == "40.11"
    assert props["perf.encoder-train.step_ms.unit"] == "ms"
    assert props["perf.encoder-train.step_ms.source"] == "budgets/cpu-amd-epyc-7763-64-core-processor.yaml:5"
    assert "aten::addmm op_self_ms: 11.68 ms vs budget 8.1 ms" in props["perf.encoder-train.step_ms.moved"]
    assert "entirely beyond the limit 40.11" in props["perf.encoder-train.step_ms.reason"]
    assert props["perf.encoder-train.flops"] == "pass" and "perf.encoder-train.flops.moved" not in props


def test_junit_xml_from_results_alone(regression: Results) -> None:
    root = ET.fromstring(junit_xml(regression))
    suite = root.find("testsuite")
    assert suite is not None and suite.get("tests") == "3" and suite.get("failures") == "1"
    case = next(c for c in suite.iter("testcase") if c.get("name") == "test_encoder_train_step")
    assert case.get("classname") == "perf_tests.test_encoder"
    failure = case.find("failure")
    assert failure is not None and "step_ms: fail (41" in (failure.get("message") or "")
    assert "budget 38.2 ms ± 5%" in (failure.get("message") or "")
    assert "aten::addmm op_self_ms: 11.68 ms vs budget 8.1 ms" in (failure.text or "")
    names = {p.get("name") for p in case.iter("property")}
    assert {"perf.encoder-train.step_ms.moved", "perf.device"} <= names
    decoder = next(c for c in suite.iter("testcase") if c.get("name") == "test_decoder_generate")
    assert decoder.find("failure") is None and decoder.find("skipped") is None  # stale/pass: not skipped


def test_html_is_self_contained_with_plots_and_names_the_failure(regression: Results) -> None:
    page = render_html(regression)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"<script|<link|src=\"http|href=\"http|url\(http", page)  # no external resources
    assert page.count("<svg") >= 5  # measured-vs-budget per test, samples, operators, padding
    regress = page[page.index("<h2>Regressions</h2>"):page.index("<h2>Tests</h2>")]
    assert "41.26 ms vs 38.2 ms" in regress and "step_ms" in regress
    assert "aten::addmm" in regress and "Top moved operators" in regress
    assert ">measured vs budget<" in page and ">per-operator breakdown<" in page and ">padding by width<" in page
    assert ">512<" in page  # width labels are text in the SVG, not paths
    assert "head/base" not in page and "head vs base commit" not in page  # no base: rendered as before
    assert render_html(regression) == page  # deterministic: no dates, stable ids


def test_failing_tests_group_metrics_headline_first(regression: Results) -> None:
    (t,) = failing_tests(regression.records)
    assert [r.metric for r in t.bad] == ["step_ms", "op_self_ms[aten::addmm]", "op_share[aten::addmm]"]
    assert t.attribution == []


def test_merged_shards_report_exactly_as_the_unsharded_run(regression: Results) -> None:
    merged = merge_results([load_results(DATA / "shard-2.json"), load_results(DATA / "shard-1.json")])
    for render in (terminal_report, markdown_report, junit_xml):
        assert render(merged) == render(regression)
    assert render_html(merged) == render_html(regression)


# --------------------------------------------------------------------------- vs base (lockstep A/B)


def test_terminal_and_markdown_show_base_ratio_ci_and_pairs(ab: Results, regression: Results) -> None:
    text = terminal_report(ab)
    header = text.splitlines()[1].split()
    assert header[-7:] == ["base", "head/base", "ratio", "CI", "pairs", "detectable", "verdict"]
    step = next(line for line in text.splitlines() if line.startswith("encoder-train") and " step_ms " in line)
    assert re.search(r"38\.03 ms\s+1\.085 \(\+8\.5%\)\s+1\.08\d-1\.08\d\s+3\s+\S+\s+FAIL$", step)
    energy = next(line for line in text.splitlines() if "energy_j_per_token" in line)
    assert energy.split()[-6:] == ["-", "-", "-", "-", "-", "UNMEASURABLE"]  # no base side: dashes
    tail = text.split("regressions:", 1)[1]
    assert "vs base: base 38.03 ms, head/base 1.085 (+8.5%), CI 1.08" in tail and "3 process pairs" in tail
    assert "aten::addmm op_self_ms: 11.68 ms vs base 7.989 ms (+45.6%, fail)" in tail
    assert "head/base" not in terminal_report(regression)  # records without base render as before

    md = markdown_report(ab)
    assert "Compared with the base commit (lockstep A/B): 12 of 13 checks, up to 3 process pairs." in md
    regress = md[md.index("### Regressions"):md.index("### Stale budgets")]
    head = next(line for line in regress.splitlines() if line.startswith("| metric"))
    # One comparison per check, the one that decided: head/base, not also the stored budget.
    assert head == "| metric | verdict | measured | against | change | interval | could resolve | tolerance | n | cv |"
    row = next(line for line in regress.splitlines() if line.startswith("| `step_ms`"))
    assert "| base, 3 pairs | **+8.5%** | +8.5% to +8.6% |" in row and "38.2" not in row
    assert "| `aten::addmm` | op_self_ms | 7.989 ms | 11.68 ms | +45.6% | fail |" in regress
    assert "| base | head/base |" not in markdown_report(regression)


def test_junit_properties_and_xml_carry_the_base_side(ab: Results) -> None:
    props = dict(junit_properties([r for r in ab.records if r.key == "encoder-train"]))
    assert props["perf.encoder-train.step_ms.base"] == "38.0259" and props["perf.encoder-train.step_ms.pairs"] == "3"
    assert props["perf.encoder-train.step_ms.ratio"].startswith("1.085")
    lo, hi = map(float, props["perf.encoder-train.step_ms.ratio_ci"].split(","))
    assert 1.08 < lo <= float(props["perf.encoder-train.step_ms.ratio"]) <= hi < 1.09
    assert "vs base 7.989 ms" in props["perf.encoder-train.step_ms.moved"]
    case = next(c for c in ET.fromstring(junit_xml(ab)).iter("testcase") if c.get("name") == "test_encoder_train_step")
    failure = case.find("failure")
    assert failure is not None and "vs base 38.03 ms: head/base 1.085 (+8.5%)" in (failure.get("message") or "")


def test_html_draws_base_vs_head_per_failing_check(ab: Results) -> None:
    page = render_html(ab)
    regress = page[page.index("<h2>Regressions</h2>"):page.index("<h2>Tests</h2>")]
    for metric in ("step_ms", "op_self_ms[aten::addmm]", "op_share[aten::addmm]"):  # the three failing checks
        assert f">{metric}: head/base " in regress
    # The line drawn for each side is the value the tables show (one quantity, one definition).
    assert regress.count("(as measured)") == 6
    for r in ab.records:
        if r.outcome == "fail" and r.base is not None and r.kind == "timing":
            assert f"head {fmt_value(r.value, r.unit)} (as measured)" in regress
            assert f"base {fmt_value(r.base.value, r.unit)} (as measured)" in regress
    assert ">head vs base commit (up to 3 process pairs)<" in page
    assert "<th>against</th>" in page and "<th>could resolve</th>" in page and "base, 3 pairs" in page
    assert "grey = base commit with its tolerance" in regress
    assert render_html(ab) == page


# --------------------------------------------------------------------------- padding, as the suite records it


def test_padding_plot_has_data_for_what_the_padding_perf_test_records() -> None:
    # What perf_tests/test_padding.py records for the bucketed strategy, on a small sample.
    lengths = np.asarray(query_lengths(600, seed=0))
    buckets = fit_buckets(lengths, BucketFitConfig(batch_size=16, max_len=512)).buckets
    plan = plan_bucketed(lengths, buckets, batch_size=16)
    rate = padding_rate(plan.real_lens, plan.padded_lens)
    ordered = plan_sorted(lengths, batch_size=16)
    assert math.isclose(sorted_batching_padding_rate(lengths.tolist(), 16),
                        padding_rate(ordered.real_lens, ordered.padded_lens))
    padding = PaddingByWidth.from_batches(plan.real_lens, plan.padded_lens,
                                          sorted_rate=sorted_batching_padding_rate(lengths.tolist(), 16))
    record = Record(nodeid="perf_tests/test_padding.py::test_padding_rate[bucketed]", key="padding-bucketed",
                    metric="padding_rate", outcome="pass", value=rate, n=1, device=CPU, unit="1", kind="exact",
                    budget=BudgetRef(value=round(rate, 4), tolerance=0.0, source="budgets/cpu.yaml", line=4),
                    extra=padding.to_extra())
    back = load_results(Results(records=[record]).write(Path(tempfile.mkdtemp()) / "r.json")).records[0]
    assert PaddingByWidth.from_extra(back.extra) == padding  # the JSON round trip keeps it

    assert len(padding.widths) >= 2 and set(padding.widths) == set(plan.padded_lens)
    svg = plot_padding([back])
    assert svg is not None and ">padding by width<" in svg
    for w in padding.widths:
        assert f">{w}<" in svg  # one bar per padded width, labelled
    assert svg.count('<g id="patch_') >= len(padding.widths) + 2  # figure, axes, one patch per bar
    assert ">sorted batching " in svg and ">budget " in svg and ">overall " in svg
    page = render_html([back])
    assert ">padding by width<" in page

    # The key the report once read draws nothing.
    assert plot_padding([record.with_(extra={"padding_by_bucket": {"a": 0.1}})]) is None


# --------------------------------------------------------------------------- a planted regression, end to end

#: The planted changes are far beyond any noise: judge them on a busy machine too (the
#: preflight would otherwise record them as unmeasurable, which these tests do not test).
QUIET_ENOUGH = ("-o", "perfbudget_max_load=1000")

PLANTED = """
import pytest
import torch

@pytest.fixture
def step():
    a = torch.randn(96, 96)

    def run():
        (a @ a).relu_()

    return run

MM = [0.30 + 0.001 * (i % 7) for i in range(30)]
RELU = [0.0100 + 0.0001 * (i % 5) for i in range(30)]

@pytest.mark.budget("mlp")
def test_mlp_step(perf, step):
    perf.time("step_ms", step, warmup_ms=5, min_samples=30, max_ms=5, max_samples=40)
    perf.record("op_self_ms[aten::mm]", MM, more=lambda: MM)
    perf.record("op_self_ms[aten::relu_]", RELU, more=lambda: RELU)

@pytest.mark.budget("mlp")
def test_mlp_flops(perf):
    perf.record("flops", 1769472)
"""

PLANTED_BUDGETS = """schema: 1
device: {type: cpu}
budgets:
  mlp:
    flops: 1769472
    step_ms: {value: 0.00001, tolerance: 0.05}
    op_self_ms[aten::mm]: {value: 0.1, tolerance: 0.05}
    op_self_ms[aten::relu_]: {value: 0.0102, tolerance: 0.05}
"""


def test_planted_regression_shows_in_every_report_with_trace_and_flame_graph(pytester: pytest.Pytester,
                                                                             stable_machine: str) -> None:
    pytester.makepyfile(test_planted=PLANTED)
    (pytester.path / "budgets").mkdir()
    # Timing budgets gate only in a file keyed by the identity of a machine declared stable.
    (pytester.path / "budgets" / "cpu.yaml").write_text(
        PLANTED_BUDGETS.replace("device: {type: cpu}", f"device: {{type: cpu, identity: {stable_machine}}}", 1))
    r = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--junitxml=junit.xml", *QUIET_ENOUGH)
    r.assert_outcomes(passed=1, failed=1)
    r.stdout.fnmatch_lines([
        "*perf budget check failed: mlp on cpu*",
        "operators that moved:",
        "*aten::mm op_self_ms: 0.303 ms vs budget 0.1 ms (+203.0%, fail)",
        "failure artifacts:",
        "*chrome trace: *test_planted.py__test_mlp_step/trace.json*",
        "*flame graph: *",
    ])
    out = pytester.path / ".perfbudget"
    folder = out / "artifacts" / "test_planted.py__test_mlp_step"

    # chrome trace of the failing step, readable by Perfetto (JSON trace events)
    trace = json.loads((folder / "trace.json").read_text())
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])
    # flame graph, or a clear reason when py-spy may not attach here
    flame = folder / "flamegraph.svg"
    if flame.exists():
        assert "<svg" in flame.read_text() and "run" in flame.read_text()
    else:
        r.stdout.fnmatch_lines(["*flame graph: not written: *"])

    md = (out / "results.md").read_text()
    assert md.startswith("## ❌ perf budgets: 2 fail")
    assert re.search(r"\| `step_ms` \| fail \| \*\*[^*]+ ms\*\* \| budget `budgets/[^`]+` \| \*\*\+", md), md
    assert "| `aten::mm` | op_self_ms | 0.1 ms | 0.303 ms | +203.0% | fail |" in md
    assert "Artifacts: chrome trace `" in md and "trace.json`" in md

    page = (out / "results.html").read_text()
    assert page.count("<svg") >= 3 and "aten::mm" in page and "Top moved operators" in page
    assert "trace.json" in page

    case = next(c for c in ET.parse(pytester.path / "junit.xml").iter("testcase") if c.get("name") == "test_mlp_step")
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["perf.mlp.step_ms"] == "fail" and props["perf.mlp.step_ms.budget"] == "1e-05"
    assert "aten::mm op_self_ms: 0.303 ms vs budget 0.1 ms" in (props["perf.mlp.step_ms.moved"] or "")
    assert (props["perf.artifact.trace"] or "").endswith("trace.json")
    failure = case.find("failure")
    assert failure is not None and "op_self_ms[aten::mm]" in (failure.text or "")
    assert "failure artifacts:" in (failure.text or "")


SHARDED = """
import pytest

@pytest.mark.budget("{key}{{n}}")
@pytest.mark.parametrize("n", [1, 2])
def test_{key}(perf, n):
    perf.record("step_ms", [{base} * n + 0.01 * i for i in range(30)], more=lambda: [{base} * n + 0.01 * i for i in range(30)])
    perf.record("op_self_ms[aten::mm]", [{base} / 4 * n + 0.001 * i for i in range(30)],
                more=lambda: [{base} / 4 * n + 0.001 * i for i in range(30)])
    perf.record("op_count[aten::mm]", 3 * n)
"""


def test_perfbudget_merge_of_two_shards_gives_the_unsharded_report(pytester: pytest.Pytester,
                                                                    stable_machine: str) -> None:
    from perfbudget.cli import main

    pytester.makepyfile(test_a=SHARDED.format(key="a", base=10.0), test_b=SHARDED.format(key="b", base=4.0))
    run = ["-p", "no:cacheprovider", "-o", "perfbudget_html=false", *QUIET_ENOUGH]
    pytester.runpytest_inprocess(*run, "--update-budgets").assert_outcomes(passed=4)
    cpu = next(p for p in (pytester.path / "budgets").glob("cpu-*.yaml"))
    cpu.write_text(cpu.read_text().replace("value: 10.14", "value: 9.0"))  # plant: a[1] step_ms now fails

    full = pytester.path / "full.json"
    pytester.runpytest_inprocess(*run, f"--perf-json={full}").assert_outcomes(passed=3, failed=1)
    pytester.runpytest_inprocess(*run, "test_b.py", "--perf-json=shards/b.json").assert_outcomes(passed=2)
    pytester.runpytest_inprocess(*run, "test_a.py", "--perf-json=shards/a.json").assert_outcomes(passed=1, failed=1)
    merged = pytester.path / "merged.json"
    assert main(["merge", "shards/b.json", "shards/a.json", "-o", str(merged)]) == 0

    a, b = load_results(full), load_results(merged)
    assert len(b.records) == len(a.records) == 12
    for render in (terminal_report, markdown_report, junit_xml):
        assert render(b) == render(a)
    assert "#### ❌ `a1` — `test_a.py::test_a[1]`" in markdown_report(b)
    for fmt in ("markdown", "junit", "terminal"):
        assert main(["report", str(merged), "-f", fmt, "-o", f"m.{fmt}"]) == 1  # regressions: exit 1
        assert main(["report", str(full), "-f", fmt, "-o", f"f.{fmt}"]) == 1
        assert (pytester.path / f"m.{fmt}").read_text() == (pytester.path / f"f.{fmt}").read_text()
    shutil.rmtree(pytester.path / "shards")


def test_every_outcome_has_its_place_in_every_report() -> None:
    from perfbudget.report.common import OUTCOME_ORDER, outcome_text
    from perfbudget.report.html import _COLOR
    from perfbudget.report.markdown import ICON
    from perfbudget.vocabulary import OUTCOMES, Outcome

    for table in (OUTCOME_ORDER, ICON, _COLOR):
        assert set(table) == set(OUTCOMES), table
    assert sorted(OUTCOME_ORDER.values()) == list(range(len(OUTCOMES)))
    assert f"{Outcome.NOT_JUDGED}" == "not_judged" and Outcome("not_judged") is Outcome.NOT_JUDGED
    r = Record(nodeid="t", key="k", metric="step_ms", outcome=Outcome.NOT_JUDGED, value=1.0)
    assert outcome_text(r) == "NOT JUDGED"


def test_a_tolerance_under_one_percent_is_shown_as_itself() -> None:
    from perfbudget.report.common import fmt_tolerance

    # An instruction count's 0.5 % read "0%" in the terminal table: a limit nobody can check.
    assert [fmt_tolerance(t) for t in (0.005, 0.05, 0.3125, 0.0)] == ["0.5%", "5%", "31.2%", "0%"]
