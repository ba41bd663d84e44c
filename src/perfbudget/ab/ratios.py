"""Head/base ratios of process pairs: a pair's ratio, the A/B policy and priors, outlying pairs, modes."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..budgets.noise import CheckNoise, NoiseTable
from ..measure import stats
from ..measure.stats import chi2_sf, t_quantile
from ..metrics import (
    UnknownMetricError,
    op_family_sizes,
    parse_name,
)
from ..verdict.ratio import PRIOR_DF, PRIOR_TEST, detectable_effect
from ..verdict.rule import Limits, classify, family_confidence, same, tolerance_for

__all__ = [
    "NOISE_DF_MAX",
    "PRIOR_SD",
    "ABPolicy",
    "Prior",
    "chi2_sf",
    "describe_change",
    "outlying_pair",
    "process_modes",
    "resolvable_lines",
    "t_quantile",
]

#: Prior per-pair sd of ln(head/base) by metric kind (docs/pr-checks.md). Timing: just above the
#: encoder and decoder steps' lockstep sd; rates are inverse times; energy adds the meter's noise.
PRIOR_SD: Mapping[str, float] = {"timing": 0.025, "rate": 0.025, "energy": 0.05}
#: A measured prior (``budgets/noise``) is worth at most this many degrees of freedom: a
#: machine's noise drifts between sessions, and a run's own pairs must still be able to move it.
NOISE_DF_MAX = 12.0
#: A measured per-pair sd is never taken below this (0.5 %).
NOISE_SD_FLOOR = 0.005


@dataclass(frozen=True)
class Prior:
    """The prior per-pair sd a check is judged with, its weight, and where it came from."""

    sd: float
    df: float
    source: str
    """``default for timing``, or ``measured: budgets/noise/<identity>.yaml, 14 df``."""


@dataclass(frozen=True, kw_only=True)
class ABPolicy:
    """How the A/B verdict is reached (docs/pr-checks.md, "How a head/base ratio is decided").

    Attributes:
        confidence: two-sided coverage of the CI of the ratio.
        prior_sd: prior per-pair sd of the log-ratio, by metric kind.
        prior_df: degrees of freedom the prior is worth.
        prior_test: the prior is set aside when the pairs' spread is less likely than this under it.
        tolerance_from_budgets: use a budget's ``ab_tolerance`` (never its stored-mode ``tolerance``).
        family_alpha: false-alarm budget shared by one test's per-operator checks (Bonferroni).
        noise: each machine identity's measured check noise (``budgets/noise``): its checks' own
            priors, worth up to ``noise_df_max`` df, and counts' tolerances.
    """

    confidence: float = 0.95
    prior_sd: Mapping[str, float] = field(default_factory=lambda: dict(PRIOR_SD))
    prior_df: float = PRIOR_DF
    prior_test: float = PRIOR_TEST
    tolerance_from_budgets: bool = True
    family_alpha: float = 0.05
    noise: Mapping[str, NoiseTable] = field(default_factory=dict)
    noise_df_max: float = NOISE_DF_MAX

    def __post_init__(self) -> None:
        if not 0.5 <= self.confidence < 1.0:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence!r}")
        if not 0.0 < self.family_alpha < 1.0:
            raise ValueError(f"family_alpha must be in (0, 1), got {self.family_alpha!r}")
        if not self.prior_df >= 0:
            raise ValueError(f"prior_df must be >= 0, got {self.prior_df!r}")
        if not 0.0 <= self.prior_test < 1.0:
            raise ValueError(f"prior_test must be in [0, 1), got {self.prior_test!r}")
        bad = {k: v for k, v in self.prior_sd.items() if not (isinstance(v, (int, float)) and v > 0)}
        if bad:
            raise ValueError(f"prior_sd: expected positive numbers, got {bad!r}")

    def sd_for(self, kind: str) -> float:
        """The prior sd for ``kind`` (the largest one for a kind without its own)."""
        return self.prior_sd.get(kind, max(self.prior_sd.values(), default=PRIOR_SD["energy"]))

    def measured(self, identity: str | None, key: str, metric: str) -> tuple[CheckNoise, NoiseTable] | None:
        """The check's measured noise on machines of ``identity``, with its table; ``None`` when not measured."""
        table = self.noise.get(identity) if identity else None
        noise = table.get(key, metric) if table is not None else None
        return None if noise is None or table is None else (noise, table)

    def prior_for(self, identity: str | None, key: str, metric: str, kind: str) -> Prior:
        """The prior a statistical check is judged with: measured for its machine identity, else the kind's."""
        found = self.measured(identity, key, metric)
        if found is None or found[0].spread != "pairs" or not math.isfinite(found[0].sd):
            return Prior(self.sd_for(kind), self.prior_df, f"default for {kind}")
        noise, table = found
        return Prior(max(noise.sd, NOISE_SD_FLOOR), min(noise.df, self.noise_df_max),
                     f"measured: {table.where}, {noise.df:g} df")


#: With this many pairs or more, one pair far from the others is set aside (:func:`outlying_pair`).
OUTLIER_MIN_PAIRS = 4
#: How far, in robust SDs (MAD x 1.4826) of the other pairs' ln ratios, a set-aside pair lies from their median.
OUTLIER_SDS = 4.0
#: Coverage of the other pairs' prediction interval a set-aside pair also lies outside, shared by the pairs.
OUTLIER_COVERAGE = 0.99


def outlying_pair(pair_ratios: Sequence[float], *, floor_sd: float) -> tuple[int, str] | None:
    """The pair to set aside as outlying (a minute another process took), and why; ``None`` for none.

    The furthest pair, beyond :data:`OUTLIER_SDS` robust SDs of the others (at least ``floor_sd``) and
    outside their :data:`OUTLIER_COVERAGE` prediction interval.
    """
    # The interval test: alone, the noisy MAD of 3-5 pairs set a pair aside in a third of simulated
    # A/A runs of a check with 10 % per-pair sd, narrowing its interval into false failures.
    n = len(pair_ratios)
    if n < OUTLIER_MIN_PAIRS or min(pair_ratios) <= 0:
        return None
    ys = [math.log(r) for r in pair_ratios]

    def robust_sds(i: int) -> tuple[float, float]:
        others = ys[:i] + ys[i + 1:]
        mid = stats.median(others)
        spread = max(1.4826 * stats.median([abs(y - mid) for y in others]), floor_sd)
        # Others that agree to the last digit and no prior spread: nothing to measure a distance in.
        return (abs(ys[i] - mid) / spread if spread > 0 else 0.0), mid

    far, i = max((robust_sds(i)[0], i) for i in range(n))
    others = ys[:i] + ys[i + 1:]
    mean = sum(others) / len(others)
    sd = max(math.sqrt(sum((y - mean) ** 2 for y in others) / (len(others) - 1)), floor_sd)
    reach = t_quantile(1 - (1 - OUTLIER_COVERAGE) / (2 * n), len(others) - 1) * sd * math.sqrt(1 + 1 / len(others))
    if far <= OUTLIER_SDS or abs(ys[i] - mean) <= reach:
        return None
    return i, (f"head/base {pair_ratios[i]:.3g} lies {far:.0f} robust SDs from the other pairs' median "
               f"{math.exp(robust_sds(i)[1]):.3g}, outside their {OUTLIER_COVERAGE:.0%} prediction interval")


#: Least gap between two modes of pair ratios (1.1): nearer clusters are a spread the interval carries.
MODES_MIN_GAP = math.log(1.1)
#: ... and in multiples of the larger cluster's robust spread (its ln ratios' median absolute deviation).
MODES_GAP_MADS = 4.0


def process_modes(pair_ratios: Sequence[float]) -> tuple[float, float] | None:
    """The medians ``(low, high)`` of two clusters of at least 2 pairs each, split at the widest gap
    of at least :data:`MODES_MIN_GAP` and :data:`MODES_GAP_MADS` MADs; ``None`` when none."""
    # Whole processes run some code at one of two speeds (the allocator's state): the CI only says inconclusive.

    if len(pair_ratios) < 4 or min(pair_ratios) <= 0:
        return None
    ys = sorted(math.log(r) for r in pair_ratios)

    def mad(xs: list[float]) -> float:
        mid = stats.median(xs)
        return stats.median([abs(x - mid) for x in xs])

    gap, i = max((ys[i] - ys[i - 1], i) for i in range(2, len(ys) - 1))
    low, high = ys[:i], ys[i:]
    if gap < max(MODES_MIN_GAP, MODES_GAP_MADS * max(mad(low), mad(high))):
        return None
    return math.exp(stats.median(low)), math.exp(stats.median(high))


def resolvable_lines(table: NoiseTable, policy: ABPolicy, *, pairs: int) -> list[str]:
    """Per measured check, the change ``pairs`` pairs can resolve at its measured spread, least first."""

    families = op_family_sizes((key, metric) for (key, metric), n in table.checks.items() if n.spread == "pairs")
    rows: list[tuple[float, str]] = []
    for (key, metric), noise in table.checks.items():
        if noise.spread != "pairs":
            continue
        try:
            info = parse_name(metric).metric
        except UnknownMetricError:
            continue
        prior = policy.prior_for(table.identity, key, metric, info.kind)
        conf = family_confidence(metric, policy.confidence, policy.family_alpha, families.get(key, 0))
        half = t_quantile(0.5 + conf / 2.0, prior.df + pairs - 1) * prior.sd / math.sqrt(pairs)
        tol = tolerance_for(info, against="base").value
        mde = detectable_effect(half, tolerance=tol, direction=info.direction)
        sign = "+" if info.direction == "lower" else "-"
        unchanged = classify(math.exp(-half), math.exp(half), Limits.around(1.0, tol, info.direction))
        passes = unchanged in ("pass", "stale")
        rows.append((mde, f"  {key}.{metric}: sd {prior.sd:.1%} per pair; resolves {sign}{mde:.1%} "
                          f"(tolerance {sign}{tol:.0%})" + ("" if passes else "; cannot pass even unchanged")))
    rows.sort(key=lambda r: -r[0])
    head = (f"measured noise for this machine ({table.where}): with up to {pairs} pairs each check resolves "
            "a change beyond (if its spread is as measured):")
    return [head, *(line for _, line in rows)]


def describe_change(head: float, base: float, *, unit: str = "") -> str:
    """``same as the base (12)`` or ``base 12 -> head 14 (+16.7 %)`` for an exact or bytes metric."""
    u = f" {unit}" if unit and unit != "1" else ""
    if same(head, base):
        return f"same as the base ({head:g}{u})"
    if base != 0:
        return f"base {base:g}{u} -> head {head:g}{u} ({(head / base - 1) * 100:+.1f} %)"
    return f"base {base:g}{u} -> head {head:g}{u}"
