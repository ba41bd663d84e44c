"""The Triton kernels' tests on a CPU: a child process under the Triton interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def run_interpreted(child: str) -> dict[str, Any]:
    """Run the Python source ``child`` with ``TRITON_INTERPRET=1`` (set before triton is first imported, as
    the kernels need) and return the JSON it prints after ``RESULT``."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    result: dict[str, Any] = json.loads(line[len("RESULT"):])
    return result
