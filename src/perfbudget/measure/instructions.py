"""Instructions per step: callgrind's Ir inside a valgrind process, or a hardware counter; a typed "unmeasurable" otherwise."""

from __future__ import annotations

import collections
import ctypes
import errno
import functools
import gc
import hashlib
import itertools
import os
import platform
import re
import shutil
import struct
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from perfbudget.measure.unmeasurable import Unmeasurable

from ..settings import CALLGRIND_OUT_ENV, HELPER_CACHE_ENV, Settings

__all__ = [
    "CALLGRIND_IR",
    "CALLGRIND_OUT_ENV",
    "HARDWARE_INSTRUCTIONS",
    "HELPER_CACHE_ENV",
    "CallgrindDump",
    "Counter",
    "FunctionCost",
    "FunctionMove",
    "HardwareCounter",
    "InstructionCount",
    "Unmeasurable",
    "build_helper",
    "callgrind_hint",
    "dumps_in",
    "history_dependent",
    "instructions",
    "moved_functions",
    "moves_between",
    "open_hardware_counter",
    "read_dump",
    "running_under_valgrind",
]

CALLGRIND_IR: Final = "callgrind Ir"
"""Instructions executed as callgrind's simulated CPU counts them (event ``Ir``)."""
HARDWARE_INSTRUCTIONS: Final = "perf instructions:u"
"""The CPU's retired-instructions counter (``PERF_COUNT_HW_INSTRUCTIONS``), user space only, this thread."""

Counter = Literal["callgrind Ir", "perf instructions:u"]
"""Which counter produced a count. The two are different metrics: never compare one with the other."""

RUN_HINT = "run it under callgrind: perfbudget instructions -- <pytest args>"
INSTALL_HINT = "valgrind is not installed: apt-get install valgrind (Debian/Ubuntu) or dnf install valgrind (Fedora)"


@dataclass(frozen=True, kw_only=True)
class InstructionCount:
    """Instructions executed by ``steps`` calls of a step, set-up and warm-up excluded."""

    per_step: float
    """Instructions per call, history-dependent functions left out: ``(total - history_dependent) / steps``
    (includes the measuring loop's own few instructions per call)."""
    total: int
    """Instructions over all measured calls, every function counted."""
    steps: int
    counter: Counter
    """The counter that produced the value; budgets and comparisons must not mix counters."""
    dump: Path | None = None
    """The callgrind dump holding exactly the measured calls (None for the hardware counter)."""
    history_dependent: int = 0
    """Of ``total``, the instructions of :func:`history_dependent` functions, left out of ``per_step``
    (always 0 for the hardware counter, which cannot tell functions apart)."""
    parsed: CallgrindDump | None = field(default=None, repr=False, compare=False)
    """``dump`` as read when it was counted (its functions), so no caller reads it again."""


# CALLGRIND_START_INSTRUMENTATION lets everything before the first measurement run uninstrumented
# (--instr-atstart=no), several times faster. torch._C only exposes TOGGLE_COLLECT (and a dump), so
# the start/stop requests come from this tiny library, built at first use from valgrind's header.
_HELPER_SOURCE = r"""
#include <valgrind/callgrind.h>
int perfbudget_running_on_valgrind(void) { return RUNNING_ON_VALGRIND; }
void perfbudget_collect_on(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_TOGGLE_COLLECT; }
void perfbudget_collect_off_dump(const char *label) {
    CALLGRIND_TOGGLE_COLLECT;
    CALLGRIND_DUMP_STATS_AT(label);
    CALLGRIND_STOP_INSTRUMENTATION;
}
"""

_helper_cache: dict[Path, ctypes.CDLL | Unmeasurable] = {}


def build_helper(cache_dir: Path | None = None) -> ctypes.CDLL | Unmeasurable:
    """The callgrind client-request helper (no-ops outside valgrind), compiled once per source
    version with ``$CC`` (default ``gcc``), or Unmeasurable naming what is missing."""
    folder = cache_dir or Settings.resolve().helper_cache_dir
    digest = hashlib.sha256(_HELPER_SOURCE.encode()).hexdigest()[:12]
    lib = folder / f"callgrind-helper-{digest}-{platform.machine()}.so"
    if lib in _helper_cache:
        return _helper_cache[lib]
    if not lib.exists():
        built = _build(lib, digest, folder)
        if built is not None:
            _helper_cache[lib] = built  # a failed build is not retried for every ask
            return built
    loaded = ctypes.CDLL(str(lib))
    # Resolved now, not by the first call (a symbol lookup inside the first measurement).
    loaded.perfbudget_running_on_valgrind.restype = ctypes.c_int
    loaded.perfbudget_collect_on.restype = None
    loaded.perfbudget_collect_off_dump.argtypes = [ctypes.c_char_p]
    loaded.perfbudget_collect_off_dump.restype = None
    _helper_cache[lib] = loaded
    return loaded


#: Seconds a build of the helper may take (a compiler stuck on a lock must not hang the session).
BUILD_TIMEOUT_S = 120


def _build(lib: Path, digest: str, folder: Path) -> Unmeasurable | None:
    """Compile the helper into ``lib``; why not, or ``None`` once it is there."""
    cc = os.environ.get("CC", "gcc")
    if shutil.which(cc) is None:
        return Unmeasurable(reason=f"no C compiler ({cc}) to build the callgrind helper")
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / f"callgrind-helper-{digest}.c"
    src.write_text(_HELPER_SOURCE, encoding="utf-8")
    tmp = lib.with_name(f"{lib.name}.{os.getpid()}.tmp")  # another process may build it at the same time
    try:
        done = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(src)],
                              capture_output=True, text=True, check=False, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Unmeasurable(reason=f"the callgrind helper's build ({cc}) took over {BUILD_TIMEOUT_S} s")
    if done.returncode:
        first = (done.stderr.strip().splitlines() or ["no output"])[0]
        return Unmeasurable(reason=f"cannot build the callgrind helper ({first}); "
                                   "valgrind/callgrind.h comes with the valgrind package (apt-get install valgrind)")
    os.replace(tmp, lib)
    return None


@functools.cache
def running_under_valgrind() -> bool:
    """Whether this process runs on valgrind's synthetic CPU (any tool)."""
    # Cached: asked before every perf test, and without valgrind/callgrind.h each ask would compile.
    helper = build_helper()
    if not isinstance(helper, Unmeasurable):
        return bool(helper.perfbudget_running_on_valgrind())
    # Without the helper: valgrind preloads its core library into every client process.
    return "vgpreload_core" in os.environ.get("LD_PRELOAD", "")


def callgrind_hint() -> str:
    """How to get a callgrind count on this machine: the install hint when valgrind is missing, else how to run."""
    return INSTALL_HINT if shutil.which("valgrind") is None else RUN_HINT


_PERF_TYPE_HARDWARE = 0
_PERF_COUNT_HW_INSTRUCTIONS = 1
_PERF_ATTR_SIZE_VER0 = 64
# attr.flags bits: disabled, inherit, pinned, exclusive, exclude_user, exclude_kernel, exclude_hv
_FLAG_DISABLED, _FLAG_EXCLUDE_KERNEL, _FLAG_EXCLUDE_HV = 1 << 0, 1 << 5, 1 << 6
_IOC_ENABLE, _IOC_DISABLE, _IOC_RESET = 0x2400, 0x2401, 0x2403
_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241, "ppc64le": 319, "s390x": 331}


class HardwareCounter:
    """An open ``perf_event_open`` instructions counter on the calling thread, user space only."""

    def __init__(self, fd: int, libc: ctypes.CDLL) -> None:
        self._fd = fd
        self._libc = libc

    def _ioctl(self, request: int) -> None:
        if self._libc.ioctl(self._fd, request, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"perf_event ioctl {request:#x}: {os.strerror(err)}")

    def start(self) -> None:
        """Zero the counter and start counting."""
        self._ioctl(_IOC_RESET)
        self._ioctl(_IOC_ENABLE)

    def stop(self) -> int:
        """Stop counting; the instructions counted since :meth:`start`."""
        self._ioctl(_IOC_DISABLE)
        return int(struct.unpack("Q", os.read(self._fd, 8))[0])

    def close(self) -> None:
        os.close(self._fd)


def open_hardware_counter() -> HardwareCounter | Unmeasurable:
    """Open the retired-instructions counter for this thread (user space), or say why not."""
    number = _PERF_EVENT_OPEN.get(platform.machine())
    if number is None or platform.system() != "Linux":
        return Unmeasurable(reason=f"perf_event_open: not supported on {platform.system()} {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    attr = bytearray(_PERF_ATTR_SIZE_VER0)
    # struct perf_event_attr, version 0: type u32, size u32, config u64, sample_period u64,
    # sample_type u64, read_format u64, flags u64, ... (the rest zero).
    struct.pack_into("IIQQQQQ", attr, 0, _PERF_TYPE_HARDWARE, _PERF_ATTR_SIZE_VER0, _PERF_COUNT_HW_INSTRUCTIONS,
                     0, 0, 0, _FLAG_DISABLED | _FLAG_EXCLUDE_KERNEL | _FLAG_EXCLUDE_HV)
    buf = (ctypes.c_char * len(attr)).from_buffer(attr)
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(ctypes.c_long(number), buf, ctypes.c_int(0), ctypes.c_int(-1), ctypes.c_int(-1),
                      ctypes.c_ulong(0))
    if fd < 0:
        err = ctypes.get_errno()
        name = errno.errorcode.get(err, str(err))
        why = {errno.ENOENT: "no hardware counters exposed (a VM without a virtual PMU?)",
               errno.EACCES: "not permitted (kernel.perf_event_paranoid, or a container policy)",
               errno.EPERM: "not permitted (kernel.perf_event_paranoid, or a container policy)"}.get(err, os.strerror(err))
        return Unmeasurable(reason=f"perf_event_open(PERF_COUNT_HW_INSTRUCTIONS) failed with {name}: {why}")
    return HardwareCounter(int(fd), libc)


def _run(step: Callable[[], object], steps: int) -> None:
    # A loop in C: a Python loop's call site is specialised by the interpreter for the callable
    # it saw last, and re-specialised (after a back-off) when another step comes, so its cost
    # inside the counted calls would depend on which step was measured before.
    collections.deque(itertools.starmap(step, itertools.repeat((), steps)), maxlen=0)


def _dump_base() -> Path:
    return Path(Settings.resolve().callgrind_out.replace("%p", str(os.getpid())))


def _dumps(base: Path) -> set[Path]:
    return set(base.parent.glob(f"{base.name}.*"))


_calibrated: list[Path] = []


def _calibrate_callgrind() -> None:
    """Spend the costlier first pass through the requests (specialising, ctypes set-up) once on an
    empty step, in a deleted dump, so the first real measurement counts like every later one."""
    if not _calibrated:
        _calibrated.append(_dump_base())
        first = _count_callgrind(lambda: None, 1, "calibration")
        if isinstance(first, InstructionCount) and first.dump is not None:
            first.dump.unlink(missing_ok=True)


def _count_callgrind(step: Callable[[], object], steps: int, label: str) -> InstructionCount | Unmeasurable:
    base = _dump_base()
    before = _dumps(base)
    helper = build_helper()
    if isinstance(helper, Unmeasurable):
        # torch's requests only toggle collection; they need --instr-atstart=yes.
        import torch

        torch._C._valgrind_toggle()
        _run(step, steps)
        torch._C._valgrind_toggle_and_dump_stats()
    else:
        # Everything between the two requests is counted: look up and build what they need first.
        collect_on, collect_off_dump, run = helper.perfbudget_collect_on, helper.perfbudget_collect_off_dump, _run
        tag = f"perfbudget: {label}".encode()
        collect_on()
        run(step, steps)
        collect_off_dump(tag)
    new = sorted(_dumps(base) - before, key=lambda p: p.stat().st_mtime_ns)
    if not new:
        return Unmeasurable(reason=f"callgrind wrote no dump next to {base} (is the tool callgrind, and is "
                                   f"{CALLGRIND_OUT_ENV} its --callgrind-out-file?); {RUN_HINT}")
    dump = new[-1]
    parsed = read_dump(dump)
    total = parsed.total_ir
    if total <= 0:
        why = ("instrumentation is off (--instr-atstart=no) and the helper that starts it is missing: "
               f"{helper.reason}" if isinstance(helper, Unmeasurable) else "collection was on before the measurement "
               "(--collect-atstart=yes?), so the toggle turned it off")
        return Unmeasurable(reason=f"callgrind counted no instructions in {dump}: {why}; {RUN_HINT}")
    dependent = sum(f.self_ir for f in parsed.functions.values() if history_dependent(f.function))
    return InstructionCount(per_step=(total - dependent) / steps, total=total, steps=steps, counter=CALLGRIND_IR,
                            dump=dump, history_dependent=dependent, parsed=parsed)


def _count_hardware(counter: HardwareCounter, step: Callable[[], object], steps: int) -> InstructionCount:
    try:
        counter.start()
        _run(step, steps)
        total = counter.stop()
    finally:
        counter.close()
    return InstructionCount(per_step=total / steps, total=total, steps=steps, counter=HARDWARE_INSTRUCTIONS)


def instructions(step: Callable[[], object], *, steps: int = 20, warmup: int = 10,
                 counter: Literal["auto", "callgrind", "hardware"] = "auto",
                 label: str = "step") -> InstructionCount | Unmeasurable:
    """Count the instructions of ``steps`` calls of ``step``, after ``warmup`` uncounted calls.

    Args:
        step: the work of one step, warm already or warmed by ``warmup``; run on this thread.
        steps: calls counted; the result is per call.
        warmup: calls made first and not counted: first calls allocate and pick kernels, and
            CPython quickens a function only on its 8th call (3.11).
        counter: ``"callgrind"`` (under ``valgrind --tool=callgrind --collect-atstart=no``, e.g.
            ``perfbudget instructions``), ``"hardware"`` (``perf_event_open``), or ``"auto"``:
            callgrind under valgrind, else the hardware counter.
        label: written into the callgrind dump's trigger line, to tell dumps apart.

    Returns:
        An InstructionCount naming its counter, or Unmeasurable with the reason and the fix.
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps must be >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    if counter not in ("auto", "callgrind", "hardware"):
        raise ValueError(f"counter: expected 'auto', 'callgrind' or 'hardware', got {counter!r}")
    under_valgrind = running_under_valgrind()
    if counter == "hardware" and under_valgrind:
        return Unmeasurable(reason="under valgrind the hardware counter would count valgrind's own work; "
                                   "use counter='callgrind' or run outside valgrind")
    hardware: HardwareCounter | Unmeasurable | None = None
    if counter == "hardware" or (counter == "auto" and not under_valgrind):
        hardware = open_hardware_counter()
        if isinstance(hardware, Unmeasurable):
            if counter == "hardware":
                return hardware
            return Unmeasurable(reason=f"not running under valgrind, and {hardware.reason}; {callgrind_hint()}")
    elif not under_valgrind:
        return Unmeasurable(reason=f"not running under valgrind; {callgrind_hint()}")
    if hardware is None:
        _calibrate_callgrind()
    _run(step, warmup)
    # A collection would land in whichever counted call crosses its threshold.
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        if isinstance(hardware, HardwareCounter):
            return _count_hardware(hardware, step, steps)
        return _count_callgrind(step, steps, label)
    finally:
        if enabled:
            gc.enable()


# The same step counted in processes with different histories moves by up to 0.7 %, all of it in
# these functions (benchmarks/instructions-history-cpu.md): allocators, whose free lists depend on
# every earlier allocation, and CPython's dict and type-attribute lookups, whose probes depend on
# collisions and the type cache (PyTorch's ``FunctionCounts.denoise`` strips them too). The rest
# repeats to a few hundredths of a percent.
_GLIBC_MALLOC: Final = frozenset({
    "malloc", "free", "calloc", "realloc", "cfree", "memalign", "posix_memalign", "aligned_alloc", "valloc",
    "pvalloc", "__libc_malloc", "__libc_free", "__libc_calloc", "__libc_realloc", "__libc_memalign",
    "__posix_memalign", "_int_malloc", "_int_free", "_int_realloc", "_int_memalign", "_mid_memalign",
    "_int_free_merge_chunk", "_int_free_create_chunk", "_int_free_maybe_consolidate", "malloc_consolidate",
    "unlink_chunk", "alloc_perturb", "free_perturb", "sysmalloc", "systrim", "tcache_init", "tcache_get",
    "tcache_put", "tcache_get_n", "tcache_put_n", "munmap_chunk", "mremap_chunk", "arena_get2", "heap_trim",
})
_CPYTHON: Final = frozenset({
    # the object and raw allocators (obmalloc.c)
    "PyObject_Malloc", "PyObject_Calloc", "PyObject_Realloc", "PyObject_Free", "_PyObject_Malloc",
    "_PyObject_Calloc", "_PyObject_Realloc", "_PyObject_Free", "PyMem_Malloc", "PyMem_Calloc", "PyMem_Realloc",
    "PyMem_Free", "PyMem_RawMalloc", "PyMem_RawCalloc", "PyMem_RawRealloc", "PyMem_RawFree", "_PyMem_RawMalloc",
    "_PyMem_RawCalloc", "_PyMem_RawRealloc", "_PyMem_RawFree", "pymalloc_alloc", "pymalloc_free",
    "pymalloc_realloc", "allocate_from_new_pool", "insert_to_usedpool", "insert_to_freepool", "new_arena",
    "address_in_range",
    # dictionary lookups (dictobject.c) and the type-attribute cache (typeobject.c)
    "_Py_dict_lookup", "unicodekeys_lookup_unicode", "unicodekeys_lookup_generic", "dictkeys_generic_lookup",
    "lookdict", "lookdict_unicode", "lookdict_unicode_nodummy", "lookdict_split", "_PyDict_GetItem_KnownHash",
    "_PyDict_LoadGlobal", "_PyType_Lookup", "find_name_in_mro", "assign_version_tag",
})
_ALLOCATOR_LIBRARY = re.compile(r"^lib(jemalloc|tcmalloc(_minimal)?|mimalloc)\b")
_CLONE_SUFFIX = re.compile(r"(\.(constprop|isra|part|cold|lto_priv)\.\d+)+$")


def history_dependent(function: str) -> bool:
    """Whether a callgrind function (``name [object file]``) is one whose instructions depend on
    the process's history: a memory allocator's, or a CPython dictionary or type-attribute lookup.

    Matched by name within glibc or CPython, or by library (jemalloc, tcmalloc, mimalloc).
    """
    name, _, obj = function.rpartition(" [")
    if not _:
        return False
    obj = obj.removesuffix("]")
    if _ALLOCATOR_LIBRARY.match(obj):
        return True
    base = _CLONE_SUFFIX.sub("", name)
    if obj.startswith(("libc.so", "libc-")):
        return base in _GLIBC_MALLOC
    if "python" in obj.lower():
        return base in _CPYTHON
    return False


@dataclass(frozen=True, kw_only=True)
class FunctionCost:
    """One function's instructions in a dump."""

    function: str
    """``name [object file]``, as callgrind symbolised it."""
    self_ir: int
    inclusive_ir: int
    """Self plus every call it made (recursion levels merged, so an inner call is not counted twice)."""
    straddles: bool = False
    """A measuring frame, whose inclusive count means nothing: on the stack when collection switched
    (charged remainders from outside the dump: < 0 or > the total), or enclosing nearly all of it."""


@dataclass(frozen=True, kw_only=True)
class CallgrindDump:
    """A callgrind output file: its total and, when read, its functions."""

    path: Path
    total_ir: int
    trigger: str
    """What wrote it, e.g. ``Client Request: perfbudget: step``."""
    functions: dict[str, FunctionCost]


def _signed(value: int) -> int:
    # Callgrind prints 64-bit costs unsigned: a call entered before the previous dump and still
    # running carries a negative remainder into the next one (and so can a later dump's summary).
    return value - 2**64 if value >= 2**63 else value


_RECURSION_LEVEL = re.compile(r"'\d+$")
_NAMED = re.compile(r"^\((\d+)\)(?: (.*))?$")
_NAME_KEYS = ("ob", "fl", "fi", "fe", "fn", "cob", "cfi", "cfl", "cfn")


def read_dump(path: str | Path, *, functions: bool = True) -> CallgrindDump:
    """Parse the callgrind output file ``path`` (its own format, name compression included); with
    ``functions``, also sum self and inclusive Ir per function (slower for large dumps)."""
    path = Path(path)
    names: dict[tuple[str, str], str] = {}  # (kind, id) -> name; ob/cob share ids, fn/cfn share ids
    events: list[str] = ["Ir"]
    ir_index, positions, trigger = 0, 1, ""
    total: int | None = None
    selfs: dict[str, int] = {}
    calls: dict[str, int] = {}
    ob = fn = cfn = ""
    after_calls = False

    def resolve(kind: str, value: str) -> str:
        group = "ob" if kind in ("ob", "cob") else "fn" if kind in ("fn", "cfn") else "fl"
        m = _NAMED.match(value)
        if not m:
            return value
        if m.group(2) is not None:
            names[(group, m.group(1))] = m.group(2)
        return names.get((group, m.group(1)), f"({m.group(1)})")

    with path.open(encoding="utf-8", errors="replace") as lines:
        for raw in lines:
            line = raw.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            head = line[0]
            if head.isdigit() or head in "+-*":
                if not functions:
                    continue
                fields = line.split()
                ir_at = positions + ir_index  # events follow the position columns; trailing zeros are left out
                ir = _signed(int(fields[ir_at])) if ir_index >= 0 and len(fields) > ir_at else 0
                key = f"{fn} [{ob}]"
                if after_calls:
                    if cfn != fn:  # a function calling itself would count its own cost twice
                        calls[key] = calls.get(key, 0) + ir
                    after_calls = False
                else:
                    selfs[key] = selfs.get(key, 0) + ir
                continue
            kind, _, value = line.partition("=")
            if kind in _NAME_KEYS and _:
                name = resolve(kind, value)
                if kind == "ob":
                    ob = os.path.basename(name)
                elif kind == "fn":
                    fn = cfn = name
                elif kind == "cfn":
                    cfn = name
                continue
            if kind == "calls":
                after_calls = True
                continue
            key_name, colon, rest = line.partition(":")
            if not colon:
                continue
            rest = rest.strip()
            if key_name == "events":
                events = rest.split()
                ir_index = events.index("Ir") if "Ir" in events else -1
            elif key_name == "positions":
                positions = len(rest.split())
            elif key_name == "totals":
                total = int(rest.split()[events.index("Ir")]) if "Ir" in events else 0
            elif key_name == "summary" and total is None:
                # Dumps after the first carry a summary computed by subtraction that can be off;
                # `totals:` (at the end) is the right one and overrides it.
                value_ir = _signed(int(rest.split()[events.index("Ir")])) if "Ir" in events else 0
                total = value_ir if value_ir >= 0 else None
            elif key_name == "desc" and rest.startswith("Trigger:"):
                trigger = rest.removeprefix("Trigger:").strip()
    if total is None:
        total = sum(selfs.values())
    return CallgrindDump(path=path, total_ir=total, trigger=trigger, functions=_by_function(selfs, calls, total))


_ENCLOSING = 0.99
"""A function whose inclusive count is at least this share of the dump's total encloses the counted calls."""


def _by_function(selfs: dict[str, int], calls: dict[str, int], total: int) -> dict[str, FunctionCost]:
    """Merge callgrind's recursion levels (``f'2`` runs inside ``f``): self costs add up, and the
    outermost level's inclusive cost already holds the inner ones."""
    levels: dict[str, list[tuple[int, int, int]]] = {}  # name -> (level, self, inclusive)
    for key in set(selfs) | set(calls):
        name, _, obj = key.rpartition(" [")
        m = _RECURSION_LEVEL.search(name)
        base = f"{name[: m.start()] if m else name} [{obj}"
        level = int(m.group()[1:]) if m else 1
        own = selfs.get(key, 0)
        levels.setdefault(base, []).append((level, own, own + calls.get(key, 0)))
    out = {}
    for base, rows in levels.items():
        rows.sort()
        inclusive = rows[0][2] if rows[0][0] == 1 else max(r[2] for r in rows)
        straddles = any(r[2] < 0 or r[2] > total for r in rows) or (total > 0 and inclusive >= _ENCLOSING * total)
        out[base] = FunctionCost(function=base, self_ir=sum(r[1] for r in rows), inclusive_ir=inclusive,
                                 straddles=straddles)
    return out


@dataclass(frozen=True, kw_only=True)
class FunctionMove:
    """A function whose inclusive instructions per step changed between two dumps."""

    function: str
    before_per_step: float
    """Inclusive Ir per step in the first dump (0 when the function did not run there)."""
    after_per_step: float
    self_delta_per_step: float
    """Change of its own (exclusive) Ir per step."""

    @property
    def delta_per_step(self) -> float:
        return self.after_per_step - self.before_per_step


def _as_dump(x: InstructionCount | CallgrindDump | str | Path) -> tuple[CallgrindDump, int]:
    if isinstance(x, InstructionCount):
        if x.dump is None:
            raise ValueError(f"a {x.counter} count has no callgrind dump to attribute from")
        return x.parsed or read_dump(x.dump), x.steps
    if isinstance(x, CallgrindDump):
        return x, 1
    return read_dump(x), 1


def moved_functions(before: InstructionCount | CallgrindDump | str | Path,
                    after: InstructionCount | CallgrindDump | str | Path, k: int = 10) -> list[FunctionMove]:
    """The ``k`` functions whose inclusive Ir moved most (by absolute change per step) from ``before`` to ``after``.

    Per step for InstructionCounts, per dump otherwise; the measuring frames are left out.
    """
    (a, a_steps), (b, b_steps) = _as_dump(before), _as_dump(after)
    straddling = {n for d in (a, b) for n, f in d.functions.items() if f.straddles}

    def per_step(d: CallgrindDump, steps: int) -> dict[str, tuple[float, float]]:
        return {n: (f.self_ir / steps, f.inclusive_ir / steps) for n, f in d.functions.items() if n not in straddling}

    return moves_between(per_step(a, a_steps), per_step(b, b_steps), k)


def moves_between(before: Mapping[str, tuple[float, float]], after: Mapping[str, tuple[float, float]],
                  k: int = 10) -> list[FunctionMove]:
    """The ``k`` functions whose inclusive count moved most from ``before`` to ``after``, each given
    as ``{function: (self, inclusive)}`` per step (absent: 0); the one ranking every report uses."""
    moves: list[FunctionMove] = []
    for name in set(before) | set(after):
        self_a, inc_a = before.get(name, (0.0, 0.0))
        self_b, inc_b = after.get(name, (0.0, 0.0))
        if inc_a != inc_b or self_a != self_b:
            moves.append(FunctionMove(function=name, before_per_step=inc_a, after_per_step=inc_b,
                                      self_delta_per_step=self_b - self_a))
    moves.sort(key=lambda m: (-abs(m.delta_per_step), -abs(m.self_delta_per_step), m.function))
    return moves[:k]


def dumps_in(folder: str | Path) -> Iterable[Path]:
    """The callgrind dumps (``callgrind.out.<pid>.<n>``) a ``perfbudget instructions`` run left in ``folder``."""
    return sorted(p for p in Path(folder).glob("callgrind.out.*.*") if p.suffix[1:].isdigit())
