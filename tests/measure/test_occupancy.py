"""Tests of measure.occupancy: the calculator against hand computation, sm_occupancy of traces from launch
parameters, Triton metadata."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from perfbudget.measure.occupancy import (
    ARCHS,
    _parse_resource_usage,
    achieved_occupancy,
    arch_for_capability,
    kernel_records,
    theoretical_occupancy,
    trace_devices,
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
        # Registers go per sub-partition (4 per SM, 16,384 registers each), as cuda_occupancy.h allocates them:
        # 224 threads = 7 warps, 40 regs -> 1280/warp -> 16384/1280 = 12 warps per sub-partition -> 48 per SM
        # -> 48/7 = 6 blocks = 42 warps = 65.6 % (65536/8960 = 7 blocks, 76.6 %, over the SM as one pool).
        (dict(threads_per_block=224, registers_per_thread=40), 6, 42 / 64, "registers"),
        # 160 threads = 5 warps, 40 regs -> 48 warps -> 9 blocks = 45 warps = 70.3 % (not 10, 78.1 %).
        (dict(threads_per_block=160, registers_per_thread=40), 9, 45 / 64, "registers"),
        # 32 threads = 1 warp, 96 regs -> 3072/warp -> 5 per sub-partition -> 20 blocks = 31.25 % (not 21).
        (dict(threads_per_block=32, registers_per_thread=96), 20, 20 / 64, "registers"),
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
        # The occupancy calculator's basic cases on both archs (64 warps, 32 blocks, 65,536
        # registers per SM on sm_80 and sm_90): 256 threads = 8 warps, 32 regs -> 1024/warp ->
        # 8,192/block -> 8 blocks; warps 64/8 = 8 -> 8 blocks = 64 warps = 100 %.
        (dict(threads_per_block=256, registers_per_thread=32, arch="sm_80"), 8, 1.0, "warps"),
        (dict(threads_per_block=256, registers_per_thread=32, arch="sm_90"), 8, 1.0, "warps"),
        # 256 threads, 64 regs -> 2048/warp -> 16,384/block -> 4 blocks = 32 warps = 50 %.
        (dict(threads_per_block=256, registers_per_thread=64, arch="sm_80"), 4, 0.5, "registers"),
        (dict(threads_per_block=256, registers_per_thread=64, arch="sm_90"), 4, 0.5, "registers"),
        # 256 threads, 64 regs, 80 KiB opt-in shared memory (the issue's GEMM-like kernel):
        # regs -> 4 blocks; smem 81,920 + 1,024 = 82,944 B -> sm_90 233472/82944 = 2.8 -> 2 blocks
        # = 16 warps = 25 %; sm_80 167936/82944 = 2.02 -> 2 blocks = 25 %.
        (
            dict(threads_per_block=256, registers_per_thread=64, shared_mem_per_block_bytes=81920),
            2,
            0.25,
            "shared_memory",
        ),
        (
            dict(
                threads_per_block=256,
                registers_per_thread=64,
                shared_mem_per_block_bytes=81920,
                arch="sm_80",
            ),
            2,
            0.25,
            "shared_memory",
        ),
        # 100 KiB: 102,400 + 1,024 = 103,424 B -> sm_90 233472/103424 = 2.26 -> 2 blocks = 25 %;
        # sm_80 167936/103424 = 1.62 -> 1 block = 8 warps = 12.5 %.
        (
            dict(threads_per_block=256, registers_per_thread=32, shared_mem_per_block_bytes=102400),
            2,
            0.25,
            "shared_memory",
        ),
        (
            dict(
                threads_per_block=256,
                registers_per_thread=32,
                shared_mem_per_block_bytes=102400,
                arch="sm_80",
            ),
            1,
            0.125,
            "shared_memory",
        ),
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
    # 23 warps x 2,816 registers = 64,768 fit a block, but the hardware counts 24 warps (a multiple of the 4
    # sub-partitions): 67,584 > 65,536.
    with pytest.raises(ValueError, match="67584 registers per block exceed 65536 on sm_90"):
        theoretical_occupancy(threads_per_block=736, registers_per_thread=88)
    with pytest.raises(ValueError, match="unknown arch"):
        theoretical_occupancy(threads_per_block=32, registers_per_thread=32, arch="sm_75")


def test_arch_lookup() -> None:
    assert arch_for_capability(9, 0) is ARCHS["sm_90"]
    assert arch_for_capability(8, 0).smem_per_sm_bytes == 164 * 1024
    with pytest.raises(KeyError, match="sm_75"):
        arch_for_capability(7, 5)


def test_grid_caps_the_resident_blocks() -> None:
    # 256 threads, 32 regs: 8 blocks per SM by resources. 66 blocks on 132 SMs: the busiest SM
    # holds ceil(66/132) = 1 block, the mean SM 0.5 blocks = 4 warps of 64 = 6.25 %.
    small = theoretical_occupancy(
        threads_per_block=256, registers_per_thread=32, grid_blocks=66, num_sms=132
    )
    assert small.limiter == "grid" and small.active_blocks_per_sm == 1
    assert small.mean_blocks_per_sm == pytest.approx(0.5) and small.occupancy == pytest.approx(
        0.0625
    )
    assert small.blocks_limit["grid"] == 1
    # 8 * 132 = 1056 blocks fill every SM exactly: resource-bound, 100 %.
    full = theoretical_occupancy(
        threads_per_block=256, registers_per_thread=32, grid_blocks=1056, num_sms=132
    )
    assert full.limiter == "warps" and full.occupancy == 1.0 and full.active_blocks_per_sm == 8
    # 200 blocks with 2 per SM allowed (80 KiB smem): the busiest SM holds 2 = ceil(200/132), yet
    # the mean is 200/132 = 1.515 blocks = 12.1 warps = 18.9 %, so the grid is the limiter.
    part = theoretical_occupancy(
        threads_per_block=256,
        registers_per_thread=64,
        shared_mem_per_block_bytes=81920,
        grid_blocks=200,
        num_sms=132,
    )
    assert part.limiter == "grid" and part.active_blocks_per_sm == 2
    assert part.occupancy == pytest.approx(200 / 132 * 8 / 64)
    # Without a grid the result is unchanged from the calculator's.
    assert (
        theoretical_occupancy(threads_per_block=256, registers_per_thread=32).mean_blocks_per_sm
        == 8.0
    )
    with pytest.raises(ValueError, match="num_sms=None"):
        theoretical_occupancy(threads_per_block=256, registers_per_thread=32, grid_blocks=66)
    with pytest.raises(ValueError, match="grid_blocks=0"):
        theoretical_occupancy(
            threads_per_block=256, registers_per_thread=32, grid_blocks=0, num_sms=132
        )


# cudaDeviceProp of an H200 as kineto writes it in "deviceProperties" (DeviceProperties.cpp).
H200_PROPS: dict[str, Any] = {
    "id": 0,
    "name": "NVIDIA H200",
    "totalGlobalMem": 150_000_000_000,
    "computeMajor": 9,
    "computeMinor": 0,
    "maxThreadsPerBlock": 1024,
    "maxThreadsPerMultiprocessor": 2048,
    "regsPerBlock": 65536,
    "warpSize": 32,
    "sharedMemPerBlock": 49152,
    "numSms": 132,
    "regsPerMultiprocessor": 65536,
    "sharedMemPerBlockOptin": 232448,
    "sharedMemPerMultiprocessor": 233472,
}


def _kernel(name: str, dur: float, **args: Any) -> dict[str, Any]:
    """A kineto kernel event; ``args`` spelled with underscores for the keys' spaces."""
    keys = {
        "regs": "registers per thread",
        "smem": "shared memory",
        "kineto": "est. achieved occupancy %",
    }
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "pid": 0,
        "tid": 7,
        "ts": 0,
        "dur": dur,
        "args": {"device": 0, "stream": 7, **{keys.get(k, k): v for k, v in args.items()}},
    }


def _trace(*kernels: dict[str, Any], props: dict[str, Any] | None = H200_PROPS) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "deviceProperties": [props] if props else [],
        "traceEvents": list(kernels),
    }


# The issue's trace: 100 us of a full 256-thread kernel, 900 us of a 256-thread kernel with 64
# registers and 80 KiB of shared memory that kineto (48 KB default limit) reads 0, and 50 us of
# a kernel whose estimate failed (-100) and which carries no resources.
ISSUE_KERNELS = (
    _kernel("k1", 100, grid=[4224, 1, 1], block=[256, 1, 1], regs=32, smem=0, kineto=100),
    _kernel("k2", 900, grid=[528, 1, 1], block=[256, 1, 1], regs=64, smem=81920, kineto=0),
    _kernel("k3", 50, grid=[1320, 1, 1], block=[128, 1, 1], kineto=-100),
)


def test_issue_three_kernel_trace_reads_launch_occupancy() -> None:
    result = achieved_occupancy(_trace(*ISSUE_KERNELS))
    # k1: 8 blocks = 100 %; k2: 2 blocks by shared memory = 25 %; k3 left out:
    # (100 * 1.0 + 900 * 0.25) / 1000 = 0.325. Kineto's own mean, -100 included, read 0.048.
    assert result.occupancy is not None and 0.31 <= result.occupancy <= 0.36
    assert result.occupancy == pytest.approx(0.325)
    assert result.occupancy != pytest.approx(0.048, abs=0.01)
    assert (result.kernels, result.kernels_computed) == (3, 2)
    assert result.computed_time_us == 1000 and result.left_out_time_us == 50
    assert result.left_out == {"no registers per thread in the trace": (1, 50.0)}
    assert result.left_out_fraction == pytest.approx(50 / 1050)
    line = result.left_out_line()
    assert line is not None and "4.8 % of kernel time" in line and "no registers per thread" in line
    # The cross-check leaves -100 out: (100 * 100 + 900 * 0) / 1000 = 10 %.
    assert result.kineto_occupancy == pytest.approx(0.10) and result.kineto_time_us == 1000
    assert result.by_kernel == {"k2": (900.0, 0.25), "k1": (100.0, 1.0)}


def test_issue_trace_with_resources_for_the_failed_kernel() -> None:
    k3 = _kernel("k3", 50, grid=[1320, 1, 1], block=[128, 1, 1], regs=40, smem=0, kineto=-100)
    result = achieved_occupancy(_trace(*ISSUE_KERNELS[:2], k3))
    # k3: 4 warps, 40 regs -> 1280/warp -> 5,120/block -> 12 blocks by registers; the grid gives
    # 1320/132 = 10 blocks per SM = 40 warps = 62.5 %. (100 + 225 + 50 * 0.625) / 1050 = 0.3393.
    assert result.occupancy == pytest.approx((100 + 225 + 50 * 0.625) / 1050)
    assert result.occupancy is not None and 0.31 <= result.occupancy <= 0.36
    assert result.left_out == {} and result.left_out_line() is None
    assert result.kineto_occupancy == pytest.approx(0.10)


def test_only_failed_estimates_give_no_occupancy() -> None:
    result = achieved_occupancy(
        _trace(
            _kernel("a", 30, kineto=-100),
            _kernel("b", 20, kineto=-100, grid=[1, 1, 1], block=[32, 1, 1]),
        )
    )
    assert result.occupancy is None
    assert result.kineto_occupancy is None and result.kineto_time_us == 0
    assert result.kernels == 2 and result.kernels_computed == 0 and result.left_out_time_us == 50


def test_sentinels_never_enter_the_cross_check() -> None:
    result = achieved_occupancy(
        _trace(
            _kernel("a", 10, kineto=50),
            _kernel("b", 10, kineto=-100),
            _kernel("c", 10, kineto=-3),
            _kernel("d", 10, kineto=150),
            _kernel("e", 10, kineto="n/a"),
            _kernel("f", 10),
        )
    )
    assert result.kineto_occupancy == pytest.approx(0.5) and result.kineto_time_us == 10


def test_small_grid_reads_low_occupancy() -> None:
    # 8 blocks of 256 threads on 132 SMs: 8/132 blocks per SM on average = 0.48 warps of 64.
    small = achieved_occupancy(
        _trace(_kernel("k", 10, grid=[8, 1, 1], block=[256, 1, 1], regs=32, smem=0))
    )
    assert small.occupancy == pytest.approx(8 / 132 * 8 / 64)
    assert small.occupancy is not None and small.occupancy < 0.01
    big = achieved_occupancy(
        _trace(_kernel("k", 10, grid=[8, 132, 1], block=[256, 1, 1], regs=32, smem=0))
    )
    assert big.occupancy == 1.0


def test_device_properties_override_the_table() -> None:
    kernel = _kernel("k", 10, grid=[528, 1, 1], block=[256, 1, 1], regs=32, smem=0)
    # An H100 PCIe has 114 SMs: 528 blocks are 4.6 per SM, under the 8 resources allow.
    pcie = achieved_occupancy(_trace(kernel, props={**H200_PROPS, "numSms": 114}))
    assert pcie.occupancy == pytest.approx(528 / 114 * 8 / 64)
    # A smaller shared-memory carve-out from the trace is used, not the table's 228 KiB:
    # 100 KiB + 1 KiB per block -> 1 block of 8 warps = 12.5 %.
    carve = achieved_occupancy(
        _trace(
            _kernel("k", 10, grid=[4224, 1, 1], block=[256, 1, 1], regs=32, smem=50 * 1024),
            props={**H200_PROPS, "sharedMemPerMultiprocessor": 100 * 1024},
        )
    )
    assert carve.occupancy == pytest.approx(0.125)
    devices = trace_devices(_trace(props=H200_PROPS))
    assert devices[0].num_sms == 132 and devices[0].arch == ARCHS["sm_90"]


def test_devices_without_limits_are_left_out_and_named() -> None:
    kernel = _kernel("k", 10, grid=[528, 1, 1], block=[256, 1, 1], regs=32, smem=0)
    b200 = achieved_occupancy(_trace(kernel, props={**H200_PROPS, "computeMajor": 10}))
    assert b200.occupancy is None and "sm_100" in next(iter(b200.left_out))
    # kineto writes maxSharedMemoryPerMultiProcessor for ROCm devices only; gfx90a says 9.0.
    rocm = {
        k: v
        for k, v in H200_PROPS.items()
        if k not in ("regsPerMultiprocessor", "sharedMemPerBlockOptin")
    }
    mi250 = achieved_occupancy(
        _trace(kernel, props={**rocm, "warpSize": 64, "maxSharedMemoryPerMultiProcessor": 65536})
    )
    assert mi250.occupancy is None and "not a CUDA GPU" in next(iter(mi250.left_out))
    none = achieved_occupancy(_trace(kernel, props=None))
    assert none.occupancy is None and next(iter(none.left_out)).startswith("no device limits")
    # Without the trace's properties, arch and num_sms supply them.
    given = achieved_occupancy(_trace(kernel, props=None), arch="sm_90", num_sms=132)
    assert given.occupancy == pytest.approx(528 / 132 * 8 / 64)
    no_sms = achieved_occupancy(_trace(kernel, props=None), arch="sm_90")
    assert no_sms.occupancy is None and next(iter(no_sms.left_out)).startswith("SM count unknown")
    with pytest.raises(ValueError, match="numSms must be a positive integer, got -1"):
        achieved_occupancy(_trace(kernel, props={**H200_PROPS, "numSms": -1}))


def test_unlaunchable_kernel_is_left_out() -> None:
    ok = _kernel("ok", 10, grid=[4224, 1, 1], block=[256, 1, 1], regs=32, smem=0)
    bad = _kernel("bad", 5, grid=[1, 1, 1], block=[2048, 1, 1], regs=32, smem=0)
    result = achieved_occupancy(_trace(ok, bad))
    assert result.occupancy == 1.0 and result.left_out == {
        "launch outside the device limits": (1, 5.0)
    }


def test_recorded_trace_parses() -> None:
    result = achieved_occupancy(TRACE)
    # H100, 132 SMs, no regsPerMultiprocessor/sharedMemPerBlockOptin in this trace (table values):
    # - GEMM, 100 us: 128 threads, 168 regs -> 5376/warp -> 3 blocks; 213,248 + 1,024 B smem ->
    #   1 block; grid 128 < 132 -> 128/132 blocks of 4 warps = 6.06 % (kineto says 50);
    # - add, 300 us: 4 warps, 32 regs -> 16 blocks; grid 1024/132 = 7.76 blocks = 48.5 %;
    # - reduce, 200 + 400 us: 512 threads = 16 warps -> 4 blocks; grid 264/132 = 2 blocks = 50 %;
    # - the Triton kernel (50 us) has no registers: left out. The memcpy, the CPU op and the
    #   instant event are not kernels.
    expected = (100 * (128 / 132 * 4 / 64) + 300 * (1024 / 132 * 4 / 64) + 600 * 0.5) / 1000
    assert result.occupancy == pytest.approx(expected)
    assert result.occupancy == pytest.approx(0.4515, abs=1e-4)
    assert (result.kernels, result.kernels_computed) == (5, 4)
    assert result.kernel_time_us == 1050 and result.computed_time_us == 1000
    assert result.left_out == {"no registers per thread in the trace": (1, 50.0)}
    # Kineto's estimates (both key spellings): (100*50 + 300*25 + 600*100) / 1000 = 72.5 %.
    assert result.kineto_occupancy == pytest.approx(0.725) and result.kineto_scale == "percent"
    name, (time_us, occ) = next(iter(result.by_kernel.items()))
    assert name == "void at::native::reduce_kernel<512, 1>" and time_us == 600 and occ == 0.5


def test_fraction_scale_cross_check_and_dict_input() -> None:
    trace = _trace(
        _kernel("a", 10, kineto=0.5),
        {
            "ph": "X",
            "cat": "kernel",
            "name": "b",
            "dur": 30,
            "args": {"est. achieved occupancy": 0.25},
        },
    )
    result = achieved_occupancy(trace)
    assert result.kineto_scale == "fraction" and result.occupancy is None
    assert result.kineto_occupancy == pytest.approx((10 * 0.5 + 30 * 0.25) / 40)
    # Kineto's integer percent values of 0 and 1 stay percent.
    ints = achieved_occupancy(_trace(_kernel("a", 10, kineto=0), _kernel("b", 10, kineto=1)))
    assert ints.kineto_scale == "percent" and ints.kineto_occupancy == pytest.approx(0.005)


def test_gzipped_trace_and_records(tmp_path: Path) -> None:
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(TRACE.read_bytes()))
    assert achieved_occupancy(gz).occupancy == pytest.approx(0.4515, abs=1e-4)
    records = kernel_records(gz)
    gemm = records[0]
    assert gemm.registers_per_thread == 168 and gemm.shared_memory_bytes == 213248
    assert gemm.block == (128, 1, 1) and gemm.grid == (128, 1, 1) and gemm.device == 0
    # Parsed records carry no device properties: the limits come from the arguments.
    assert achieved_occupancy(records, arch="sm_90", num_sms=132).occupancy == pytest.approx(
        0.4515, abs=1e-4
    )
    assert achieved_occupancy(records).occupancy is None


def test_bare_array_trace(tmp_path: Path) -> None:
    path = tmp_path / "bare.json"
    path.write_text(
        json.dumps(
            [_kernel("k", 5, grid=[4224, 1, 1], block=[256, 1, 1], regs=32, smem=0, kineto=40)]
        )
    )
    assert achieved_occupancy(path, arch="sm_80", num_sms=108).occupancy == 1.0
    assert achieved_occupancy(path).kineto_occupancy == pytest.approx(0.4)


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
