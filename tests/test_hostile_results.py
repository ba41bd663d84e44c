"""Results files written by a pull request's code, read as an attacker would write them: each gives
a clear error or inert output, and nothing is written outside the budgets folder."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from perfbudget.budgets.loader import load_dir
from perfbudget.budgets.update import Measured, apply_updates
from perfbudget.cli import main
from perfbudget.device import DeviceInfo
from perfbudget.exitcodes import ExitCode
from perfbudget.results import ABRunInfo, Record, Results, RunInfo
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
    assert "x/../../../ESCAPED" in said
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
