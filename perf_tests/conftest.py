"""perf_tests set-up: one torch thread for CPU work, inductor's caches in the ignored .perfbudget/ folder."""

from pathlib import Path

import torch

from perfbudget.measure.compile_health import inductor_dirs

inductor_dirs(Path(__file__).resolve().parent.parent / ".perfbudget")
# Timing pins one thread anyway; warming up (and compiling) at the same count keeps
# inductor's thread-specialised kernels and dynamo's guards identical to the measured runs.
torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list) -> None:
    """Run the compiling tests last: compiling leaves the process changed (allocator state,
    worker threads, a ~10-40 % slower eager step measured here), which would shift every eager
    timing measured after it and make budgets depend on test selection."""
    items.sort(key=lambda item: "encoder_compiled" in getattr(item, "fixturenames", ()))
