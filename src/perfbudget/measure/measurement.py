"""One measurement to judge: its first samples, how to take a fresh batch, and how to explain a failure."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from perfbudget.measure.unmeasurable import Unmeasurable

__all__ = ["Batch", "Explanation", "Measurement", "Passes"]

#: A fresh batch of samples: the samples alone, or ``(samples, reference)`` when the first
#: batch came paired with machine-speed reference times.
Batch = list[float] | tuple[list[float], list[float]]

P = TypeVar("P")


@dataclass(frozen=True, kw_only=True)
class Explanation:
    """What explains a failing measurement: lines for people and typed data for the reports."""

    lines: tuple[str, ...] = ()
    """Readable attribution lines (e.g. the graph-break reasons)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """JSON-serialisable data kept with the record (one key per type of :mod:`perfbudget.extras`)."""


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """The samples of one metric, and what the judge may ask of them later: :meth:`more` for extra
    rounds, :meth:`explain` only on failure, so a passing run pays nothing for its explanation."""

    samples: float | Sequence[float]
    """One value (exact kinds) or the first raw samples (statistical kinds)."""
    reference: Sequence[float] | None = None
    """Machine-speed reference times paired with ``samples`` (``None``: not normalised)."""
    fresh: Callable[[], Batch] | None = None
    """Takes a fresh batch (see :meth:`more`); ``None`` when the samples cannot be taken again."""
    explainer: Callable[[], Explanation] | None = None
    """Computes the explanation of a failure (see :meth:`explain`)."""
    attribution: tuple[str, ...] = ()
    """Lines kept with the verdict whatever its outcome."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """JSON-serialisable data kept with the record whatever its outcome."""

    @property
    def repeatable(self) -> bool:
        """Whether :meth:`more` can take a fresh batch."""
        return self.fresh is not None

    def more(self) -> Batch:
        """A fresh batch: samples, or ``(samples, reference)`` when ``reference`` is set; ``RuntimeError``
        when the measurement cannot be taken again, or no longer can."""
        if self.fresh is None:
            raise RuntimeError("this measurement cannot be taken again")
        return self.fresh()

    def explain(self) -> Explanation:
        """What explains a failure; an explainer that raises is reported, never raised, so the
        explanation cannot hide the verdict it explains."""
        if self.explainer is None:
            return Explanation()
        try:
            return self.explainer()
        except Exception as exc:
            return Explanation(lines=(f"attribution failed: {type(exc).__name__}: {exc}",))


class Passes(Generic[P]):
    """Passes of one measuring routine that several metrics read their samples from.

    The first pass is taken on construction; the n-th extra batch of every metric reads the n-th
    fresh pass, run once, when the first metric asks for it.

    Args:
        take: runs the routine once; may return :class:`~perfbudget.measure.unmeasurable.Unmeasurable`.
        what: what is measured, for the error when a later pass turns unmeasurable.
    """

    def __init__(self, take: Callable[[], P | Unmeasurable], *, what: str = "the measurement") -> None:
        self._take = take
        self._what = what
        self._fresh: list[P] = []
        self._first: P | Unmeasurable = take()

    @property
    def unmeasurable(self) -> Unmeasurable | None:
        """Why the first pass measured nothing; ``None`` when it did."""
        return self._first if isinstance(self._first, Unmeasurable) else None

    @property
    def first(self) -> P:
        """The first pass; ``ValueError`` when it is unmeasurable (check :attr:`unmeasurable` first)."""
        if isinstance(self._first, Unmeasurable):
            raise ValueError(f"{self._what} is unmeasurable: {self._first.reason}")
        return self._first

    def _pass(self, n: int) -> P:
        while len(self._fresh) <= n:
            got = self._take()
            if isinstance(got, Unmeasurable):
                raise RuntimeError(f"{self._what} went away: {got.reason}")
            self._fresh.append(got)
        return self._fresh[n]

    def measurement(
        self,
        samples: Callable[[P], Sequence[float]],
        *,
        reference: Callable[[P], Sequence[float] | None] | None = None,
        explain: Callable[[], Explanation] | None = None,
        attribution: Sequence[str] = (),
        extra: Mapping[str, Any] | None = None,
    ) -> Measurement:
        """One statistical metric read from every pass.

        Args:
            samples: the metric's raw samples in one pass.
            reference: the reference times paired with them in one pass (``None``, or a
                function returning ``None``: not paired).
            explain, attribution, extra: as in :class:`Measurement`.

        Raises:
            ValueError: the first pass is unmeasurable (check :attr:`unmeasurable` first).
        """
        first = self.first
        refs = reference(first) if reference is not None else None
        asked = 0

        def fresh() -> Batch:
            nonlocal asked
            got = self._pass(asked)
            asked += 1
            xs = list(samples(got))
            return (xs, list(reference(got) or [])) if reference is not None and refs is not None else xs

        return Measurement(samples=list(samples(first)), reference=None if refs is None else list(refs),
                           fresh=fresh, explainer=explain, attribution=tuple(attribution), extra=dict(extra or {}))
