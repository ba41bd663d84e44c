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
    """Peak of the running sum of allocation deltas, starting from zero.

    Args:
        deltas: ``(time_ns, nbytes)`` pairs, ``nbytes`` positive for an allocation and
            negative for a free. Sorted by time here; ties keep their given order.

    Returns:
        The largest running total (bytes live above the starting level), at least 0.
    """
    level = peak = 0
    for _, nbytes in sorted(deltas, key=lambda d: d[0]):
        level += nbytes
        peak = max(peak, level)
    return peak


def _allocation_records(prof: Any, device: DeviceType) -> list[tuple[int, int, int | None]]:
    """``(start_ns, nbytes, address)`` of every allocator event of a finished profile.

    The address comes from the profiler's event tree; where that (experimental) API is missing,
    the kineto ``[memory]`` records are used without addresses.
    """
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
    """Allocations inside ``[start, end]`` and the frees of exactly those blocks.

    Frees of blocks allocated earlier are dropped. The CPU allocator remembers block sizes
    across profiling sessions by address, so without this pairing a block allocated outside
    profiling at a reused address is "freed" with a stale size, and the peak wanders by whole
    tensors from run to run.
    """
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
    """Allocator events of a finished ``torch.profiler.profile(profile_memory=True)`` run.

    One event per allocation (positive bytes) and per free (negative bytes) of a block that
    was allocated while profiling; frees of older blocks are dropped, so the running sum
    (see :func:`peak_live_bytes`) starts at 0 and counts the profiled code's own memory.

    Args:
        prof: the profiler object, after its context exited.
        device: keep events of this device type only.

    Returns:
        ``(start_ns, nbytes)`` pairs in time order.
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
    """Peak of the CPU memory a step allocates itself, in MiB.

    The running sum of the step's allocations minus its frees of those same blocks, at its
    highest: what the step needs on top of what was live before it. Blocks that were live
    before the step and that it frees (e.g. last step's gradients under ``zero_grad``) are not
    subtracted, so the number does not depend on what the previous step left behind.

    Reconstructed from the profiler's allocator events (``profile_memory=True``): RSS and
    tracemalloc cannot see it, because after warm-up the allocator reuses freed pages and
    torch allocations bypass Python's allocator.

    Args:
        step: zero-argument callable.
        warmup: unprofiled calls first (optimizer state and caches get allocated there).
        steps: profiled calls; the largest per-step peak is returned.
        threads: torch intra-op threads during the run (restored after); ``None`` leaves them.

    Returns:
        Peak live bytes above the step's starting level, in MiB.
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
    """``None`` when no optimizer phase ran (``optimizer=None``: e.g. a precision policy whose
    backward callable also steps the optimizer). A phase that ran nothing has no peak: a 0
    would be written as a budget and would pass whatever the other phases hold."""
    reference: Literal["step_start"]
    """What the peaks count, on both devices: the bytes the step itself allocated and still
    holds, counted from the step's start (CUDA: ``max_memory_allocated`` during the phase minus
    ``memory_allocated`` before the step; CPU: see :func:`peak_cpu_mib`)."""
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

    def default_backward(loss: Any) -> Any:
        return loss.backward()

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

    return forward, backward or default_backward, None if optimizer is None else opt_phase


def training_step(
    forward: Callable[[], torch.Tensor],
    *,
    backward: Callable[[torch.Tensor], Any] | None = None,
    optimizer: Any = None,
) -> Callable[[], None]:
    """The phases :func:`peak_by_phase` takes, as one unmeasured step (what a failing memory
    check re-runs for its artifacts, the CUDA memory snapshot among them)."""
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
    """Peak memory of the forward, backward and optimizer phases of one training step.

    CUDA: before each phase the allocator's peak is reset
    (``torch.cuda.reset_peak_memory_stats``); after it, ``max_memory_allocated`` is read, less
    what was allocated before the step (weights, optimizer state), so the number means what
    it means on CPU. Allocated, never reserved or NVML "used": those include the cache and
    other processes.

    CPU: the step runs under the profiler with ``profile_memory=True`` and each phase's
    peak is read from the running sum of the step's own allocations and frees, counted from
    the step's start (see :func:`peak_cpu_mib`).

    Args:
        forward: returns the loss.
        backward: called with the loss; default ``loss.backward()``.
        optimizer: a ``torch.optim.Optimizer`` (phase = ``step()`` then
            ``zero_grad(set_to_none=True)``), a zero-argument callable, or ``None``: no
            optimizer phase runs, and it has no peak (``optimizer_mib`` is ``None``).
        device: ``"cuda"`` or ``"cpu"``.
        warmup: unmeasured steps first (the first step allocates optimizer state).
        threads: torch intra-op threads during the run (restored after).

    Returns:
        ``PhasePeaks`` in MiB.
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
    # Counted from the step's start, as on CPU (where only the step's own allocations are
    # visible): weights, optimizer state and anything else alive before the step are left out,
    # so one metric name means one thing on both devices.
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
    return PhasePeaks(
        forward_mib=peaks["forward"],
        backward_mib=peaks["backward"],
        optimizer_mib=peaks.get("optimizer"),
        reference="step_start",
        device="cuda",
    )


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
    return PhasePeaks(
        forward_mib=found["forward"] / MIB,
        backward_mib=found["backward"] / MIB,
        optimizer_mib=found["optimizer"] / MIB if with_optimizer else None,
        reference="step_start",
        device="cpu",
    )


#: Key of :class:`Allocation` in a timing record's ``extra``.
ALLOCATION = "allocation"
#: A change in bytes allocated per call is named only from this size (and 1 % of the base's) up: the
#: profiler's own bookkeeping moves a call's count by a few bytes between processes.
ALLOCATION_FLOOR_BYTES = 4096


@dataclass(frozen=True, kw_only=True)
class Allocation:
    """What one call of a timed function allocates, kept beside its time (``extra["allocation"]``)."""

    bytes_per_call: float
    """Bytes the call asks of torch's allocator on its device (CPU: the profiler's allocator events;
    CUDA: the caching allocator's ``allocated_bytes.all.allocated``), whether or not it frees them."""
    minor_faults_per_call: float
    """The process's minor page faults per call (``getrusage``): fresh pages the call touched."""

    def to_extra(self) -> dict[str, float]:
        return {"bytes_per_call": self.bytes_per_call, "minor_faults_per_call": self.minor_faults_per_call}

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> Allocation | None:
        """The payload under :data:`ALLOCATION` in a record's ``extra`` (``None``: absent).

        Raises:
            ValueError: naming the field and the value, when it is there but not two finite numbers >= 0.
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
        """What moved since ``base``, for a verdict's reason (empty when nothing did):
        ``+25.0 MiB allocated per call (6.0 -> 31.0 MiB)``, ``+1536 minor page faults per call (0 -> 1536)``."""
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
    """Bytes allocated and minor page faults per call of a warm ``fn``.

    Faults are counted over ``calls`` plain calls; bytes on the CPU from one call profiled with
    ``profile_memory=True`` (the allocator has no counter of its own there), on a GPU from the
    caching allocator's counter over the same calls.

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
