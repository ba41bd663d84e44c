"""Inside a pair: noisy checks take more turns, quiet ones none; the operator set is the same on both sides."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from perfbudget.ab.merge import PairRecords
from perfbudget.ab.run import _pin_operators
from perfbudget.budgets import load_dir
from perfbudget.device import DeviceInfo
from perfbudget.metrics import parse_name
from perfbudget.recorder import PerfRecorder
from perfbudget.results import Record, Results
from perfbudget.verdict.judge import ABSide, Judge, JudgeConfig, Stored, pinned_operators

CPU = DeviceInfo(type="cpu", model="test cpu", count=2, threads=1)


def _side(tmp_path: Path, precision: float | None, **kw: float) -> Judge:
    return Judge("k", CPU, load_dir(tmp_path), JudgeConfig(judging=ABSide(precision=precision, **kw)))


def _batches(sd: float, seed: int = 1) -> tuple[list[float], list[int], object]:
    rng = random.Random(seed)
    taken = [0]

    def batch() -> list[float]:
        return [10.0 * (1 + rng.gauss(0, sd)) for _ in range(30)]

    def more() -> list[float]:
        taken[0] += 1
        return batch()

    return batch(), taken, more


def test_a_noisy_check_takes_fresh_batches_up_to_the_cap_and_a_quiet_one_none(tmp_path: Path) -> None:
    name = parse_name("step_ms")
    first, taken, more = _batches(sd=0.001)
    v = _side(tmp_path, 0.01).judge(name, first, more=more)  # type: ignore[arg-type]
    assert taken[0] == 0 and v.n == 30

    first, taken, more = _batches(sd=0.2)
    v = _side(tmp_path, 0.01, max_batches=3).judge(name, first, more=more)  # type: ignore[arg-type]
    assert taken[0] == 3 and v.n == 120, "a noisy check samples until the cap"
    assert v.outcome == "unbudgeted"

    first, taken, more = _batches(sd=0.03)
    v = _side(tmp_path, 0.01, max_batches=20).judge(name, first, more=more)  # type: ignore[arg-type]
    assert 0 < taken[0] < 20, "a moderately noisy check stops once its median is tight"
    lo, hi = sorted(v.samples)[0], sorted(v.samples)[-1]
    assert lo < hi


def test_without_a_precision_a_side_takes_one_fixed_sample_set(tmp_path: Path) -> None:
    first, taken, more = _batches(sd=0.2)
    v = _side(tmp_path, None).judge(parse_name("step_ms"), first, more=more)  # type: ignore[arg-type]
    assert taken[0] == 0 and v.n == 30


def test_paired_batches_keep_their_samples_not_the_reference(tmp_path: Path) -> None:
    rng = random.Random(3)
    first = [5.0 * (1 + rng.gauss(0, 0.3)) for _ in range(30)]
    v = _side(tmp_path, 0.01, max_batches=1).judge(
        parse_name("step_ms"), first, reference=[1.0] * 30,
        more=lambda: ([5.0] * 30, [1.0] * 30))
    assert v.n == 60 and v.samples[-1] == 5.0


def test_exact_checks_are_not_resampled(tmp_path: Path) -> None:
    called = []
    v = _side(tmp_path, 0.01).judge(parse_name("flops"), 123.0, more=lambda: called.append(1) or [1.0])
    assert not called and v.value == 123.0


def _record(nodeid: str, key: str, metric: str) -> Record:
    return Record(nodeid=nodeid, key=key, metric=metric, device="cpu", outcome="unbudgeted", value=1.0)


def test_the_driver_pins_every_operator_either_side_recorded(tmp_path: Path) -> None:
    head = Results(records=[_record("t.py::a", "enc", "op_self_ms[aten::mm]"), _record("t.py::a", "enc", "step_ms")])
    base = Results(records=[_record("t.py::a", "enc", "op_count[aten::add_]"),
                            _record("t.py::b", "dec", "op_share[aten::bmm]")])
    path = tmp_path / "operators.json"
    _pin_operators(path, [PairRecords(head=head, base=base)])
    assert json.loads(path.read_text()) == {"t.py::a": {"enc": ["aten::add_", "aten::mm"]},
                                           "t.py::b": {"dec": ["aten::bmm"]}}
    assert pinned_operators(str(path), "t.py::a", "enc") == ("aten::add_", "aten::mm")
    assert pinned_operators(str(path), "t.py::c", "enc") is None
    assert pinned_operators(str(tmp_path / "absent.json"), "t.py::a", "enc") is None


def test_a_broken_pin_file_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "operators.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"operators\.json: cannot be read"):
        pinned_operators(str(path), "t", "k")
    path.write_text(json.dumps({"t": {"k": "aten::mm"}}))
    with pytest.raises(ValueError, match=r"\['t'\]\['k'\]: expected a list"):
        pinned_operators(str(path), "t", "k")


def test_a_pinned_side_records_exactly_the_pinned_operators(tmp_path: Path) -> None:
    a, b = torch.randn(64, 64), torch.randn(64, 64)

    def step() -> torch.Tensor:
        return (a @ b).relu_().sum()

    path = tmp_path / "operators.json"

    def ops_recorded(collect: bool) -> set[str]:
        judging = ABSide(operators_file=str(path)) if collect else Stored()
        rec = PerfRecorder(Judge("k", CPU, load_dir(tmp_path), JudgeConfig(judging=judging)), nodeid="t::x")
        rec.operators(step, rounds=2, steps=2, families=("op_count",))
        return {r.metric for r in rec.records()}

    path.write_text(json.dumps({"t::x": {"k": ["aten::relu_", "aten::sum"]}}))
    assert ops_recorded(collect=True) == {"op_count[aten::relu_]", "op_count[aten::sum]"}
    assert "op_count[aten::mm]" in ops_recorded(collect=False), "outside an A/B side the pin file is not read"
