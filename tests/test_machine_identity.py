"""Machine identity: what tells machine kinds apart, how budget files select it, and the migration of files
keyed by a model name several kinds share."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path
from types import ModuleType

import pytest

from perfbudget.budgets import load_dir
from perfbudget.cli import main
from perfbudget.device import (
    DeviceInfo,
    Selector,
    cpu_id,
    cpu_isa,
    device_file_stem,
    isa_class,
)
from perfbudget.measure.machine import describe
from perfbudget.metrics import parse_name
from perfbudget.verdict.judge import Judge, JudgeConfig, VerdictPolicy

ROOT = Path(__file__).parents[1]

# Two VMs that report the same model name: an older Xeon without AMX and a newer one with it.
CPUINFO_SPR = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 207
model name\t: Intel(R) Xeon(R) Processor
stepping\t: 2

processor\t: 1
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 207
"""
CAPS_AMX = {"avx2": True, "avx512_f": True, "avx512_vnni": True, "avx512_bf16": True, "amx_tile": True,
            "amx_bf16": True, "avx512_fp16": True}
CAPS_AVX512 = {"avx2": True, "avx512_f": True, "avx512_vnni": True}


def xeon(cpuid: str, caps: dict[str, bool]) -> DeviceInfo:
    isa = cpu_isa(caps, "AVX512")
    return DeviceInfo(type="cpu", model="Intel(R) Xeon(R) Processor", count=2, threads=1, vendor="GenuineIntel",
                      cpuid=cpuid, isa=isa, isa_class=isa_class(isa))


def test_cpuinfo_gives_vendor_and_family_model_stepping() -> None:
    got = cpu_id(CPUINFO_SPR)
    assert (got.vendor, got.family, got.model, got.stepping) == ("GenuineIntel", 6, 207, 2)
    assert got.text == "6/207/2"
    assert cpu_id("").text is None


@pytest.mark.parametrize(("caps", "capability", "cls"), [
    (CAPS_AMX, "AVX512", "amx"),
    ({"avx2": True, "avx512_f": True, "avx512_bf16": True}, "AVX512", "avx512_bf16"),
    (CAPS_AVX512, "AVX512", "avx512"),
    ({"avx2": True}, "AVX2", "avx2"),
    ({}, "DEFAULT", "default"),
])
def test_isa_class_follows_the_bf16_kernel_path(caps: dict[str, bool], capability: str, cls: str) -> None:
    assert isa_class(cpu_isa(caps, capability)) == cls


def test_one_model_name_two_identities() -> None:
    spr, icx = xeon("6/207/2", CAPS_AMX), xeon("6/106/6", CAPS_AVX512)
    assert spr.identity == "cpu-intel-xeon-processor-6-207-2-amx"
    assert icx.identity == "cpu-intel-xeon-processor-6-106-6-avx512"
    assert device_file_stem(spr) != device_file_stem(icx)
    # The model-name selector matches both; an identity selector only its own machine, whole.
    assert Selector((("model", "Intel(R) Xeon(R) Processor"),)).matches(spr)
    assert Selector((("model", "Intel(R) Xeon(R) Processor"),)).matches(icx)
    assert Selector((("identity", spr.identity),)).matches(spr)
    assert not Selector((("identity", spr.identity),)).matches(icx)
    assert not Selector((("cpuid", "6/20"),)).matches(spr)  # no substring match on 6/207
    assert Selector((("isa_class", "amx"),)).matches(spr) and not Selector((("isa_class", "amx"),)).matches(icx)
    old = DeviceInfo(type="cpu", model="Intel(R) Xeon(R) Processor", count=2)  # a record from before identity
    assert old.identity is None and not Selector((("identity", spr.identity),)).matches(old)


def test_gpu_identity_names_architecture_memory_and_clock() -> None:
    h200 = DeviceInfo(type="cuda", model="NVIDIA H200", count=1, compute_capability="9.0", isa_class="sm90",
                      memory_gib=141, sm_clock_mhz=1980, driver="570.1", cuda="12.8")
    assert h200.identity == "nvidia-h200-sm90-141gib-1980mhz"
    assert any("max SM clock: 1980 MHz" in line for line in h200.describe_identity())


MIB = 2**20


@pytest.mark.parametrize(
    ("name", "total_mib", "capability", "memory_gib", "identity"),
    [
        # What CUDA reports as total memory (nvidia-smi's "Total"), not the installed size.
        ("NVIDIA H200", 143_771, (9, 0), 141, "nvidia-h200-sm90-141gib"),
        ("NVIDIA A100-SXM4-80GB", 81_559, (8, 0), 80, "nvidia-a100-sxm4-80gb-sm80-80gib"),
        ("NVIDIA H100 80GB HBM3", 81_559, (9, 0), 80, "nvidia-h100-80gb-hbm3-sm90-80gib"),
        ("NVIDIA A100 80GB PCIe", 81_920, (8, 0), 80, "nvidia-a100-80gb-pcie-sm80-80gib"),  # exactly 80 GiB
    ],
)
def test_gpu_memory_in_the_identity_is_the_reported_total_rounded_up_to_whole_gib(
    monkeypatch: pytest.MonkeyPatch, name: str, total_mib: int, capability: tuple[int, int], memory_gib: int,
    identity: str,
) -> None:
    import torch

    from perfbudget.measure import machine

    class Props:
        total_memory = total_mib * MIB

    # Fakes for what needs a GPU: torch.cuda's answers about device 0, and no NVML.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: Props())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: name)
    monkeypatch.setattr(machine, "_nvml_max_sm_clock", lambda: None)
    monkeypatch.setattr(machine, "_nvml_driver", lambda: None)
    info = describe("cuda")
    assert info.memory_gib == memory_gib
    assert info.identity == identity


def show(*args: str) -> tuple[int, str]:
    """``perfbudget show ARGS`` in this repository: its exit code and what it printed."""
    out = io.StringIO()
    return main(["show", *args], out=out), out.getvalue()


def test_this_machine_has_an_identity_and_show_prints_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("PERFBUDGET_STABLE_MACHINE", raising=False)
    me = describe("cpu")
    assert me.identity and me.cpuid and me.isa_class
    assert show("--identity") == (0, f"{me.identity}\n")
    code, out = show()
    assert code == 0 and f"identity: {me.identity}" in out and "not declared stable" in out


BUDGETS = """schema: 1
device: {{type: cpu, identity: {identity}, threads: 1}}
budgets:
  k:
    step_ms: {{value: 10.0, tolerance: 0.05}}
"""


def _judge(tmp_path: Path, identity: str, me: DeviceInfo, stable: str | None) -> Judge:
    (tmp_path / "cpu-x.yaml").write_text(BUDGETS.format(identity=identity))
    return Judge("k", me, load_dir(tmp_path), JudgeConfig(stable_identity=stable, policy=VerdictPolicy()))


def test_stored_timing_gates_only_on_a_declared_stable_machine_with_its_identity(tmp_path: Path) -> None:
    me = xeon("6/207/2", CAPS_AMX)
    slow = [12.0 + 0.01 * i for i in range(30)]  # +20 % against a 5 % tolerance
    name = parse_name("step_ms")
    gating = _judge(tmp_path, me.identity or "", me, stable=me.identity).judge(name, slow)
    assert gating.outcome == "fail"
    advisory = _judge(tmp_path, me.identity or "", me, stable=None).judge(name, slow)
    assert advisory.outcome == "advisory" and advisory.advice == "fail"
    assert "would fail" in advisory.reason and "perfbudget ab" in advisory.reason
    other = xeon("6/106/6", CAPS_AVX512)
    # Declared stable, but the budget file describes another machine kind: advisory, never a fail.
    # (The identity selector does not match it at all, so it is not even applied.)
    assert _judge(tmp_path, me.identity or "", other, stable=other.identity).judge(name, slow).outcome == "unbudgeted"
    # The decision: advisory fails nothing, except under strict when it is beyond the budget.
    j = _judge(tmp_path, me.identity or "", me, stable=None)
    assert j.decision([advisory]).outcome == "pass"
    strict = Judge("k", me, j.budgets, JudgeConfig(strict=True))
    assert strict.decision([advisory]).outcome == "fail"


def test_exact_checks_gate_everywhere(tmp_path: Path) -> None:
    (tmp_path / "cpu.yaml").write_text("schema: 1\ndevice: {type: cpu}\nbudgets:\n  k:\n    flops: 100\n")
    me = xeon("6/207/2", CAPS_AMX)
    j = Judge("k", me, load_dir(tmp_path), JudgeConfig())
    assert j.judge(parse_name("flops"), 120).outcome == "fail"


def _migrate_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("migrate_budgets", ROOT / "scripts" / "migrate-budgets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LEGACY_MODEL = """schema: 1
device: {type: cpu, model: Intel(R) Xeon(R) Processor, threads: 1}
budgets:
  enc:
    step_ms: {value: 30.0, tolerance: 0.2, provenance: {device: cpu Intel(R) Xeon(R) Processor (1 thread)}}
"""
KNOWN_MODEL = """schema: 1
device: {type: cpu, model: AMD EPYC, threads: 1}
budgets:
  enc:
    step_ms: {value: 20.0, tolerance: 0.2, provenance: {identity: cpu-amd-epyc-25-1-1-avx2}}
"""
PORTABLE = """schema: 1
device: {type: cpu}
budgets:
  enc:
    flops: 100
    loss_drift: {value: 0.0157, tolerance: 0.12, provenance: {device: cpu Intel(R) Xeon(R) Processor}}
  lever:
    loss_drift: {value: 0.0025, tolerance: 0.03, provenance: {identity: cpu-amd-epyc-25-1-1-avx2}}
"""


def test_migration_rekeys_or_sets_aside_and_moves_numerics_by_isa_class(tmp_path: Path) -> None:
    mig = _migrate_script()
    (tmp_path / "cpu-intel-xeon-processor.yaml").write_text(LEGACY_MODEL)
    (tmp_path / "cpu-amd-epyc.yaml").write_text(KNOWN_MODEL)
    (tmp_path / "cpu.yaml").write_text(PORTABLE)
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert mig.main(["--budgets-dir", str(tmp_path), "--dry-run"]) == 0
    assert {p.name: p.read_text() for p in tmp_path.iterdir() if p.is_file()} == before
    assert mig.main(["--budgets-dir", str(tmp_path)]) == 0
    bs = load_dir(tmp_path)
    assert not bs.file_errors and not bs.entry_errors
    names = {f.path.name: f for f in bs.files}
    # The model-name file whose machine nobody recorded is set aside whole, values untouched.
    assert "cpu-intel-xeon-processor.yaml" not in names
    aside = tmp_path / "unidentified" / "cpu-intel-xeon-processor.yaml"
    assert "value: 30.0" in aside.read_text()
    # The one whose provenance names its machine is keyed by that identity.
    assert names["cpu-amd-epyc.yaml"].selector is not None
    assert names["cpu-amd-epyc.yaml"].selector.as_dict() == {"type": "cpu", "identity": "cpu-amd-epyc-25-1-1-avx2",
                                                              "threads": 1}
    # Kernel-path numerics leave the portable file: to their ISA class when known, else aside.
    assert set(names["cpu.yaml"].entries["enc"]) == {"flops"} and "lever" not in names["cpu.yaml"].entries
    assert names["cpu-isa-avx2.yaml"].entries["lever"]["loss_drift"].value == 0.0025
    assert "0.0157" in (tmp_path / "unidentified" / "cpu-path-dependent-numerics.yaml").read_text()
    # Nothing left to do the second time; an unidentified file is keyed once its machine is known.
    assert mig.migrate(tmp_path) == []
    assert mig.main(["--budgets-dir", str(tmp_path), "--identity", "cpu-intel-xeon-processor-6-143-8-amx",
                     str(aside)]) == 0
    rekeyed = load_dir(tmp_path)
    f = next(f for f in rekeyed.files if f.path.name == "cpu-intel-xeon-processor-6-143-8-amx.yaml")
    assert f.entries["enc"]["step_ms"].value == 30.0 and not aside.exists()


def test_the_repository_has_no_budget_file_keyed_by_a_model_name_alone() -> None:
    for f in load_dir(ROOT / "budgets").files:
        sel = f.selector.as_dict() if f.selector else {}
        assert not ("model" in sel and not {"identity", "cpuid"} & set(sel)), f"{f.path.name}: {sel}"


def test_one_reading_of_the_stable_declaration_for_the_plugin_and_show(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from perfbudget.verdict.judge import stable_identity

    me = xeon("6/207/2", CAPS_AMX)
    assert stable_identity("", me) is None and stable_identity("no", me) is None
    assert stable_identity("yes", me) == me.identity == stable_identity(me.identity.upper(), me)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="declares a stable machine, but this cpu device is cpu-intel"):
        stable_identity("cpu-amd-epyc-25-1-1-avx2", me)
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PERFBUDGET_STABLE_MACHINE", "cpu-not-this-one-1-1-1-avx2")
    assert show()[0] == 2 and "declares a stable machine" in capsys.readouterr().err
