"""Serving streamed requests: time to first token, per-token and end-to-end latency, tokens/s."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from ..lease import LEASE_SERVE_ROUNDS
from ..measure.measurement import Passes
from ..measure.timing import time_streams
from ..verdict.judge import Verdict
from .core import RecorderCore

__all__ = ["SERVE_METRICS", "SERVE_ROUNDS", "ServeRound", "Serving"]

#: Rounds of requests per serving sample set: one round of 64 left a pair's median ratio uncertain
#: by 3-5 % (benchmarks/user-repo-cpu.md).
SERVE_ROUNDS = 4
SERVE_METRICS = ("ttft_ms", "token_ms", "e2e_ms_p50", "e2e_ms_p90", "tokens_per_s")


@dataclass(frozen=True, kw_only=True)
class ServeRound:
    """Latencies of one sample set of streamed requests, each paired with its reference time."""

    samples: dict[str, tuple[list[float], list[float]]]
    """metric -> (samples, paired machine-speed reference times)."""


class Serving(RecorderCore):
    """``perf.serve``."""

    METRICS: ClassVar[tuple[str, ...]] = SERVE_METRICS

    def serve(
        self,
        requests: Callable[[], Iterable[Callable[[], Iterable[Any]]]],
        *,
        reference: Callable[[], Any] | bool | None = None,
        rounds: int | None = None,
    ) -> dict[str, Verdict]:
        """Record ``ttft_ms``, ``token_ms``, ``e2e_ms_p50``, ``e2e_ms_p90`` and ``tokens_per_s``.

        Args:
            requests: returns one round of >= 64 requests, each a callable yielding its tokens.
            reference: as in :meth:`time`; timed after every request and paired with it.
            rounds: rounds of requests per sample set (default :data:`SERVE_ROUNDS`; fewer under the lease).

        Returns:
            metric -> verdict.
        """
        if rounds is None:
            rounds = LEASE_SERVE_ROUNDS if self.lease else SERVE_ROUNDS
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds!r}")
        ref = self._reference(reference)
        passes = Passes(lambda: self._serve_rounds(requests, ref, rounds))

        def of(metric: str, part: int) -> Callable[[ServeRound], list[float]]:
            return lambda r: r.samples[metric][part]

        return {m: self._record(m, passes.measurement(of(m, 0), reference=of(m, 1) if ref is not None else None))
                for m in SERVE_METRICS}

    def _serve_rounds(self, requests: Callable[[], Iterable[Callable[[], Iterable[Any]]]],
                     ref: Callable[[], Any] | None, rounds: int) -> ServeRound:
        out: dict[str, tuple[list[float], list[float]]] = {m: ([], []) for m in SERVE_METRICS}
        timed = (t for _ in range(rounds)
                 for t in time_streams(requests(), device=self._dev, threads=self._timing_threads(), reference=ref))
        for t in timed:
            values = {"ttft_ms": [t.first_ms], "token_ms": list(t.item_ms), "e2e_ms_p50": [t.total_ms],
                      "e2e_ms_p90": [t.total_ms], "tokens_per_s": [t.items_per_s]}
            for metric, xs in values.items():
                out[metric][0].extend(xs)
                out[metric][1].extend([t.reference_ms or 1.0] * len(xs))
        return ServeRound(samples=out)
