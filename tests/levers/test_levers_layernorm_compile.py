"""fp32-statistics LayerNorm under torch.compile: the Triton kernels as the custom ops
``torchlevers::ln_fwd``/``ln_bwd`` (opcheck, a fullgraph dynamic compile), the PyTorch path
compiled, launches only inside the ops, and backend="auto"'s fallback warnings.

The Triton cases run their kernels under ``TRITON_INTERPRET=1`` in a child process, as
tests/levers/test_levers_layernorm_triton.py does; the rest run here, where
``torchlevers._triton_layernorm`` is imported without the interpreter (as on a GPU), so
they replace the kernel objects with recording fakes or never reach a launch.
"""

from __future__ import annotations

import inspect
import sys
import textwrap
from typing import Any

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from tests.levers.support import run_interpreted
from tests.measure.support import gpu_test
from torchlevers import layernorm
from torchlevers.layernorm import FP32StatsLayerNorm, select_backend

triton = pytest.importorskip("triton")
pytest.importorskip("numpy")  # the interpreter runs on numpy

CHILD = textwrap.dedent(
    """
    import json
    import torch
    from torch import nn
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters
    from torchlevers.layernorm import FP32StatsLayerNorm
    import torchlevers._triton_layernorm  # registers torchlevers::ln_fwd / ln_bwd

    torch.set_num_threads(1)
    out = {}
    g = torch.Generator().manual_seed(0)
    ops = torch.ops.torchlevers

    def opcheck(name, op, args):
        try:
            torch.library.opcheck(op, args)  # default test_utils, test_aot_dispatch_dynamic among them
            out[name] = ""
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"[:2000]

    for dtype in (torch.float32, torch.bfloat16):
        for affine in ("weight+bias", "none"):
            for grad in (True, False):
                x = torch.randn(5, 24, generator=g).to(dtype).requires_grad_(grad)
                w = torch.randn(24, generator=g).requires_grad_(grad) if affine != "none" else None
                b = torch.randn(24, generator=g).requires_grad_(grad) if affine != "none" else None
                opcheck(f"ln_fwd {dtype} {affine} grad={grad}", ops.ln_fwd.default, (x, w, b, 1e-5))
        x = torch.randn(5, 24, generator=g).to(dtype)
        _, mean, rstd = ops.ln_fwd(x, None, None, 1e-5)
        for w in (torch.randn(24, generator=g), None):
            opcheck(f"ln_bwd {dtype} weight={w is not None}", ops.ln_bwd.default,
                    (torch.randn(5, 24, generator=g).to(dtype), x, w, mean, rstd))

    # A model through the op, compiled fullgraph with dynamic shapes, at two sizes.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), FP32StatsLayerNorm(32, backend="triton"), nn.GELU(), nn.Linear(32, 4))
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    diffs, frames = [], []
    for rows in (6, 11):
        x = torch.randn(rows, 3, 16, generator=g)
        grads = []
        for fn in (model, compiled):
            model.zero_grad()
            y = fn(x)
            y.square().sum().backward()
            grads.append([y.detach()] + [p.grad.clone() for p in model.parameters()])
        diffs.append(max(float((a - e).abs().max()) for a, e in zip(*grads)))
        frames.append(counter.frame_count)
    out["compile"] = {
        "frames": frames,
        "graph_breaks": sum(counters["graph_break"].values()),
        "ops": sorted({str(n.target) for gm in counter.graphs for n in gm.graph.nodes if "torchlevers" in str(n.target)}),
        "max_diff": max(diffs),
    }
    print("RESULT" + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def child_result() -> dict[str, Any]:
    return run_interpreted(CHILD)


def test_opcheck_passes_on_both_ops(child_result: dict[str, Any]) -> None:
    checks = {k: v for k, v in child_result.items() if k.startswith("ln_")}
    assert len(checks) == 12  # 2 dtypes x (4 forward + 2 backward variants)
    assert {k: v for k, v in checks.items() if v} == {}


def test_triton_lever_compiles_fullgraph_dynamic_once(child_result: dict[str, Any]) -> None:
    r = child_result["compile"]
    assert r["graph_breaks"] == 0
    # The second size reuses the dynamic graph: no recompile. (The first compile may count
    # twice: dynamo restarts once to specialise the float eps the op takes.)
    assert r["frames"][0] == r["frames"][1]
    assert r["ops"] == ["torchlevers.ln_fwd"]  # dynamo's graph holds the op, not its launch
    assert r["max_diff"] <= 1e-6  # outputs and every parameter gradient, compiled vs eager


# -- in this process: no interpreter ----------------------------------------------------------


@pytest.fixture
def fresh_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget which inputs the kernels were found to refuse, and the warnings given."""
    monkeypatch.setattr(layernorm, "_problems", {})
    monkeypatch.setattr(layernorm, "_warned", set())


def test_torch_path_compiles_fullgraph_under_autocast(fresh_checks: None) -> None:
    # backend="auto" on CPU: select_backend and the autocast-off probe, traced with no break.
    torch.manual_seed(0)
    ln = FP32StatsLayerNorm(32)

    def fn(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return ln(x.bfloat16()).float()

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    for rows in (4, 9):
        x = torch.randn(rows, 32)
        got = compiled(x)
        got.sum().backward()
        compiled_grad = ln.weight.grad.clone()  # type: ignore[union-attr]
        ln.zero_grad()
        want = fn(x)
        want.sum().backward()
        assert torch.equal(got, want)
        assert torch.equal(compiled_grad, ln.weight.grad)  # type: ignore[arg-type]
        ln.zero_grad()
    assert counter.frame_count == 1


class _OpCalls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


class _RecordingKernel:
    """Stands in for a compiled Triton kernel: records each launch and the impl it ran in."""

    def __init__(self, launches: list[tuple[str, str | None, Any]], name: str) -> None:
        self.launches, self.name = launches, name

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def launch(*args: Any, **kwargs: Any) -> None:
            tk = sys.modules["torchlevers._triton_layernorm"]
            impl = next((f.function for f in inspect.stack() if f.filename == tk.__file__
                         and f.function in ("ln_fwd", "ln_bwd")), None)
            self.launches.append((self.name, impl, (grid, kwargs["num_warps"])))

        return launch


@pytest.fixture
def recorded_launches(monkeypatch: pytest.MonkeyPatch, fresh_checks: None) -> list[tuple[str, str | None, Any]]:
    from torchlevers import _triton_layernorm as tk

    launches: list[tuple[str, str | None, Any]] = []
    monkeypatch.setattr(tk, "_ln_fwd", _RecordingKernel(launches, "fwd"))
    monkeypatch.setattr(tk, "_ln_bwd", _RecordingKernel(launches, "bwd"))
    # CPU tensors take the kernel path (as under the interpreter); fp32 needs no conversion.
    monkeypatch.setattr(tk, "INTERPRET", True)
    return launches


# Launched with real ints (grid, num_warps), from the ops' implementations only.
EXPECTED_LAUNCHES = [
    ("fwd", "ln_fwd", ((3,), 2)), ("bwd", "ln_bwd", ((3,), 2)),
    ("fwd", "ln_fwd", ((5,), 2)), ("bwd", "ln_bwd", ((5,), 2)),
]


def test_eager_calls_go_through_the_ops(recorded_launches: list[Any]) -> None:
    ln = FP32StatsLayerNorm(300, backend="triton")
    for rows in (3, 5):
        calls = _OpCalls()
        with calls:
            ln(torch.randn(rows, 300, requires_grad=True)).sum().backward()
        ours = [n for n in calls.names if n.startswith("torchlevers")]
        assert ours == ["torchlevers.ln_fwd.default", "torchlevers.ln_bwd.default"]
    assert recorded_launches == EXPECTED_LAUNCHES


def test_compiled_graph_holds_the_op_and_never_the_launch(recorded_launches: list[Any]) -> None:
    # Dynamo runs frames under a dispatch mode eagerly, so the graph itself is inspected here.
    ln = FP32StatsLayerNorm(300, backend="triton")
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(ln, backend=counter, fullgraph=True, dynamic=True)
    frames = []
    for rows in (3, 5):
        compiled(torch.randn(rows, 300, requires_grad=True)).sum().backward()
        frames.append(counter.frame_count)
    assert frames[0] == frames[1]
    targets = [str(n.target) for n in counter.graphs[-1].graph.nodes if n.op == "call_function"]
    assert "torchlevers.ln_fwd" in targets
    assert recorded_launches == EXPECTED_LAUNCHES


def _cuda_like(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    # A tensor that says it lives on a CUDA device, with no CUDA here: backend="auto" asks
    # the kernels about it. Nothing reads its data.
    with FakeTensorMode():
        return torch.empty(shape, device="cuda", dtype=dtype)


@pytest.mark.parametrize(
    ("shape", "dtype", "reason"),
    [
        ((4, 64), torch.float64, "dtype torch.float64; the kernels take float16, bfloat16 and float32"),
        ((2, 20000), torch.float16, "20000 features; the kernels take at most 16384"),
        # The probe launch fails (here: no CUDA at all), as on a device triton cannot compile for.
        ((4, 64), torch.bfloat16, "cannot run them on cuda:0 (torch.bfloat16)"),
    ],
    ids=["dtype", "width", "device"],
)
def test_auto_falls_back_with_one_warning_per_reason(
    fresh_checks: None, shape: tuple[int, int], dtype: torch.dtype, reason: str
) -> None:
    x = _cuda_like(*shape, dtype=dtype)
    with pytest.warns(UserWarning, match="backend='auto' uses PyTorch") as record:
        assert select_backend(x, shape[-1]) == "torch"
        assert select_backend(x, shape[-1]) == "torch"
    assert len(record) == 1 and reason in str(record[0].message)
    with pytest.raises(RuntimeError, match="backend='triton' cannot take this input") as exc:
        select_backend(x, shape[-1], "triton")
    assert reason in str(exc.value)


@pytest.mark.parametrize(
    ("patch", "reason"),
    [
        (lambda mp: mp.setattr(triton, "__version__", "3.5.1"), "triton 3.5.1 is older than 3.6"),
        (lambda mp: mp.setitem(sys.modules, "triton", None), "triton cannot be imported"),
    ],
    ids=["old", "missing"],
)
def test_auto_falls_back_on_a_triton_it_cannot_use(
    fresh_checks: None, monkeypatch: pytest.MonkeyPatch, patch: Any, reason: str
) -> None:
    patch(monkeypatch)
    x = _cuda_like(4, 64)
    with pytest.warns(UserWarning, match=reason):
        assert select_backend(x, 64) == "torch"
    with pytest.raises(RuntimeError, match=reason):
        select_backend(x, 64, "triton")


def test_cpu_needs_the_interpreter_for_backend_triton(fresh_checks: None) -> None:
    from torchlevers import _triton_layernorm as tk

    if tk.INTERPRET:
        pytest.skip("this process runs the Triton interpreter")
    with pytest.raises(RuntimeError, match="set TRITON_INTERPRET=1"):
        select_backend(torch.randn(2, 8), 8, "triton")
    assert select_backend(torch.randn(2, 8), 8) == "torch"  # auto: CPU is not a fallback, no warning
    assert select_backend(torch.empty(0, 8), 8, "triton") == "torch"  # nothing to compute


# -- on a GPU: the compiled kernels ------------------------------------------------------------


@gpu_test
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("grad", [True, False])
def test_cuda_ops_pass_opcheck(dtype: torch.dtype, affine: bool, grad: bool) -> None:
    g = torch.Generator("cuda").manual_seed(0)
    x = torch.randn(37, 768, device="cuda", generator=g).to(dtype).requires_grad_(grad)
    w, b = (torch.randn(768, device="cuda", generator=g).requires_grad_(grad) if affine else None for _ in "wb")
    torch.library.opcheck(torch.ops.torchlevers.ln_fwd.default, (x, w, b, 1e-5))
    _, mean, rstd = torch.ops.torchlevers.ln_fwd(x.detach(), None, None, 1e-5)
    torch.library.opcheck(torch.ops.torchlevers.ln_bwd.default, (torch.randn_like(x).detach(), x.detach(), w.detach() if w is not None else None, mean, rstd))


@gpu_test
def test_cuda_lever_compiles_with_inductor(fresh_checks: None) -> None:
    # The raw launch failed here under dynamic=True ('SymNodeVariable' object has no attribute
    # 'value'): the op keeps dynamo out of it.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), FP32StatsLayerNorm(256), nn.GELU(), nn.Linear(256, 8)).cuda()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    frames = []
    for rows in (48, 80):
        x = torch.randn(rows, 64, device="cuda")
        assert select_backend(x.new_empty(rows, 256), 256) == "triton"
        results = []
        for fn in (model, compiled):
            model.zero_grad()
            y = fn(x)
            y.square().sum().backward()
            results.append([y.detach()] + [p.grad.clone() for p in model.parameters()])  # type: ignore[union-attr]
        for got, want in zip(*results, strict=True):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        frames.append(counter.frame_count)
    assert frames[0] == frames[1]
    assert any("torchlevers.ln_fwd" in str(n.target) for n in counter.graphs[-1].graph.nodes)


@gpu_test
def test_cuda_float64_falls_back_with_a_warning(fresh_checks: None) -> None:
    x = torch.randn(4, 64, device="cuda", dtype=torch.float64)
    with pytest.warns(UserWarning, match="dtype torch.float64"):
        y = FP32StatsLayerNorm(64).cuda().double()(x)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (64,)))
