"""Run one process pair: the base and the head side at once, taking turns through a coordinator."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ..fileio import atomic_write
from ..measure.nvml import ClockSampler, GpuClocks
from ..settings import SIDES, SPEC_ENV, RunSpec
from .coordinator import Coordinator, TurnLog
from .trees import side_env

__all__ = [
    "HALVES",
    "STOP_S",
    "PairRun",
    "SideCommand",
    "SideRun",
    "SideSetup",
    "one_cpu",
    "parse_cpus",
    "placement",
    "pytest_command",
    "run_pair",
    "select_tests",
]

# Seconds between SIGTERM and SIGKILL for a side that outlived the time limit, and after SIGKILL.
_KILL_GRACE_S = 10.0
_KILLED_S = 5.0
#: Seconds the holder of the machine has, once the pair's time is up, to end its turn or finish.
STOP_GRACE_S = 5.0
#: Seconds an interrupted side has to end its session and write what it finished.
INTERRUPT_GRACE_S = 10.0
#: What stopping a pair may take, a side that ignores its interrupt killed too (started this early).

STOP_S = STOP_GRACE_S + INTERRUPT_GRACE_S + _KILL_GRACE_S + _KILLED_S

#: ``--cpus halves``: each side pinned to its own half of the CPUs (the default on a GPU machine).
HALVES: Literal["halves"] = "halves"
CpuChoice = tuple[int, ...] | Literal["halves"]
"""CPUs both sides are pinned to (``()``: not pinned), or :data:`HALVES`."""


def one_cpu() -> tuple[int, ...]:
    """The CPU both sides are pinned to by default: the last one this process may use (``()``: cannot pin)."""
    # One core's state for both sides narrows the pair ratio's spread on a shared VM
    # (benchmarks/ab-gate-cpu.md); one side runs at a time; the first CPU takes the interrupts.
    if not hasattr(os, "sched_getaffinity"):
        return ()
    return (max(os.sched_getaffinity(0)),)


def placement(cpus: CpuChoice, index: int, allowed: Sequence[int] | None = None) -> dict[str, tuple[int, ...]]:
    """The CPUs each side of pair ``index`` is pinned to (``()``: not pinned).

    :data:`HALVES` splits ``allowed`` (default: this process's CPUs, less the first) in two; the sides
    swap halves each pair, as they swap the first turn, so a difference between halves cancels.
    """
    if not isinstance(cpus, str):
        return {s: tuple(cpus) for s in SIDES}
    if allowed is None:
        allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    usable = list(allowed[1:] if len(allowed) > 2 else allowed)
    half = len(usable) // 2
    if half == 0:
        return {s: tuple(usable) for s in SIDES}
    low, high = tuple(usable[:half]), tuple(usable[half:2 * half])
    return {"base": low, "head": high} if index % 2 else {"base": high, "head": low}


def parse_cpus(spec: str) -> CpuChoice | None:
    """``"auto"`` -> ``None`` (the driver's default), ``"all"`` -> ``()`` (no pinning), ``"halves"`` ->
    :data:`HALVES`, ``"0,2-3"`` -> ``(0, 2, 3)``.

    Raises:
        ValueError: naming the spec when it is none of these.
    """
    spec = spec.strip()
    if spec == "auto":
        return None
    if spec == "all":
        return ()
    if spec == HALVES:
        return HALVES
    cpus: set[int] = set()
    try:
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ValueError(f"--cpus: expected 'auto', 'all' or a list such as '3' or '0,2-3', or 'halves', "
                         f"got {spec!r}") from None
    if not cpus or min(cpus) < 0:
        raise ValueError(f"--cpus: expected CPU numbers >= 0, got {spec!r}")
    return tuple(sorted(cpus))


@dataclass(frozen=True, kw_only=True)
class SideSetup:
    """What the command of one side needs to know."""

    side: str
    """``base`` or ``head``."""
    tree: Path
    """The side's checkout (its working directory)."""
    results: Path
    """Where the side writes its results JSON."""
    tests: tuple[str, ...] | None = None
    """The nodeids to run, in order, instead of the user's selection (``None``: the user's)."""


SideCommand = Callable[[SideSetup], Sequence[str]]
"""The argv that runs one side (``pytest_command`` in real runs; a small script in tests)."""


def pytest_command(pytest_args: Sequence[str] = (), *, python: str = sys.executable) -> SideCommand:
    """``python -m pytest --perf-collect --perf-json <results> -p no:cacheprovider <args>``.

    The base also gets ``--continue-on-collection-errors``: a module needing what only the head's
    instrument has is missing from the base, and the rest still runs.
    """
    args = tuple(pytest_args)

    def command(setup: SideSetup) -> list[str]:
        extra = ["--continue-on-collection-errors"] if setup.side == "base" else []
        chosen = args if setup.tests is None else select_tests(args, setup.tests, tree=setup.tree)
        return [python, "-m", "pytest", "--perf-collect", "--perf-json", str(setup.results),
                "-p", "no:cacheprovider", *extra, *chosen]

    return command


#: Options (pytest's, xdist's, ours) whose value may be the next argument, never a test selection.

_VALUE_OPTIONS = frozenset({
    "-k", "-m", "-p", "-c", "-o", "-W", "-r", "-n",
    "--maxfail", "--durations", "--durations-min", "--verbosity", "--report-chars", "--tb", "--show-capture",
    "--color", "--code-highlight", "--pastebin", "--junit-xml", "--junitxml", "--junit-prefix", "--junitprefix",
    "--pythonwarnings", "--max-warnings", "--ignore", "--ignore-glob", "--deselect", "--confcutdir",
    "--import-mode", "--doctest-report", "--doctest-glob", "--config-file", "--rootdir", "--basetemp",
    "--override-ini", "--assert", "--capture", "--pdbcls", "--log-level", "--log-format", "--log-date-format",
    "--log-cli-level", "--log-cli-format", "--log-cli-date-format", "--log-file", "--log-file-mode",
    "--log-file-level", "--log-file-format", "--log-file-date-format", "--log-auto-indent", "--log-disable",
    "--lfnf", "--last-failed-no-failures", "--numprocesses", "--maxprocesses", "--max-worker-restart", "--dist",
    "--tx", "--px", "--rsyncdir", "--budgets-dir", "--perf-json",
})


def select_tests(pytest_args: Sequence[str], tests: Sequence[str], *, tree: Path) -> list[str]:
    """``pytest_args`` with the user's test selection replaced by ``tests`` (nodeids, in order).

    Options are kept; a positional argument naming a path in ``tree``, a ``.py`` file or a nodeid is
    dropped (others, e.g. an unknown option's value, stay). The nodeids go last, one argument each.
    """
    kept: list[str] = []
    value_next = False
    for arg in pytest_args:
        if value_next:
            kept.append(arg)
            value_next = False
        elif arg.startswith("-"):
            kept.append(arg)
            value_next = arg in _VALUE_OPTIONS
        elif not _is_selection(arg, tree):
            kept.append(arg)
    return [*kept, *tests]


def _is_selection(arg: str, tree: Path) -> bool:
    path = arg.split("::", 1)[0]
    if "::" in arg or path.endswith(".py"):
        return True
    try:
        return (tree / path).exists()
    except OSError:  # a name too long for a path: an option's value
        return False


@dataclass(frozen=True, kw_only=True)
class SideRun:
    """How one side's process went."""

    side: str
    results: Path
    """Its results JSON (may be missing when the process failed early)."""
    log: Path
    """Its standard output and error."""
    returncode: int | None
    """The exit status; ``None`` when it was stopped at the time limit (interrupted or killed)."""
    wall_s: float

    def tail(self, lines: int = 15) -> str:
        """The last lines of its output, for error messages."""
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def as_dict(self) -> dict[str, Any]:
        return {"side": self.side, "results": str(self.results), "log": str(self.log),
                "returncode": self.returncode, "wall_s": round(self.wall_s, 3)}


@dataclass(frozen=True, kw_only=True)
class PairRun:
    """One process pair."""

    index: int
    """1-based pair number."""
    first: str
    """The side that got the machine first."""
    sides: Mapping[str, SideRun]
    turns: TurnLog
    wall_s: float
    timed_out: bool
    cpus: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """CPUs each side was pinned to (empty: not pinned)."""
    clocks: Mapping[str, GpuClocks] = field(default_factory=dict)
    """Per side, the GPU clocks over its turns (empty without NVML)."""
    tests: tuple[str, ...] | None = None
    """The nodeids both sides were asked to run, in order (``None``: the user's selection)."""
    ran: tuple[str, ...] = ()
    """The nodeids the head recorded checks for, in its order (set by the driver)."""
    invalid: str = ""
    """Why the pair is not used: turn-taking was lost for part of it (empty: valid)."""
    replaces: int | None = None
    """The number of the invalid pair this one re-runs."""

    def as_dict(self) -> dict[str, Any]:
        return {"pair": self.index, "first": self.first, "wall_s": round(self.wall_s, 3),
                "cpus": {s: list(c) for s, c in self.cpus.items()},
                "timed_out": self.timed_out, "tests": None if self.tests is None else list(self.tests),
                "ran": list(self.ran), "invalid": self.invalid, "replaces": self.replaces,
                "sides": [self.sides[s].as_dict() for s in SIDES if s in self.sides], "turns": self.turns.as_dict()}


def run_pair(
    index: int,
    *,
    trees: Mapping[str, Path],
    shims: Mapping[str, Path],
    workdir: Path,
    command: SideCommand,
    first: str,
    timeout_s: float,
    spec: RunSpec | None = None,
    cpus: Sequence[int] | Mapping[str, Sequence[int]] = (),
    env: Mapping[str, str] | None = None,
    tests: Sequence[str] | None = None,
    replaces: int | None = None,
    lockstep: bool = True,
) -> PairRun:
    """Run both sides of pair ``index`` to the end, taking turns, and return how it went.

    Args:
        trees, shims: each side's checkout and import shim; its files go to ``workdir/pair-<index>``.
        command: one side's argv; ``spec`` (default: the instrument's) is told its side and socket.
        first: the side that gets the machine first; past ``timeout_s`` running sides are stopped.
        cpus: the CPUs both sides are pinned to, or each side's (:func:`placement`).
        env: the sides' base environment (default: this process's).
        tests: the nodeids both run, in order (``None``: the user's selection).
        replaces: the invalid pair this one re-runs (recorded only).
        lockstep: take turns and sample GPU clocks; ``False`` runs both at once (instruction counts).

    Returns:
        The pair, ``invalid`` when a side or the coordinator reported lost turn-taking.
    """
    folder = workdir / f"pair-{index}"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    per_side = {s: tuple(c) for s, c in cpus.items()} if isinstance(cpus, Mapping) else \
        {s: tuple(cpus) for s in SIDES}
    # Unix socket paths are limited to ~107 bytes: keep it in a short temporary folder.
    sockdir = Path(tempfile.mkdtemp(prefix="perfbudget-ab-"))
    sockpath = sockdir / "turns.sock"
    coordinator: Coordinator | None = None
    sampler: ClockSampler | None = None
    procs: dict[str, subprocess.Popen[bytes]] = {}
    started: dict[str, float] = {}
    ended: dict[str, float] = {}
    logs, results, reports = ({s: folder / f"{s}{suffix}" for s in SIDES} for suffix in (".log", ".json", ".turns"))
    chosen = None if tests is None else tuple(tests)
    t0 = time.monotonic()
    timed_out, stopped = False, set[str]()
    try:
        # Inside the try: the socket folder, the coordinator and the sampler are closed whatever fails.
        if lockstep:
            coordinator = Coordinator(sockpath, first=first).start()
            sampler = ClockSampler(lambda: coordinator.running if coordinator is not None else None).start()
        for side in (first, *(s for s in SIDES if s != first)):
            told = replace(spec or RunSpec(side=side), side=side, report=str(reports[side]),
                           socket=str(sockpath) if coordinator is not None else "")
            spec_path = atomic_write(folder / f"{side}.spec.json", told.to_json())
            argv = list(command(SideSetup(side=side, tree=trees[side], results=results[side], tests=chosen)))
            procs[side] = _start_side(argv, tree=trees[side], log=logs[side], cpus=per_side.get(side, ()),
                                      env=side_env(shims[side], base_env=env, **{SPEC_ENV: str(spec_path)}))
            started[side] = time.monotonic()
        timed_out = _wait(procs, coordinator, deadline=t0 + timeout_s, ended=ended, stopped=stopped)
    finally:
        turn_log, clocks = _close(procs, coordinator, sampler, ended=ended, stopped=stopped)
        shutil.rmtree(sockdir, ignore_errors=True)
    sides = {
        s: SideRun(side=s, results=results[s], log=logs[s],
                   returncode=None if s in stopped else procs[s].returncode,
                   wall_s=ended.get(s, time.monotonic()) - started.get(s, t0))
        for s in procs
    }
    lost = [f"{s} {line}" for s in SIDES for line in _lines(reports[s])]
    lost += [f"coordinator: {problem}" for problem in turn_log.problems]
    return PairRun(index=index, first=first, sides=sides, turns=turn_log, wall_s=time.monotonic() - t0,
                   timed_out=timed_out, cpus={s: c for s, c in per_side.items() if c}, tests=chosen,
                   replaces=replaces, clocks=clocks,
                   invalid=f"turn-taking was lost: {'; '.join(lost)}" if lost else "")


def _start_side(argv: list[str], *, tree: Path, log: Path, cpus: Sequence[int],
                env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start one side in its checkout, its output to ``log``, pinned to ``cpus`` (``()``: not pinned)."""
    with open(log, "wb") as out, _interruptible():
        out.write(f"$ (cd {tree} && {' '.join(argv)})\n".encode())
        out.flush()
        proc = subprocess.Popen(
            argv, cwd=tree, env=dict(env), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a timeout kills its children too
        )
    if cpus and hasattr(os, "sched_setaffinity"):
        # Right after the start, before any timing: threads made later inherit it.
        os.sched_setaffinity(proc.pid, set(cpus))
    return proc


def _wait(procs: Mapping[str, subprocess.Popen[bytes]], coordinator: Coordinator | None, *, deadline: float,
          ended: dict[str, float], stopped: set[str]) -> bool:
    """Wait for the sides to end (``ended``); past ``deadline`` interrupt them (``stopped``), giving
    up :data:`INTERRUPT_GRACE_S` later. Returns whether the deadline passed."""
    timed_out = False
    while len(ended) < len(procs):
        for side, proc in procs.items():
            if side not in ended and proc.poll() is not None:
                ended[side] = time.monotonic()
                if coordinator is not None:
                    coordinator.side_exited(side)
        late_s = time.monotonic() - deadline
        if late_s > 0 and not timed_out:
            timed_out = True
            if coordinator is not None:
                coordinator.halt()
        if timed_out:
            # Between turns: a side waiting for one is interrupted now, the others once their grace is over.
            parked = coordinator.parked() if coordinator is not None else frozenset(procs)
            for side in procs.keys() - ended.keys() - stopped:
                if side in parked or late_s > STOP_GRACE_S:
                    _signal(procs[side], signal.SIGINT)
                    stopped.add(side)
            if late_s > STOP_GRACE_S + INTERRUPT_GRACE_S:
                break
        time.sleep(0.05)
    return timed_out


def _close(procs: Mapping[str, subprocess.Popen[bytes]], coordinator: Coordinator | None,
           sampler: ClockSampler | None, *, ended: dict[str, float], stopped: set[str]) -> tuple[TurnLog, dict[str, GpuClocks]]:
    """Stop what still runs, close the coordinator and sampler; returns the turns and clocks."""
    running = [side for side, proc in procs.items() if proc.poll() is None]
    _stop_all(list(procs.values()))
    for side in running:
        stopped.add(side)
        ended.setdefault(side, time.monotonic())
        if coordinator is not None:
            coordinator.side_exited(side)
    turn_log = coordinator.close() if coordinator is not None else TurnLog(turns=(), joined=(), left=())
    return turn_log, sampler.stop() if sampler is not None else {}


def _lines(path: Path) -> list[str]:
    """A side's turn-taking report: one ``<pid> <problem>`` line per loss (none: no file)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        pid, _, problem = line.strip().partition(" ")
        if problem:
            out.append(f"(pid {pid}): {problem}" if pid.isdigit() else f": {line.strip()}")
    return out


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """A child started inside takes SIGINT as Ctrl-C even where this process ignores it (a shell
    starts background jobs so, and the ignoring is inherited): the time limit interrupts with it."""
    ignored = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Send ``sig`` to the side's process group (its children too), unless it is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every running side's group, SIGKILL after one shared grace (:data:`STOP_S` holds one); then
    SIGKILL every group: a child left behind (a DataLoader worker) would disturb the next pair."""

    running = [p for p in procs if p.poll() is None]
    for sig, wait_s in ((signal.SIGTERM, _KILL_GRACE_S), (signal.SIGKILL, _KILLED_S)):
        if not running:
            break
        for proc in running:
            _signal(proc, sig)
        until = time.monotonic() + wait_s
        for proc in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(until - time.monotonic(), 0.0))
        running = [p for p in running if p.poll() is None]
    for proc in procs:
        _signal(proc, signal.SIGKILL)
