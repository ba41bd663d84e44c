"""The allocator settled before timing: glibc's thresholds, torch's alignment, the setting and the side's environment."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from perfbudget.measure import allocator
from perfbudget.settings import RunSpec, Settings

PROBE = """
import json, os, sys
from perfbudget.measure import allocator
said = allocator.settle(sys.argv[1])
import torch
ts = [torch.empty((3 << 20) + 64 * i, dtype=torch.uint8) for i in range(4)]
print(json.dumps({"said": said, "aligned": all(t.data_ptr() % 4096 == 0 for t in ts),
                  "thp": os.environ.get("THP_MEM_ALLOC_ENABLE")}))
"""


def probe(mode: str, env: dict[str, str] | None = None) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                         env={k: v for k, v in (env or {}).items()} or None)
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_settled_before_torch_loads_aligns_large_blocks_and_says_settled() -> None:
    got = probe("settled")
    assert got == {"said": "settled", "aligned": True, "thp": "1"}


def test_as_is_leaves_the_process_alone() -> None:
    assert probe("as-is")["said"] == "as-is"
    assert allocator.environment("as-is") == {}


def test_settled_after_torch_allocated_says_what_it_could_not_settle() -> None:
    import torch  # this process allocated long ago, without the variable

    torch.empty(1)
    aligned = all(torch.empty((3 << 20) + 64 * i, dtype=torch.uint8).data_ptr() % 4096 == 0 for i in range(4))
    said = allocator.settle("settled")
    assert said == "settled" if aligned else "torch: large blocks unaligned" in said


def test_a_side_starts_settled_from_its_environment() -> None:
    env = allocator.environment("settled")
    assert env == {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
                   "THP_MEM_ALLOC_ENABLE": "1"}


def test_the_setting_is_one_of_two_named_where_it_came_from() -> None:
    assert Settings.resolve(env={}).allocator == "settled"
    assert Settings.resolve(env={"PERFBUDGET_ALLOCATOR": "as-is"}).allocator == "as-is"
    with pytest.raises(ValueError, match="PERFBUDGET_ALLOCATOR: expected one of settled, as-is, got 'jemalloc'"):
        Settings.resolve(env={"PERFBUDGET_ALLOCATOR": "jemalloc"})
    with pytest.raises(ValueError, match="ini: perfbudget_allocator"):
        Settings.resolve(ini={"perfbudget_allocator": "off"}, env={})
    with pytest.raises(ValueError, match="allocator: expected one of settled, as-is"):
        RunSpec(side="head", allocator="mmap")
    with pytest.raises(ValueError, match="allocator"):
        allocator.settle("mmap")
