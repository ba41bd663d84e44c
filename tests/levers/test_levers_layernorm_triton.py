"""Triton LayerNorm kernels (forward and backward) on CPU under TRITON_INTERPRET=1, in a subprocess.

The interpreter flag is read when kernels are decorated and is process-wide, so it is
set only in a child process; this test session's own Triton state stays untouched.
The unit tests run it on the oldest triton pyproject.toml allows, and
scripts/test-triton-newest.sh on the newest.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.levers.support import run_interpreted

pytest.importorskip("triton")
pytest.importorskip("numpy")  # the interpreter runs on numpy

CHILD = textwrap.dedent(
    """
    import json
    import torch
    import torch.nn.functional as F
    import triton
    from torchlevers.layernorm import fp32_stats_layer_norm, select_backend

    torch.set_num_threads(1)
    out = {"triton": triton.__version__}
    g = torch.Generator().manual_seed(0)

    def errors(x, w, b, dtype):
        x = x.to(dtype).requires_grad_()
        w = w.clone().requires_grad_(); b = b.clone().requires_grad_()
        y = fp32_stats_layer_norm(x, x.shape[-1:], w, b, backend="triton")
        dy = torch.randn(y.shape, generator=g).to(dtype)
        dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
        xr = x.detach().float().requires_grad_()
        wr = w.detach().clone().requires_grad_(); br = b.detach().clone().requires_grad_()
        yr = F.layer_norm(xr, x.shape[-1:], wr, br)
        rx, rw, rb = torch.autograd.grad(yr, (xr, wr, br), dy.float())
        # Same dtype rounding as the kernel output: compare with the reference rounded to dtype.
        return {
            "dtype_out": str(y.dtype), "dtype_dx": str(dx.dtype),
            "finite": bool(torch.isfinite(y).all() and torch.isfinite(dx).all()),
            "y": float((y.detach().float() - yr.detach().to(dtype).float()).abs().max()),
            "dx": float((dx.float() - rx.to(dtype).float()).abs().max()),
            # Sums over rows: error relative to the largest entry.
            "dw": float((dw - rw).abs().max() / rw.abs().max()),
            "db": float((db - rb).abs().max() / rb.abs().max()),
        }

    x = torch.randn(37, 3, 96, generator=g) * 3 + 1
    w = torch.randn(96, generator=g); b = torch.randn(96, generator=g)
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        out[str(dt)] = errors(x, w, b, dt)
    big = 2000 + 300 * torch.randn(16, 512, generator=g)
    out["large_fp16"] = errors(big, torch.ones(512), torch.zeros(512), torch.float16)
    out["backend"] = select_backend(x, 96, "triton")
    # Affine parameters that are views with a stride (every other element), or absent, or a bias alone.
    xs = torch.randn(5, 96, generator=g)
    ws, bs = torch.randn(192, generator=g)[::2], torch.randn(192, generator=g)[::2]
    out["affine"] = {
        name: float((fp32_stats_layer_norm(xs, 96, wt, bt, backend="triton") - F.layer_norm(xs, (96,), wt, bt)).abs().max())
        for name, wt, bt in (("strided", ws, bs), ("none", None, None), ("bias only", None, bs))
    }
    # Rows longer than the kernel's block limit are refused with a reason.
    try:
        select_backend(torch.randn(2, 20000), 20000, "triton")
        out["refused"] = ""
    except RuntimeError as exc:
        out["refused"] = str(exc)
    print("RESULT" + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def child_result() -> dict[str, object]:
    return run_interpreted(CHILD)


def test_triton_kernels_run_under_the_interpreter(child_result: dict[str, object]) -> None:
    import triton

    # The child ran the triton this session imports (scripts/test-triton-newest.sh shadows
    # the venv's one through PYTHONPATH, which the child inherits).
    assert child_result["triton"] == triton.__version__
    assert child_result["backend"] == "triton"
    assert "20000 features" in str(child_result["refused"])


def test_triton_matches_f_layer_norm_in_fp32(child_result: dict[str, object]) -> None:
    r = child_result["torch.float32"]
    assert isinstance(r, dict)
    assert r["dtype_out"] == "torch.float32"
    assert max(r["y"], r["dx"], r["dw"], r["db"]) <= 1e-5


@pytest.mark.parametrize(("key", "ulp"), [("torch.float16", 2**-10), ("torch.bfloat16", 2**-7)])
def test_triton_half_inputs_round_like_the_reference(child_result: dict[str, object], key: str, ulp: float) -> None:
    r = child_result[key]
    assert isinstance(r, dict)
    assert r["dtype_out"] == key and r["dtype_dx"] == key and r["finite"]
    # Outputs up to ~8 in magnitude: at most one rounding step of the dtype there.
    assert r["y"] <= 8 * ulp
    assert r["dx"] <= 8 * ulp
    assert max(r["dw"], r["db"]) <= 1e-4  # fp32 accumulations, relative


def test_triton_large_fp16_activations_finite(child_result: dict[str, object]) -> None:
    r = child_result["large_fp16"]
    assert isinstance(r, dict)
    assert r["finite"]
    assert r["y"] <= 4 * 2**-10 * 4


def test_triton_reads_strided_and_absent_affine_parameters(child_result: dict[str, object]) -> None:
    errors = child_result["affine"]
    assert isinstance(errors, dict) and set(errors) == {"strided", "none", "bias only"}
    assert all(e < 1e-5 for e in errors.values()), errors


def test_warps_grow_with_the_row_width() -> None:
    from torchlevers._triton_layernorm import _num_warps

    assert [_num_warps(b) for b in (64, 256, 1024, 2048, 16384)] == [1, 1, 4, 8, 8]
