"""A real turn-taking client for the coordinator tests: ``python turn_client.py MODE LOG [N [SETUP_S]]``.

Modes: ``bursts`` (N bursts of busy work between ``pass_turn`` calls, each burst's
``time.monotonic()`` interval written to LOG as JSON), ``die-holding`` (join, then exit
abruptly while holding the machine), ``wait`` (join and pass once, whatever happens). SETUP_S: seconds
of set-up (a sleep) before the join, its ``time.monotonic()`` interval written to LOG as ``setup``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

from perfbudget.measure import turns


def main(mode: str, log: str, n: int, setup_s: float = 0.0) -> int:
    caught: list[str] = []
    setup = [time.monotonic()]
    time.sleep(setup_s)
    setup.append(time.monotonic())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        turns.join()
        intervals = []
        if mode == "bursts":
            for _ in range(n):
                turns.pass_turn()
                t0 = time.monotonic()
                end = t0 + turns.burst_ms() / 1e3
                while time.monotonic() < end:
                    sum(range(1000))
                intervals.append([t0, time.monotonic()])
        elif mode == "die-holding":
            os._exit(3)
        elif mode == "wait":
            turns.pass_turn()
        turns.leave()
        caught = [str(w.message) for w in seen if issubclass(w.category, turns.TurnsWarning)]
    with open(log, "w") as fh:
        json.dump({"intervals": intervals, "warnings": caught, "active_after": turns.active(), "setup": setup}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0,
                  float(sys.argv[4]) if len(sys.argv) > 4 else 0.0))
