"""Change points on absolute series and chained A/B ratios, the cumulative ratio's interval, and what
``history check`` finds, on histories built from results files."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from history_support import ab_results, date, sha, stored_results

from perfbudget.history import HistoryStore, checks_from_results, run_of
from perfbudget.history.analysis import analyze, analyze_store, chain_gaps_since, findings_since
from perfbudget.history.chain import chain_of, cumulative, pooled
from perfbudget.history.changepoints import ChangeConfig, chained_drifts, level_shifts, segment_sum
from perfbudget.history.store import Check, Point, Run
from perfbudget.measure.stats import t_quantile
from perfbudget.results import load_results
from perfbudget.vocabulary import Outcome


def noise(n: int, sd: float, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, sd, n)


def test_a_planted_step_in_an_absolute_series_is_one_change_point_at_its_commit() -> None:
    level = np.r_[np.zeros(25), np.full(25, math.log(1.10))]
    shifts = level_shifts(list(40.0 * np.exp(level + noise(50, 0.02, seed=2))))
    assert [s.index for s in shifts] == [25]
    assert shifts[0].change == pytest.approx(0.10, abs=0.02)


def test_noise_alone_has_no_change_point_and_a_short_series_none_at_all() -> None:
    assert level_shifts(list(40.0 * np.exp(noise(60, 0.03, seed=2)))) == []
    assert level_shifts([40.0, 44.0, 48.0]) == []


def test_an_exact_metric_changes_where_its_value_does() -> None:
    assert [s.index for s in level_shifts([1e9] * 10 + [1.06e9] * 5)] == [10]


def test_a_count_that_leaves_zero_is_a_change_point_from_zero() -> None:
    [shift] = level_shifts([0.0] * 10 + [2.0] * 5)  # graph breaks appear
    assert (shift.index, shift.before, shift.after, shift.label) == (10, 0.0, 2.0, "0 -> 2")
    assert shift.change == math.inf


def test_level_shifts_refuse_values_that_are_negative_or_not_finite() -> None:
    with pytest.raises(ValueError, match="finite values >= 0"):
        level_shifts([1.0, -1.0, 2.0, 1.0, 1.0, 1.0])


def test_a_creeping_drift_of_five_small_merges_is_one_drift_over_exactly_them() -> None:
    steps = np.r_[np.zeros(20), np.full(5, math.log(1.02)), np.zeros(20)]
    se = [0.006] * 45
    drifts = chained_drifts(list(steps + noise(45, 0.006, seed=3)), se, [5.0] * 45)
    assert [(d.first, d.last) for d in drifts] == [(20, 24)]
    assert drifts[0].ratio == pytest.approx(1.02**5, abs=0.02)
    assert drifts[0].ci[0] > 1.0
    # Each merge alone is +2 % +- 1.5 %: none of them would have failed a pull request at 5 %.
    assert all(abs(x) < 0.05 for x in steps)


def test_a_single_large_merge_is_a_drift_of_one() -> None:
    steps = np.r_[np.zeros(20), [math.log(1.10)], np.zeros(20)]
    drifts = chained_drifts(list(steps + noise(41, 0.01, seed=4)), [0.01] * 41)
    assert [(d.first, d.last) for d in drifts] == [(20, 20)]


def test_chained_drifts_refuse_missing_standard_errors() -> None:
    with pytest.raises(ValueError, match="standard errors"):
        chained_drifts([0.0, 0.1], [0.01, 0.0])
    with pytest.raises(ValueError, match="2 log-ratios but 1"):
        chained_drifts([0.0, 0.1], [0.01])


def test_the_cumulative_interval_adds_log_variances_with_welch_satterthwaite_df() -> None:
    ratio, (lo, hi) = segment_sum([math.log(1.02)] * 5, [0.01] * 5, [5.0] * 5, 0.95)
    # var 5e-4, df (5e-4)^2 / (5 * 1e-8 / 5) = 25, t(0.975, 25) = 2.0595
    half = 2.0595 * math.sqrt(5e-4)
    assert ratio == pytest.approx(1.02**5)
    assert (lo, hi) == (pytest.approx(1.02**5 * math.exp(-half), rel=1e-4),
                        pytest.approx(1.02**5 * math.exp(half), rel=1e-4))


def test_change_config_names_a_bad_value() -> None:
    with pytest.raises(ValueError, match="chain_confidence: expected a number in"):
        ChangeConfig(chain_confidence=1.5)


# ---------------------------------------------------------------- from results files


def _stored_history(tmp_path: Path, levels: list[float]) -> HistoryStore:
    store = HistoryStore(tmp_path / "history.db")
    for i, ms in enumerate(levels):
        path = stored_results(ms).write(tmp_path / f"r{i}.json")
        store.add(run_of(load_results(path), source=str(path), commit=sha(i), parent=sha(i - 1) if i else None,
                         date=date(i)), checks_from_results(load_results(path)))
    return store


def _ab_history(tmp_path: Path, steps: list[float], seed: int = 5, sd: float = 0.005) -> HistoryStore:
    rng = np.random.default_rng(seed)
    store = HistoryStore(tmp_path / "history.db")
    for i, step in enumerate(steps, start=1):
        pairs = list(np.exp(math.log(step) + rng.normal(0, sd, 4)))
        path = ab_results(sha(i), sha(i - 1), pairs, sd=sd).write(tmp_path / f"ab{i}.json")
        res = load_results(path)
        store.add(run_of(res, source=str(path), date=date(i)), checks_from_results(res))
    return store


def test_a_stored_history_from_results_files_finds_the_step_and_names_the_commits(tmp_path: Path) -> None:
    levels = list(40.0 * np.exp(np.r_[np.zeros(15), np.full(15, math.log(1.10))] + noise(30, 0.02, seed=6)))
    with _stored_history(tmp_path, levels) as store:
        analysis = analyze(store.series("encoder-train", "step_ms"))
        assert [s.index for s in analysis.shifts] == [15]
        found, lines = findings_since(analysis, date(5))
        assert not any(line.startswith("cumulative:") for line in lines)  # stored runs have no chain
        # The step is also a trend of this machine's values since commit 5 (the line overstates a
        # step: it rises over the whole window); both name commit 15 as the first at the new level.
        assert [(f.what, f.good, f.bad) for f in found] == [("change point", sha(14), sha(15)),
                                                            ("trend beyond 5%", sha(5), sha(29))]
        assert "git bisect start" in found[0].describe()
        assert findings_since(analysis, date(20))[0] == []  # before --since: not reported
        flops = analyze(store.series("encoder-train", "flops"))
        assert flops.shifts == []


def test_an_ab_history_from_results_files_finds_the_creeping_drift_and_the_cumulative_change(tmp_path: Path) -> None:
    steps = [1.0] * 12 + [1.02] * 5 + [1.0] * 8
    with _ab_history(tmp_path, steps) as store:
        points = store.series("encoder-train", "step_ms")
        links, gaps = chain_of(points)
        assert len(links) == 25 and gaps == []
        analysis = analyze(points)
        assert analysis.shifts == []  # A/B timing is judged on the chain, not on absolute values
        # Only the creep is a drift for the worse (this seed's no-op merges sum to -2.0 %: with the
        # per-pair sd pooled over 25 runs, an improvement at the 99 % level).
        assert [(d.first, d.last) for d in analysis.drifts if d.ratio > 1] == [(12, 16)]
        found, lines = findings_since(analysis, date(10), tolerance=0.05)
        assert lines[0].startswith("cumulative: ") and "since " + sha(10)[:12] in lines[0]
        whats = {f.what: f for f in found}
        assert set(whats) == {"drift", "cumulative beyond 5%"}
        assert (whats["drift"].good, whats["drift"].bad, whats["drift"].merges) == (sha(12), sha(17), 5)
        assert whats["cumulative beyond 5%"].ci is not None and whats["cumulative beyond 5%"].ci[0] > 1.05
        assert cumulative(links).ratio == pytest.approx(1.02**5, rel=0.03)


def test_a_missing_link_ends_the_chain_and_says_so(tmp_path: Path) -> None:
    with _ab_history(tmp_path, [1.0] * 6) as store:
        res = ab_results(sha(20), sha(19), [1.0, 1.0], sd=0.01)
        store.add(run_of(res, source="late.json", date=date(20)), checks_from_results(res))
        links, gaps = chain_of(store.series("encoder-train", "step_ms"))
    assert [link.commit for link in links] == [sha(20)]
    assert gaps and f"parent {sha(19)[:8]} has no A/B ratio" in str(gaps[0])


def test_ab_runs_on_different_machines_are_one_chain(tmp_path: Path) -> None:
    """Hosted runners differ from job to job: each ratio was measured within one, so the chain goes on."""
    rng = np.random.default_rng(9)
    with HistoryStore(tmp_path / "h.db") as store:
        for i in range(1, 21):
            step = 1.10 if i == 12 else 1.0
            res = ab_results(sha(i), sha(i - 1), list(np.exp(math.log(step) + rng.normal(0, 0.005, 3))), sd=0.005)
            run = run_of(res, source=f"ab{i}.json", date=date(i), machine=f"cpu-runner-kind-{i % 3}")
            store.add(run, checks_from_results(res))
        [analysis] = analyze_store(store, names=[("encoder-train", "step_ms")])
    assert analysis.machine == "3 machines" and len(analysis.links) == 20 and analysis.gaps == []
    assert [(d.first, d.last) for d in analysis.drifts] == [(11, 11)]
    assert analysis.links[11].commit == sha(12)


# ---------------------------------------------------------------- pooled per-pair sd


# The issue's creep as `perfbudget ab` measures it: a no-op, then four merges of +2.5 %, each run
# stopping at 2-4 pairs once decided (per-pair ratios as spread as on the Intel VM of
# benchmarks/history-real.md, about 1.5 % per pair).
CREEP_PAIRS = [
    [1.02, 0.985],                   # no-op, 2 pairs
    [1.015, 1.04, 1.02, 1.03],       # +2.5 %
    [1.04, 1.015, 1.03, 1.035],      # +2.5 %
    [1.045, 1.01],                   # +2.5 %
    [1.015, 1.04],                   # +2.5 %
]


def _history_of(tmp_path: Path, runs: list[list[float]], machine: str | None = None) -> HistoryStore:
    store = HistoryStore(tmp_path / "history.db")
    for i, pairs in enumerate(runs, start=1):
        # Judged on the pairs' own sd (the prior set aside, as a 2-pair run at 10 % sets it aside).
        res = ab_results(sha(i), sha(i - 1), pairs, sd=float(np.std(np.log(pairs), ddof=1)), df=len(pairs) - 1)
        store.add(run_of(res, source=f"ab{i}.json", date=date(i), machine=machine), checks_from_results(res))
    return store


def test_the_chain_pools_each_machines_per_pair_sd_over_its_runs(tmp_path: Path) -> None:
    with _history_of(tmp_path, CREEP_PAIRS) as store:
        points = store.series("encoder-train", "step_ms")
    own, _ = chain_of(points)
    links = pooled(own, points)
    logs = [np.log(p) for p in CREEP_PAIRS]
    ss = sum(float(np.sum((x - x.mean()) ** 2)) for x in logs)
    df = sum(len(x) - 1 for x in logs)
    assert [link.df for link in links] == [float(df)] * 5 and df == 9
    assert [link.log_se for link in links] == pytest.approx([math.sqrt(ss / df / len(x)) for x in logs])
    assert own[0].log_se == pytest.approx(float(np.std(logs[0], ddof=1)) / math.sqrt(2))  # its own: 1 df
    assert all(link.pooled_over == 5 for link in links) and all(link.pooled_over == 0 for link in own)
    # A link from a store that kept no pair sd (before version 3) keeps its own standard error.
    older = [replace(p, check=replace(p.check, pair_sd=None)) if i == 0 else p for i, p in enumerate(points)]
    assert pooled(chain_of(older)[0], older)[0] == chain_of(older)[0][0]


def test_pooling_is_per_machine_identity(tmp_path: Path) -> None:
    with _history_of(tmp_path, CREEP_PAIRS[:2]) as store:
        res = ab_results(sha(3), sha(2), [1.3, 0.8, 1.1], sd=0.2)
        store.add(run_of(res, source="ab3.json", date=date(3), machine="cpu-other-machine"),
                  checks_from_results(res))
        points = store.series("encoder-train", "step_ms")
    links = pooled(chain_of(points)[0], points)
    assert [link.pooled_over for link in links] == [2, 2, 0]  # the other machine has one run: its own
    assert links[2].log_se == pytest.approx(0.2 / math.sqrt(3))


def test_the_issues_creep_is_flagged_with_pooled_noise_and_was_not_on_each_runs_own(tmp_path: Path) -> None:
    with _history_of(tmp_path, CREEP_PAIRS) as store:
        points = store.series("encoder-train", "step_ms")
    own = cumulative(chain_of(points)[0], confidence=0.99)
    assert own.ci[0] < 1.0  # each run's own sd: three rest on 1 df (a t quantile of 63.7 at 99 %)
    analysis = analyze(points)
    found, _ = findings_since(analysis, date(0), since_commit=sha(0), tolerance=0.05)
    [cum] = [f for f in found if f.what.startswith("cumulative")]
    assert cum.ci is not None and cum.ci[0] > 1.0 and cum.change > 0.05  # +11.8 % (+4.1 % to +20.1 %, 99 %)
    assert (cum.good, cum.bad, cum.merges) == (sha(0), sha(5), 5)
    # The same noise around no change at all is not flagged.
    centred = [list(np.exp(np.log(p) - np.log(p).mean())) for p in CREEP_PAIRS]
    with _history_of(tmp_path / "noop", centred) as store:
        quiet = analyze(store.series("encoder-train", "step_ms"))
    assert findings_since(quiet, date(0), since_commit=sha(0), tolerance=0.05)[0] == []


def test_a_cumulative_change_within_the_tolerance_is_not_flagged_however_sure(tmp_path: Path) -> None:
    runs = [[1.008, 1.009, 1.01, 1.011]] * 4  # +4 % in all, known to a fraction of a percent
    with _history_of(tmp_path, runs) as store:
        analysis = analyze(store.series("encoder-train", "step_ms"))
    found, lines = findings_since(analysis, date(0), since_commit=sha(0), tolerance=0.05)
    assert not [f for f in found if f.what.startswith("cumulative")]
    assert "+3.9% (+3.4% to +4.3%, 99%)" in lines[0]


# ---------------------------------------------------------------- gaps in the chain


def _ab_runs(tmp_path: Path, commits: list[int], ratio: float = 1.0) -> HistoryStore:
    """A/B runs of ``commits``, each against the commit before it (missing numbers: never measured)."""
    store = HistoryStore(tmp_path / "history.db")
    for i in commits:
        res = ab_results(sha(i), sha(i - 1), [ratio * 1.002, ratio * 0.998, ratio * 1.001], sd=0.005)
        store.add(run_of(res, source=f"ab{i}.json", date=date(i)), checks_from_results(res))
    return store


def test_every_gap_is_found_newest_first_with_the_commits_it_cannot_reach_back_over(tmp_path: Path) -> None:
    with _ab_runs(tmp_path, [1, 2, 3, 6, 7, 10, 11]) as store:
        links, gaps = chain_of(store.series("encoder-train", "step_ms"))
    assert [link.commit for link in links] == [sha(10), sha(11)]
    assert [(g.commit, g.parent, g.older.commit, g.unchained) for g in gaps] == [
        (sha(10), sha(9), sha(7), 5), (sha(6), sha(5), sha(3), 3)]
    assert f"cannot reach back over {sha(7)[:8]}..{sha(9)[:8]}" in str(gaps[0])


def test_a_gap_after_the_ref_is_said_and_the_cumulative_change_is_only_after_it(tmp_path: Path) -> None:
    with _ab_runs(tmp_path, [1, 2, 3, 6, 7, 10, 11]) as store:
        analysis = analyze(store.series("encoder-train", "step_ms"))
    _, lines = findings_since(analysis, date(2), since_commit=sha(2))
    assert lines[0].startswith("cumulative: ") and f"since {sha(9)[:12]} only: the chain does not reach back to " \
        f"{sha(2)[:12]}" in lines[0]
    gaps = [line for line in lines if line.startswith("gap: ")]
    assert gaps == chain_gaps_since(analysis, date(2), since_commit=sha(2)) and len(gaps) == 2
    assert f"{sha(7)[:8]}..{sha(9)[:8]}" in gaps[0] and f"{sha(3)[:8]}..{sha(5)[:8]}" in gaps[1]
    # After the newer gap only the older one is behind the ref; from the chain's first parent on, none.
    assert len(chain_gaps_since(analysis, date(6), since_commit=sha(6))) == 1
    assert chain_gaps_since(analysis, date(9), since_commit=sha(9)) == []
    assert "only" not in findings_since(analysis, date(10), since_commit=sha(10))[1][0]


def test_a_chain_that_starts_after_the_ref_says_so(tmp_path: Path) -> None:
    with _ab_runs(tmp_path, [5, 6, 7]) as store:
        analysis = analyze(store.series("encoder-train", "step_ms"))
    assert analysis.chain_gaps == []
    [gap] = chain_gaps_since(analysis, date(2), since_commit=sha(2))
    assert f"the chain starts at {sha(5)[:8]} (against {sha(4)[:8]}), after {sha(2)[:8]}" in gap
    assert chain_gaps_since(analysis, date(4), since_commit=sha(4)) == []


# ---------------------------------------------------------------- links on a shared prior


def _prior_link_points(n: int, *, pairs: int = 2, prior_df: float = 3.0, machine: str = "cpu-m") -> list[Point]:
    """``n`` A/B runs on one machine whose sd pooled their pairs with a prior of ``prior_df``
    degrees of freedom, keeping no pair sd (so they are not pooled over the machine's runs)."""
    return [Point(Run(commit=sha(i), parent=sha(i - 1), date=date(i), machine=machine, mode="ab"),
                  Check(nodeid="n", key="k", metric="step_ms", unit="ms", kind="timing", direction="lower",
                        outcome=Outcome.PASS, value=40.0, ratio=1.01, log_se=0.02, df=prior_df + pairs - 1,
                        pairs=pairs))
            for i in range(1, n + 1)]


def test_unpooled_links_count_the_prior_they_share_once() -> None:
    points = _prior_link_points(5)
    links = pooled(chain_of(points)[0], points)
    assert [(link.pooled_over, link.prior_df, link.df) for link in links] == [(0, 3.0, 4.0)] * 5
    cum = cumulative(links, confidence=0.95)
    # Welch-Satterthwaite over the prior's share (3/4 of each variance, 3 df, counted once) and
    # each run's own (1/4, 1 df): 5 (3 + 1)^2 / (5 * 3 + 1) = 5 df, not the 5 * 4 = 20 of counting it per link.
    half = t_quantile(0.975, 5.0) * math.sqrt(5) * 0.02
    assert cum.ci == (pytest.approx(1.01**5 * math.exp(-half)), pytest.approx(1.01**5 * math.exp(half)))
    # One link keeps its run's own degrees of freedom; runs that set the prior aside share nothing.
    one = cumulative(links[:1], confidence=0.95)
    assert one.ci[1] == pytest.approx(1.01 * math.exp(t_quantile(0.975, 4.0) * 0.02))
    aside = pooled(chain_of(_prior_link_points(5, pairs=4, prior_df=0.0))[0])
    assert cumulative(aside, confidence=0.95).ci[1] == pytest.approx(1.01**5 * math.exp(
        t_quantile(0.975, 15.0) * math.sqrt(5) * 0.02))


def test_segment_sum_splits_each_variance_between_its_shared_estimate_and_its_own() -> None:
    # Two links, each 3 of 4 df a shared prior's: (2v)^2 / ((1.5v)^2 / 3 + 2 (0.25v)^2 / 1) = 32/7 df.
    v = 0.0004
    _, (_, hi) = segment_sum([0.0, 0.0], [math.sqrt(v)] * 2, [4.0, 4.0], 0.95, ["prior", "prior"], [3.0, 3.0])
    assert hi == pytest.approx(math.exp(t_quantile(0.975, 32 / 7) * math.sqrt(2 * v)))
    # All of it shared (a machine's pooled sd) is the old rule: the source's df once.
    _, (_, hi) = segment_sum([0.0, 0.0], [math.sqrt(v)] * 2, [4.0, 4.0], 0.95, ["m", "m"])
    assert hi == pytest.approx(math.exp(t_quantile(0.975, 4.0) * math.sqrt(2 * v)))


# ---------------------------------------------------------------- direction


def test_a_metric_of_unknown_direction_fails_on_a_cumulative_change_either_way(tmp_path: Path) -> None:
    runs = [[0.97, 0.968, 0.972, 0.971]] * 4  # -11 % in all, known to a fraction of a percent
    with _history_of(tmp_path, runs) as store:
        points = store.series("encoder-train", "step_ms")
    known = analyze(points)
    assert not [f for f in findings_since(known, date(0), since_commit=sha(0))[0] if f.what.startswith("cumulative")]
    unknown = analyze([replace(p, check=replace(p.check, direction="")) for p in points])
    assert unknown.worse(-0.11)
    [cum] = [f for f in findings_since(unknown, date(0), since_commit=sha(0))[0] if f.what.startswith("cumulative")]
    assert cum.change < -0.05 and cum.ci is not None and cum.ci[1] < 1.0
