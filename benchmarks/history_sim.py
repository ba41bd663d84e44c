"""Simulated main-branch histories: how well the history's change points and chained A/B ratios find
planted regressions, per change-point library, with per-pair noise drawn from this project's A/A runs.

Each history has 60 commits. A plant is one commit at +5 % or +10 %, or five consecutive commits at
+2 % each (creeping, +10.4 % in all), at a random commit in 20..40; A/A histories have none. Every
commit is measured two ways:

- absolute: one value per commit (a stored-mode run on a stable machine): the level times
  exp(e), e one draw of a per-pair log-ratio from the A/A runs;
- A/B: ``pairs`` process pairs, each ln(head/parent) = the commit's step + one draw; the ratio,
  its interval and per-pair sd from ``perfbudget.verdict.ratio.judge_ratios`` (the verdict's own
  pooling with the prior), its standard error = sd / sqrt(pairs).

Draws: the A/A per-pair log-ratios, centred within each run and scaled by sqrt(n / (n - 1)) to undo
the centring, resampled with replacement: ``benchmarks/ab-gate-cpu.json`` (the 5 encoder A/A runs)
and the per-pair ratios in ``benchmarks/ab-suite-aa-cpu.md`` (the whole-suite A/A).

A detector is evaluated as the history grows, at the last planted commit and 2, 5, 10 and 19
commits later; commits to detection count from the last planted commit. False change points are
counted on the whole 60 commits, away from the plant (any direction).

Usage: python benchmarks/history_sim.py [--histories 30] [--seed 18] [--out TABLE.md]
       python benchmarks/history_sim.py --example-db history.db   (one simulated history as a store:
       what docs/history-page.png shows, rendered by `perfbudget history report --db history.db`)
       python benchmarks/history_sim.py --check [--histories 500] [--seed 25]   (what `history check`
       finds since the start of short A/B histories on one machine: its trend of the values beside
       the chained ratios; see :func:`check_table`)
Candidates that are not installed are listed as such (``pip install --no-deps apache-otava
signal-processing-algorithms structlog more-itertools`` adds the two that are not dependencies).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from perfbudget.ab.ratios import PRIOR_SD
from perfbudget.history.changepoints import (
    Breakpoints,
    ChangeConfig,
    chained_drifts,
    level_shifts,
    pelt_breakpoints,
    segment_sum,
)
from perfbudget.verdict.ratio import PRIOR_DF, RatioVerdict, can_decide, judge_ratios

HERE = Path(__file__).resolve().parent
N_COMMITS = 60
PLANT_AT = (20, 40)
LAGS = (0, 2, 5, 10, 19)
TOLERANCE = 0.05
WINDOW = 10
"""``history check --since HEAD~10``: the cumulative check's window, in merges."""


@dataclass(frozen=True)
class Profile:
    """A check whose A/A noise drives a simulated history."""

    name: str
    draws: np.ndarray
    pairs: int
    """Process pairs per A/B run (the median the A/A runs took)."""


@dataclass(frozen=True)
class Plant:
    name: str
    steps: tuple[float, ...]
    """Relative change of each consecutive planted commit."""


PLANTS = (
    Plant("A/A (none)", ()),
    Plant("single +5 %", (0.05,)),
    Plant("single +10 %", (0.10,)),
    Plant("creeping 5 x +2 %", (0.02,) * 5),
)


def _centred(ratios: Sequence[float]) -> list[float]:
    logs = [math.log(r) for r in ratios]
    if len(logs) < 2:
        return []
    mean = statistics.fmean(logs)
    scale = math.sqrt(len(logs) / (len(logs) - 1))
    return [(x - mean) * scale for x in logs]


def _suite_md_ratios(path: Path) -> dict[str, list[float]]:
    """Per-pair head/base ratios of each check in the whole-suite A/A table."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"\| `([^`]+)` \| \w+ \| \d+ \| ([\d., ]+) \|", line)
        if m:
            out[m.group(1)] = [float(x) for x in m.group(2).split(",")]
    return out


def profiles() -> list[Profile]:
    gate = json.loads((HERE / "ab-gate-cpu.json").read_text())
    suite = _suite_md_ratios(HERE / "ab-suite-aa-cpu.md")
    pooled: dict[str, list[float]] = {}
    for scenario in gate["scenarios"]:
        if scenario["kind"] != "aa":
            continue
        for run in scenario["done"]:
            for name, check in run["checks"].items():
                pooled.setdefault(name, []).extend(_centred(check["pair_ratios"]))
    for name, ratios in suite.items():
        pooled.setdefault(name, []).extend(_centred(ratios))
    chosen = (("encoder-train.step_ms", 3), ("encoder-train.op_share[aten::mm]", 6), ("tiny-mlp-train.step_ms", 6))
    return [Profile(name, np.asarray(pooled[name]), pairs) for name, pairs in chosen]


@dataclass
class History:
    values: list[float]
    log_ratios: list[float]
    log_se: list[float]
    dfs: list[float]
    first: int
    """First planted commit (-1: none)."""
    last: int


def simulate(profile: Profile, plant: Plant, rng: np.random.Generator) -> History:
    steps = np.zeros(N_COMMITS)
    first = last = -1
    if plant.steps:
        first = int(rng.integers(PLANT_AT[0], PLANT_AT[1] + 1))
        last = first + len(plant.steps) - 1
        steps[first:last + 1] = np.log1p(plant.steps)
    level = np.cumsum(steps)
    values = list(40.0 * np.exp(level + rng.choice(profile.draws, N_COMMITS)))
    log_ratios, log_se, dfs = [], [], []
    for i in range(N_COMMITS):
        pair_ratios = np.exp(steps[i] + rng.choice(profile.draws, profile.pairs))
        v = judge_ratios(list(pair_ratios), tolerance=TOLERANCE, direction="lower", prior_sd=PRIOR_SD["timing"])
        log_ratios.append(math.log(v.ratio))
        log_se.append(v.sd / math.sqrt(v.pairs))
        dfs.append(v.df)
    return History(values, log_ratios, log_se, dfs, first, last)


# ---------------------------------------------------------------- candidates


def otava_breakpoints(series: Sequence[float], penalty: float) -> list[int]:
    """Apache Otava's E-divisive with a t-test (windows of 30 commits, p < 0.001 as its default)."""
    from otava.analysis import compute_change_points

    cps, _ = compute_change_points(list(series), window_len=30, max_pvalue=0.001)
    return [*sorted({int(c.index) for c in cps} - {0, len(series)}), len(series)]


def spa_breakpoints(series: Sequence[float], penalty: float) -> list[int]:
    """MongoDB's signal-processing-algorithms E-divisive (permutation test, p < 0.01, 100 permutations)."""
    from signal_processing_algorithms.energy_statistics.energy_statistics import e_divisive

    np.random.seed(0)  # its permutations draw from numpy's global generator: the same table every run
    cps = e_divisive(np.asarray(series, dtype=float), pvalue=0.01, permutations=100)
    return [*sorted({int(c) for c in cps} - {0, len(series)}), len(series)]


CANDIDATES: dict[str, tuple[Breakpoints, str]] = {
    "ruptures (PELT, l2)": (pelt_breakpoints, "ruptures"),
    "Apache Otava (E-divisive, t-test)": (otava_breakpoints, "otava"),
    "signal-processing-algorithms (E-divisive)": (spa_breakpoints, "signal_processing_algorithms"),
}


def available(module: str) -> str | None:
    """``None`` when importable, else the error."""
    try:
        __import__(module)
    except Exception as exc:  # an import error of any kind says the candidate cannot run here
        return f"{type(exc).__name__}: {exc}"
    return None


# ---------------------------------------------------------------- detectors


Detector = Callable[[History, int], list[tuple[int, int, float]]]
"""``(history, k) -> changes``: each ``(first, last, change)`` found in commits 0..k."""


def level_detector(breakpoints: Breakpoints, config: ChangeConfig) -> Detector:
    def detect(h: History, k: int) -> list[tuple[int, int, float]]:
        return [(s.index, s.index, s.change) for s in level_shifts(h.values[:k + 1], config=config,
                                                                    breakpoints=breakpoints)]
    return detect


def chain_detector(breakpoints: Breakpoints, config: ChangeConfig) -> Detector:
    def detect(h: History, k: int) -> list[tuple[int, int, float]]:
        drifts = chained_drifts(h.log_ratios[:k + 1], h.log_se[:k + 1], h.dfs[:k + 1], config=config,
                                breakpoints=breakpoints)
        return [(d.first, d.last, d.change) for d in drifts]
    return detect


def cumulative_detector(h: History, k: int) -> list[tuple[int, int, float]]:
    """``history check --since HEAD~10 --tolerance 0.05``: the chained ratio of the last 10 merges."""
    if k + 1 < WINDOW:
        return []
    lo_i = k + 1 - WINDOW
    ratio, (lo, _) = segment_sum(h.log_ratios[lo_i:k + 1], h.log_se[lo_i:k + 1], h.dfs[lo_i:k + 1], 0.95)
    return [(lo_i, k, ratio - 1)] if lo > 1 + TOLERANCE else []


@dataclass
class Tally:
    detected: int = 0
    histories: int = 0
    delays: list[int] = field(default_factory=list)
    false: int = 0
    commits: int = 0


def hits(changes: list[tuple[int, int, float]], h: History, *, level: bool) -> bool:
    lo, hi = (h.first - 1, h.last + 2) if level else (h.first, h.last)
    return any(c > 0 and first <= hi and last >= lo for first, last, c in changes)


def evaluate(detector: Detector, hist: list[History], *, level: bool, cumulative: bool = False) -> Tally:
    t = Tally()
    for h in hist:
        t.histories += 1
        if h.first >= 0:
            for lag in LAGS:
                k = min(h.last + lag, N_COMMITS - 1)
                if hits(detector(h, k), h, level=level):
                    t.detected += 1
                    t.delays.append(k - h.last)
                    break
        if cumulative:
            if h.first < 0:  # false alarms: every commit checked in an A/A history
                t.false += sum(1 for k in range(WINDOW - 1, N_COMMITS) if detector(h, k))
                t.commits += N_COMMITS - WINDOW + 1
            continue
        changes = detector(h, N_COMMITS - 1)
        lo, hi = (h.first - 1, h.last + 2) if level else (h.first, h.last)
        t.false += sum(1 for first, last, _ in changes if h.first < 0 or not (first <= hi and last >= lo))
        t.commits += N_COMMITS
    return t


def write_example_db(path: Path, seed: int) -> None:
    """One simulated history in a store: an operator's share of the step by A/B (a creeping drift,
    5 x +2 % from commit 30, drawn until the chain finds it: 21 of 30 histories do), and a step time
    on a stable machine (one +10 % merge)."""
    from perfbudget.history import Check, HistoryStore, Run
    from perfbudget.vocabulary import Outcome

    rng = np.random.default_rng(seed)
    step, share = profiles()[0], profiles()[1]
    creep = History([], [], [], [], -1, -1)
    while creep.first != 30 or not chained_drifts(creep.log_ratios, creep.log_se, creep.dfs):
        creep = simulate(share, PLANTS[3], rng)
    jump = simulate(step, PLANTS[2], rng)
    path.unlink(missing_ok=True)
    with HistoryStore(path) as store:
        for i in range(N_COMMITS):
            commit, parent = (hashlib.sha1(f"commit {j}".encode()).hexdigest() for j in (i + 1, i))
            d = f"2026-{10 + i // 30:02d}-{1 + i % 30:02d}T12:00:00Z"
            r, se = creep.log_ratios[i], creep.log_se[i]
            share_now = creep.values[i] / 40.0 * 0.31
            ab = Check(nodeid="perf_tests/test_encoder.py::test_operators[cpu]", key="encoder-train",
                       metric="op_share[aten::mm]", unit="fraction", kind="timing", direction="lower",
                       outcome=Outcome.PASS, value=share_now, ratio=math.exp(r),
                       ratio_ci=(math.exp(r - 2.5 * se), math.exp(r + 2.5 * se)), log_se=se, df=creep.dfs[i],
                       pairs=share.pairs)
            store.add(Run(commit=commit, parent=parent, date=d, machine="cpu-amd-epyc-25-1-1-avx2", mode="ab"), [ab])
            ms = jump.values[i] / 4.0
            stored = Check(nodeid="perf_tests/test_encoder.py::test_step_latency[cpu]", key="encoder-train",
                           metric="step_ms", unit="ms", kind="timing", direction="lower", outcome=Outcome.PASS,
                           value=ms, ci=(ms * 0.985, ms * 1.015))
            # A stable self-hosted runner's absolute series (simulated values, not a measurement).
            store.add(Run(commit=commit, parent=parent, date=d, machine="cpu-simulated-stable-runner",
                          mode="stored"), [stored])


# ---------------------------------------------------------------- history check, end to end


CHECK_COMMITS = (5, 10, 20)
CHECK_MAX_PAIRS = 6
CHECK_PAIR_SDS = (0.03, 0.07)
"""Per-pair sd of ln(head/base): 3 %, this project's steps in 100 ms turns on a 2-vCPU VM
(``benchmarks/burst-length-cpu.md``); 7 %, the issue's BERT step in 400 ms turns (issue 25, item 5)."""
CHECK_OFFSETS = (0.02, 0.06)
"""sd of each run's machine offset (one machine identity, another VM or another hour), shared by both
sides of its pairs: the head's median moves by it, the ratio does not."""
CHECK_PLANTS: dict[str, Callable[[int], list[float]]] = {
    "no-op": lambda n: [0.0] * n,
    "creep: no-op, then 4 x +2.5 %": lambda n: [0.0] * (n - 4) + [0.025] * 4,
    "+10 % at the last commit": lambda n: [0.0] * (n - 1) + [0.10],
    "+10 % at the middle commit": lambda n: [0.10 if i == n // 2 else 0.0 for i in range(n)],
}
"""Relative change of each commit 1..n (commit 0 is the ref the check runs since)."""


@dataclass
class CheckRun:
    """What ``history check --since <commit 0>`` said on one simulated history."""

    failed: bool
    whats: set[str]
    head_sd: float
    """sd of ln(head value) across the runs, around the true levels (the per-run noise as a user sees it)."""
    pairs: int
    """Process pairs the history's runs took in all."""
    before: bool
    """What the check said before the chain pooled its runs' per-pair sd and flagged a cumulative
    change worse with its whole interval and beyond the tolerance on its estimate: the cumulative
    interval on each run's own sd entirely beyond the tolerance (the trend and drifts left out)."""


def _gate_pairs(head_level: float, base_level: float, u: float, pair_sd: float, rng: np.random.Generator,
                tolerance: float) -> tuple[list[float], list[float], RatioVerdict]:
    """The pairs one ``perfbudget ab`` run takes: 2, then one more while the check is undecided and
    more pairs could still decide it (:func:`can_decide`), at most ``CHECK_MAX_PAIRS``."""
    proc_sd = pair_sd / math.sqrt(2)
    heads: list[float] = []
    ratios: list[float] = []
    while True:
        head = math.exp(head_level + u + rng.normal(0.0, proc_sd))
        base = math.exp(base_level + u + rng.normal(0.0, proc_sd))
        heads.append(head)
        ratios.append(head / base)
        if len(ratios) < 2:
            continue
        left = CHECK_MAX_PAIRS - len(ratios)
        v = judge_ratios(ratios, tolerance=tolerance, direction="lower", prior_sd=PRIOR_SD["timing"], final=left == 0)
        if v.state != "undecided" or not can_decide(v, left):
            return heads, ratios, v


def check_history(steps: Sequence[float], offset_sd: float, pair_sd: float, rng: np.random.Generator, *,
                  tolerance: float = TOLERANCE) -> CheckRun:
    """One history of ``len(steps)`` A/B runs on one machine identity, each commit against its parent,
    kept as ``history add`` keeps it and checked as ``history check --since <commit 0>`` checks it.

    Each run: a machine offset ``u ~ N(0, offset_sd)`` shared by the job; pairs of processes as the
    gate takes them (:func:`_gate_pairs`), each side's ln(time) = its commit's level + u +
    N(0, pair_sd / sqrt(2)); the record's value the median of the head's processes, as
    ``perfbudget ab`` writes it; :meth:`Check.from_record` reduces it.
    """
    from perfbudget.device import DeviceInfo
    from perfbudget.history import Check, Point, Run, analyze, findings_since
    from perfbudget.history.chain import chain_of, cumulative
    from perfbudget.results import BaseSide, Record

    device = DeviceInfo(type="cpu", model="Simulated CPU", count=2, threads=1, cpuid="25/17/1", isa_class="avx2")
    levels = np.cumsum([0.0, *np.log1p(steps)])
    points, resid, pairs = [], [], 0
    sha = [hashlib.sha1(f"commit {i}".encode()).hexdigest() for i in range(len(levels))]
    for i in range(1, len(levels)):
        heads, ratios, v = _gate_pairs(levels[i], levels[i - 1], rng.normal(0.0, offset_sd), pair_sd, rng, tolerance)
        pairs += v.pairs
        value = 40.0 * float(np.median(heads))
        resid.append(math.log(value / 40.0) - levels[i])
        record = Record(nodeid="perf/test_bert.py::test_train_step", key="bert-train", metric="step_ms",
                        outcome="fail" if v.state == "fail" else "pass" if v.state == "pass" else "inconclusive",
                        value=value, unit="ms", kind="timing", direction="lower", device=device,
                        base=BaseSide(value=value / v.ratio, ratio=v.ratio, ratio_ci=v.ci, pairs=v.pairs,
                                      pair_ratios=tuple(ratios), tolerance=tolerance, sd=v.sd, df=v.df, confidence=0.95))
        run = Run(commit=sha[i], parent=sha[i - 1], date=f"2026-12-01T{i // 60:02d}:{i % 60:02d}:00Z",
                  machine=str(device.identity), mode="ab")
        points.append(Point(run, Check.from_record(record)))
    analysis = analyze(points)
    found, _ = findings_since(analysis, "2026-12-01T00:00:00Z", since_commit=sha[0], tolerance=tolerance)
    before = cumulative(chain_of(points)[0]).ci[0] > 1 + tolerance
    return CheckRun(failed=bool(found), whats={f.what.split(" beyond")[0] for f in found},
                    head_sd=float(np.std(resid)), pairs=pairs, before=before)


def pooled_sd_check(runs: int, seed: int) -> str:
    """Whether the gate's optional stopping biases the pooled per-pair sd: ``runs`` no-op gate runs
    at each of :data:`CHECK_PAIR_SDS`, their pairs' own sds pooled by degrees of freedom."""
    rng = np.random.default_rng(seed)
    out = []
    for sd in CHECK_PAIR_SDS:
        ss = df = 0.0
        for _ in range(runs):
            _, ratios, _ = _gate_pairs(0.0, 0.0, 0.0, sd, rng, TOLERANCE)
            logs = np.log(ratios)
            ss += float(np.sum((logs - logs.mean()) ** 2))
            df += len(logs) - 1
        out.append(f"true {sd:.0%}: pooled {math.sqrt(ss / df):.2%} over {df:.0f} df")
    return f"Pooled per-pair sd of {runs} simulated gate runs (2 to {CHECK_MAX_PAIRS} pairs each): " + "; ".join(out) + "."


def check_table(histories: int, seed: int) -> str:
    """False alarms and detections of ``history check`` (and of its parts) on simulated histories."""
    t0 = time.monotonic()
    rng = np.random.default_rng(seed)
    plants = list(CHECK_PLANTS)
    rows = []
    for pair_sd in CHECK_PAIR_SDS:
        for offset in CHECK_OFFSETS:
            for n in CHECK_COMMITS:
                cells, sds, pairs = [], [], []
                for plant in plants:
                    runs = [check_history(CHECK_PLANTS[plant](n), offset, pair_sd, rng) for _ in range(histories)]
                    sds += [r.head_sd for r in runs]
                    pairs += [r.pairs / n for r in runs]

                    def pct(pred: Callable[[CheckRun], bool], rs: list[CheckRun] = runs) -> str:
                        return f"{100 * sum(1 for r in rs if pred(r)) / len(rs):.1f}"

                    cells.append(f"**{pct(lambda r: r.failed)}** ({pct(lambda r: 'cumulative' in r.whats)} / "
                                 f"{pct(lambda r: 'drift' in r.whats)} / {pct(lambda r: 'trend' in r.whats)}; "
                                 f"was {pct(lambda r: r.before)})")
                rows.append(f"| {pair_sd:.0%} ({statistics.fmean(pairs):.1f}) | {offset:.0%} "
                            f"({statistics.fmean(sds):.1%}) | {n} | " + " | ".join(cells) + " |")
    return "\n".join([
        "| per-pair sd (pairs per run) | machine offset sd (head median sd) | commits | " + " | ".join(plants) + " |",
        "|---|---|---|" + "---|" * len(plants),
        *rows,
        "",
        f"Cells: % of {histories} histories in which `history check --since <commit 0> --tolerance "
        f"{TOLERANCE:g}` exits 1 (**bold**); in parentheses, by the cumulative chained ratio / a drift / the "
        f"trend of the machine's values; *was*: the cumulative ratio's interval on each run's own sd "
        f"entirely beyond the tolerance (the rule before the per-pair sd was pooled). Each commit measured "
        f"by one A/B run against its parent on one machine identity, its pairs taken as the gate takes "
        f"them (2, then more while undecided and decidable, at most {CHECK_MAX_PAIRS}), judged by the A/B "
        f"verdict (prior {PRIOR_SD['timing']:.1%} worth {PRIOR_DF:g} df); the run's machine offset moves "
        f"both sides. Head median sd: of ln(head value) around the true level, averaged over the row's "
        f"histories. Seed {seed}; wall time {time.monotonic() - t0:.0f} s.",
        "",
        pooled_sd_check(3000, seed),
    ])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--histories", type=int, help="histories per profile and plant (default 30; --check: 500)")
    p.add_argument("--seed", type=int, help="default 18 (--check: 25)")
    p.add_argument("--check", action="store_true",
                   help="history check end to end on short one-machine A/B histories (trend and chain)")
    p.add_argument("--candidates", default="all", metavar="NAMES",
                   help="comma-separated module names to compare (ruptures, otava, signal_processing_algorithms); "
                        "default all that are installed")
    p.add_argument("--out", type=Path, help="write the Markdown table here (else standard output)")
    p.add_argument("--example-db", type=Path, metavar="PATH", help="write one simulated history to this store and stop")
    args = p.parse_args(argv)
    if args.check:
        text = check_table(args.histories or 500, 25 if args.seed is None else args.seed)
        if args.out:
            args.out.write_text(text + "\n")
        print(text)
        return 0
    args.histories = args.histories or 30
    args.seed = 18 if args.seed is None else args.seed
    if args.example_db:
        write_example_db(args.example_db, args.seed)
        print(f"wrote {args.example_db}")
        return 0
    t0 = time.monotonic()
    rng = np.random.default_rng(args.seed)
    profs = profiles()
    config = ChangeConfig()
    sims = {(pr.name, pl.name): [simulate(pr, pl, rng) for _ in range(args.histories)] for pr in profs for pl in PLANTS}
    wanted = {name for name, (_, module) in CANDIDATES.items()
              if args.candidates == "all" or module in args.candidates.split(",")}
    missing = {name: err for name, (_, module) in CANDIDATES.items()
               if name in wanted and (err := available(module)) is not None}
    rows = []
    methods: list[tuple[str, str, Detector, bool, bool]] = []
    for name, (bp, _) in CANDIDATES.items():
        if name in missing or name not in wanted:
            continue
        methods.append(("absolute series", name, level_detector(bp, config), True, False))
        methods.append(("chained A/B log-ratios", name, chain_detector(bp, config), False, False))
    methods.append(("chained A/B, cumulative", f"since HEAD~{WINDOW}, CI beyond +{TOLERANCE:.0%}",
                    cumulative_detector, False, True))
    for pr in profs:
        for series, name, det, level, cumulative in methods:
            cells, false, commits = [], 0, 0
            for pl in PLANTS:
                t = evaluate(det, sims[(pr.name, pl.name)], level=level, cumulative=cumulative)
                false += t.false
                commits += t.commits
                if pl.steps:
                    delay = f"{statistics.median(t.delays):.0f}" if t.delays else "-"
                    cells.append(f"{t.detected}/{t.histories} ({delay})")
            rows.append(f"| `{pr.name}` ({pr.pairs} pairs) | {series} | {name} | " + " | ".join(cells)
                        + f" | {100 * false / max(commits, 1):.2f} |")
    sds = ", ".join(f"`{pr.name}` {np.std(pr.draws) * 100:.1f} % ({len(pr.draws)} draws)" for pr in profs)
    text = "\n".join([
        "| check (noise) | series | detector | single +5 % | single +10 % | creeping 5 x +2 % | false per 100 commits |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Cells: histories detected / histories (median commits from the last planted commit to detection). "
        f"{args.histories} histories of {N_COMMITS} commits per check and plant, seed {args.seed}; "
        f"per-pair sd of the draws: {sds}; change-point settings: {config}; prior per-pair sd "
        f"{PRIOR_SD['timing']:.1%} worth {PRIOR_DF:g} df (the A/B verdict's).",
        *(f"Not run: {name}: {err}" for name, err in missing.items()),
        f"Wall time: {time.monotonic() - t0:.0f} s.",
    ])
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
