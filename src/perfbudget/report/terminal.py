"""Plain-text reports: the budget table of records, and the whole run with each regression explained."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ..results import Record, Results
from ..vocabulary import Outcome
from .common import (
    BASE_COLUMNS,
    FailingTest,
    base_cells,
    base_text,
    budget_text,
    budget_where,
    change_text,
    ci_text,
    cv_text,
    device_label,
    devices,
    failing_tests,
    finite,
    fmt_tolerance,
    fmt_value,
    has_base,
    move_line,
    ordered,
    outcome_text,
    record_ci_text,
    run_problems,
    sort_key,
    summary_line,
    terminal_text,
    text_table,
)

__all__ = ["LAUNCH_BOUND_IDLE", "GpuStep", "detail_lines", "gpu_steps", "numbers_text", "records_table",
           "terminal_report"]

#: A GPU step whose GPU idles at least this share of its wall time is launch-bound: the host
#: issues work slower than the GPU runs it, so its wall time follows the host.
LAUNCH_BOUND_IDLE = 0.5


@dataclass(frozen=True, kw_only=True)
class GpuStep:
    """How one workload's step used the GPU, from its records (``step_device_ms`` and ``step_ms``,
    and when recorded ``kernel_count`` and ``flops``)."""

    key: str
    device: str
    idle_share: float
    """``1 - step_device_ms / step_ms``: the share of the (unprofiled) wall step the GPU did no work."""
    kernels: float | None
    tflops_per_s: float | None
    """Counted FLOPs per step over the median wall step time: what the step achieves end to end."""

    @property
    def launch_bound(self) -> bool:
        return self.idle_share >= LAUNCH_BOUND_IDLE

    def line(self) -> str:
        """``encoder-train: 1744 kernels/step, GPU idle 62 %, 71 TFLOP/s: launch-bound``."""
        parts = [f"{self.kernels:.0f} kernels/step"] if self.kernels is not None else []
        parts.append(f"GPU idle {self.idle_share * 100:.0f} %")
        if self.tflops_per_s is not None:
            parts.append(f"{self.tflops_per_s:.0f} TFLOP/s")
        return f"{self.key}: {', '.join(parts)}: {'launch-bound' if self.launch_bound else 'GPU-bound'}"


def gpu_steps(records: Iterable[Record]) -> list[GpuStep]:
    """One :class:`GpuStep` per (device, key) whose step recorded its device and wall time, in that order."""
    by: dict[tuple[str, str], dict[str, float]] = {}
    for r in records:
        if r.device is not None and r.device.type == "cuda" and r.value is not None and math.isfinite(r.value):
            by.setdefault((device_label(r), r.key), {})[r.metric] = r.value
    out = []
    for (dev, key), got in sorted(by.items()):
        flops, step_ms, busy_ms = got.get("flops"), got.get("step_ms"), got.get("step_device_ms")
        if step_ms and busy_ms is not None:
            out.append(GpuStep(key=key, device=dev, idle_share=max(0.0, 1 - busy_ms / step_ms),
                               kernels=got.get("kernel_count"),
                               tflops_per_s=flops / step_ms / 1e9 if flops and step_ms else None))
    return out


def _row(r: Record, *, with_key: bool, vs_base: bool) -> list[str]:
    tol = fmt_tolerance(r.budget.tolerance) if r.budget else "-"
    cells = [r.metric, fmt_value(r.budget.value, r.unit) if r.budget else "-", tol, fmt_value(r.value, r.unit),
             ci_text(r.ci), str(r.n), cv_text(r)]
    if vs_base:
        cells += base_cells(r)
    cells.append(outcome_text(r))
    return [r.key, *cells] if with_key else cells


def records_table(records: Iterable[Record], *, with_key: bool = False, sort: bool = True) -> str:
    """The budget table: metric, budget, tolerance, measured, CI, samples, noise, verdict, and where
    any record was compared with the base commit, the base value and head/base with its CI and pairs.

    Args:
        records: the records to show.
        with_key: lead with the workload key column.
        sort: worst outcome first; else the given order.
    """
    recs = list(records)
    if sort:
        recs.sort(key=sort_key)
    vs_base = has_base(recs)
    header = ["metric", "budget", "tol", "measured", "CI", "n", "cv", *(BASE_COLUMNS if vs_base else ()), "verdict"]
    if with_key:
        header = ["key", *header]
    return text_table(header, (_row(r, with_key=with_key, vs_base=vs_base) for r in recs))


def numbers_text(r: Record) -> str:
    """``budget 38.2 ms ± 5%, limit 40.11 ms, measured 41 ms (+7.3%), CI 40.5-41.6, n 40, cv 2.0%``."""
    nums = [f"budget {budget_text(r)}"]
    if r.limit is not None:
        nums.append(f"limit {fmt_value(r.limit, r.unit)}")
    change = change_text(r)
    nums.append(f"measured {fmt_value(r.value, r.unit)}" + (f" ({change})" if change else ""))
    if r.ci:
        nums.append(f"CI {record_ci_text(r)}")
    if r.n:
        nums.append(f"n {r.n}")
    if finite(r.cv) is not None:
        nums.append(f"cv {cv_text(r)}")
    return ", ".join(nums)


def detail_lines(t: FailingTest) -> list[str]:
    """Plain-text lines explaining one failing test: numbers, base, reasons, moved operators, artifacts."""
    lines = [f"{t.key}  {t.nodeid}  ({t.device})"]
    for r in t.bad:
        lines.append(f"  {r.metric}: {r.outcome.upper()}: {numbers_text(r)}")
        if r.vs_base is not None:
            lines.append(f"      vs base: {base_text(r)}")
        if budget_where(r):
            lines.append(f"      budget from {budget_where(r)}")
        if r.reason:
            lines.append(f"      {r.reason}")
    if t.moves:
        lines.append(f"  operators that moved ({t.moves_note}):" if t.moves_note else "  operators that moved:")
        lines.extend(f"      {move_line(m)}" for m in t.moves)
    if t.attribution:
        lines.append("  attribution:")
        lines.extend(f"      {a}" for a in t.attribution)
    for label, path in t.artifacts.items():
        lines.append(f"  {label}: {path}")
    return lines


def terminal_report(results: Results | Iterable[Record]) -> str:
    """Plain-text report: the budget table per device, the counts, then each regression explained."""
    records = ordered(results.records if isinstance(results, Results) else results)
    problems = [f"perf budgets: {p}" for p in run_problems(results)] if isinstance(results, Results) else []
    if not records:
        return terminal_text("\n".join([*problems, "perf budgets: no records"]))
    out = [*problems]
    for dev in devices(records):
        out += [f"perf budgets on {dev}", records_table([r for r in records if device_label(r) == dev], with_key=True), ""]
    out.append(summary_line(records))
    out.extend(step.line() for step in gpu_steps(records))
    failing = failing_tests(records)
    if failing:
        out += ["", "regressions:"]
        for t in failing:
            out.extend(detail_lines(t))
    inconclusive = [r for r in records if r.outcome == Outcome.INCONCLUSIVE]
    if inconclusive:
        out += ["", "inconclusive (not a failure; --perf-strict makes it one):"]
        out.extend(f"  {r.key}.{r.metric}  {r.nodeid}: {r.reason}" for r in inconclusive)
    # Names and reasons come from a results file: no escape sequence of theirs reaches the terminal.
    return terminal_text("\n".join(out))
