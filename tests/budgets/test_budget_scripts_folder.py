"""The budget scripts' default folder is the ini key ``perfbudget_budgets_dir``, as pytest reads it.

(Here because this change was limited to tests/history; it belongs with tests/budgets.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from perfbudget.settings import Settings

ROOT = Path(__file__).resolve().parents[2]

KNOWN_MODEL = """schema: 1
device: {type: cpu, model: AMD EPYC, threads: 1}
budgets:
  enc:
    step_ms: {value: 20.0, tolerance: 0.2, provenance: {identity: cpu-amd-epyc-25-1-1-avx2}}
"""


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"), ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while decorating
    spec.loader.exec_module(module)
    return module


def test_migrate_budgets_defaults_to_the_ini_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\nperfbudget_budgets_dir = perf/budgets\n")
    folder = tmp_path / "perf" / "budgets"
    folder.mkdir(parents=True)
    (folder / "cpu-amd-epyc.yaml").write_text(KNOWN_MODEL)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")  # the ini file is found upwards, its folder relative to it
    assert _script("migrate-budgets").main(["--dry-run"]) == 0
    assert f"{folder / 'cpu-amd-epyc.yaml'}: keyed by the model name 'AMD EPYC'" in capsys.readouterr().out


def test_portable_budgets_defaults_to_the_repositorys_ini_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    pb = _script("portable-budgets")
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "broken.yaml").write_text("schema: [\n")
    asked: list[Path] = []

    def for_folder(where: Path) -> Settings:
        asked.append(where)
        return Settings(budgets_dir=folder)

    monkeypatch.setattr(pb, "for_folder", for_folder)
    measured = tmp_path / "measured"
    measured.mkdir()
    assert pb.main(["--measured", str(measured), "--dry-run"]) == 2
    assert asked == [ROOT] and str(folder / "broken.yaml") in capsys.readouterr().err
