"""Numerical health of training: per-layer gradient norms, non-finite gradients, GradScaler skips, loss drift."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

__all__ = [
    "GradReport",
    "LossDrift",
    "NonFiniteGrad",
    "ScalerReport",
    "check_grads",
    "compare_to_reference",
    "count_scaler_skips",
    "grad_norms",
    "loss_drift",
    "record_losses",
]

GroupBy = Literal["layer", "parameter"]


def _layer_of(param_name: str) -> str:
    """``"encoder.0.linear1.weight"`` -> ``"encoder.0.linear1"`` (``""`` for a top-level parameter)."""
    return param_name.rpartition(".")[0]


def _group(norms: Mapping[str, float], by: GroupBy) -> dict[str, float]:
    if by == "parameter":
        return dict(norms)
    if by != "layer":
        raise ValueError(f"by must be 'layer' or 'parameter', got {by!r}")
    sq: dict[str, float] = {}
    for name, n in norms.items():
        layer = _layer_of(name)
        sq[layer] = sq.get(layer, 0.0) + n * n
    return {k: math.sqrt(v) for k, v in sq.items()}


def grad_norms(model: torch.nn.Module, *, by: GroupBy = "layer") -> dict[str, float]:
    """``{name: L2 norm}`` of the gradients ``model``'s parameters hold now, in parameter order
    (``inf``/``nan`` where non-finite); ``by="layer"`` combines a module's (sqrt of summed squares)."""
    import torch

    norms = {
        name: float(torch.linalg.vector_norm(p.grad.detach(), dtype=torch.float32))
        for name, p in model.named_parameters()
        if p.grad is not None
    }
    return _group(norms, by)


@dataclass(frozen=True, kw_only=True)
class NonFiniteGrad:
    """A parameter whose gradient held NaN or Inf after a step's backward."""

    step: int
    """0-based index of the step."""
    parameter: str
    """Parameter name, e.g. ``"2.weight"``."""
    layer: str
    """Module path owning the parameter."""
    kind: Literal["nan", "inf", "nan+inf"]


@dataclass(frozen=True, kw_only=True)
class GradReport:
    """Gradient health over a run of training steps."""

    steps: int
    """Steps run (fewer than asked when stopped at the first non-finite gradient)."""
    norms: tuple[Mapping[str, float], ...]
    """Per step, gradient L2 norm by layer (or parameter)."""
    nonfinite: tuple[NonFiniteGrad, ...]
    """Every non-finite gradient, by step, in the order backward produced them."""

    @property
    def first(self) -> NonFiniteGrad | None:
        """The first non-finite gradient: the earliest step, the first parameter backward
        finished there (closest to the loss, i.e. where the bad values entered)."""
        return self.nonfinite[0] if self.nonfinite else None

    @property
    def nonfinite_grads(self) -> int:
        """Number of (step, parameter) pairs with a non-finite gradient."""
        return len(self.nonfinite)

    def lines(self) -> list[str]:
        """Readable summary for a failure message."""
        if not self.nonfinite:
            return [f"all gradients finite over {self.steps} step(s)"]
        f = self.nonfinite[0]
        return [
            f"non-finite gradient ({f.kind}) first at step {f.step} in {f.parameter} "
            f"(layer {f.layer or '<root>'}); {len(self.nonfinite)} non-finite in total"
        ]


def _read_step(seen: Sequence[tuple[str, Any, Any, Any]], *, step: int) -> tuple[dict[str, float], list[NonFiniteGrad]]:
    """One step's gradient norms by parameter (the last accumulation's) and non-finite gradients."""
    norms: dict[str, float] = {}
    flagged: dict[str, tuple[bool, bool]] = {}  # insertion order: backward's
    for name, norm, has_nan, has_inf in seen:
        norms[name] = float(norm)
        prev = flagged.get(name, (False, False))
        flagged[name] = (prev[0] or bool(has_nan), prev[1] or bool(has_inf))
    kinds: dict[tuple[bool, bool], Literal["nan", "inf", "nan+inf"]] = {
        (True, True): "nan+inf", (True, False): "nan", (False, True): "inf"}
    return norms, [NonFiniteGrad(step=step, parameter=name, layer=_layer_of(name), kind=kinds[flags])
                   for name, flags in flagged.items() if any(flags)]


def check_grads(
    step: Callable[[], Any],
    model: torch.nn.Module,
    *,
    steps: int = 1,
    by: GroupBy = "layer",
    stop_at_first: bool = True,
) -> GradReport:
    """Run ``step`` ``steps`` times and watch every gradient right after accumulation (a hook), so
    clipping or ``zero_grad`` later in the step do not hide it; one device sync per step.
    A ``GradScaler``'s gradients are seen *scaled*: see :func:`count_scaler_skips` for its overflow.

    Args:
        step: one training step (forward, backward, optimizer).
        model: the module whose parameters to watch.
        steps: steps to run.
        by: group norms by ``"layer"`` or ``"parameter"``.
        stop_at_first: stop after the first step with a non-finite gradient.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    import torch

    # (order, name, norm, has_nan, has_inf) as tensors, filled by the hooks during one step.
    seen: list[tuple[str, Any, Any, Any]] = []

    def make_hook(name: str) -> Callable[[Any], None]:
        def hook(p: Any) -> None:
            g = p.grad.detach()
            seen.append((name, torch.linalg.vector_norm(g, dtype=torch.float32), torch.isnan(g).any(),
                         torch.isinf(g).any()))

        return hook

    handles = [p.register_post_accumulate_grad_hook(make_hook(name))
               for name, p in model.named_parameters() if p.requires_grad]
    norms_per_step: list[Mapping[str, float]] = []
    bad: list[NonFiniteGrad] = []
    ran = 0
    try:
        for i in range(steps):
            seen.clear()
            step()
            ran += 1
            norms, step_bad = _read_step(seen, step=i)
            norms_per_step.append(_group(norms, by))
            bad.extend(step_bad)
            if step_bad and stop_at_first:
                break
    finally:
        for h in handles:
            h.remove()
    return GradReport(steps=ran, norms=tuple(norms_per_step), nonfinite=tuple(bad))


@dataclass(frozen=True, kw_only=True)
class ScalerReport:
    """Optimizer steps a ``GradScaler`` skipped because of Inf/NaN gradients."""

    steps: int
    skipped_steps: int
    skipped_at: tuple[int, ...]
    """0-based indices of the skipped steps."""
    scales: tuple[float, ...]
    """Loss scale after each step."""


def count_scaler_skips(step: Callable[[], Any], scaler: Any, *, steps: int = 1) -> ScalerReport:
    """Run ``step`` ``steps`` times (it must call ``scaler.step`` and ``scaler.update``; a disabled
    ``torch.amp.GradScaler`` never skips) and count skipped steps: ``update`` lowers the scale
    (by ``backoff_factor`` < 1) exactly when it skipped ``optimizer.step`` for Inf/NaN."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    enabled = bool(scaler.is_enabled())
    if enabled:
        backoff = float(scaler.get_backoff_factor())
        if not backoff < 1.0:
            raise ValueError(
                f"skips are read from scale decreases: backoff_factor must be < 1, got {backoff}"
            )
    skipped: list[int] = []
    scales: list[float] = []
    for i in range(steps):
        before = float(scaler.get_scale()) if enabled else 1.0
        step()
        after = float(scaler.get_scale()) if enabled else 1.0
        scales.append(after)
        if enabled and after < before:
            skipped.append(i)
    return ScalerReport(
        steps=steps, skipped_steps=len(skipped), skipped_at=tuple(skipped), scales=tuple(scales)
    )


def record_losses(step: Callable[[], Any], *, steps: int) -> tuple[float, ...]:
    """Run ``step`` ``steps`` times and collect the loss each call returns (tensor or number)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    out = []
    for _ in range(steps):
        loss = step()
        out.append(float(loss.detach() if hasattr(loss, "detach") else loss))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class LossDrift:
    """How far a run's losses drift from a reference run's, step by step."""

    steps: int
    max_abs: float
    """Largest ``|loss - reference|``."""
    max_rel: float
    """Largest ``|loss - reference| / |reference|`` (``inf`` for a non-finite loss)."""
    final_rel: float
    """Relative difference at the last step."""
    rtol: float
    first_step_over: int | None
    """0-based first step whose relative difference exceeds ``rtol``, else ``None``."""

    @property
    def ok(self) -> bool:
        """True when no step drifted beyond ``rtol``."""
        return self.first_step_over is None


def _rel(a: float, ref: float) -> float:
    if not (math.isfinite(a) and math.isfinite(ref)):
        return math.inf
    denom = abs(ref)
    if denom == 0:
        return 0.0 if a == 0 else math.inf
    return abs(a - ref) / denom


def loss_drift(
    losses: Sequence[float], reference: Sequence[float], *, rtol: float = 0.01
) -> LossDrift:
    """Compare a run's per-step ``losses`` with a ``reference`` run's on the same steps and data (e.g.
    mixed precision vs fp32), ``rtol`` the relative tolerance per step."""
    if len(losses) != len(reference):
        raise ValueError(
            f"losses and reference must have the same length, got {len(losses)} and {len(reference)}"
        )
    if not losses:
        raise ValueError("no losses to compare")
    if rtol < 0:
        raise ValueError(f"rtol must be >= 0, got {rtol!r}")
    rels = [_rel(float(a), float(r)) for a, r in zip(losses, reference, strict=True)]
    abss = [
        abs(float(a) - float(r))
        if math.isfinite(float(a)) and math.isfinite(float(r))
        else math.inf
        for a, r in zip(losses, reference, strict=True)
    ]
    over = next((i for i, r in enumerate(rels) if r > rtol), None)
    return LossDrift(
        steps=len(losses),
        max_abs=max(abss),
        max_rel=max(rels),
        final_rel=rels[-1],
        rtol=rtol,
        first_step_over=over,
    )


def compare_to_reference(
    step: Callable[[], Any],
    reference_step: Callable[[], Any],
    *,
    steps: int,
    rtol: float = 0.01,
) -> LossDrift:
    """Run ``reference_step`` (e.g. fp32) and ``step`` (e.g. autocast) ``steps`` times each and
    compare their losses (:func:`loss_drift`). Both return the loss and must start from the same
    weights and data (separate model copies, same seed)."""
    ref = record_losses(reference_step, steps=steps)
    got = record_losses(step, steps=steps)
    return loss_drift(got, ref, rtol=rtol)
