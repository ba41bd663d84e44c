"""Wall-time sampling of a zero-argument callable: a host timer for CPU work, CUDA events for GPU work."""

from __future__ import annotations

import gc
import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Literal

from perfbudget.device import DeviceType
from perfbudget.measure import stats, turns
from perfbudget.measure.sync import device_sync

__all__ = ["Bursts", "Samples", "StreamTiming", "bench", "bench_paired", "calls_per_sample", "pinned_threads", "time_stream",
           "time_streams"]

Device = DeviceType
_DEVICES: tuple[str, ...] = ("cpu", "cuda")

# triton.testing.do_bench zeroes a 256 MB buffer before every repetition: larger than the L2 of
# any current NVIDIA part (H100: 50 MB), so each timed call starts from a cold L2.
_L2_FLUSH_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class Samples:
    """Raw per-call times of one benchmark run."""

    samples_ms: tuple[float, ...]
    """Per-call wall time in milliseconds, in the order measured (warm-up calls excluded)."""
    warmup_calls: int
    """Calls made before the first timed call and discarded."""
    threads: int | None
    """torch intra-op threads during the run (``None``: left as the process had it)."""
    device: Device = "cpu"
    """``"cpu"``: host ``perf_counter``; ``"cuda"``: CUDA events."""
    timer: Literal["perf_counter", "cuda_event", "cuda_graph"] = "perf_counter"
    """How each sample was taken."""
    l2_flushed: bool = False
    """Whether L2 was flushed before every timed call (cold-cache numbers)."""
    calls_per_sample: int = 1
    """Calls averaged into one sample (> 1 for CUDA-graph replay and a CPU bench batched to ``min_sample_ms``)."""

    def __post_init__(self) -> None:
        if not self.samples_ms:
            raise ValueError("Samples needs at least one sample, got none")
        if self.device not in _DEVICES:
            raise ValueError(f"device must be one of {_DEVICES}, got {self.device!r}")

    @property
    def n(self) -> int:
        """Number of timed samples."""
        return len(self.samples_ms)

    @property
    def median_ms(self) -> float:
        """Median per-call time in milliseconds."""
        return stats.median(self.samples_ms)

    def summary(self, confidence: float = 0.95) -> stats.Summary:
        """Median, distribution-free CI of the median, IQR, CV, min and max (all in ms)."""
        return stats.summarize(self.samples_ms, confidence)


@contextmanager
def pinned_threads(threads: int | None) -> Iterator[None]:
    """Set ``torch.set_num_threads(threads)`` for the block (``None``: leave it) and restore it after."""
    if threads is None:
        yield
        return
    if threads < 1:
        raise ValueError(f"threads must be >= 1 or None, got {threads!r}")
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Bursts:
    """Cuts a measurement into bursts that alternate with the other side of a lockstep A/B run.

    :meth:`tick`, between timed calls, hands over after :func:`~perfbudget.measure.turns.burst_ms`;
    back, ``rewarm`` (if any) runs once untimed (the caches went cold). A no-op outside A/B.
    """

    def __init__(self, rewarm: Callable[[], Any] | None = None) -> None:
        self.active = turns.active()
        self.limit_s = turns.burst_ms() / 1e3
        self.rewarm = rewarm
        self.started = time.perf_counter()
        self.waited_s = 0.0
        """Seconds spent handing over (the other side's bursts and the re-warm calls)."""
        self.handovers = 0

    def tick(self) -> bool:
        """Hand over if this burst is long enough; returns whether it did."""
        if not self.active or time.perf_counter() - self.started < self.limit_s:
            return False
        self.handover()
        return True

    def handover(self) -> None:
        """Hand the machine to the other side now (no-op outside an A/B run)."""
        if not self.active:
            return
        t0 = time.perf_counter()
        turns.pass_turn()
        if self.rewarm is not None:
            self.rewarm()
        self.started = time.perf_counter()
        self.waited_s += self.started - t0
        self.handovers += 1

    def elapsed_ms(self, since: float) -> float:
        """Milliseconds of this process's own running since ``since`` (hand-overs excluded)."""
        return (time.perf_counter() - since - self.waited_s) * 1e3


#: Least timed calls of :func:`bench` when not asked otherwise.
MIN_SAMPLES = 30


def bench(
    fn: Callable[[], Any],
    *,
    warmup_ms: float = 200,
    min_samples: int = MIN_SAMPLES,
    max_ms: float = 2000,
    threads: int | None = 1,
    device: Device = "cpu",
    min_warmup_calls: int = 2,
    max_samples: int = 100_000,
    flush_l2: bool = False,
    cuda_graph: bool = False,
    min_sample_ms: float = 0.0,
    setup: Callable[[], Any] | None = None,
) -> Samples:
    """Time ``fn()`` repeatedly and return every per-call time.

    Warm-up and measurement are time budgets with floors on the call counts, as in
    ``triton.testing.do_bench``. CPU calls are timed by ``time.perf_counter`` (GPU work is *not*
    waited for); CUDA calls by events, their counts from a 5-call estimate.

    Args:
        fn: zero-argument callable; set-up belongs outside it (in its closure).
        warmup_ms: warm-up time budget in milliseconds.
        min_samples: least number of timed calls, whatever the budget.
        max_ms: measurement time budget in milliseconds; exceeded only to reach ``min_samples``.
        threads: torch intra-op threads during the run (``None``: unchanged; 1 is stable on small CPUs).
        device: ``"cpu"`` or ``"cuda"``.
        min_warmup_calls: least number of discarded warm-up calls.
        max_samples: cap on timed calls (sub-microsecond functions would fill memory).
        flush_l2: CUDA only, zero a 256 MB buffer before every timed call (cold-cache numbers).
        cuda_graph: CUDA only, time replays of a CUDA graph of several calls (no launch overhead).
        min_sample_ms: CPU only: each sample is the per-call time of a batch lasting at least this
            long (:func:`calls_per_sample`); a microsecond call alone times mostly the clock.
        setup: CPU only: called untimed before every call (fresh inputs); excludes batching.

    Returns:
        ``Samples`` with the raw per-call times in milliseconds.
    """
    _check_budgets(device, warmup_ms=warmup_ms, min_samples=min_samples, max_ms=max_ms, max_samples=max_samples)
    if min_warmup_calls < 0:
        raise ValueError(f"min_warmup_calls must be >= 0, got {min_warmup_calls!r}")
    if device == "cpu" and (flush_l2 or cuda_graph):
        raise ValueError("flush_l2 and cuda_graph need device='cuda'")
    if flush_l2 and cuda_graph:
        raise ValueError("flush_l2 cannot be combined with cuda_graph (the flush would be replayed)")
    if device != "cpu" and (min_sample_ms or setup is not None):
        raise ValueError("min_sample_ms and setup need device='cpu'")
    if setup is not None and min_sample_ms:
        raise ValueError("setup runs before every call, so calls cannot be batched: pass min_sample_ms=0")

    common = dict(warmup_ms=warmup_ms, min_samples=min_samples, max_ms=max_ms, threads=threads,
                  min_warmup_calls=min_warmup_calls, max_samples=max_samples)
    with pinned_threads(threads):
        if device == "cpu":
            return _bench_cpu(fn, min_sample_ms=min_sample_ms, setup=setup, **common)  # type: ignore[arg-type]
        return _bench_cuda(fn, flush_l2=flush_l2, cuda_graph=cuda_graph, **common)  # type: ignore[arg-type]


def _check_budgets(device: str, *, warmup_ms: float, min_samples: int, max_ms: float, max_samples: int) -> None:
    """The argument checks shared by :func:`bench` and :func:`bench_paired`."""
    if device not in _DEVICES:
        raise ValueError(f"device must be one of {_DEVICES}, got {device!r}")
    if min_samples < 1:
        raise ValueError(f"min_samples must be >= 1, got {min_samples!r}")
    if max_samples < min_samples:
        raise ValueError(f"max_samples ({max_samples}) must be >= min_samples ({min_samples})")
    if warmup_ms < 0 or max_ms < 0:
        raise ValueError(f"warmup_ms and max_ms must be >= 0, got {warmup_ms!r}, {max_ms!r}")


def _bench_cpu(
    fn: Callable[[], Any],
    *,
    warmup_ms: float,
    min_samples: int,
    max_ms: float,
    threads: int | None,
    min_warmup_calls: int,
    max_samples: int,
    min_sample_ms: float,
    setup: Callable[[], Any] | None,
) -> Samples:
    clock = time.perf_counter
    untimed = fn if setup is None else lambda: (setup(), fn())
    warmup_calls = 0
    start = clock()
    while warmup_calls < min_warmup_calls or (clock() - start) * 1e3 < warmup_ms:
        untimed()
        warmup_calls += 1
    calls = calls_per_sample(fn, min_sample_ms, clock=clock) if min_sample_ms > 0 else 1
    timed = fn if calls == 1 else _repeat(fn, calls)
    # A collection triggered by warm-up garbage would otherwise land in some timed call.
    gc.collect()
    samples: list[float] = []
    bursts = Bursts(rewarm=untimed)
    start = clock()
    while len(samples) < max_samples:
        if setup is not None:
            setup()
        t0 = clock()
        timed()
        t1 = clock()
        samples.append((t1 - t0) * 1e3 / calls)
        if len(samples) >= min_samples and bursts.elapsed_ms(start) >= max_ms:
            break
        bursts.tick()
    return Samples(
        samples_ms=tuple(samples),
        warmup_calls=warmup_calls,
        threads=threads,
        device="cpu",
        timer="perf_counter",
        calls_per_sample=calls,
    )


def _repeat(fn: Callable[[], Any], calls: int) -> Callable[[], None]:
    """One batch: ``calls`` calls of ``fn``."""
    def batch() -> None:
        for _ in range(calls):
            fn()

    return batch


def calls_per_sample(fn: Callable[[], Any], min_sample_ms: float, *, clock: Callable[[], float] = time.perf_counter,
                     max_calls: int = 10_000_000) -> int:
    """Calls of ``fn`` that together last at least ``min_sample_ms`` (or ``max_calls``).

    As pytest-benchmark calibrates rounds: a short batch grows by its shortfall, at least doubled.
    """
    calls = 1
    while True:
        t0 = clock()
        for _ in range(calls):
            fn()
        took_ms = (clock() - t0) * 1e3
        if took_ms >= min_sample_ms or calls >= max_calls:
            return calls
        grown = math.ceil(calls * min_sample_ms / took_ms) if took_ms > 0 else calls * 10
        calls = min(max_calls, max(2 * calls, grown))


def _counts_from_estimate(
    estimate_ms: float,
    *,
    warmup_ms: float,
    min_samples: int,
    max_ms: float,
    min_warmup_calls: int,
    max_samples: int,
) -> tuple[int, int]:
    """Warm-up and repetition counts from a per-call estimate (device timers cannot stop on time)."""
    per_call = max(estimate_ms, 1e-6)
    n_warmup = max(min_warmup_calls, 1, math.floor(warmup_ms / per_call))
    n_repeat = min(max_samples, max(min_samples, math.floor(max_ms / per_call)))
    return n_warmup, n_repeat


def _calls_per_burst(per_call_ms: float, bursts: Bursts) -> int:
    """Timed calls between hand-overs, from a per-call estimate (events cannot stop on time)."""
    if not bursts.active:
        return 1 << 62
    return max(1, math.floor(bursts.limit_s * 1e3 / max(per_call_ms, 1e-6)))


def _bench_cuda(
    fn: Callable[[], Any],
    *,
    warmup_ms: float,
    min_samples: int,
    max_ms: float,
    threads: int | None,
    min_warmup_calls: int,
    max_samples: int,
    flush_l2: bool,
    cuda_graph: bool,
) -> Samples:
    import torch

    if not torch.cuda.is_available():
        asked = "cuda_graph=True" if cuda_graph else "device='cuda'"
        raise RuntimeError(f"bench({asked}) needs CUDA; torch.cuda.is_available() is False")
    cache = torch.empty(_L2_FLUSH_BYTES, dtype=torch.int8, device="cuda") if flush_l2 else None
    stream = torch.cuda.current_stream()
    if cuda_graph:
        # Capture must happen on a side stream, after the callable ran there at least once; the
        # side stream must see the inputs the current stream is still writing (torch's own
        # CUDA-graph recipe waits the same way before warming on a side stream).
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            if cache is not None:
                cache.zero_()
            fn()
        end.record()
        torch.cuda.synchronize()
        per_call_ms = start.elapsed_time(end) / 5
        call, calls = _captured(fn, per_call_ms) if cuda_graph else (fn, 1)
        n_warmup, n_repeat = _counts_from_estimate(
            per_call_ms * calls, warmup_ms=warmup_ms, min_samples=min_samples, max_ms=max_ms,
            min_warmup_calls=min_warmup_calls, max_samples=max_samples)
        for _ in range(n_warmup):
            call()
        # As on CPU: a collection triggered by warm-up garbage would land in some timed call (a
        # host-bound step's events span the host's work too).
        gc.collect()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
        bursts = Bursts(rewarm=call)
        per_burst = _calls_per_burst(per_call_ms * calls, bursts)
        for i in range(n_repeat):
            if cache is not None:
                cache.zero_()
            starts[i].record()
            call()
            ends[i].record()
            if (i + 1) % per_burst == 0 and i + 1 < n_repeat:
                # The other side must find the GPU idle: drain this burst before handing over.
                torch.cuda.synchronize()
                bursts.handover()
        # One synchronize per burst: per-call syncs would time host overhead too.
        torch.cuda.synchronize()
    return Samples(
        samples_ms=tuple(float(s.elapsed_time(e)) / calls for s, e in zip(starts, ends, strict=True)),
        warmup_calls=6 + n_warmup * calls,
        threads=threads,
        device="cuda",
        timer="cuda_graph" if cuda_graph else "cuda_event",
        l2_flushed=flush_l2,
        calls_per_sample=calls,
    )


def _captured(fn: Callable[[], Any], per_call_ms: float) -> tuple[Callable[[], Any], int]:
    """The replay of a CUDA graph of ``fn`` calls lasting ~1 ms (launch cost amortized), and their count."""
    import torch

    calls = max(1, min(1000, math.ceil(1.0 / max(per_call_ms, 1e-6))))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return graph.replay, calls


def bench_paired(
    fn: Callable[[], Any],
    ref: Callable[[], Any],
    *,
    warmup_ms: float = 200,
    min_samples: int = 30,
    max_ms: float = 2000,
    threads: int | None = 1,
    device: Device = "cpu",
    max_samples: int = 100_000,
    min_warmup_calls: int = 2,
) -> tuple[Samples, Samples]:
    """Time ``fn`` and a fixed reference ``ref`` alternately: ``fn, ref, fn, ref, ...``.

    ``fn_i / ref_i`` cancels the machine's drifting speed (``PerfRecorder.time(reference=...)``).
    CUDA calls are synchronised after each (host clock): for step-sized work, not small kernels.

    Args:
        fn: the code under test.
        ref: a fixed workload of similar character, e.g. :func:`~perfbudget.measure.reference.reference_step`.
        warmup_ms, min_samples, max_ms, threads, device, max_samples, min_warmup_calls: as
            in :func:`bench`; the time budgets cover both callables.

    Returns:
        ``(fn samples, ref samples)``, pairwise aligned.
    """
    _check_budgets(device, warmup_ms=warmup_ms, min_samples=min_samples, max_ms=max_ms, max_samples=max_samples)
    sync = device_sync(device)
    clock = time.perf_counter
    with pinned_threads(threads):
        start = clock()
        calls = 0
        while calls < min_warmup_calls or (clock() - start) * 1e3 < warmup_ms:
            fn()
            ref()
            calls += 1
        sync()
        gc.collect()
        a: list[float] = []
        b: list[float] = []

        def rewarm() -> None:
            fn()
            ref()
            sync()

        bursts = Bursts(rewarm=rewarm)
        start = clock()
        while len(a) < max_samples:
            t0 = clock()
            fn()
            sync()
            t1 = clock()
            ref()
            sync()
            t2 = clock()
            a.append((t1 - t0) * 1e3)
            b.append((t2 - t1) * 1e3)
            if len(a) >= min_samples and bursts.elapsed_ms(start) >= max_ms:
                break
            bursts.tick()
    timer: Literal["perf_counter"] = "perf_counter"
    return (
        Samples(samples_ms=tuple(a), warmup_calls=calls, threads=threads, device=device, timer=timer),
        Samples(samples_ms=tuple(b), warmup_calls=calls, threads=threads, device=device, timer=timer),
    )


@dataclass(frozen=True, kw_only=True)
class StreamTiming:
    """Timing of one streamed request (a generation yielding its tokens), in milliseconds."""

    first_ms: float
    """Request start to the first item (time to first token)."""
    item_ms: tuple[float, ...]
    """Time between consecutive items after the first (per-token latency)."""
    total_ms: float
    """Request start to the last item (end-to-end latency)."""
    items: int
    """Items produced."""
    reference_ms: float | None = None
    """The machine-speed reference timed right after this request, when one was given."""

    @property
    def items_per_s(self) -> float:
        """Items per second over the whole request."""
        return self.items * 1e3 / self.total_ms if self.total_ms > 0 else 0.0


def time_stream(start: Callable[[], Iterable[Any]], *, device: Device = "cpu") -> StreamTiming:
    """Time one streamed request: ``start()`` begins it and returns its items (e.g. tokens).

    The clock starts before ``start()`` (its set-up counts) and is read at every item after
    synchronising ``device``; ``ValueError`` when the request yields nothing.
    """
    sync = device_sync(device)
    clock = time.perf_counter
    sync()
    t0 = clock()
    marks: list[float] = []
    for _ in start():
        sync()
        marks.append(clock())
    if not marks:
        raise ValueError("time_stream: the request yielded no item")
    gaps = tuple((b - a) * 1e3 for a, b in itertools.pairwise(marks))
    return StreamTiming(first_ms=(marks[0] - t0) * 1e3, item_ms=gaps, total_ms=(marks[-1] - t0) * 1e3,
                        items=len(marks))


def time_streams(
    starts: Iterable[Callable[[], Iterable[Any]]],
    *,
    device: Device = "cpu",
    threads: int | None = 1,
    reference: Callable[[], Any] | None = None,
) -> list[StreamTiming]:
    """One :class:`StreamTiming` per request of ``starts``, timed in turn (:func:`time_stream`) with
    ``threads`` torch threads, each followed by the machine-speed ``reference`` (its moment's speed)."""
    sync = device_sync(device)
    out: list[StreamTiming] = []
    bursts = Bursts()
    with pinned_threads(threads):
        for start in starts:
            got = time_stream(start, device=device)
            if reference is not None:
                t0 = time.perf_counter()
                reference()
                sync()
                got = replace(got, reference_ms=(time.perf_counter() - t0) * 1e3)
            out.append(got)
            bursts.tick()
    return out
