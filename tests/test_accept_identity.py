"""``perfbudget accept`` writes timing only for a machine identity it can trust: this machine's own
(the trusted runner's job), or a claim the reviewer trusts with ``--trust-identity``; a forged
identity in a results file rewrites no timing budget, and the identity trusted is printed."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from perfbudget.budgets import load_dir
from perfbudget.cli import build_parser, main
from perfbudget.device import DeviceInfo
from perfbudget.measure.machine import describe
from perfbudget.results import ABRunInfo, Record, Results, RunInfo
from perfbudget.vocabulary import Outcome, RunMode

SHA = "0123456789abcdef0123456789abcdef01234567"
STABLE = DeviceInfo(type="cpu", model="Stable Runner CPU", count=8, threads=1, cpuid="6/143/8",
                    isa_class="amx")
"""The trusted runner the timing budgets are keyed by: not this machine."""


def setup(tmp_path: Path, device: DeviceInfo) -> tuple[str, Path]:
    """Budgets with a timing file keyed by ``device`` and a results file claiming ``device``
    measured a slower step and more FLOPs."""
    root = tmp_path / "budgets"
    root.mkdir()
    (root / "cpu.yaml").write_text("schema: 1\ndevice: {type: cpu}\nbudgets:\n  enc:\n    flops: 1000\n")
    (root / f"{device.identity}.yaml").write_text(
        f"schema: 1\ndevice: {{type: cpu, identity: {device.identity}, threads: 1}}\nbudgets:\n"
        "  enc:\n    step_ms: {value: 10.0, tolerance: 0.05}\n")
    records = [Record(nodeid="t.py::test_enc", key="enc", metric=metric, outcome=Outcome.FAIL,
                      value=value, n=1, device=device, kind=kind, direction="lower", unit=unit)
               for metric, value, kind, unit in (("flops", 1100.0, "exact", "1"),
                                                  ("step_ms", 12.0, "timing", "ms"))]
    path = Results(records=records, meta=RunInfo(mode=RunMode.AB, ab=ABRunInfo(head_commit=SHA)))
    return str(path.write(tmp_path / "results.json")), root


def accept(results: str, root: Path, *extra: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["accept", results, "--reason", "reviewed", "--budgets-dir", str(root), *extra], out=out)
    return code, out.getvalue()


def values(root: Path, device: DeviceInfo) -> list[float | None]:
    budgets = load_dir(root)
    return [None if (b := budgets.resolve("enc", metric, device)) is None else b.value
            for metric in ("flops", "step_ms")]


def test_a_claimed_identity_is_refused_unless_trusted(tmp_path: Path) -> None:
    assert STABLE.identity != describe("cpu").identity
    results, root = setup(tmp_path, STABLE)
    code, text = accept(results, root, "--dry-run")
    assert code == 1 and "trusted machine identity" not in text
    code, text = accept(results, root)
    assert code == 1 and "trusted machine identity" not in text
    assert (f"refused  {STABLE.identity}.yaml  enc.step_ms: the results claim {STABLE.identity}, "
            "which a results file cannot prove: write it on that machine, or trust the claim "
            "(--trust-identity)") in text
    assert values(root, STABLE) == [1100, 10.0]  # the exact value is the reviewer's to see
    code, text = accept(results, root, "--trust-identity")
    assert code == 0 and values(root, STABLE) == [1100, 12.0]
    assert text.startswith(f"trusted machine identity {STABLE.identity} "
                           "(--trust-identity: the results' claim)\n")


def test_this_machines_own_identity_is_trusted(tmp_path: Path) -> None:
    here = describe("cpu")
    assert here.identity
    results, root = setup(tmp_path, here)
    code, text = accept(results, root)
    assert code == 0 and values(root, here) == [1100, 12.0]
    assert text.startswith(f"trusted machine identity {here.identity} (this machine's own identity)\n")


def test_the_help_says_what_proves_an_identity(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["accept", "--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "A results file cannot prove where it ran" in said
    assert "only for results the trusted runner's own job produced" in said


@pytest.mark.parametrize(("command", "metric", "value", "kind"), [
    (["update"], "step_ms", 9e99, "timing"),
    (["update"], "instructions[callgrind]", 1e6, "count"),
    (["accept", "--reason", "reviewed"], "instructions[callgrind]", 1e6, "count"),
])
def test_update_and_accept_write_no_value_of_a_claimed_identitys_file_unless_trusted(
        tmp_path: Path, command: list[str], metric: str, value: float, kind: str) -> None:
    _, root = setup(tmp_path, STABLE)
    record = Record(nodeid="t.py::test_enc", key="enc2", metric=metric, outcome=Outcome.PASS, value=value, n=1,
                    device=STABLE, kind=kind, direction="lower", unit="ms" if kind == "timing" else "1")
    results = Results(records=[record], meta=RunInfo(mode=RunMode.AB, ab=ABRunInfo(head_commit=SHA)))
    path = str(results.write(tmp_path / "forged.json"))
    before = (root / f"{STABLE.identity}.yaml").read_text()
    out = io.StringIO()
    code = main([command[0], path, "--budgets-dir", str(root), *command[1:]], out=out)
    assert code == 1 and (root / f"{STABLE.identity}.yaml").read_text() == before
    assert (f"refused  {STABLE.identity}.yaml  enc2.{metric}: the results claim {STABLE.identity}, which a "
            "results file cannot prove: write it on that machine, or trust the claim (--trust-identity)") \
        in out.getvalue()
    code = main([command[0], path, "--budgets-dir", str(root), *command[1:], "--trust-identity"], out=io.StringIO())
    written = load_dir(root).resolve("enc2", metric, STABLE)
    assert code == 0 and written is not None and written.value == value
