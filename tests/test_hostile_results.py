"""Results files written by a pull request's code, read as an attacker would write them: each gives
a clear error or inert output, and nothing is written outside the budgets folder."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest

from perfbudget.budgets.loader import load_dir, load_file
from perfbudget.budgets.schema import _clip
from perfbudget.budgets.update import Measured, apply_updates
from perfbudget.cli import main
from perfbudget.device import DeviceInfo
from perfbudget.exitcodes import ExitCode
from perfbudget.history.commits import git_commit_info
from perfbudget.results import ABRunInfo, Record, Results, RunInfo, load_results
from perfbudget.vocabulary import Outcome, RunMode

SHA = "0123456789abcdef0123456789abcdef01234567"
ESCAPING = DeviceInfo(type="cpu", model="Test CPU", count=2, threads=1, cpuid="6/207/2",
                      isa_class="x/../../../ESCAPED")


def files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("command", ["update", "accept"])
@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_a_device_field_that_names_a_path_writes_nothing_anywhere(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, dry_run: list[str]) -> None:
    work = tmp_path / "a" / "b" / "c"
    root = work / "budgets"
    root.mkdir(parents=True)
    (root / "cpu.yaml").write_text("schema: 1\ndevice: {type: cpu}\nbudgets: {}\n")
    record = Record(nodeid="t.py::test_x", key="enc", metric="loss_drift", outcome=Outcome.PASS,
                    value=0.01, n=1, device=ESCAPING, kind="exact", direction="lower")
    results = work / "results.json"
    Results(records=[record], meta=RunInfo(mode=RunMode.AB, ab=ABRunInfo(head_commit=SHA))).write(results)
    before = files_under(tmp_path)
    extra = ["--reason", "r"] if command == "accept" else []
    out = io.StringIO()
    code = main([command, str(results), "--budgets-dir", str(root), *extra, *dry_run], out=out)
    said = out.getvalue() + capsys.readouterr().err
    assert code == ExitCode.USAGE
    assert "x/../../../ESCAPED" in said and "device.isa_class" in said
    assert files_under(tmp_path) == before


def test_the_updater_refuses_a_file_outside_the_budgets_folder(tmp_path: Path) -> None:
    root = tmp_path / "budgets"
    root.mkdir()
    m = Measured(key="enc", metric="loss_drift", value=0.01, samples=1, cv=None, device=ESCAPING)
    report = apply_updates([m], load_dir(root))
    assert [str(e) for e in report.errors] == [
        f"{root}: enc.loss_drift: refusing to write a budget file outside the budgets folder: the "
        "device fields make its name 'cpu-isa-x/../../../ESCAPED'"]
    assert files_under(tmp_path) == set()


def results_file(tmp_path: Path, record: dict[str, object] | None = None, meta: dict[str, object] | None = None,
                 ) -> Path:
    """A results file of one passing record, with ``record``'s and ``meta``'s fields replaced."""
    device = {"type": "cpu", "model": "Test CPU", "count": 2, "cpuid": "6/207/2", "isa_class": "avx2"}
    rec = {"nodeid": "t.py::test_x", "key": "enc", "metric": "flops", "outcome": "pass", "value": 1.0,
           "device": device, **(record or {})}
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"schema": 3, "meta": {"mode": "check", **(meta or {})}, "records": [rec]}))
    return path


LONG = "k" * 70_000
DEVICE = {"type": "cpu", "model": "Test CPU", "count": 2}


@pytest.mark.parametrize(("record", "meta", "says"), [
    ({"device": {**DEVICE, "isa_class": "x/../../../ESCAPED"}}, None,
     "records[0].device.isa_class: expected [a-z0-9_]{1,40}, got 'x/../../../ESCAPED'"),
    ({"device": {**DEVICE, "cpuid": "6/207/2; rm"}}, None, "records[0].device.cpuid: expected"),
    ({"device": {**DEVICE, "model": "CPU\n# heading"}}, None,
     "records[0].device.model: expected no control characters, got 'CPU\\n# heading'"),
    ({"key": LONG}, None, f"records[0].key: expected at most 20000 characters, got 70000: {'k' * 80!r}..."),
    ({"key": "k" * 5000}, None, "records[0].key: expected at most 1000 characters, got 5000"),
    ({"reason": LONG}, None, "records[0].reason: expected at most 20000 characters, got 70000"),
    ({"metric": "flops\n"}, None, "records[0].metric: expected no control characters, got 'flops\\n'"),
    ({"metric": "flops[a]b"}, None, "records[0].metric: expected [a-z][a-z0-9_]*"),
    ({"nodeid": "t.py::test_\x1b[31mred"}, None, "records[0].nodeid: expected no control characters"),
    ({"unit": "<img src=x onerror=alert(1)> <!--"}, None, "records[0].unit: expected [A-Za-z0-9/]{0,16}"),
    ({"key": "enc\u202egnp.exe"}, None, "records[0].key: expected no control characters"),
    ({"ci": [1, "inf"]}, None, "records[0].ci: expected two finite numbers, low to high, got [1.0, inf]"),
    ({"ci": [2, 1]}, None, "records[0].ci: expected two finite numbers, low to high, got [2.0, 1.0]"),
    ({"ci_confidence": 7}, None, "records[0].ci_confidence: expected a number in (0, 1), got 7.0"),
    ({"value": "BIG"}, None, "cannot read results: Exceeds the limit (4300 digits)"),
    (None, {"mode": "ab", "ab": {"head_commit": "--output=/tmp/x"}},
     "meta.ab.head_commit: expected a git commit hash (4 to 40 hex digits, '-dirty' allowed), "
     "got '--output=/tmp/x'"),
    (None, {"mode": "ab", "ab": {"base_commit": "HEAD"}}, "meta.ab.base_commit: expected a git commit hash"),
    (None, {"budgets_dir": "b\n```\nrm -rf /"}, "meta.budgets_dir: expected no control characters"),
    ({"reason": "\ud800 half a pair"}, None, "records[0].reason: expected text, got a lone surrogate"),
    (None, {"measured": {"settings": {"threads": [1, 2]}}}, "meta.measured.settings.threads: expected a str"),
    ({"ci_confidence": 0.9999999999999999}, None, "records[0].ci_confidence: expected a number in (0, 1)"),
    ({"metric": "foo_ms"}, None, "records[0].metric: unknown metric 'foo_ms'"),
    ({"n": -5}, None, "records[0].n: expected an integer in [0, 10000000], got -5"),
    ({"base": {"value": 1.0, "pairs": 10**12}}, None, "records[0].base.pairs: expected an integer in [0, 10000000]"),
    ({"base": {"value": 1.0, "pairs": 9, "pair_ratios": [1.0, 1.01]}}, None,
     "records[0].base.pairs: expected at most the 2 pair ratios given, got 9"),
    ({"base": {"value": 1.0, "sd": "inf"}}, None, "records[0].base.sd: expected a finite number >= 0, got inf"),
    ({"base": {"value": 1.0, "ratio_ci": [1.1, 0.9]}}, None, "records[0].base.ratio_ci: expected two finite numbers"),
    ({"extra": {"moved_ops": {"note": "\ud800"}}}, None, "records[0].extra.'moved_ops'.'note': expected text, got a lone"),
    ({"extra": {"moved_ops": {"note": LONG}}}, None, "expected at most 20000 characters, got 70000"),
    ({"extra": {"a": [[[[[[[[[["deep"]]]]]]]]]]}}, None, "expected at most 8 levels of nesting"),
])
def test_a_hostile_field_is_refused_at_load_naming_file_record_and_field(
        tmp_path: Path, record: dict[str, object] | None, meta: dict[str, object] | None, says: str) -> None:
    path = results_file(tmp_path, record, meta)
    path.write_text(path.read_text().replace('"BIG"', "9" * 5000))
    with pytest.raises(ValueError) as err:
        load_results(path)
    assert str(err.value).startswith(f"{path}: ") and says in str(err.value)
    assert len(str(err.value)) < 500


def test_a_key_given_twice_is_refused_not_read_as_the_last(tmp_path: Path) -> None:
    path = results_file(tmp_path)
    path.write_text(path.read_text()[:-1] + ', "records": []}')
    with pytest.raises(ValueError, match=f"^{path}: cannot read results: duplicate key 'records'"):
        load_results(path)


def test_merging_keeps_every_shards_unfinished_run_and_faults_and_report_fails_on_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = Record(nodeid="t.py::test_x", key="enc", metric="flops", outcome=Outcome.PASS, value=1.0, n=1)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    Results(records=[record], meta=RunInfo()).write(a)
    fault = {"nodeid": "t.py::test_y", "key": "enc", "error": "RuntimeError: CUDA out of memory"}
    Results(records=[], meta=RunInfo(unfinished="killed at test 3", errors=(fault,))).write(b)
    merged = tmp_path / "merged.json"
    assert main(["merge", str(a), str(b), "-o", str(merged)], out=io.StringIO()) == ExitCode.OK
    meta = load_results(merged).meta
    assert meta.unfinished == "killed at test 3" and meta.errors == (fault,)
    assert main(["report", str(a)], out=io.StringIO()) == ExitCode.OK
    capsys.readouterr()
    assert main(["report", str(merged)], out=io.StringIO()) == ExitCode.FAILED
    err = capsys.readouterr().err
    assert "the run did not finish: killed at test 3" in err
    assert "t.py::test_y: raised while measuring: RuntimeError: CUDA out of memory" in err


@pytest.mark.parametrize("text", ['{"schema": 3, "records": 5}', '{"schema": 1, "records": [{"extra": {"ab": 1}, '
                                  '"base": [1]}]}', "[" * 100_000 + "]" * 100_000])
def test_a_malformed_file_is_an_error_naming_it_not_a_traceback(tmp_path: Path, text: str) -> None:
    path = tmp_path / "results.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"^{path}: "):
        load_results(path)


def test_a_big_integer_in_a_budget_file_is_an_error_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "cpu.yaml"
    path.write_text("schema: 1\ndevice: {type: cpu}\nbudgets:\n  enc:\n    flops: " + "9" * 5000 + "\n")
    assert [str(e) for e in load_file(path).errors] == [
        f"{path}:5: budgets.enc.flops: expected a number that fits a float, got 5000 digits"]


def test_git_reads_a_commit_as_a_commit_never_as_an_option(tmp_path: Path) -> None:
    written = tmp_path / "written"
    assert git_commit_info(f"--output={written}", cwd=Path(__file__).parent) is None
    assert not written.exists()


def test_a_dry_run_never_reads_through_a_link_nor_copies_a_fifo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "budgets"
    root.mkdir()
    (root / "cpu.yaml").write_text("schema: 1\ndevice: {type: cpu}\nbudgets: {}\n")
    secret = tmp_path / "outside.yaml"
    secret.write_text("note: SECRET_TOKEN\n")
    (root / "leak.yaml").symlink_to(secret)
    os.mkfifo(root / "pipe.yaml")
    record = Record(nodeid="t.py::test_x", key="enc", metric="flops", outcome=Outcome.PASS, value=1.0, n=1,
                    device=DeviceInfo(type="cpu", model="Test CPU", count=2, threads=1), kind="exact", direction="lower")
    results = tmp_path / "results.json"
    Results(records=[record]).write(results)
    out = io.StringIO()
    assert main(["update", str(results), "--budgets-dir", str(root), "--dry-run"], out=out) == ExitCode.USAGE
    said = out.getvalue() + capsys.readouterr().err
    assert "SECRET_TOKEN" not in said and "leak.yaml: cannot read: a symbolic link" in said
    assert "pipe.yaml: cannot read: not a regular file" not in said  # not copied: the copy has no such file
    # Nor a real run: a file that cannot be read might hold the entry; nothing is written until it reads.
    before = (root / "cpu.yaml").read_text()
    assert main(["update", str(results), "--budgets-dir", str(root)], out=io.StringIO()) == ExitCode.USAGE
    assert (root / "cpu.yaml").read_text() == before


def test_every_report_says_the_run_did_not_finish_and_what_raised_escaped() -> None:
    from perfbudget.report import markdown_report, pr_comment, terminal_report

    fault = {"nodeid": "t.py::test_y", "key": "enc", "error": "RuntimeError: <img src=x> @octocat \x1b[31m"}
    record = Record(nodeid="t.py::test_x", key="enc", metric="flops", outcome=Outcome.PASS, value=1.0, n=1)
    for records in ([record], []):
        results = Results(records=list(records), meta=RunInfo(unfinished="killed at test 3", errors=(fault,)))
        md, comment, term = markdown_report(results), pr_comment(results), terminal_report(results)
        for text in (md, comment, term):
            assert "the run did not finish: killed at test 3" in text
            assert "t.py::test_y: raised while measuring: RuntimeError:" in text and "\x1b" not in text
        assert not re.search(r"(?<!\\)<img", md + comment) and "@octocat" not in comment  # escaped: inert


def flops_results(path: Path) -> Path:
    """A pull request's A/B results with a new exact value, which ``accept`` and ``update`` write to ``cpu.yaml``."""
    record = Record(nodeid="t.py::test_x", key="newkey", metric="graph_breaks", outcome=Outcome.PASS, value=1.0,
                    n=1, device=DeviceInfo(type="cpu", model="Test CPU", count=2), kind="exact", direction="lower")
    return Results(records=[record], meta=RunInfo(mode=RunMode.AB, ab=ABRunInfo(head_commit=SHA))).write(path)


@pytest.mark.parametrize("command", [["accept", "--reason", "r"], ["update"], ["show"]])
@pytest.mark.parametrize("leads_out", ["link", "relative", "absolute"])
def test_a_committed_budgets_folder_that_leads_out_of_the_repository_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        command: list[str], leads_out: str) -> None:
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    repo.mkdir()
    outside.mkdir()
    value = {"link": None, "relative": "../outside", "absolute": str(outside)}[leads_out]
    ini = "[pytest]\n" + (f"perfbudget_budgets_dir = {value}\n" if value else "")
    (repo / "pytest.ini").write_text(ini)
    if leads_out == "link":
        (repo / "budgets").symlink_to(outside)  # what a pull request can commit
    results = flops_results(repo / "results.json")
    monkeypatch.chdir(repo)
    argv = [command[0], *([str(results)] if command[0] != "show" else []), *command[1:]]
    code = main(argv, out=io.StringIO())
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and files_under(outside) == set()
    if value:
        assert f"{repo / 'pytest.ini'}: perfbudget_budgets_dir: leads to {outside}, outside the repository {repo}" \
               in err and f"got {_clip(repr(value))}" in err  # a long value (a deep tmp_path) is clipped
    else:
        assert f"budgets: the default budgets folder leads to {outside}, outside the repository {repo}" in err
    assert "name it with --budgets-dir" in err
    # Named on the command line, the folder is the user's choice.
    if command[0] != "show":
        assert main([*argv, "--budgets-dir", str(outside)], out=io.StringIO()) == ExitCode.OK
        assert files_under(outside) == {outside / "cpu.yaml"}


def test_a_noise_folder_that_leads_out_of_the_budgets_folder_is_neither_read_nor_written(tmp_path: Path) -> None:
    from perfbudget.budgets.noise import CheckNoise, NoiseTable, load_noise
    from perfbudget.budgets.schema import BudgetError

    outside, root = tmp_path / "outside", tmp_path / "budgets"
    outside.mkdir()
    root.mkdir()
    (root / "noise").symlink_to(outside)
    table = NoiseTable(identity="cpu-x", checks={("enc", "step_ms"): CheckNoise(ss=0.01, df=4.0, runs=1)})
    for action in (lambda: load_noise(root), lambda: table.write(root)):
        with pytest.raises(BudgetError, match=rf"^{root / 'noise'}: a symbolic link \(to {outside}\)"):
            action()
    assert files_under(outside) == set()


def test_a_results_file_larger_than_perfbudget_writes_is_refused_unread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import perfbudget.results

    monkeypatch.setattr(perfbudget.results, "MAX_RESULTS_BYTES", 1 << 20)
    path = results_file(tmp_path)
    path.write_text(path.read_text() + " " * (1 << 20))  # valid JSON, but past the limit
    with pytest.raises(ValueError) as err:
        load_results(path)
    assert str(err.value) == (f"{path}: cannot read results: larger than 1 MiB, more than perfbudget writes "
                              f"({path.stat().st_size} bytes)")


@pytest.mark.parametrize("command", [["update"], ["accept", "--reason", "r", "--commit", "abc1234"]])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_value_that_is_not_finite_is_named_with_why_it_is_not_written(
        tmp_path: Path, command: list[str], value: str) -> None:
    path = results_file(tmp_path, {"value": value})
    root = tmp_path / "budgets"
    out = io.StringIO()
    code = main([command[0], str(path), "--budgets-dir", str(root), *command[1:]], out=out)
    assert code == ExitCode.FAILED and files_under(tmp_path) == {path}
    assert f"refused  cpu.yaml  enc.flops: measured value {value}: expected a finite non-negative number" \
        in out.getvalue()


def test_a_folder_named_inside_the_repository_that_a_link_leads_out_of_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # The comment's accept command names the pull request's folder: named, it is still the PR's link.
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    repo.mkdir()
    outside.mkdir()
    (repo / "pytest.ini").write_text("[pytest]\n")
    (repo / "perf-budgets").symlink_to(outside)
    results = flops_results(repo / "results.json")
    monkeypatch.chdir(repo)
    code = main(["accept", str(results), "--reason", "r", "--budgets-dir", "perf-budgets"], out=io.StringIO())
    assert code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert f"perf-budgets: a folder inside the repository that leads to {outside}, outside the repository" in err
    assert files_under(outside) == set()
