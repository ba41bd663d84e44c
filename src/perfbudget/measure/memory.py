"""Peak memory of a step: CPU from the profiler's allocator events, GPU from the caching allocator's peaks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from perfbudget.device import DeviceType
from perfbudget.measure.sync import device_sync
from perfbudget.measure.timing import pinned_threads
from perfbudget.verdict.rule import changed_by

if TYPE_CHECKING:
    import torch

__all__ = [
    "ALLOCATION",
    "MIB",
    "PHASES",
    "Allocation",
    "PhasePeaks",
    "allocation",
    "memory_events",
    "peak_by_phase",
    "peak_cpu_mib",
    "peak_live_bytes",
    "training_step",
]

MIB = 1024 * 1024
PHASES: tuple[str, ...] = ("forward", "backward", "optimizer")

_STEP_MARK = "perfbudget::step"
_PHASE_MARK = "perfbudget::phase::"


def peak_live_bytes(deltas: Iterable[tuple[int, int]]) -> int:
    """Peak of the running sum of allocation deltas from zero: bytes live above the starting level, at least 0.

    Args:
        deltas: ``(time_ns, nbytes)`` pairs (negative for a free), sorted by time here (ties in given order).
    """
    level = peak = 0
    for _, nbytes in sorted(deltas, key=lambda d: d[0]):
        level += nbytes
        peak = max(peak, level)
    return peak


def _allocation_records(prof: Any, device: DeviceType) -> list[tuple[int, int, int | None]]:
    """``(start_ns, nbytes, address)`` of every allocator event (no address without the experimental event tree)."""
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if results is None:
        raise RuntimeError(
            "profiler has no kineto results: run it with profile_memory=True and read it "
            "after the profile context has exited"
        )
    try:
        from torch._C._profiler import _EventType

        out: list[tuple[int, int, int | None]] = []
        stack = list(results.experimental_event_tree())
        while stack:
            node = stack.pop()
            stack.extend(node.children)
            if node.tag != _EventType.Allocation:
                continue
            f = node.extra_fields
            if f.device.type != device:
                continue
            out.append((int(node.start_time_ns), int(f.alloc_size), int(f.ptr)))
    except (ImportError, AttributeError, RuntimeError):
        from torch.autograd import DeviceType as ProfilerDevice

        want = ProfilerDevice.CPU if device == "cpu" else ProfilerDevice.CUDA
        out = [
            (int(e.start_ns()), int(e.nbytes()), None)
            for e in results.events()
            if e.name() == "[memory]" and e.device_type() == want
        ]
    out.sort(key=lambda r: r[0])
    return out


def _own_allocations(
    records: Sequence[tuple[int, int, int | None]], start: int, end: int
) -> list[tuple[int, int]]:
    """Allocations inside ``[start, end]`` and the frees of exactly those blocks."""
    # The CPU allocator remembers sizes by address across sessions: an older block's free at a reused
    # address would carry a stale size, and the peak would wander by whole tensors.
    live: dict[int, int] = {}
    out = []
    for t, nbytes, ptr in records:
        if not start <= t <= end:
            continue
        if ptr is None:
            out.append((t, nbytes))
        elif nbytes > 0:
            live[ptr] = nbytes
            out.append((t, nbytes))
        elif live.get(ptr) == -nbytes:
            del live[ptr]
            out.append((t, nbytes))
    return out


def memory_events(prof: Any, *, device: DeviceType = "cpu") -> list[tuple[int, int]]:
    """``(start_ns, nbytes)`` in time order: allocations (positive) and frees (negative) of blocks allocated
    while profiling, of a finished ``torch.profiler.profile(profile_memory=True)`` run.

    Args:
        prof: the profiler object, after its context exited.
        device: keep events of this device type only.
    """
    records = _allocation_records(prof, device)
    if not records:
        return []
    return _own_allocations(records, records[0][0], records[-1][0])


def _annotation_windows(prof: Any, prefix: str) -> list[tuple[str, int, int]]:
    """``(name, start_ns, end_ns)`` of ``record_function`` ranges whose name starts with ``prefix``."""
    results = prof.profiler.kineto_results
    wins = [
        (e.name(), int(e.start_ns()), int(e.end_ns()))
        for e in results.events()
        if e.name().startswith(prefix)
    ]
    wins.sort(key=lambda w: w[1])
    return wins


def _window_peaks(
    deltas: Sequence[tuple[int, int]], windows: Sequence[tuple[str, int, int]]
) -> list[tuple[str, int]]:
    """Peak live bytes inside each window, relative to the level at the first window's start."""
    if not windows:
        return []
    origin = windows[0][1]
    out = []
    for name, start, end in windows:
        level = sum(n for t, n in deltas if origin <= t < start)
        peak = level
        for t, n in deltas:
            if start <= t <= end:
                level += n
                peak = max(peak, level)
        out.append((name, peak))
    return out


def peak_cpu_mib(
    step: Callable[[], Any],
    *,
    warmup: int = 1,
    steps: int = 1,
    threads: int | None = 1,
) -> float:
    """Peak of the CPU memory a step allocates itself (frees of older blocks not subtracted), in MiB.

    From the profiler's allocator events: RSS and tracemalloc miss reused pages and torch's allocations.

    Args:
        step: zero-argument callable.
        warmup: unprofiled calls first (optimizer state and caches get allocated there).
        steps: profiled calls; the largest per-step peak is returned.
        threads: torch intra-op threads during the run (restored after); ``None`` leaves them.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup!r}")
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    with pinned_threads(threads):
        for _ in range(warmup):
            step()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            for _ in range(steps):
                with record_function(_STEP_MARK):
                    step()
    records = _allocation_records(prof, "cpu")
    windows = _annotation_windows(prof, _STEP_MARK)
    if not windows:
        return peak_live_bytes(memory_events(prof, device="cpu")) / MIB
    return max(peak_live_bytes(_own_allocations(records, s, e)) for _, s, e in windows) / MIB


@dataclass(frozen=True, kw_only=True)
class PhasePeaks:
    """Peak memory during each phase of a training step, in MiB."""

    forward_mib: float
    backward_mib: float
    optimizer_mib: float | None
    """``None`` when no optimizer phase ran: a 0 would be written as a budget."""
    reference: Literal["step_start"]
    """What the peaks count on both devices: bytes the step itself allocated, from the step's start."""
    device: DeviceType

    def by_phase(self) -> dict[str, float]:
        """``{"forward": MiB, "backward": MiB, "optimizer": MiB}``, the phases that ran."""
        out = {"forward": self.forward_mib, "backward": self.backward_mib}
        if self.optimizer_mib is not None:
            out["optimizer"] = self.optimizer_mib
        return out

    @property
    def peak_mib(self) -> float:
        """Largest of the phases that ran."""
        return max(self.by_phase().values())


def _phase_fns(
    forward: Callable[[], torch.Tensor],
    backward: Callable[[torch.Tensor], Any] | None,
    optimizer: Any,
) -> tuple[Callable[[], Any], Callable[[Any], Any], Callable[[], Any] | None]:
    """The three phases; the optimizer phase is ``None`` when there is no optimizer."""

    def opt_phase() -> None:
        if callable(getattr(optimizer, "step", None)) and callable(
            getattr(optimizer, "zero_grad", None)
        ):
            optimizer.step()
            # Freeing the gradients belongs to this phase: it is where their memory goes.
            optimizer.zero_grad(set_to_none=True)
        elif callable(optimizer):
            optimizer()
        else:
            raise TypeError(
                f"optimizer must be a torch.optim.Optimizer, a callable or None, got {type(optimizer)}"
            )

    return forward, backward or (lambda loss: loss.backward()), None if optimizer is None else opt_phase


def training_step(
    forward: Callable[[], torch.Tensor],
    *,
    backward: Callable[[torch.Tensor], Any] | None = None,
    optimizer: Any = None,
) -> Callable[[], None]:
    """The phases :func:`peak_by_phase` takes, as one unmeasured step (re-run for a failure's artifacts)."""
    fwd, bwd, opt = _phase_fns(forward, backward, optimizer)

    def step() -> None:
        bwd(fwd())
        if opt is not None:
            opt()

    return step


def peak_by_phase(
    forward: Callable[[], torch.Tensor],
    *,
    backward: Callable[[torch.Tensor], Any] | None = None,
    optimizer: Any = None,
    device: DeviceType = "cuda",
    warmup: int = 1,
    threads: int | None = 1,
) -> PhasePeaks:
    """Peak memory of the forward, backward and optimizer phases of one training step, from the step's start.

    CUDA: ``max_memory_allocated`` per phase (never reserved or NVML "used": cache, other processes);
    CPU: the profiler's allocator events (see :func:`peak_cpu_mib`).

    Args:
        forward: returns the loss.
        backward: called with the loss; default ``loss.backward()``.
        optimizer: a ``torch.optim.Optimizer`` (``step()``, ``zero_grad(set_to_none=True)``), a callable,
            or ``None``: no optimizer phase.
        device: ``"cuda"`` or ``"cpu"``.
        warmup: unmeasured steps first (the first step allocates optimizer state).
        threads: torch intra-op threads during the run (restored after).
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup!r}")
    import torch

    fwd, bwd, opt = _phase_fns(forward, backward, optimizer)

    def one_step(mark: Callable[[str], Any]) -> None:
        with mark("forward"):
            loss = fwd()
        with mark("backward"):
            bwd(loss)
        del loss
        if opt is not None:
            with mark("optimizer"):
                opt()

    with pinned_threads(threads):
        for _ in range(warmup):
            one_step(lambda _name: nullcontext())
        if device == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("peak_by_phase(device='cuda') needs CUDA; none is available")
            return _cuda_phase_peaks(fwd, bwd, opt)
        return _cpu_phase_peaks(one_step, with_optimizer=opt is not None)


def _cuda_phase_peaks(
    fwd: Callable[[], Any], bwd: Callable[[Any], Any], opt: Callable[[], Any] | None
) -> PhasePeaks:
    import torch

    peaks: dict[str, float] = {}
    sync = device_sync("cuda")
    sync()
    # Counted from the step's start, as on CPU, so one metric name means one thing on both devices.
    start = torch.cuda.memory_allocated()

    def run(name: str, fn: Callable[[], Any]) -> Any:
        sync()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        sync()
        peaks[name] = (torch.cuda.max_memory_allocated() - start) / MIB
        return out

    held = {"loss": run("forward", fwd)}
    run("backward", lambda: bwd(held["loss"]))
    # The loss (and the graph it keeps alive) is gone before the optimizer runs, as in a loop.
    held.clear()
    if opt is not None:
        run("optimizer", opt)
    return _phase_peaks(peaks, "cuda")


def _phase_peaks(mib: Mapping[str, float], device: DeviceType) -> PhasePeaks:
    return PhasePeaks(forward_mib=mib["forward"], backward_mib=mib["backward"], optimizer_mib=mib.get("optimizer"),
                      reference="step_start", device=device)


def _cpu_phase_peaks(one_step: Callable[[Callable[[str], Any]], None], *, with_optimizer: bool) -> PhasePeaks:
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        one_step(lambda name: record_function(_PHASE_MARK + name))
    windows = _annotation_windows(prof, _PHASE_MARK)
    records = _allocation_records(prof, "cpu")
    # Pair frees with allocations over the whole step: the loss and activations allocated in
    # forward are freed in backward.
    deltas = _own_allocations(records, windows[0][1], windows[-1][2]) if windows else []
    found = {name.removeprefix(_PHASE_MARK): peak for name, peak in _window_peaks(deltas, windows)}
    ran = PHASES if with_optimizer else tuple(p for p in PHASES if p != "optimizer")
    missing = [p for p in ran if p not in found]
    if missing:
        raise RuntimeError(f"profiler recorded no range for phase(s) {missing}")
    return _phase_peaks({p: found[p] / MIB for p in ran}, "cpu")


#: Key of :class:`Allocation` in a timing record's ``extra``.
ALLOCATION = "allocation"
#: A change in bytes per call is named only from this size (and 1 %) up: profiler bookkeeping moves a few bytes.
ALLOCATION_FLOOR_BYTES = 4096


@dataclass(frozen=True, kw_only=True)
class Allocation:
    """What one call of a timed function allocates, kept beside its time (``extra["allocation"]``)."""

    bytes_per_call: float
    """Bytes the call asks of torch's allocator on its device, whether or not it frees them."""
    minor_faults_per_call: float
    """The process's minor page faults per call (``getrusage``): fresh pages the call touched."""

    def to_extra(self) -> dict[str, float]:
        return {"bytes_per_call": self.bytes_per_call, "minor_faults_per_call": self.minor_faults_per_call}

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> Allocation | None:
        """The payload under :data:`ALLOCATION` in a record's ``extra`` (``None``: absent).

        Raises:
            ValueError: naming the field and the value that is not a finite number >= 0.
        """
        got = extra.get(ALLOCATION)
        if got is None:
            return None
        if not isinstance(got, dict) or set(got) != {"bytes_per_call", "minor_faults_per_call"}:
            raise ValueError(f"extra[{ALLOCATION!r}]: expected bytes_per_call and minor_faults_per_call, got {got!r}")
        for k, x in got.items():
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x < float("inf"):
                raise ValueError(f"extra[{ALLOCATION!r}].{k}: expected a finite number >= 0, got {x!r}")
        return cls(**{k: float(x) for k, x in got.items()})

    def change_from(self, base: Allocation) -> str:
        """What moved since ``base``, for a verdict's reason (``+25.0 MiB allocated per call (6.0 -> 31.0 MiB)``)."""
        said = []
        moved = self.bytes_per_call - base.bytes_per_call
        if changed_by(moved, base.bytes_per_call, least=ALLOCATION_FLOOR_BYTES, share=0.01):
            said.append(f"{moved / MIB:+.1f} MiB allocated per call ({base.bytes_per_call / MIB:.1f} -> "
                        f"{self.bytes_per_call / MIB:.1f} MiB)")
        faults = self.minor_faults_per_call - base.minor_faults_per_call
        # One fresh 4 KiB page is one fault: a few per call is a reused block's edge, hundreds a fresh buffer.
        if changed_by(faults, base.minor_faults_per_call, least=16.0, share=0.1):
            said.append(f"{faults:+.0f} minor page faults per call ({base.minor_faults_per_call:.0f} -> "
                        f"{self.minor_faults_per_call:.0f})")
        return "; ".join(said)


def allocation(fn: Callable[[], Any], *, device: DeviceType = "cpu", calls: int = 3,
               threads: int | None = 1) -> Allocation:
    """Bytes allocated (CPU: one profiled call; CUDA: the allocator's counter) and minor page faults per call.

    Args:
        fn: zero-argument callable, already warm (a first call's lazy allocations would count).
        device: where its tensors live.
        calls: calls the faults (and CUDA bytes) are averaged over.
        threads: torch intra-op threads during the calls (restored after); ``None`` leaves them.
    """
    import resource

    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls!r}")
    sync = device_sync(device)
    with pinned_threads(threads):
        if device == "cuda":
            import torch

            sync()
            before_bytes = torch.cuda.memory_stats().get("allocated_bytes.all.allocated", 0)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(calls):
            fn()
        sync()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        if device == "cuda":
            nbytes = (torch.cuda.memory_stats().get("allocated_bytes.all.allocated", 0) - before_bytes) / calls
        else:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                fn()
            nbytes = sum(n for _, n, _ in _allocation_records(prof, "cpu") if n > 0)
    return Allocation(bytes_per_call=float(nbytes), minor_faults_per_call=faults / calls)
