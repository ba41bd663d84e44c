"""Lend the machine to one side of a lockstep A/B pair at a time (the server of ``measure.turns``)."""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..settings import SIDES

__all__ = ["Coordinator", "Turn", "TurnLog"]

#: Seconds of a hold listed in the turn log (it compiled or built a workload); the other side waits.
LONG_HOLD_S = 120.0


@dataclass(frozen=True, kw_only=True)
class Turn:
    """One grant of the machine."""

    side: str
    start_s: float
    """``time.monotonic()`` when the side was told to go."""
    end_s: float
    """``time.monotonic()`` when it passed, left or died."""

    @property
    def held_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, kw_only=True)
class TurnLog:
    """What the coordinator saw during one process pair."""

    turns: tuple[Turn, ...]
    joined: tuple[str, ...]
    left: tuple[str, ...]

    """Sides that left (or died), in order."""
    solo_s: dict[str, float] = field(default_factory=dict)
    """Per side, how long it ran alone after the other side left."""
    problems: tuple[str, ...] = ()
    """Turn-taking lost on the coordinator's side (a process refused); the pair is then invalid."""

    def grants(self, side: str) -> int:
        return sum(1 for t in self.turns if t.side == side)

    @property
    def long_holds(self) -> tuple[Turn, ...]:
        return tuple(t for t in self.turns if t.held_s > LONG_HOLD_S)

    def as_dict(self) -> dict[str, Any]:
        return {
            "grants": {s: self.grants(s) for s in SIDES},
            "held_s": {s: round(sum(t.held_s for t in self.turns if t.side == s), 3) for s in SIDES},
            "longest_hold_s": round(max((t.held_s for t in self.turns), default=0.0), 3),
            "long_holds": [{"side": t.side, "held_s": round(t.held_s, 3)} for t in self.long_holds],
            "joined": list(self.joined), "left": list(self.left),
            "solo_s": {s: round(v, 3) for s, v in self.solo_s.items()},
            "problems": list(self.problems),
        }


@dataclass(kw_only=True)
class _Conn:
    sock: socket.socket
    buffer: bytes = b""
    side: str | None = None


class Coordinator:
    """Grant the machine to one side at a time, alternately, once every side has joined (or left).

    A side holds it until it passes; once one side has left (``LEAVE``, a closed socket, or
    :meth:`side_exited`), the other is told ``SOLO`` and runs freely.

    Args:
        path: Unix socket to listen on (kept short: the kernel limit is ~107 bytes).
        first: the side granted the machine first.
        sides: the sides expected to join.
    """

    def __init__(self, path: str | Path, *, first: str = "base", sides: Sequence[str] = SIDES) -> None:
        if first not in sides:
            raise ValueError(f"first: expected one of {tuple(sides)}, got {first!r}")
        self.path = str(path)
        self.first = first
        self.sides = tuple(sides)
        self._sel = selectors.DefaultSelector()
        self._server: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._exited: list[str] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closing = False
        # Loop state (touched by the loop thread only, read after it ends).
        self._conns: dict[str, _Conn] = {}
        self._waiting: set[str] = set()
        self._left: list[str] = []
        self._joined: list[str] = []
        self._holder: str | None = None
        self._since = 0.0
        self._last: str | None = None
        self._turns: list[Turn] = []
        self._solo_start: dict[str, float] = {}
        self._solo_end: dict[str, float] = {}
        self._problems: list[str] = []
        self._halted = False
        # Published for other threads after each pass of the loop (one reference each, read whole).
        self._parked: frozenset[str] = frozenset()
        self._running: str | None = None

    def start(self) -> Coordinator:
        """Listen and serve in a background thread; returns ``self``."""
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(self.path)
        server.listen(8)
        server.setblocking(False)
        self._server = server
        self._sel.register(server, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._loop, name="perfbudget-turns", daemon=True)
        self._thread.start()
        return self

    def side_exited(self, side: str) -> None:
        """A side's process ended: it leaves (it may have died holding the machine)."""
        with self._lock:
            self._exited.append(side)
        self._wake()

    def halt(self) -> None:
        """Grant no further turn (the time limit): the holder runs on until it passes or leaves, then
        every side still here waits, and is :meth:`parked`."""
        self._halted = True
        self._wake()

    def parked(self) -> frozenset[str]:
        """Once halted, the sides waiting for a turn that will not come (safe from any thread)."""
        return self._parked

    @property
    def running(self) -> str | None:
        """The side that runs now: the holder, or the one left alone (safe from any thread)."""
        return self._running

    def close(self) -> TurnLog:
        """Stop serving, close every connection and remove the socket; returns the log."""
        self._closing = True
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for c in list(self._conns.values()):
            c.sock.close()
        # A connection accepted that never said which side it is has no entry in _conns: close it too.
        for key in list(self._sel.get_map().values()):
            if key.data not in ("accept", "wake"):
                key.fileobj.close()  # type: ignore[union-attr]
        if self._server is not None:
            self._server.close()
        self._wake_r.close()
        self._wake_w.close()
        self._sel.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        return self.log()

    def log(self) -> TurnLog:
        """Turns granted so far (an open turn counts up to now)."""
        now = time.monotonic()
        turns = list(self._turns)
        if self._holder is not None:
            turns.append(Turn(side=self._holder, start_s=self._since, end_s=now))
        solo = {s: self._solo_end.get(s, now) - t for s, t in self._solo_start.items()}
        return TurnLog(turns=tuple(turns), joined=tuple(self._joined), left=tuple(self._left), solo_s=solo,
                       problems=tuple(self._problems))

    def __enter__(self) -> Coordinator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # closed already
            self._wake_w.send(b"x")

    def _loop(self) -> None:
        while not self._closing:
            for key, _ in self._sel.select(timeout=1.0):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                else:
                    self._read(key.data)
            with self._lock:
                exited, self._exited = self._exited, []
            for side in exited:
                self._leave(side)
            self._schedule()
            present = [s for s in self.sides if s not in self._left]
            alone = present[0] if len(present) == 1 and self._left and present[0] in self._conns else None
            self._running = self._holder or alone
            self._parked = frozenset(self._waiting) if self._halted else frozenset()

    def _accept(self) -> None:
        assert self._server is not None
        try:
            sock, _ = self._server.accept()
        except OSError:
            return
        sock.setblocking(True)
        self._sel.register(sock, selectors.EVENT_READ, _Conn(sock=sock))


    def _read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(4096)
        except OSError:
            chunk = b""
        if not chunk:  # the process closed the socket or died
            self._drop(conn)
            return
        conn.buffer += chunk
        while b"\n" in conn.buffer:
            raw, conn.buffer = conn.buffer.split(b"\n", 1)
            self._message(conn, raw.decode("ascii", "replace").split())
            if conn.sock.fileno() < 0:
                return

    def _message(self, conn: _Conn, words: list[str]) -> None:
        verb = words[0] if words else ""
        if verb == "JOIN" and conn.side is None:
            side = words[1] if len(words) > 1 else ""
            if side not in self.sides:
                self._refuse(conn, f"unknown side {side!r}; expected one of {self.sides}")
            elif side in self._conns or side in self._left:
                self._refuse(conn, f"side {side!r} has joined already (one process per side: no xdist)")
            else:
                conn.side = side
                self._conns[side] = conn
                self._joined.append(side)
                self._waiting.add(side)
        elif verb == "PASS" and conn.side is not None and self._holder == conn.side:
            self._release()
            self._waiting.add(conn.side)
        elif verb == "LEAVE" and conn.side is not None:
            self._leave(conn.side)
        else:
            self._refuse(conn, f"unexpected message {' '.join(words)!r} from side {conn.side!r}")

    def _refuse(self, conn: _Conn, reason: str) -> None:
        # The refused process (or its joined side's other) measures on alone: out of lockstep.
        self._problems.append(f"refused {'side ' + repr(conn.side) if conn.side else 'a process'}: {reason}")
        self._send(conn, f"NO {reason}")
        self._drop(conn)


    def _drop(self, conn: _Conn) -> None:
        if conn.side is not None:
            self._leave(conn.side)
        else:
            self._unregister(conn)

    def _unregister(self, conn: _Conn) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.sock.close()

    def _leave(self, side: str) -> None:
        if side in self._left:
            return
        self._left.append(side)
        if self._holder == side:
            self._release()
        self._waiting.discard(side)
        now = time.monotonic()
        self._solo_end[side] = now
        for other in self.sides:
            if other not in self._left and other not in self._solo_start:
                self._solo_start[other] = now
        conn = self._conns.pop(side, None)
        if conn is not None:
            self._unregister(conn)

    def _release(self) -> None:
        assert self._holder is not None
        self._turns.append(Turn(side=self._holder, start_s=self._since, end_s=time.monotonic()))
        self._last = self._holder
        self._holder = None

    def _send(self, conn: _Conn, line: str) -> bool:
        try:
            conn.sock.sendall(line.encode("ascii", "replace") + b"\n")
        except OSError:
            return False
        return True

    def _schedule(self) -> None:
        if self._holder is not None or not self._waiting or self._halted:
            return
        present = [s for s in self.sides if s not in self._left]
        if len(present) <= 1:
            for side in sorted(self._waiting):
                self._waiting.discard(side)
                if side in self._conns:
                    self._send(self._conns[side], "SOLO")
            return
        if not self._turns and any(s not in self._conns for s in present):
            return  # the first grant waits until the other side is here
        if not self._turns:
            order = [self.first, *(s for s in self.sides if s != self.first)]
        else:
            order = [*(s for s in self.sides if s != self._last), *([self._last] if self._last else [])]
        side = next(s for s in order if s in self._waiting)
        self._waiting.discard(side)
        if self._send(self._conns[side], "GO"):
            self._holder = side
            self._since = time.monotonic()
        else:
            self._leave(side)
            self._schedule()
