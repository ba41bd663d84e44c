"""Each check's measured noise: calibrated from A/B results, kept beside the budgets, used by the verdict."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from perfbudget.ab.calibration import calibrate
from perfbudget.ab.merge import PairRecords, compare_pairs
from perfbudget.ab.ratios import ABPolicy, resolvable_lines
from perfbudget.budgets.loader import BudgetSet
from perfbudget.budgets.noise import CheckNoise, NoiseTable, load_noise, noise_path
from perfbudget.budgets.schema import BudgetError
from perfbudget.cli import main
from perfbudget.device import DeviceInfo
from perfbudget.results import ABRunInfo, BaseSide, Record, Results, RunInfo
from perfbudget.verdict.ratio import can_decide, judge_ratios
from perfbudget.vocabulary import RunMode

DEV = DeviceInfo(type="cpu", model="Test CPU", count=2, threads=1, cpuid="25/17/1", isa_class="avx2")
ID = DEV.identity
NODE = "perf_tests/test_enc.py::test_train"


def test_the_identity_of_the_test_machine_is_known() -> None:
    assert ID == "cpu-test-cpu-25-17-1-avx2"


def ab_results(checks: dict[str, tuple[float, ...]], *, head: str = "a" * 40, base: str = "b" * 40,
               counts: dict[str, float] | None = None) -> Results:
    recs = [Record(nodeid=NODE, key="enc", metric=m, outcome="pass", value=1.0, device=DEV, kind="timing",
                   base=BaseSide(value=1.0, ratio=math.prod(rs) ** (1 / len(rs)), pairs=len(rs), pair_ratios=rs))
            for m, rs in checks.items()]
    recs += [Record(nodeid=NODE, key="enc", metric=m, outcome="unbudgeted", value=1000.0 * r, device=DEV, kind="count",
                    base=BaseSide(value=1000.0, ratio=r, pairs=1))
             for m, r in (counts or {}).items()]
    return Results(records=recs, meta=RunInfo(mode=RunMode.AB, ab=ABRunInfo(head_commit=head, base_commit=base,
                                                                             burst_ms=100.0)))


def test_calibration_pools_each_checks_per_pair_spread_about_its_runs_own_mean() -> None:
    run1 = ab_results({"step_ms": (1.02, 0.98, 1.00)})
    run2 = ab_results({"step_ms": (1.21, 1.19)})  # a real +20 % change: the mean moves, the spread does not
    (table,) = calibrate([("r1.json", run1), ("r2.json", run2)], date="2026-12-03").values()
    n = table.get("enc", "step_ms")
    assert n is not None and n.df == 3 and n.runs == 2 and n.spread == "pairs"
    ys1 = [math.log(x) for x in (1.02, 0.98, 1.00)]
    ys2 = [math.log(x) for x in (1.21, 1.19)]
    ss = sum((y - sum(ys1) / 3) ** 2 for y in ys1) + sum((y - sum(ys2) / 2) ** 2 for y in ys2)
    assert n.ss == pytest.approx(ss) and n.sd == pytest.approx(math.sqrt(ss / 3))
    assert [(p["file"], p["burst_ms"]) for p in table.provenance] == [("r1.json", 100.0), ("r2.json", 100.0)]


def test_calibration_counts_the_pair_set_aside_as_outlying_too() -> None:
    """The prior is the spread of pairs as they come: it is applied to runs of 2-3 pairs, where none is set
    aside, so calibrating on the trimmed pairs would make it too narrow."""
    from dataclasses import replace as with_

    from perfbudget.results import SetAsidePair

    run = ab_results({"step_ms": (1.00, 1.01, 0.99, 1.00)})
    (r,) = run.records
    assert r.base is not None
    run.records = [with_(r, base=with_(r.base, set_aside=(SetAsidePair(pair=5, ratio=1.30, why="far"),)))]
    (table,) = calibrate([("r.json", run)], date="2026-12-03").values()
    n = table.get("enc", "step_ms")
    ys = [math.log(x) for x in (1.00, 1.01, 0.99, 1.00, 1.30)]
    assert n is not None and n.df == 4 and n.ss == pytest.approx(sum((y - sum(ys) / 5) ** 2 for y in ys))


def test_counts_are_calibrated_from_aa_runs_only() -> None:
    aa = ab_results({}, head="c" * 40, base="c" * 40, counts={"instructions[callgrind]": 1.00002})
    ab = ab_results({}, counts={"instructions[callgrind]": 1.05})  # a real change: not noise
    (table,) = calibrate([("aa.json", aa), ("ab.json", ab)]).values()
    n = table.get("enc", "instructions[callgrind]")
    assert n is not None and n.runs == 1 and n.spread == "runs" and n.ss == pytest.approx(math.log(1.00002) ** 2)
    assert n.count_tolerance() is None  # one A/A run is not enough to set a tolerance


def test_calibration_refuses_results_not_written_by_an_ab_run() -> None:
    with pytest.raises(ValueError, match=r"plain\.json: not the results of `perfbudget ab`"):
        calibrate([("plain.json", Results(records=[]))])


def test_a_noise_file_round_trips_and_pools(tmp_path: Path) -> None:
    t1 = NoiseTable(identity=ID, checks={("enc", "step_ms"): CheckNoise(ss=0.001, df=4, runs=1)},
                    provenance=({"file": "a.json"},))
    t1.write(tmp_path)
    back = load_noise(tmp_path)[ID]
    assert back.get("enc", "step_ms") == CheckNoise(ss=0.001, df=4, runs=1)
    assert back.path == noise_path(tmp_path, ID)
    pooled = back.pooled(t1)
    assert pooled.get("enc", "step_ms") == CheckNoise(ss=0.002, df=8, runs=2)
    assert load_noise(tmp_path / "nowhere") == {}


def test_a_noise_file_is_named_relative_to_the_working_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    NoiseTable(identity=ID, checks={("enc", "step_ms"): CheckNoise(ss=0.001, df=4, runs=1)}).write(tmp_path / "budgets")
    back = load_noise(tmp_path / "budgets")[ID]
    assert back.path is not None and back.path.is_absolute()
    assert back.where == f"budgets/noise/{ID}.yaml"  # what a verdict's reason shows


@pytest.mark.parametrize(("text", "where"), [
    ("schema: 1\nidentity: other\nchecks: {}\n", "identity: expected the identity the file is named after"),
    ("schema: 2\nidentity: X\nchecks: {}\n", "schema: expected schema 1, got 2"),
    ("schema: 1\nidentity: X\nchecks:\n  enc:\n    step_ms: {ss: 0.1, df: 0, runs: 1}\n",
     "checks.enc.step_ms.df: expected a number > 0, got 0"),
    ("schema: 1\nidentity: X\nchecks:\n  enc:\n    step_ms: {ss: -1, df: 2, runs: 1}\n",
     "checks.enc.step_ms.ss: expected a number >= 0, got -1"),
    ("schema: 1\nidentity: X\nchecks: [1\n", "invalid YAML"),
    # Parsed as budget files are: a second block does not silently replace the first, ...
    ("schema: 1\nidentity: X\nchecks:\n  enc: {step_ms: {ss: 0.1, df: 2, runs: 1}}\nchecks: {}\n",
     ":5: checks: duplicate key (first defined on line 3)"),
    # ... a number too large for a float, nesting and aliases that would exhaust the parser are errors.
    ("schema: 1\nidentity: X\nchecks:\n  enc:\n    step_ms: {ss: 1" + "9" * 400 + ", df: 2, runs: 1}\n",
     ":5: checks.enc.step_ms.ss: expected a number >= 0, got 1999"),
    ("schema: 1\nidentity: X\nprovenance: " + "[" * 3000 + "]" * 3000 + "\n", "nested deeper than 32 levels"),
    ("schema: 1\nidentity: X\n" + "\n".join([f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}" if i else "x"] * 10) + "]"
                                           for i in range(9)]) + "\n", "more than 100000 values (aliases expanded)"),
    ("schema: 1\nidentity: X\nchecks: {1: {step_ms: {ss: 0.1, df: 2, runs: 1}}}\n",
     ":3: checks: a mapping key must be a string; quote it ('1')"),
    # A turn length read back later as a float must be one.
    ("schema: 1\nidentity: X\nchecks: {}\nprovenance:\n  - {file: r.json}\n  - {file: s.json, burst_ms: abc}\n",
     ":6: provenance.1.burst_ms: expected a number of milliseconds > 0, got 'abc'"),
    ("schema: 1\nidentity: X\nchecks: {}\nprovenance: [{burst_ms: 0}]\n", "provenance.0.burst_ms"),
])
def test_a_bad_noise_file_is_an_error_naming_file_key_and_value(tmp_path: Path, text: str, where: str) -> None:
    (tmp_path / "noise").mkdir()
    path = tmp_path / "noise" / "X.yaml"
    path.write_text(text)
    with pytest.raises(BudgetError) as err:
        load_noise(tmp_path)
    assert str(err.value).startswith(str(path)) and where in str(err.value)


def test_a_noise_file_is_read_only_as_a_plain_file_inside_the_budgets_folder(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / f"{ID}.yaml").write_text(f"schema: 1\nidentity: {ID}\nchecks: {{}}\n")
    budgets = tmp_path / "budgets"
    (budgets / "noise").mkdir(parents=True)
    link = budgets / "noise" / f"{ID}.yaml"
    link.symlink_to(outside / f"{ID}.yaml")
    with pytest.raises(BudgetError, match=rf"^{link}: cannot read: a symbolic link \(to {outside}/"):
        load_noise(budgets)
    link.unlink()
    (budgets / "noise").rmdir()
    (budgets / "noise").symlink_to(outside)  # the folder a link: refused, read or written
    with pytest.raises(BudgetError, match=rf"^{link.parent}: a symbolic link \(to {outside}\)"):
        load_noise(budgets)


def policy_with(sd: float, df: float, metric: str = "step_ms") -> ABPolicy:
    table = NoiseTable(identity=ID, checks={("enc", metric): CheckNoise(ss=sd * sd * df, df=df, runs=2)})
    return ABPolicy(noise={ID: table})


def pairs_of(ratios: tuple[float, ...], metric: str = "step_ms") -> list[PairRecords]:
    def side(v: float) -> Results:
        return Results(records=[Record(nodeid=NODE, key="enc", metric=metric, outcome="pass", value=v,
                                       samples=(v * 0.99, v, v * 1.01), n=3, device=DEV, kind="timing")])
    return [PairRecords(head=side(10.0 * r), base=side(10.0)) for r in ratios]


def test_a_quiet_check_measured_quiet_is_decided_where_the_flat_prior_leaves_it_inconclusive() -> None:
    ratios = (1.035, 1.043, 1.031, 1.039)  # +3.7 %, well inside +5 % for a check measured at 0.6 %
    flat = compare_pairs(pairs_of(ratios), budgets=BudgetSet(root=Path("b")), final=True)
    (r,) = flat.records
    assert r.outcome == "inconclusive", r.reason
    measured = compare_pairs(pairs_of(ratios), budgets=BudgetSet(root=Path("b")), final=True,
                             policy=policy_with(0.006, 20))
    (m,) = measured.records
    assert m.outcome == "pass", m.reason
    assert "prior sd 0.6% per pair, measured: noise/" in m.reason and "20 df" in m.reason


def test_a_measured_prior_the_pairs_contradict_is_set_aside() -> None:
    ratios = (1.10, 0.92, 1.12, 0.90)  # sd ~11 % against a measured 0.6 %
    (m,) = compare_pairs(pairs_of(ratios), budgets=BudgetSet(root=Path("b")), final=True,
                         policy=policy_with(0.006, 20)).records
    assert m.outcome == "inconclusive" and "which is set aside" in m.reason


def test_a_measured_prior_applies_only_to_its_machine_identity() -> None:
    other = ABPolicy(noise={"cpu-other": policy_with(0.006, 20).noise[ID]})
    assert other.prior_for(ID, "enc", "step_ms", "timing").source == "default for timing"
    p = policy_with(0.001, 50).prior_for(ID, "enc", "step_ms", "timing")
    assert p.sd == 0.005 and p.df == 12  # floored, and worth at most NOISE_DF_MAX


def test_a_counts_tolerance_follows_its_measured_aa_spread() -> None:
    # The case: a redundant .clone() read +0.23 % instructions; A/A counts move ~0.0005 %.
    aa = [1.000002, 0.999995, 1.000005, 0.999998]
    table = NoiseTable(identity=ID, checks={("dec", "instructions[callgrind]"): CheckNoise(
        ss=sum(math.log(x) ** 2 for x in aa), df=4, runs=4, spread="runs")})
    tol = table.checks[("dec", "instructions[callgrind]")].count_tolerance()
    assert tol is not None and tol == pytest.approx(1e-4)  # the floor: the spread is far below it

    def count(v: float) -> Results:
        return Results(records=[Record(nodeid=NODE, key="dec", metric="instructions[callgrind]",
                                       outcome="unbudgeted", value=v, n=1, device=DEV, kind="count")])

    clone = [PairRecords(head=count(2_849_791), base=count(2_843_329))]
    (flat,) = compare_pairs(clone, budgets=BudgetSet(root=Path("b"))).records
    assert flat.outcome == "unbudgeted"  # within the flat 0.5 %
    (measured,) = compare_pairs(clone, budgets=BudgetSet(root=Path("b")), policy=ABPolicy(noise={ID: table})).records
    assert measured.outcome == "fail" and "from measured spread" in measured.reason


def test_a_check_the_pairs_left_cannot_decide_is_beyond_reach_and_gets_no_more_pairs() -> None:
    noisy = (1.10, 0.93)  # sd ~12 % per pair: two more pairs cannot bring it inside 5 %
    c = compare_pairs(pairs_of(noisy), budgets=BudgetSet(root=Path("b")), min_pairs=2, pairs_left=2)
    assert c.beyond_reach and not c.undecided
    many = compare_pairs(pairs_of(noisy), budgets=BudgetSet(root=Path("b")), min_pairs=2, pairs_left=40)
    assert many.undecided and not many.beyond_reach
    quiet = compare_pairs(pairs_of((1.03, 1.01)), budgets=BudgetSet(root=Path("b")), min_pairs=2, pairs_left=2)
    assert quiet.undecided or not quiet.beyond_reach


def test_can_decide_needs_pairs_left() -> None:
    rv = judge_ratios([1.03, 1.05], tolerance=0.05, direction="lower", prior_sd=0.025)
    assert not can_decide(rv, 0)
    assert can_decide(rv, 50)


def test_resolvable_lines_put_the_least_resolvable_first_and_say_which_cannot_pass() -> None:
    table = NoiseTable(identity=ID, checks={
        ("enc", "step_ms"): CheckNoise(ss=0.02**2 * 10, df=10, runs=2),
        ("enc", "tokens_per_s"): CheckNoise(ss=0.10**2 * 10, df=10, runs=2)})
    head, first, second = resolvable_lines(table, ABPolicy(noise={ID: table}), pairs=4)
    assert "with up to 4 pairs" in head
    assert first.startswith("  enc.tokens_per_s: sd 10.0% per pair") and first.endswith("cannot pass even unchanged")
    assert second.startswith("  enc.step_ms: sd 2.0% per pair; resolves +") and "cannot pass" not in second


def test_the_calibrate_command_writes_the_file_beside_the_budgets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = ab_results({"step_ms": (1.02, 0.98, 1.00)})
    path = tmp_path / "ab.json"
    res.write(path)
    budgets = tmp_path / "budgets"
    import io

    out = io.StringIO()
    assert main(["calibrate", str(path), "--budgets-dir", str(budgets), "--trust-identity"], out=out) == 0
    assert f"{budgets}/noise/{ID}.yaml: 1 check(s) from 1 run(s)" in out.getvalue()
    assert main(["calibrate", str(path), "--budgets-dir", str(budgets), "--trust-identity"], out=io.StringIO()) == 0
    assert load_noise(budgets)[ID].get("enc", "step_ms") == CheckNoise(
        ss=pytest.approx(2 * load_noise(budgets)[ID].checks[("enc", "step_ms")].ss / 2), df=4, runs=2)
    plain = tmp_path / "plain.json"
    Results(records=[]).write(plain)
    assert main(["calibrate", str(plain), "--budgets-dir", str(budgets)], out=io.StringIO()) == 2
    assert "not the results of `perfbudget ab`" in capsys.readouterr().err


def test_calibrate_writes_only_this_machines_noise_unless_told_to_trust_the_claim(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A results file can claim any machine: a forged one must not rewrite a stable machine's priors.
    from perfbudget.measure.machine import describe

    path = tmp_path / "ab.json"
    ab_results({"step_ms": (1.02, 0.98, 1.00)}).write(path)
    budgets = tmp_path / "budgets"
    import io

    assert describe("cpu").identity != ID
    assert main(["calibrate", str(path), "--budgets-dir", str(budgets)], out=io.StringIO()) == 1
    assert f"refused: the results claim machine identity {ID}" in capsys.readouterr().err
    assert not noise_path(budgets, ID).exists()
    out = io.StringIO()
    assert main(["calibrate", str(path), "--budgets-dir", str(budgets), "--trust-identity"], out=out) == 0
    assert f"trusted machine identity {ID} (--trust-identity" in out.getvalue() and noise_path(budgets, ID).exists()


def test_the_verdicts_degrees_of_freedom_and_prior_are_kept_and_history_reads_them() -> None:
    from perfbudget.history.store import Check

    (m,) = compare_pairs(pairs_of((1.035, 1.043, 1.031, 1.039)), budgets=BudgetSet(root=Path("b")), final=True,
                         policy=policy_with(0.006, 20)).records
    info = m.base
    assert info is not None and info.df == 12 + 3 and info.prior.startswith("measured: noise/")
    assert Check.from_record(m).df == 15  # not the flat prior's 3 + 3
    (s,) = compare_pairs(pairs_of((1.10, 0.92, 1.12, 0.90)), budgets=BudgetSet(root=Path("b")), final=True,
                         policy=policy_with(0.006, 20)).records
    assert s.base is not None and s.base.prior == "set aside" and Check.from_record(s).df == 3


def test_noise_measured_in_turns_of_another_length_is_neither_pooled_nor_used(tmp_path: Path) -> None:
    from perfbudget.ab.run import ABConfig, _with_noise
    from perfbudget.measure.machine import describe

    here = describe("cpu").identity
    assert here is not None
    t400 = NoiseTable(identity=here, checks={("enc", "step_ms"): CheckNoise(ss=0.004, df=4, runs=1)},
                      provenance=({"file": "a.json", "burst_ms": 400.0},))
    t100 = NoiseTable(identity=here, checks={("enc", "step_ms"): CheckNoise(ss=0.001, df=4, runs=1)},
                      provenance=({"file": "b.json", "burst_ms": 100.0},))
    with pytest.raises(ValueError, match=r"turns of 400 ms, the new runs in turns of 100 ms"):
        t400.pooled(t100)
    t400.write(tmp_path / "budgets")
    said: list[str] = []
    config = ABConfig(root=tmp_path, base="HEAD")
    assert _with_noise(config, tmp_path / "budgets", said.append, burst_ms=100.0).noise == {}
    assert "holds for turns of 400 ms, this run takes 100 ms" in said[0]
    said.clear()
    assert here in _with_noise(config, tmp_path / "budgets", said.append, burst_ms=400.0).noise
    assert not any("flat prior" in line for line in said)


def test_calibrate_refuses_to_pool_runs_of_another_turn_length(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = ab_results({"step_ms": (1.01, 0.98, 1.02)})
    res.write(tmp_path / "a.json")
    assert main(["calibrate", "--trust-identity", "--budgets-dir", str(tmp_path / "budgets"), str(tmp_path / "a.json")]) == 0
    before = noise_path(tmp_path / "budgets", ID).read_text()
    assert res.meta.ab is not None
    res.meta = replace(res.meta, ab=replace(res.meta.ab, burst_ms=400.0))
    res.write(tmp_path / "b.json")
    assert main(["calibrate", "--trust-identity", "--budgets-dir", str(tmp_path / "budgets"), str(tmp_path / "b.json")]) == 2
    assert "turns of 100 ms, the new runs in turns of 400 ms" in capsys.readouterr().err
    assert noise_path(tmp_path / "budgets", ID).read_text() == before
    assert main(["calibrate", "--trust-identity", "--replace", "--budgets-dir", str(tmp_path / "budgets"), str(tmp_path / "b.json")]) == 0
