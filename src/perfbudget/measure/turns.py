"""Take turns with a second process on one machine: the client side of a lockstep A/B run."""

from __future__ import annotations

# Stdlib only (and the settings): the timers import this, and it must not pull in torch or pytest.
import atexit
import contextlib
import os
import socket
import threading
import warnings
from dataclasses import dataclass

from ..settings import DEFAULT_BURST_MS, DEFAULT_WAIT_S, SIDES, RunSpec, run_spec

__all__ = [
    "DEFAULT_BURST_MS",
    "DEFAULT_WAIT_S",
    "SIDES",
    "TurnsWarning",
    "active",
    "burst_ms",
    "join",
    "leave",
    "pass_turn",
]

_CONNECT_S = 10.0


class TurnsWarning(RuntimeWarning):
    """Turn-taking stopped early: what follows ran without the other side standing still."""


@dataclass(kw_only=True)
class _Client:
    """The connection of this process to the coordinator."""

    sock: socket.socket
    side: str
    pid: int
    """The process that joined; a forked child inherits the object but must not use it."""
    buffer: bytes = b""
    granted: bool = False
    """Whether the coordinator has granted this process a turn yet."""


_lock = threading.RLock()
_client: _Client | None = None
_stopped = False
"""Set once this process stops taking turns (left, alone, refused or the coordinator gone)."""


def active() -> bool:
    """Whether this process takes turns: it runs under ``perfbudget ab``, has not stopped (left,
    alone) and is not a forked child of the process that joined.

    Raises:
        ValueError: the run spec cannot be read (naming the file, key and value).
    """
    if _stopped or not _spec().socket:
        return False
    return _client is None or _client.pid == os.getpid()


def burst_ms() -> float:
    """Target burst length in milliseconds: the run spec's (default :data:`DEFAULT_BURST_MS`)."""
    return _spec().burst_ms


def join() -> None:
    """Connect to the coordinator and block until this process holds the machine (idempotent).

    Call it after set-up, before the first measurement: the first grant waits for both sides, so
    their starts and set-ups overlap while neither measures. A no-op outside an A/B run.
    """
    with _lock:
        if active() and _client is None:
            _join_locked()


def pass_turn() -> None:
    """Hand the machine to the other side and block until it is handed back (joins first if needed)."""
    if not active():
        return
    with _lock:
        if not active():
            return
        if _client is None:
            _join_locked()
            return
        try:
            _client.sock.sendall(b"PASS\n")
        except OSError as exc:
            _stop(f"lost the coordinator while passing the turn: {exc}")
            return
        _await_turn(_client)


def leave() -> None:
    """Give up the turn for good: the other side runs freely from now on (``atexit`` after :func:`join`)."""
    global _client, _stopped
    with _lock:
        client = _client
        if client is not None and client.pid == os.getpid():
            with contextlib.suppress(OSError):  # the coordinator is gone already: nothing to leave
                client.sock.sendall(b"LEAVE\n")
            _close(client)
            _client = None
        _stopped = True


_NO_RUN = RunSpec(side="head")
"""Outside an A/B run: no socket, so no turn-taking."""


def _spec() -> RunSpec:
    """This process's run spec (read once), or :data:`_NO_RUN`."""
    return run_spec() or _NO_RUN


def _join_locked() -> None:
    global _client
    spec = _spec()
    path, side = spec.socket, spec.side
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(_CONNECT_S)
        sock.connect(path)
        sock.sendall(f"JOIN {side} {os.getpid()}\n".encode())
    except OSError as exc:
        sock.close()
        _stop(f"cannot reach the coordinator at {path!r}: {exc}")
        return
    _client = _Client(sock=sock, side=side, pid=os.getpid())
    atexit.register(leave)
    _await_turn(_client)


def _await_turn(client: _Client) -> None:
    """Block until the coordinator answers ``GO``; stop taking turns on anything else."""
    # One ASCII line a message. To the coordinator: JOIN <side> <pid>, PASS, LEAVE. Back: GO (you
    # hold the machine), SOLO (the other side left: run freely), NO <reason> (refused).
    wait_s = _spec().wait_s
    try:
        client.sock.settimeout(wait_s)
        line = _readline(client)
    except TimeoutError:
        _stop(f"waited {wait_s:g} s for the turn (the run spec's wait_s); the other side seems stuck" if client.granted
              else f"waited {wait_s:g} s for the first turn (the run spec's wait_s): the other side never joined "
                   "(its start, collection or set-up before its first test hung or took longer) or held its "
                   "first turn as long")
        return
    except OSError as exc:
        _stop(f"lost the coordinator while waiting for the turn: {exc}")
        return
    if line == "GO":
        client.granted = True
        return
    if line == "SOLO":
        _stop(None)  # the other side finished or failed: the normal end of turn-taking
        return
    if line.startswith("NO"):
        _stop(f"the coordinator refused {client.side!r}: {line[2:].strip() or 'no reason given'}")
        return
    if not line:
        _stop("the coordinator closed the connection")
        return
    _stop(f"unexpected message from the coordinator: {line!r}")


def _readline(client: _Client) -> str:
    """One line from the coordinator ('' at end of stream)."""
    while b"\n" not in client.buffer:
        chunk = client.sock.recv(256)
        if not chunk:
            return ""
        client.buffer += chunk
    line, client.buffer = client.buffer.split(b"\n", 1)
    return line.decode("ascii", "replace").strip()


def _close(client: _Client) -> None:
    with contextlib.suppress(OSError):
        client.sock.close()


def _stop(problem: str | None) -> None:
    """Stop taking turns for the rest of the process; warn unless it is the normal end."""
    global _client, _stopped
    if _client is not None:
        _close(_client)
        _client = None
    _stopped = True
    if problem:
        _report(problem)
        warnings.warn(
            f"perfbudget turns: {problem}; measuring on without taking turns "
            "(the A/B comparison of what follows is not in lockstep: the A/B driver does not use this pair)",
            TurnsWarning, stacklevel=3,
        )


def _report(problem: str) -> None:
    """Append ``problem`` to the driver's report file, so the lost lockstep cannot go unnoticed."""
    path = _spec().report
    if not path:
        return
    line = " ".join(problem.split())  # one line per problem, whatever the OS error said
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()} {line}\n")
    except OSError as exc:  # the warning still says it; the driver then sees no report
        warnings.warn(f"perfbudget turns: cannot write the report {path!r}: {exc}", TurnsWarning, stacklevel=4)
