"""Tests of measure.occupancy: the calculator against hand computation, trace parsing, Triton metadata."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from perfbudget.measure.occupancy import (
    ARCHS,
    _parse_resource_usage,
    achieved_occupancy,
    arch_for_capability,
    kernel_records,
    theoretical_occupancy,
    triton_kernel_resources,
    triton_occupancy,
)

TRACE = Path(__file__).parent.parent / "data" / "measure" / "kernels_trace.json"


# Hand computations. sm_90: 64 warps, 32 blocks, 65,536 registers and 228 KiB (233,472 B) of
# shared memory per SM; registers go per warp in 256-register units; shared memory per block is
# rounded up to 128 B and 1 KiB (1,024 B) is reserved per block. sm_80: same, 164 KiB (167,936 B).
@pytest.mark.parametrize(
    ("config", "blocks", "occupancy", "limiter"),
    [
        # 256 threads = 8 warps; regs 32*32 = 1024/warp -> 8,192/block -> 65536/8192 = 8 blocks;
        # warps 64/8 = 8 blocks; smem 233472/1024 = 228; cap 32 -> 8 blocks = 64 warps = 100 %.
        (dict(threads_per_block=256, registers_per_thread=32), 8, 1.0, "warps"),
        # 128 threads = 4 warps; regs 128*32 = 4096/warp -> 16,384/block -> 4 blocks;
        # warps 64/4 = 16 -> 4 blocks = 16 warps = 25 %.
        (dict(threads_per_block=128, registers_per_thread=128), 4, 0.25, "registers"),
        # 256 threads = 8 warps; regs 33*32 = 1056 -> rounded to 1280/warp -> 10,240/block ->
        # 65536/10240 = 6.4 -> 6 blocks = 48 warps = 75 % (without the 256 granularity: 7, 87.5 %).
        (dict(threads_per_block=256, registers_per_thread=33), 6, 0.75, "registers"),
        # 128 threads = 4 warps, 32 regs -> 16 blocks by regs; smem 48 KiB + 1 KiB = 50,176 B ->
        # 233472/50176 = 4.65 -> 4 blocks = 16 warps = 25 %.
        (
            dict(threads_per_block=128, registers_per_thread=32, shared_mem_per_block_bytes=49152),
            4,
            0.25,
            "shared_memory",
        ),
        # 32 threads = 1 warp, 16 regs -> 512/warp -> 128 blocks by regs; warps 64; cap 32 ->
        # 32 blocks = 32 warps = 50 %.
        (dict(threads_per_block=32, registers_per_thread=16), 32, 0.5, "blocks"),
        # sm_80: 256 threads = 8 warps, 64 regs -> 2048/warp -> 16,384/block -> 4 blocks;
        # smem 16 KiB + 1 KiB = 17,408 -> 167936/17408 = 9.6 -> 9 -> 4 blocks = 32 warps = 50 %.
        (
            dict(
                threads_per_block=256,
                registers_per_thread=64,
                shared_mem_per_block_bytes=16384,
                arch="sm_80",
            ),
            4,
            0.5,
            "registers",
        ),
        # sm_80: 64 threads = 2 warps, 24 regs -> 768/warp -> 1536/block -> 42 blocks; smem 41,000 ->
        # rounded 41,088 + 1,024 = 42,112 -> 167936/42112 = 3.99 -> 3 blocks = 6 warps = 9.375 %
        # (without rounding and reserve: 167936/41000 = 4.1 -> 4 blocks).
        (
            dict(
                threads_per_block=64,
                registers_per_thread=24,
                shared_mem_per_block_bytes=41000,
                arch="sm80",
            ),
            3,
            0.09375,
            "shared_memory",
        ),
        # sm_90: 1000 threads -> 32 warps (last one partial), 64 regs -> 2048/warp -> 65536/block ->
        # 1 block; warps 64/32 = 2 -> 1 block = 32 warps = 50 %.
        (dict(threads_per_block=1000, registers_per_thread=64), 1, 0.5, "registers"),
    ],
)
def test_calculator_matches_hand_computation(
    config: dict, blocks: int, occupancy: float, limiter: str
) -> None:
    result = theoretical_occupancy(**config)
    assert result.active_blocks_per_sm == blocks
    assert result.occupancy == pytest.approx(occupancy)
    assert result.limiter == limiter


def test_calculator_rejects_unlaunchable_configs() -> None:
    with pytest.raises(ValueError, match="threads_per_block"):
        theoretical_occupancy(threads_per_block=2048, registers_per_thread=32)
    with pytest.raises(ValueError, match="registers_per_thread"):
        theoretical_occupancy(threads_per_block=128, registers_per_thread=256)
    with pytest.raises(ValueError, match="shared_mem_per_block_bytes"):
        theoretical_occupancy(
            threads_per_block=128, registers_per_thread=32, shared_mem_per_block_bytes=228 * 1024
        )
    # 1024 threads x 128 registers = 131,072 > 65,536 registers per block.
    with pytest.raises(ValueError, match="launch would fail"):
        theoretical_occupancy(threads_per_block=1024, registers_per_thread=128)
    with pytest.raises(ValueError, match="unknown arch"):
        theoretical_occupancy(threads_per_block=32, registers_per_thread=32, arch="sm_75")


def test_arch_lookup() -> None:
    assert arch_for_capability(9, 0) is ARCHS["sm_90"]
    assert arch_for_capability(8, 0).smem_per_sm_bytes == 164 * 1024
    with pytest.raises(KeyError, match="sm_75"):
        arch_for_capability(7, 5)


def test_constructed_trace_gives_expected_weighted_occupancy() -> None:
    result = achieved_occupancy(TRACE)
    # Kernels with an estimate: 100 us at 50 % (new key), 300 us at 25 % (old key "theoretical
    # occupancy %", category "Kernel"), 200 + 400 us at 100 %:
    # (100*50 + 300*25 + 600*100) / 1000 = 72.5 %. The 50 us kernel without an estimate is not
    # weighted; the memcpy, the CPU op and the instant event are not kernels.
    assert result.occupancy == pytest.approx(0.725)
    assert result.occupancy_pct == pytest.approx(72.5)
    assert result.scale == "percent"
    assert (result.kernels, result.kernels_with_estimate) == (5, 4)
    assert result.kernel_time_us == 1050 and result.covered_time_us == 1000
    name, (time_us, occ) = next(iter(result.by_kernel.items()))
    assert name == "void at::native::reduce_kernel<512, 1>" and time_us == 600 and occ == 1.0


def test_fraction_scale_and_dict_input() -> None:
    trace = {
        "traceEvents": [
            {
                "ph": "X",
                "cat": "kernel",
                "name": "a",
                "dur": 10,
                "args": {"est. achieved occupancy %": 0.5},
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": "b",
                "dur": 30,
                "args": {"est. achieved occupancy": 0.25},
            },
        ]
    }
    result = achieved_occupancy(trace)
    assert result.scale == "fraction"
    assert result.occupancy == pytest.approx((10 * 0.5 + 30 * 0.25) / 40)


def test_gzipped_trace_and_records(tmp_path: Path) -> None:
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(TRACE.read_bytes()))
    assert achieved_occupancy(gz).occupancy == pytest.approx(0.725)
    records = kernel_records(gz)
    gemm = records[0]
    assert gemm.registers_per_thread == 168 and gemm.shared_memory_bytes == 213248
    assert gemm.block == (128, 1, 1) and gemm.grid == (128, 1, 1)
    assert achieved_occupancy(records).occupancy == pytest.approx(0.725)


def test_bare_array_trace(tmp_path: Path) -> None:
    path = tmp_path / "bare.json"
    path.write_text(
        json.dumps(
            [
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": "k",
                    "dur": 5,
                    "args": {"est. achieved occupancy %": 40},
                }
            ]
        )
    )
    assert achieved_occupancy(path).occupancy == pytest.approx(0.4)


def test_no_kernels_means_no_estimate() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.randn(8, 8).sum()
    result = achieved_occupancy(prof)
    assert result.occupancy is None and result.kernels == 0


def test_parse_cuobjdump_resource_usage() -> None:
    text = """
Resource usage:
 Common:
  GLOBAL:0
 Function other:
  REG:90 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:576 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function add_kernel:
  REG:30 STACK:8 SHARED:0 LOCAL:16 CONSTANT[0]:576 TEXTURE:0 SURFACE:0 SAMPLER:0
"""
    assert _parse_resource_usage(text, "add_kernel") == (30, 16)
    assert _parse_resource_usage(text, "missing") is None


@pytest.fixture(scope="module")
def compiled_add() -> object:
    triton = pytest.importorskip("triton")
    tl = pytest.importorskip("triton.language")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if shutil.which("cuobjdump") is None and not Path(triton.knobs.nvidia.cuobjdump.path).exists():
        pytest.skip("no cuobjdump to read registers from the cubin")

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[name-defined]
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(
            out_ptr + offs,
            tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
            mask=mask,
        )

    src = ASTSource(
        fn=add_kernel,
        signature={
            "x_ptr": "*fp32",
            "y_ptr": "*fp32",
            "out_ptr": "*fp32",
            "n": "i32",
            "BLOCK": "constexpr",
        },
        constexprs={"BLOCK": 1024},
    )
    # Compiling for an explicit target needs no GPU: ptxas and cuobjdump ship with Triton.
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


def test_triton_kernel_occupancy_from_metadata(compiled_add: object) -> None:
    res = triton_kernel_resources(compiled_add)
    assert res.name == "add_kernel" and res.num_warps == 4 and res.arch == "sm_90"
    assert res.shared_bytes == 0 and res.registers_source == "cuobjdump"
    assert res.registers_per_thread is not None and 0 < res.registers_per_thread <= 255
    occ = triton_occupancy(compiled_add)
    expected = theoretical_occupancy(
        threads_per_block=128, registers_per_thread=res.registers_per_thread, arch="sm_90"
    )
    assert occ == expected
    # Same kernel judged against A100 limits.
    assert triton_occupancy(res, arch="sm_80") is not None


def test_triton_occupancy_unavailable_without_registers() -> None:
    from perfbudget.measure.occupancy import TritonKernelResources

    res = TritonKernelResources(
        name="k",
        num_warps=4,
        shared_bytes=0,
        registers_per_thread=None,
        local_bytes=None,
        arch="sm_90",
        registers_source="unavailable",
    )
    assert triton_occupancy(res) is None
