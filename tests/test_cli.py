"""The `perfbudget` command: report, merge, diff, show, update; errors name the file; exit codes."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from test_docs import docs_text

from perfbudget.budgets.loader import load_dir
from perfbudget.cli import EXIT_INPUT, EXIT_OK, EXIT_REGRESSION, diff_results, explain_budgets, main
from perfbudget.device import DeviceInfo
from perfbudget.exitcodes import ExitCode
from perfbudget.results import ABRunInfo, RunInfo, load_results
from perfbudget.vocabulary import Outcome, RunMode

DATA = Path(__file__).parent / "data" / "results"
REGRESSION, BASE, AB = str(DATA / "regression.json"), str(DATA / "base.json"), str(DATA / "ab.json")
EPYC = DeviceInfo(type="cpu", model="AMD EPYC 7763 64-Core Processor", count=2, torch="2.13.0+cpu", threads=1)


def run(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(args), out=out), out.getvalue()


@pytest.fixture
def budgets(tmp_path: Path) -> Path:
    """The budgets the sample results were judged against, plus a GPU file and a rival CPU file."""
    sys.path.insert(0, str(DATA))
    try:
        from generate import BUDGETS  # the sample data's own budgets
    finally:
        sys.path.remove(str(DATA))
    root = tmp_path / "budgets"
    root.mkdir()
    for name, text in BUDGETS.items():
        (root / name).write_text(text)
    (root / "nvidia-h100.yaml").write_text("schema: 1\ndevice: {type: cuda, model: H100}\nbudgets:\n"
                                           "  encoder-train:\n    step_ms: 9.5\n")
    return root


def test_exit_codes_are_the_documented_ones_for_every_command() -> None:
    assert [(c.name, int(c)) for c in ExitCode] == [("OK", 0), ("FAILED", 1), ("USAGE", 2)]
    readme = docs_text()
    assert "Exit codes: `0` ok; `1` regressions found" in readme and "`2` usage or input error" in readme
    assert "Exit codes: 0 no check" in readme and "2 usage error." in readme  # perfbudget ab
    assert (EXIT_OK, EXIT_REGRESSION, EXIT_INPUT) == (ExitCode.OK, ExitCode.FAILED, ExitCode.USAGE)
    assert run("ab", "--base", "HEAD", "--cpus", "nonsense")[0] == ExitCode.USAGE  # the A/B command's own exit


# --------------------------------------------------------------------------- report


def test_report_formats_and_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run("report", REGRESSION)
    assert code == EXIT_REGRESSION and "regressions:" in text and "3 fail" in text
    code, text = run("report", REGRESSION, "--exit-zero", "-f", "markdown")
    assert code == EXIT_OK and text.startswith("## ❌ perf budgets: 3 fail, 1 unbudgeted, 2 stale, 1 unmeasurable, 6 pass")
    code, _ = run("report", BASE)
    assert code == EXIT_OK  # nothing fails in the base run
    for fmt, head in (("html", "<!DOCTYPE html>"), ("junit", "<?xml"), ("markdown", "## "), ("terminal", "perf ")):
        out = tmp_path / f"r.{fmt}"
        assert run("report", REGRESSION, "-f", fmt, "-o", str(out))[0] == EXIT_REGRESSION
        assert out.read_text().startswith(head)
    assert "wrote junit report of 13 records" in capsys.readouterr().err
    code, text = run("report", REGRESSION, "-f", "markdown", "--title", "perf (h100)", "--exit-zero")
    assert text.startswith("## ❌ perf (h100): 3 fail")


def test_report_of_a_lockstep_ab_results_file(tmp_path: Path) -> None:
    code, text = run("report", AB)
    assert code == EXIT_REGRESSION and "head/base" in text and "vs base: base 38.03 ms" in text
    for fmt, shows in (("markdown", "| base, 3 pairs | **+8.5%** |"), ("junit", "step_ms.ratio_ci"),
                       ("html", ">head vs base commit (up to 3 process pairs)<")):
        out = tmp_path / f"ab.{fmt}"
        assert run("report", AB, "-f", fmt, "-o", str(out))[0] == EXIT_REGRESSION
        assert shows in out.read_text()
    assert run("report", AB, "--exit-zero")[0] == EXIT_OK


def test_a_malformed_extra_is_an_input_error_naming_file_and_key(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(Path(REGRESSION).read_text())
    data["records"][0]["extra"] = {"padding_by_width": [0.1]}
    bad = tmp_path / "bad-extra.json"
    bad.write_text(json.dumps(data))
    assert run("report", str(bad), "-f", "html")[0] == EXIT_INPUT
    assert f"{bad}: extra['padding_by_width']: expected a mapping, got [0.1]" in capsys.readouterr().err


def test_input_errors_name_the_file_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("report", str(tmp_path / "missing.json"))[0] == EXIT_INPUT
    assert f"perfbudget report: error: {tmp_path / 'missing.json'}: cannot read results" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": 7, "records": []}')
    assert run("report", str(bad))[0] == EXIT_INPUT
    assert f"{bad}: results schema 7 is newer than this perfbudget reads (schema 4)" in capsys.readouterr().err
    bad.write_text("{not json")
    assert run("merge", str(bad), "-o", str(tmp_path / "m.json"))[0] == EXIT_INPUT
    assert f"{bad}: cannot read results" in capsys.readouterr().err
    assert run("report")[0] == EXIT_INPUT  # argparse usage error
    assert run("frobnicate")[0] == EXIT_INPUT
    assert run("--help")[0] == EXIT_OK
    assert "exit codes:" in capsys.readouterr().out


# --------------------------------------------------------------------------- merge


def test_merge_shards_equals_the_whole_and_refuses_overlap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    merged = tmp_path / "merged.json"
    code, text = run("merge", str(DATA / "shard-1.json"), str(DATA / "shard-2.json"), "-o", str(merged))
    assert code == EXIT_OK and "merged 2 file(s), 13 records" in text
    meta = json.loads(merged.read_text())["meta"]
    assert meta["shards"] == 2 and meta["sources"][0].endswith("shard-1.json")
    assert run("report", str(merged), "-f", "markdown")[1] == run("report", REGRESSION, "-f", "markdown")[1]
    # report merges several files itself too
    assert run("report", str(DATA / "shard-2.json"), str(DATA / "shard-1.json"))[1] == run("report", REGRESSION)[1]

    assert run("merge", str(DATA / "shard-1.json"), REGRESSION, "-o", str(merged))[0] == EXIT_INPUT
    err = capsys.readouterr().err
    assert "regression.json: record perf_tests/test_encoder.py::test_encoder_train_step encoder-train." in err
    assert "is also in" in err and "shard-1.json; shards must not overlap" in err


def test_merge_reconciles_each_shards_not_measured_budgets(tmp_path: Path) -> None:
    """Each shard's session reports the budgets it did not record; one shard measuring a budget makes
    another shard's report of it moot, and two shards reporting the same one report it once."""
    one, two = load_results(DATA / "shard-1.json"), load_results(DATA / "shard-2.json")
    measured_in_two = two.records[0]
    assert measured_in_two.outcome != "not_measured"
    unrecorded = replace(measured_in_two, nodeid="", outcome=Outcome.NOT_MEASURED, value=None,
                         reason="budgeted but no test of this run recorded it")
    elsewhere = replace(unrecorded, metric="peak_allocated_mib[never_recorded]")
    one.records += [unrecorded, elsewhere]
    two.records += [elsewhere]
    paths = [tmp_path / "one.json", tmp_path / "two.json"]
    one.write(paths[0])
    two.write(paths[1])
    merged = tmp_path / "merged.json"
    code, text = run("merge", *map(str, paths), "-o", str(merged))
    assert code == EXIT_OK, text
    records = load_results(merged).records
    assert [r for r in records if r.metric == measured_in_two.metric and r.key == measured_in_two.key
            and r.outcome == Outcome.NOT_MEASURED] == []
    assert [(r.metric, r.outcome) for r in records if r.metric == "peak_allocated_mib[never_recorded]"] == [
        ("peak_allocated_mib[never_recorded]", Outcome.NOT_MEASURED)]
    assert len(records) == 14  # the 13 measured records, and the one budget no shard recorded


# --------------------------------------------------------------------------- diff


def test_diff_operator_by_operator_and_exit_1_when_worse() -> None:
    code, text = run("diff", BASE, REGRESSION)
    assert code == EXIT_REGRESSION
    assert text.splitlines()[0].startswith("perf diff: 3 worse")
    ops = text[text.index("operators:"):text.index("metrics:")]
    row = next(line for line in ops.splitlines() if line.startswith("aten::addmm"))
    assert "7.989 ms -> 11.68 ms +46.2%" in row and "worse" in row
    assert "aten::gelu" not in ops  # within tolerance and CIs overlap: not listed without --all
    assert "step_ms" in text[text.index("metrics:"):]
    extra = text[text.index("operator table of step_ms (extra):"):]
    assert "aten::addmm" in extra and "+45.0%" in extra and "aten::softmax" not in extra

    code, text = run("diff", BASE, REGRESSION, "--all", "-f", "markdown", "--key", "encoder-train")
    assert "| aten::gelu |" in text and "decoder-generate" not in text and "## perf diff" in text
    assert run("diff", BASE, BASE)[0] == EXIT_OK
    assert run("diff", REGRESSION, BASE)[0] == EXIT_OK  # only improvements


def test_diff_statuses_threshold_and_devices() -> None:
    base, new = load_results(BASE), load_results(REGRESSION)
    changes, note = diff_results(base, new)
    status = {c.metric: c.status for c in changes if c.key == "encoder-train"}
    assert status["step_ms"] == "worse" and status["op_self_ms[aten::gelu]"] == "same"
    assert status["op_count[aten::mm]"] == "same" and note == ""
    changes, _ = diff_results(base, new, threshold=0.3)
    assert {c.metric for c in changes if c.status == "worse"} == {"op_self_ms[aten::addmm]"}
    # another machine: matched on key and metric, and said so
    new.records = [r.with_(device=replace(r.device, model="Other CPU")) for r in new.records if r.device]
    changes, note = diff_results(base, new)
    assert "no common device" in note and any(c.status == "worse" for c in changes)


# --------------------------------------------------------------------------- show


def test_explain_budgets_says_which_files_apply_why_and_who_wins(budgets: Path) -> None:
    (budgets / "cpu-epyc.yaml").write_text("schema: 1\ndevice: {type: cpu, model: EPYC}\nbudgets:\n"
                                           "  encoder-train:\n    step_ms: 40.0\n")
    text, broken = explain_budgets(load_dir(budgets), EPYC)
    assert not broken
    lines = text.splitlines()
    assert lines[0] == "device: cpu AMD EPYC 7763 64-Core Processor (1 thread)"
    table = {ln.split()[0]: ln.split() for ln in lines if ln.endswith(".yaml") or ".yaml " in ln}
    assert table["cpu-amd-epyc-7763-64-core-processor.yaml"][1:3] == ["3", "yes"]
    assert table["cpu-epyc.yaml"][1:3] == ["2", "yes"] and table["cpu.yaml"][1:3] == ["1", "yes"]
    assert table["nvidia-h100.yaml"][2] == "no"
    assert "type=cuda (this device: cpu)" in text and "model=H100 (this device: AMD EPYC" in text
    step = next(ln for ln in lines if ln.startswith("encoder-train") and " step_ms " in ln)
    assert "38.2 ms" in step and "cpu-amd-epyc-7763-64-core-processor.yaml:5" in step and "cpu-epyc.yaml=40" in step
    flops = next(ln for ln in lines if " flops " in ln)
    assert "cpu.yaml:5" in flops


def test_show_flags_broken_and_ambiguous_budgets(budgets: Path, tmp_path: Path) -> None:
    (budgets / "cpu-rival.yaml").write_text("schema: 1\ndevice: {type: cpu, model: EPYC, threads: 1}\nbudgets:\n"
                                            "  encoder-train:\n    step_ms: 40.0\n")
    text, broken = explain_budgets(load_dir(budgets), EPYC)
    assert broken and "AMBIGUOUS: equally specific files" in text
    (budgets / "cpu-rival.yaml").write_text("schema: 1\ndevice: {type: cpu\n")
    code, text = run("show", "--budgets-dir", str(budgets), "--from-results", REGRESSION)
    assert code == EXIT_INPUT and "ERROR" in text and "cpu-rival.yaml" in text and "invalid YAML" in text
    code, text = run("show", "--budgets-dir", str(tmp_path / "none"), "--from-results", REGRESSION)
    assert code == EXIT_OK and "does not exist" in text and "no budget file selects this device" in text


def test_show_on_this_machine(budgets: Path) -> None:
    code, text = run("show", "--budgets-dir", str(budgets), "--key", "encoder-train")
    assert code == EXIT_OK and text.startswith("device: cpu ") and "(1 thread)" in text.splitlines()[0]
    assert "cpu.yaml" in text and "decoder-generate" not in text


# --------------------------------------------------------------------------- update


def test_update_applies_the_same_ratchet(budgets: Path) -> None:
    before = {p.name: p.read_text() for p in budgets.glob("*.yaml")}
    code, text = run("update", REGRESSION, "--budgets-dir", str(budgets), "--dry-run")
    assert code == EXIT_REGRESSION  # worse values were refused
    assert text.startswith(f"dry run: nothing written to {budgets}")
    assert "refused  cpu-amd-epyc-7763-64-core-processor.yaml  encoder-train.op_self_ms[aten::addmm]" in text
    assert "tightened  cpu-amd-epyc-7763-64-core-processor.yaml  decoder-generate.ttft_ms: 31 -> 25.98" in text
    assert "added  cpu-amd-epyc-7763-64-core-processor.yaml  decoder-generate.token_ms" in text
    assert {p.name: p.read_text() for p in budgets.glob("*.yaml")} == before  # dry run wrote nothing

    code, text = run("update", REGRESSION, "--budgets-dir", str(budgets))
    assert code == EXIT_REGRESSION and "+      value: 25.98" in text
    ttft = load_dir(budgets).resolve("decoder-generate", "ttft_ms", EPYC)
    assert ttft is not None and ttft.value == 25.98 and ttft.provenance is not None
    addmm = load_dir(budgets).resolve("encoder-train", "op_self_ms[aten::addmm]", EPYC)
    assert addmm is not None and addmm.value == 8.1  # the ratchet kept the budget

    code, text = run("update", REGRESSION, "--budgets-dir", str(budgets), "--allow-loosen")
    assert code == EXIT_OK and "loosened" in text
    addmm = load_dir(budgets).resolve("encoder-train", "op_self_ms[aten::addmm]", EPYC)
    assert addmm is not None and addmm.value == 11.68


def test_update_into_a_broken_file_is_an_input_error(budgets: Path) -> None:
    shutil.copy(budgets / "cpu.yaml", budgets / "keep.txt")
    (budgets / "cpu.yaml").write_text((budgets / "cpu.yaml").read_text().replace("tolerance: 0.0}", "tolerance: 5%}", 1))
    code, text = run("update", REGRESSION, "--budgets-dir", str(budgets))
    assert code == EXIT_INPUT and "cpu.yaml" in text and "not updated" in text


# --------------------------------------------------------------------------- accept

SHA = "0123456789abcdef0123456789abcdef01234567"
RUNNER = DeviceInfo(type="cpu", model="Test CPU", count=2, torch="2.13.0+cpu", threads=1,
                    cpuid="6/207/2", isa_class="avx2")
WHY = "--reason: expected why the change is expected (kept in the budgets' provenance), got '  '"
NOT_A_SHA = "expected a git commit hash (4 to 40 hex digits, '-dirty' allowed), got 'main'"


def ab_file(path: Path, head_commit: str | None, *, key: str = "enc", flops: float = 1100.0) -> str:
    """An A/B run's results (a pytest run's without ``head_commit``): one failing exact check."""
    from perfbudget.results import Record, Results

    record = Record(nodeid=f"t.py::test_{key}", key=key, metric="flops", outcome=Outcome.FAIL,
                    value=flops, n=1, device=RUNNER, kind="exact", direction="lower")
    meta = RunInfo(mode=RunMode.AB, ab=ABRunInfo(head_commit=head_commit)) if head_commit else RunInfo()
    Results(records=[record], meta=meta).write(path)
    return str(path)


def test_accept_from_a_pull_requests_results(tmp_path: Path) -> None:
    root = tmp_path / "budgets"
    root.mkdir()
    (root / "cpu.yaml").write_text("schema: 1\ndevice: {type: cpu}\nbudgets:\n  enc:\n"
                                   "    flops: 1000\n")
    results = ab_file(tmp_path / "results-ab.json", SHA)
    args = ["accept", results, "--reason", "more layers", "--budgets-dir", str(root)]
    code, text = run(*args, "--dry-run")
    assert code == EXIT_OK and text.startswith(f"dry run: nothing written to {root}")
    assert "+      value: 1100" in text and "flops: 1000" in (root / "cpu.yaml").read_text()
    code, text = run(*args)
    assert code == EXIT_OK and "loosened  cpu.yaml  enc.flops: 1000 -> 1100" in text
    b = load_dir(root).resolve("enc", "flops", RUNNER)
    assert b is not None and b.value == 1100 and b.provenance is not None
    assert (b.provenance.reason, b.provenance.commit) == ("more layers", SHA)
    # A pytest run's results name no commit: --commit says which was measured.
    stored = ab_file(tmp_path / "stored.json", None, flops=1200.0)
    code, text = run("accept", stored, "--reason", "r", "--budgets-dir", str(root),
                     "--commit", "abc1234", "--dry-run")
    assert code == EXIT_OK and "+        commit: abc1234" in text


@pytest.mark.parametrize(("head", "args", "says"), [
    (None, [], "{f}: meta.ab.head_commit: the results do not name the commit they measured"),
    ("main", [], "{f}: meta.ab.head_commit: " + NOT_A_SHA),
    (SHA, ["--commit", "HEAD~1"], "--commit: expected a git commit hash"),
    (SHA, ["--reason", "  "], WHY),
    (SHA, ["{o}"], "the results measured different commits ({f}: " + SHA + ", {o}: abcdef1)"),
])
def test_accept_errors_name_the_file_the_key_and_the_value(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], head: str | None, args: list[str],
        says: str) -> None:
    f = ab_file(tmp_path / "r.json", head)
    o = ab_file(tmp_path / "o.json", "abcdef1", key="dec")
    argv = [a.format(o=o) for a in args]
    code, _ = run("accept", f, *argv, *([] if "--reason" in argv else ["--reason", "ok"]),
                  "--budgets-dir", str(tmp_path / "budgets"))
    assert code == EXIT_INPUT
    assert says.format(f=f, o=o) in capsys.readouterr().err
    assert not (tmp_path / "budgets").exists()


def test_console_script_is_installed() -> None:
    exe = Path(sys.executable).parent / "perfbudget"
    if not exe.exists():
        pytest.skip("perfbudget console script not installed in this environment")
    done = subprocess.run([str(exe), "report", BASE, "-f", "markdown"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("## ✅ perf budgets: 1 unbudgeted, 2 stale, 1 unmeasurable, 9 pass")
