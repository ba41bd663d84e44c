"""``perfbudget_lease`` in a lockstep A/B run: the driver reads it (``-o`` overrides too), tells both sides in
their run spec, which wins over a side's own ini file, and records it in the merged results."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from perfbudget.ab import run as ab_run
from perfbudget.ab.coordinator import TurnLog
from perfbudget.ab.pairs import PairRun, SideRun
from perfbudget.device import DeviceInfo
from perfbudget.results import Record, Results
from perfbudget.settings import SIDES, SPEC_ENV, RunSpec, Settings, pytest_overrides


def test_a_sides_run_spec_sets_the_lease_whatever_its_ini_file_says(tmp_path: Path) -> None:
    for told, ini in ((True, "false"), (False, "true")):
        spec = tmp_path / f"{told}.json"
        spec.write_text(RunSpec(side="base", lease=told).to_json())
        got = Settings.resolve(ini={"perfbudget_lease": ini}, env={SPEC_ENV: str(spec)})
        assert got.lease is told
    assert Settings.resolve(ini={"perfbudget_lease": "true"}, env={}).lease is True  # no A/B side: its ini
    with pytest.raises(ValueError, match="lease: expected true or false, got 'yes'"):
        RunSpec(side="head", lease="yes")  # type: ignore[arg-type]


def test_the_driver_reads_pytests_ini_overrides() -> None:
    args = ["-o", "perfbudget_lease=true", "-operfbudget_html=false", "--override-ini=perfbudget_strict=1",
            "--override-ini", "a=b=c", "-k", "x", "-o"]
    assert pytest_overrides(args) == {"perfbudget_lease": "true", "perfbudget_html": "false",
                                      "perfbudget_strict": "1", "a": "b=c"}


def test_both_sides_are_told_the_lease_and_the_merged_results_record_it(
        make_repo: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo({"pytest.ini": "[pytest]\n"})  # neither commit's ini sets the lease
    told: list[RunSpec] = []
    cpu = DeviceInfo(type="cpu", model="fake cpu", count=1, threads=1, cpuid="6/1/1", isa_class="avx2")

    def pair(index: int, *, workdir: Path, first: str, spec: RunSpec, **_: object) -> PairRun:
        told.append(spec)
        sides = {}
        for side in SIDES:  # results whose own meta says nothing of the lease
            path = workdir / f"pair-{index}" / f"{side}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            Results(records=[Record(nodeid="t.py::test", key="k", metric="flops", outcome="pass", value=1.0, n=1,
                                    unit="1", kind="exact", direction="lower", device=cpu)]).write(path)
            sides[side] = SideRun(side=side, results=path, log=path.with_suffix(".log"), returncode=0, wall_s=1.0)
        return PairRun(index=index, first=first, sides=sides, wall_s=1.0, timed_out=False,
                       turns=TurnLog(turns=(), joined=SIDES, left=SIDES))

    monkeypatch.setattr(ab_run, "run_pair", pair)
    done = ab_run.run_ab(ab_run.ABConfig(root=repo, base="HEAD", min_pairs=1, max_pairs=1,
                                         pytest_args=("t.py", "-o", "perfbudget_lease=true")), say=lambda _: None)
    assert [s.lease for s in told] == [True]
    assert json.loads(done.path.read_text())["meta"]["lease"] is True
