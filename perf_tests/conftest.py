"""perf_tests set-up: one torch thread for CPU work, inductor's caches in the ignored .perfbudget/ folder."""

from pathlib import Path

import torch

from fixtures.workloads import inductor_dirs

inductor_dirs(Path(__file__).resolve().parent.parent / ".perfbudget")
# Timing pins one thread anyway; warming up (and compiling) at the same count keeps
# inductor's thread-specialised kernels and dynamo's guards identical to the measured runs.
torch.set_num_threads(1)
