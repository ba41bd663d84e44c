"""``perfbudget instructions``: one pytest session under callgrind, so ``instructions()`` calls count Ir."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from .exitcodes import ExitCode
from .measure.instructions import CALLGRIND_OUT_ENV, INSTALL_HINT, build_helper, dumps_in
from .measure.unmeasurable import Unmeasurable

__all__ = ["InstructionsRun", "callgrind_command", "callgrind_environment", "run_instructions", "under_callgrind"]

@dataclass(frozen=True, kw_only=True)
class InstructionsRun:
    """What one ``perfbudget instructions`` run did."""

    exit_code: int
    """pytest's exit code (valgrind passes it through), or 2 when valgrind is missing."""
    wall_s: float
    """Wall time of the whole valgrind process (import, collection, fixtures and every measurement)."""
    out_dir: Path
    dumps: tuple[Path, ...]
    """One callgrind dump per ``instructions()`` call, in the order they were written."""
    results_json: Path | None
    """The results file this pytest session wrote, when it wrote one (not one an earlier run left)."""


def _has_option(args: Sequence[str], option: str) -> bool:
    return any(a == option or a.startswith(option + "=") for a in args)


def _results_path(args: Sequence[str], out_dir: Path) -> Path:
    """Where the session writes its results: the user's ``--perf-json``, else ``out_dir/results.json``."""
    for i, a in enumerate(args):
        if a.startswith("--perf-json="):
            return Path(a.split("=", 1)[1])
        if a == "--perf-json" and i + 1 < len(args):
            return Path(args[i + 1])
    return out_dir / "results.json"


def _signature(path: Path) -> tuple[int, int, int, int] | None:
    """What changes when ``path`` is written again (inode, size, both times in ns); ``None``: no file."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def callgrind_command(pytest_args: Sequence[str], out_dir: Path, *, python: str = sys.executable,
                      valgrind: str = "valgrind", fast_start: bool = True) -> list[str]:
    """The valgrind command line that runs ``python -m pytest <pytest_args>`` under callgrind
    (:func:`under_callgrind`), writing its results JSON to ``out_dir`` unless told otherwise."""
    args = list(pytest_args)
    plugin_off = any(a.endswith("no:perfbudget") for a in args)  # `-p no:perfbudget`: no --perf-json option
    if not plugin_off and not _has_option(args, "--perf-json"):
        args += ["--perf-json", str(out_dir / "results.json")]
    return under_callgrind([python, "-m", "pytest", *args], out_dir, valgrind=valgrind, fast_start=fast_start)


def under_callgrind(argv: Sequence[str], out_dir: Path, *, valgrind: str = "valgrind",
                    fast_start: bool = True) -> list[str]:
    """``argv`` run under callgrind with collection (and, with ``fast_start``, instrumentation: importing
    torch runs several times faster) off until an ``instructions()`` count; dumps and logs go to
    ``out_dir``, one per pid. Run it with :func:`callgrind_environment` of the same ``out_dir``."""
    return [
        valgrind, "--tool=callgrind",
        f"--callgrind-out-file={out_dir / 'callgrind.out.%p'}",
        f"--log-file={out_dir / 'valgrind.%p.log'}",
        "--collect-atstart=no",
        f"--instr-atstart={'no' if fast_start else 'yes'}",
        *argv,
    ]


def callgrind_environment(out_dir: Path, base: Mapping[str, str]) -> dict[str, str]:
    """The environment of a process run by :func:`under_callgrind` with the same ``out_dir``."""
    env = dict(base)
    env[CALLGRIND_OUT_ENV] = str(out_dir / "callgrind.out.%p")
    # One torch thread (callgrind runs threads one at a time anyway; a thread pool only adds
    # scheduling instructions) and a fixed hash seed, so dict and set order repeat across runs.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env.setdefault("PYTHONHASHSEED", "0")
    return env


def run_instructions(pytest_args: Sequence[str], out_dir: str | Path, *, err: TextIO | None = None,
                     env: Mapping[str, str] | None = None) -> InstructionsRun:
    """Run a pytest session under callgrind with dumps (and its results JSON) in ``out_dir``.

    Prints the command and, at the end, the wall time and the dumps written, to ``err``.
    """
    stream = err or sys.stderr
    out = Path(out_dir).resolve()
    base_env = os.environ if env is None else env
    valgrind = shutil.which("valgrind", path=base_env.get("PATH"))
    if valgrind is None:
        print(f"perfbudget instructions: {INSTALL_HINT}", file=stream)
        return InstructionsRun(exit_code=ExitCode.USAGE, wall_s=0.0, out_dir=out, dumps=(), results_json=None)
    out.mkdir(parents=True, exist_ok=True)
    helper = build_helper()
    if isinstance(helper, Unmeasurable):
        print(f"perfbudget instructions: {helper.reason}; instrumenting from the start (slower)", file=stream)
    cmd = callgrind_command(pytest_args, out, valgrind=valgrind, fast_start=not isinstance(helper, Unmeasurable))
    print(f"perfbudget instructions: {shlex.join(cmd)}", file=stream, flush=True)
    before = set(dumps_in(out))
    results = _results_path(pytest_args, out)
    earlier = _signature(results)  # a results file of an earlier run is not this one's
    start = time.monotonic()
    code = subprocess.run(cmd, env=callgrind_environment(out, base_env), check=False).returncode
    wall_s = time.monotonic() - start
    dumps = tuple(sorted(set(dumps_in(out)) - before, key=lambda p: p.stat().st_mtime_ns))
    written = (now := _signature(results)) is not None and now != earlier
    said = ""
    if written:
        said = f"; results in {results}"
    elif earlier is not None:
        said = f"; no results written ({results} is an earlier run's)"
    print(f"perfbudget instructions: {wall_s:.1f} s wall under callgrind, {len(dumps)} dump(s) in {out}{said}",
          file=stream)
    return InstructionsRun(exit_code=code, wall_s=wall_s, out_dir=out, dumps=dumps,
                           results_json=results if written else None)
