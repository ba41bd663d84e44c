"""Portable budgets: scripts/portable-budgets.py moves machine-independent entries into cpu.yaml with
tolerances from several machine kinds, and the repository's budget files keep that split."""

from __future__ import annotations

import importlib.util
import math
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

from perfbudget.budgets import load_dir
from perfbudget.device import DeviceInfo
from perfbudget.metrics import parse_name
from perfbudget.verdict.judge import decide

ROOT = Path(__file__).parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("portable_budgets", ROOT / "scripts" / "portable-budgets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while decorating
    spec.loader.exec_module(module)
    return module


pb = _script()

PROV = "provenance: {{device: '{dev}', torch: 2.13.0+cpu, samples: 1, date: '2026-11-29', threads: 1}}"
XEON = "cpu Intel(R) Xeon(R) Processor (1 thread)"
EPYC = "cpu AMD EPYC (1 thread)"


def _file(selector: str, device: str, entries: dict[str, dict[str, str]]) -> str:
    lines = ["schema: 1", f"device: {selector}", "budgets:"]
    for key, metrics in entries.items():
        lines.append(f"  {key}:")
        for metric, body in metrics.items():
            lines.append(f"    {metric}: {{{body}, {PROV.format(dev=device)}}}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    budgets, amd = tmp_path / "budgets", tmp_path / "amd"
    budgets.mkdir()
    amd.mkdir()
    (budgets / "cpu.yaml").write_text(_file("{type: cpu}", XEON, {
        "enc": {"flops": "value: 100", "ratio[shrink]": "value: 0.5"}}))
    (budgets / "cpu-xeon.yaml").write_text(_file("{type: cpu, model: Xeon, threads: 1}", XEON, {
        "enc": {"step_ms": "value: 30.0, tolerance: 0.1", '"ratio[drift]"': "value: 0.0157392",
                '"peak_allocated_mib[forward]"': "value: 8.543, tolerance: 0.02",
                '"ratio[error]"': "value: 1.43e-06", "loss_drift": "value: 0.0157392"},
        "only-here": {'"ratio[drift]"': "value: 0.5"}}))
    (amd / "cpu-amd-epyc.yaml").write_text(_file("{type: cpu, model: AMD EPYC, threads: 1}", EPYC, {
        "enc": {"step_ms": "value: 20.0", '"ratio[drift]"': "value: 0.0166723", "loss_drift": "value: 0.0166723",
                '"peak_allocated_mib[forward]"': "value: 8.543", '"ratio[error]"': "value: 1.43e-06"}}))
    (amd / "cpu.yaml").write_text(_file("{type: cpu}", EPYC, {"enc": {"ratio[shrink]": "value: 0.5075"}}))
    return budgets, amd


@pytest.mark.parametrize(
    ("metric", "values", "tolerance"),
    [
        ("ratio[x]", [0.0157392, 0.0166723], 0.12),  # spread 5.93 %, x2 = 11.9 % -> 12 %
        ("ratio[x]", [1.0, 1.015], 0.03),  # exactly 3 %: not rounded up to 4 %
        ("peak_allocated_mib[forward]", [8.543, 8.543], 0.02),  # identical: the bytes default
        ("ratio[y]", [1.43e-06, 1.43e-06], 0.0),  # identical: the exact default
        ("ratio[x]", [0.0, 0.0], 0.0),
        ("ratio[x]", [0.0, 0.1], 1.0),  # unbounded spread: the widest tolerance
        ("ratio[x]", [0.0094, 0.0157], 1.0),  # 67 % x 2, capped at 1
        ("loss_drift", [0.0157392, 0.0166723], 0.25),  # numerics: never below the stated bound
    ],
)
def test_tolerance_is_the_kind_default_or_twice_the_spread(metric: str, values: list[float], tolerance: float) -> None:
    assert pb.derive_tolerance(metric, values) == tolerance


def test_spread_is_relative_to_the_smallest_value() -> None:
    assert math.isclose(pb.spread([0.0157392, 0.0166723]), 0.0166723 / 0.0157392 - 1)
    assert pb.spread([2.0, 2.0]) == 0.0 and pb.spread([0.0, 1.0]) == math.inf


def test_moves_non_timing_entries_and_derives_tolerances(folders: tuple[Path, Path], capsys) -> None:
    budgets, amd = folders
    assert pb.main(["--budgets", str(budgets), "--measured", str(amd)]) == 0
    out = capsys.readouterr().out
    assert "only-here.ratio[drift]: measured only on" in out
    bs = load_dir(budgets)
    assert not bs.file_errors and not bs.entry_errors
    model = next(f for f in bs.files if f.path.name == "cpu-xeon.yaml")
    portable = next(f for f in bs.files if f.path.name == "cpu.yaml")
    # Timing stays with its model; so do numerics that follow the kernel path (per ISA class).
    assert set(model.entries["enc"]) == {"step_ms", "loss_drift"}
    assert set(model.entries["only-here"]) == {"ratio[drift]"}  # one machine kind: not moved
    assert "loss_drift" not in portable.entries["enc"]
    drift = portable.entries["enc"]["ratio[drift]"]
    assert drift.value == 0.0157392 and drift.tolerance == 0.12  # value and provenance kept
    assert drift.provenance is not None and drift.provenance.device == XEON
    assert drift.note is not None and XEON in drift.note and EPYC in drift.note and "= 12%" in drift.note
    assert portable.entries["enc"]["peak_allocated_mib[forward]"].tolerance == 0.02
    assert portable.entries["enc"]["ratio[error]"].tolerance == 0.0
    shrink = portable.entries["enc"]["ratio[shrink]"]  # already portable: tolerance from both machines
    assert shrink.tolerance == 0.03 and shrink.note is not None and "spread 1.5%" in shrink.note
    assert portable.entries["enc"]["flops"].note is None  # measured on one machine kind only: untouched
    # Both machines now judge the moved entries, and both of their values pass.
    for dev, value in (("Intel(R) Xeon(R) Processor", 0.0157392), ("AMD EPYC", 0.0166723)):
        b = bs.resolve("enc", "ratio[drift]", DeviceInfo(type="cpu", model=dev, count=1, threads=1))
        assert b is not None and decide("enc", "ratio[drift]", value, b).outcome == "pass"
    # A second run finds nothing to do.
    before = {p.name: p.read_text() for p in budgets.iterdir()}
    assert pb.main(["--budgets", str(budgets), "--measured", str(amd)]) == 0
    assert {p.name: p.read_text() for p in budgets.iterdir()} == before
    assert "already portable" in capsys.readouterr().out


def test_a_check_that_fails_writes_nothing(folders: tuple[Path, Path], capsys) -> None:
    budgets, amd = folders
    # A reviewer widened this tolerance beyond what two machines justify: the script would lower it.
    cpu = budgets / "cpu.yaml"
    cpu.write_text(cpu.read_text().replace("value: 0.5,", "value: 0.5, tolerance: 0.5,"))
    before = {p.name: p.read_text() for p in budgets.iterdir()}
    assert pb.main(["--budgets", str(budgets), "--measured", str(amd)]) == 1
    err = capsys.readouterr().err
    assert "check failed" in err and "enc.ratio[shrink] changed from 0.5 ±50% to 0.5 ±3%" in err
    assert {p.name: p.read_text() for p in budgets.iterdir()} == before


def test_dry_run_writes_nothing_and_bad_input_is_refused(folders: tuple[Path, Path], capsys) -> None:
    budgets, amd = folders
    before = {p.name: p.read_text() for p in budgets.iterdir()}
    assert pb.main(["--budgets", str(budgets), "--measured", str(amd), "--dry-run"]) == 0
    assert "+++ b/cpu.yaml" in capsys.readouterr().out
    assert {p.name: p.read_text() for p in budgets.iterdir()} == before
    (amd / "broken.yaml").write_text("schema: 1\ndevice: {type: cpu, model: 123}\n")
    assert pb.main(["--budgets", str(budgets), "--measured", str(amd)]) == 2
    assert "broken.yaml:2: device.model" in capsys.readouterr().err


def test_an_interrupted_move_is_finished_by_a_rerun(folders: tuple[Path, Path]) -> None:
    budgets, amd = folders
    shutil.copy(budgets / "cpu-xeon.yaml", budgets / "saved")
    assert pb.main(["--budgets", str(budgets), "--measured", str(amd)]) == 0
    shutil.move(budgets / "saved", budgets / "cpu-xeon.yaml")  # as if the second write never happened
    assert pb.main(["--budgets", str(budgets), "--measured", str(amd)]) == 0
    bs = load_dir(budgets)
    model = next(f for f in bs.files if f.path.name == "cpu-xeon.yaml")
    assert set(model.entries["enc"]) == {"step_ms", "loss_drift"}


# The repository's own budget files.

REPO = load_dir(ROOT / "budgets")
NEW_CPU = DeviceInfo(type="cpu", model="A CPU model with no file of its own", count=4, threads=1, torch="2.13.0+cpu",
                     isa_class="avx2")


def test_repository_budget_files_load_cleanly() -> None:
    assert REPO.file_errors == [] and REPO.entry_errors == []


def test_cpu_model_files_hold_timing_only() -> None:
    for f in REPO.files:
        if f.selector is not None and "model" in f.selector.as_dict():
            loose = [f"{k}.{m}" for k, ms in f.entries.items() for m in ms if not parse_name(m).metric.statistical]
            assert loose == [], f"{f.path.name}: machine-independent entries belong in cpu.yaml: {loose}"


def test_a_cpu_without_a_file_of_its_own_judges_memory_numerics_and_counts() -> None:
    for key, metric in [
        ("encoder-train", "peak_allocated_mib[backward]"), ("segmentation-train", "peak_allocated_mib[forward]"),
        ("lever-layernorm", "max_abs_error[fp16_large]"), ("lever-precision", "loss_drift"),
        ("encoder-train", "loss_drift"), ("encoder-train", "flops"),
    ]:
        assert REPO.resolve(key, metric, NEW_CPU) is not None, f"{key}.{metric}"


def test_numerics_that_follow_the_kernel_path_apply_only_to_their_isa_class() -> None:
    amx = DeviceInfo(type="cpu", model="Intel(R) Xeon(R) Processor", count=2, threads=1, isa_class="amx")
    assert REPO.resolve("encoder-train", "loss_drift", amx) is None  # unbudgeted there, never wrong
    assert REPO.resolve("encoder-train", "flops", amx) is not None  # counts hold on every path
    for f in REPO.files:
        if f.selector is not None and f.selector.as_dict() == {"type": "cpu"}:
            per_isa = [f"{k}.{m}" for k, ms in f.entries.items() for m in ms if parse_name(m).metric.per_isa]
            assert per_isa == [], f"{f.path.name}: kernel-path numerics cannot be portable: {per_isa}"


def test_portable_floats_name_where_their_tolerance_comes_from() -> None:
    portable = next(f for f in REPO.files if f.selector is not None and f.selector.as_dict() == {"type": "cpu"})
    for metrics in portable.entries.values():
        for b in metrics.values():
            if not float(b.value).is_integer() or b.metric.startswith("ratio["):
                assert b.note is not None and pb.NOTE_PREFIX in b.note, f"{b.key}.{b.metric}: a portable float needs a note"
