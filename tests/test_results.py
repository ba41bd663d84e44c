"""Results files: records serialised from their fields, the schema version read in one place, errors that name the field."""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

import pytest

from perfbudget.device import DeviceInfo
from perfbudget.results import (
    RESULTS_SCHEMA,
    BaseSide,
    BudgetRef,
    Record,
    Results,
    RunInfo,
    load_results,
)
from perfbudget.vocabulary import RunMode

DATA = Path(__file__).parent / "data" / "results"

FULL = Record(
    nodeid="perf_tests/test_x.py::test_step[cpu]", key="encoder-train", metric="step_ms", outcome="fail",
    value=41.5, ci=(40.0, 43.0), ci_confidence=0.99, n=30, cv=0.02,
    budget=BudgetRef(value=38.2, tolerance=0.05, source="budgets/cpu.yaml", line=5, ab_tolerance=0.03),
    limit=40.11, rounds=2, confirmed=True, reason="slower", samples=(41.0, math.nan, math.inf),
    attribution=("aten::addmm +45 %",), unit="ms", ref_ms=math.nan, kind="timing", direction="lower",
    device=DeviceInfo(type="cpu", model="AMD EPYC 7763", count=2, torch="2.13.0+cpu", threads=1, isa_class="avx2"),
    base=BaseSide(value=38.0, samples=(38.0, 38.1), ratio=1.09, ratio_ci=(1.05, 1.12), pairs=3,
                  pair_ratios=(1.08, 1.1, 1.09), detectable=0.02),
    advice="fail", extra={"ops": [{"name": "aten::mm", "self_ms": 1.0}]},
)


def same(a: Record, b: Record) -> bool:
    """Equal, with NaN equal to NaN (a record's floats may be NaN)."""
    return json.dumps(a.as_dict(), sort_keys=True) == json.dumps(b.as_dict(), sort_keys=True)


def test_the_json_form_has_one_key_per_field_and_reads_back(tmp_path: Path) -> None:
    d = FULL.as_dict()
    assert list(d) == [f.name for f in fields(Record)]
    assert list(d["budget"]) == [f.name for f in fields(BudgetRef)]
    assert list(d["base"]) == [f.name for f in fields(BaseSide)]
    assert list(d["device"]) == [f.name for f in fields(DeviceInfo)]
    assert d["samples"] == [41.0, "nan", "inf"] and d["ref_ms"] == "nan" and d["ci"] == [40.0, 43.0]
    path = Results(records=[FULL], meta=RunInfo()).write(tmp_path / "r.json")
    data = json.loads(path.read_text())
    assert data["schema"] == RESULTS_SCHEMA == 4
    assert data["meta"] == {"mode": "stored", "errors": []}  # what the run has not, it does not write
    back = load_results(path)
    assert back.meta == RunInfo(mode=RunMode.STORED) and len(back.records) == 1 and same(back.records[0], FULL)
    got = back.records[0]
    assert got.ci == (40.0, 43.0) and isinstance(got.samples, tuple) and math.isnan(got.samples[1])
    assert got.budget == FULL.budget and got.device == FULL.device and got.base == FULL.base


def test_files_of_earlier_writers_read_with_defaults_for_later_fields() -> None:
    # The sample files predate ``advice``, ``ab_tolerance`` and the machine-identity fields.
    raw = json.loads((DATA / "base.json").read_text())
    assert "advice" not in raw["records"][0] and "isa_class" not in raw["records"][0]["device"]
    rec = load_results(DATA / "base.json").records[0]
    assert rec.advice == "" and rec.device is not None and rec.device.isa_class is None
    d = {"nodeid": "n", "key": "k", "metric": "flops", "outcome": "pass", "someday": 1}  # unknown keys: ignored
    assert Record.from_dict(d) == Record(nodeid="n", key="k", metric="flops", outcome="pass")


@pytest.mark.parametrize(("schema", "message"), [
    (5, "results schema 5 is newer than this perfbudget reads (schema 4); upgrade perfbudget to read it"),
    (None, "schema: expected a results schema version (1 to 4), got None"),
    ("1", "schema: expected a results schema version (1 to 4), got '1'"),
    (True, "schema: expected a results schema version (1 to 4), got True"),
    (0, "schema: expected a results schema version (1 to 4), got 0"),
])
def test_a_schema_this_version_does_not_read_is_refused_naming_file_and_versions(
    tmp_path: Path, schema: object, message: str
) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"schema": schema, "meta": {}, "records": []}))
    with pytest.raises(ValueError) as err:
        load_results(path)
    assert str(err.value) == f"{path}: {message}"


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: r["budget"].update(value="x"), "records[1].budget.value: expected a number, got 'x'"),
    (lambda r: r.pop("nodeid"), "records[1].nodeid: missing"),
    (lambda r: r.update(n=True), "records[1].n: expected an integer, got True"),
    (lambda r: r.update(ci=[1.0]), "records[1].ci: expected 2 values, got [1.0]"),
    (lambda r: r.update(samples=[1.0, None]), "records[1].samples[1]: expected a number, got None"),
    (lambda r: r["device"].update(type="tpu"), "records[1].device.type: expected one of 'cpu', 'cuda', got 'tpu'"),
    (lambda r: r.update(base=[1]), "records[1].base: expected a mapping, got [1]"),
    (lambda r: r.update(confirmed="yes"), "records[1].confirmed: expected a bool, got 'yes'"),
])
def test_a_bad_field_is_named_with_its_record_and_path(tmp_path: Path, change: object, message: str) -> None:
    records = [FULL.as_dict(), FULL.as_dict()]
    change(records[1])  # type: ignore[operator]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"schema": 1, "meta": {}, "records": records}))
    with pytest.raises(ValueError) as err:
        load_results(path)
    assert str(err.value) == f"{path}: {message}"


def test_a_schema_2_file_says_its_mode_in_one_vocabulary_once_read(tmp_path: Path) -> None:
    # Schema 2 wrote an A/B run's mode as the presence of meta.ab (older A/B runs: no "mode");
    # a plain run's file may not say its mode at all. Schema 3 reads both as typed meta.
    ab = {"base_ref": "main", "base_commit": "a" * 40, "head_commit": "b" * 40, "pairs": 3, "valid_pairs": 3,
          "invalid_pairs": [], "stopped": "decided", "cpus": [1], "burst_ms": 100.0,
          "inconclusive": [["t.py::test", "k", "step_ms"]], "runs": [{"pair": 1}],
          "policy": {"confidence": 0.95, "prior_sd": {"timing": 0.025}, "prior_df": 3.0, "family_alpha": 0.05,
                     "noise": []}, "someday": 1}
    (tmp_path / "ab.json").write_text(json.dumps({"schema": 2, "meta": {"budgets_dir": "b", "errors": [], "ab": ab},
                                                 "records": []}))
    (tmp_path / "plain.json").write_text(json.dumps({"schema": 2, "meta": {"budgets_dir": "b"}, "records": []}))
    got = load_results(tmp_path / "ab.json").meta
    assert got.mode is RunMode.AB and got.ab is not None and got.ab.head_commit == "b" * 40
    assert got.ab.inconclusive == (("t.py::test", "k", "step_ms"),) and got.ab.cpus == (1,)
    assert got.ab.policy is not None and got.ab.policy.prior_sd == {"timing": 0.025}
    assert load_results(tmp_path / "ab.json").head_commit == "b" * 40
    plain = load_results(tmp_path / "plain.json")
    assert plain.meta == RunInfo(budgets_dir="b") and plain.head_commit is None
    # Written again, it reads back the same, at this schema.
    again = load_results(Results(records=[], meta=got).write(tmp_path / "again.json"))
    written = json.loads((tmp_path / "again.json").read_text())
    assert again.meta == got and written["schema"] == 4 and "unfinished" not in written["meta"]
    assert written["meta"]["ab"]["invalid_pairs"] == [] and written["meta"]["ab"]["policy"]["confidence"] == 0.95


@pytest.mark.parametrize(("meta", "message"), [
    ({"mode": "sometimes"}, "meta.mode: expected one of 'stored', 'update', 'collect', 'ab', got 'sometimes'"),
    ({"ab": {"pairs": "three"}}, "meta.ab.pairs: expected an integer, got 'three'"),
    ({"budgets_dir": 3}, "meta.budgets_dir: expected a str, got 3"),
])
def test_a_bad_meta_field_is_named_with_its_path(tmp_path: Path, meta: dict[str, object], message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"schema": 3, "meta": meta, "records": []}))
    with pytest.raises(ValueError) as err:
        load_results(path)
    assert str(err.value) == f"{path}: {message}"
