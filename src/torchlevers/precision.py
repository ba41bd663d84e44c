"""Layered mixed precision: embeddings and loss in fp32, blocks under fp16/bf16 autocast, GradScaler only for fp16, per-module overrides by name pattern."""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

__all__ = [
    "MixedPrecision",
    "Precision",
    "PrecisionPolicy",
    "StepReport",
    "autocast_off",
    "count_nonfinite_grads",
]

Precision = Literal["fp32", "fp16", "bf16"]
_PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16")
_TORCH_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
_LOW = (torch.float16, torch.bfloat16)


@dataclass(frozen=True, kw_only=True)
class PrecisionPolicy:
    """Which parts of a model run in which precision; :meth:`apply` turns it into a :class:`MixedPrecision`.

    Example::

        policy = PrecisionPolicy(dtype="fp16", fp32_modules=("*embed*",))
        mp = policy.apply(model)            # before building the optimizer
        report = mp.step(lambda: model(x), lambda out: F.cross_entropy(out, y), opt)

    Parameters stay fp32 (master weights) everywhere; autocast casts them per
    op. A low-precision *copy* of optimizer state, as sometimes suggested, only
    helps if the optimizer actually reads it; ``torch.optim`` does not, so this
    policy does not make one.
    """

    dtype: Precision = "bf16"
    """Compute precision of the blocks (every module not matched below). "fp32" turns
    autocast off: the full-precision reference run."""
    fp32_modules: tuple[str, ...] = ("*embed*",)
    """``fnmatch`` patterns on qualified module names (as in ``model.named_modules()``)
    that run in fp32 with autocast off, their floating inputs upcast. The default keeps
    embeddings (and whatever their module contains, e.g. a projection and LayerNorm)
    in fp32: large embedding outputs overflow fp16 (max 65504)."""
    overrides: tuple[tuple[str, Precision], ...] | Mapping[str, Precision] = ()
    """``(pattern, precision)`` pairs checked before ``fp32_modules``; the first match wins,
    e.g. ``(("encoder.layers.0.*", "fp32"), ("head", "bf16"))``. A mapping (e.g. from a
    config file) is accepted and stored as pairs in its order."""
    loss_in_fp32: bool = True
    """Compute the loss with autocast off on fp32 inputs (softmax/log over a large vocabulary
    loses accuracy and overflows in fp16)."""
    device_type: Literal["auto", "cpu", "cuda"] = "auto"
    """Autocast device; "auto" takes the device of the model's first parameter."""
    init_scale: float = 2.0**16
    """fp16 only: initial GradScaler loss scale."""
    growth_interval: int = 2000
    """fp16 only: steps without overflow before the loss scale doubles."""
    skip_nonfinite: bool = True
    """Without a GradScaler (bf16/fp32): skip the optimizer step when a gradient is
    non-finite, as the scaler does for fp16, instead of writing inf/nan into the weights."""

    def __post_init__(self) -> None:
        if self.dtype not in _PRECISIONS:
            raise ValueError(f"dtype must be one of {_PRECISIONS}, got {self.dtype!r}")
        if isinstance(self.fp32_modules, str):
            raise ValueError(
                f"fp32_modules must be a tuple of patterns, got the string {self.fp32_modules!r} "
                f"(write ({self.fp32_modules!r},))"
            )
        object.__setattr__(self, "fp32_modules", tuple(self.fp32_modules))
        raw: Any = self.overrides
        if isinstance(raw, Mapping):
            raw = tuple(raw.items())
        overrides: tuple[Any, ...] = tuple(tuple(o) for o in raw)
        for i, item in enumerate(overrides):
            if len(item) != 2 or not isinstance(item[0], str):
                raise ValueError(f"overrides[{i}]: expected (pattern, precision), got {item!r}")
            if item[1] not in _PRECISIONS:
                raise ValueError(f"overrides[{i}] ({item[0]!r}): precision must be one of {_PRECISIONS}, got {item[1]!r}")
        object.__setattr__(self, "overrides", overrides)
        for i, pat in enumerate(self.fp32_modules):
            if not isinstance(pat, str):
                raise ValueError(f"fp32_modules[{i}]: expected a pattern string, got {pat!r}")
        if self.device_type not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device_type must be one of 'auto', 'cpu', 'cuda', got {self.device_type!r}")
        if not self.init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {self.init_scale!r}")
        if self.growth_interval < 1:
            raise ValueError(f"growth_interval must be >= 1, got {self.growth_interval!r}")

    def precision_of(self, name: str) -> Precision | None:
        """The override for the module called ``name``, or None if it inherits its parent's."""
        pairs: tuple[tuple[str, Precision], ...] = self.overrides  # type: ignore[assignment]  # normalised in __post_init__
        for pattern, prec in pairs:
            if fnmatch.fnmatchcase(name, pattern):
                return prec
        for pattern in self.fp32_modules:
            if fnmatch.fnmatchcase(name, pattern):
                return "fp32"
        return None

    def plan(self, model: nn.Module) -> dict[str, Precision]:
        """Effective precision of every module, by qualified name (root is "")."""
        out: dict[str, Precision] = {}
        for name, _ in model.named_modules():
            own = self.precision_of(name) if name else None
            if own is None:
                parent = name.rpartition(".")[0] if name else None
                own = out[parent] if parent is not None else self.dtype
            out[name] = own
        return out

    def apply(self, model: nn.Module) -> MixedPrecision:
        """Install the per-module overrides on ``model`` (in place) and return the runtime object.

        Modules whose precision differs from their parent's get their
        ``forward`` wrapped in the matching autocast context (a container that is
        never called, such as ``nn.ModuleList``, passes it to its children); fp32 modules get
        their floating parameters and buffers cast to fp32. Call before building
        the optimizer (the parameters keep their identity, but state created
        earlier would have the old dtype). Undo with :meth:`MixedPrecision.remove`.
        """
        return MixedPrecision(self, model)


@dataclass(frozen=True)
class StepReport:
    """What one training step did."""

    loss: float
    """Loss value (fp32)."""
    loss_finite: bool
    """False when the forward pass already produced inf/nan."""
    nonfinite_grads: int
    """Parameters whose (unscaled) gradient holds inf/nan when the step was decided."""
    skipped: bool
    """The optimizer step was skipped (GradScaler overflow, or non-finite grads without a scaler)."""
    scale: float | None
    """Loss scale used for this step (fp16), None without a scaler."""

    @property
    def overflow(self) -> Literal["forward", "loss_scale", "backward"] | None:
        """Where inf/nan came from: "forward" (the loss itself is not finite: what fp32
        embeddings prevent), "loss_scale" (fp16 backward overflowed at this loss scale; the
        scaler skips the step and halves the scale, normal calibration), "backward"
        (non-finite gradients without a scaler), or None."""
        if not self.loss_finite:
            return "forward"
        if self.nonfinite_grads == 0:
            return None
        return "loss_scale" if self.scale is not None else "backward"


def _nonfinite_count(params: Any) -> torch.Tensor | None:
    """Parameters whose gradient contains inf or nan, counted on the device (no host sync);
    None when no parameter has a gradient."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return None
    flags = [(~torch.isfinite(g)).any() for g in grads]
    # One device for the sum (parameters may be spread over several).
    return torch.stack([f.to(flags[0].device) for f in flags]).sum()


def count_nonfinite_grads(params: Any) -> int:
    """Number of parameters whose gradient contains inf or nan (one host sync)."""
    count = _nonfinite_count(params)
    return 0 if count is None else int(count.item())


def _upcast(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.float() if obj.dtype in _LOW else obj
    if isinstance(obj, tuple):
        return type(obj)(*map(_upcast, obj)) if hasattr(obj, "_fields") else tuple(map(_upcast, obj))
    if isinstance(obj, list):
        return [_upcast(o) for o in obj]
    if isinstance(obj, dict):
        return {k: _upcast(v) for k, v in obj.items()}
    return obj


def _optimizer_params(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for group in optimizer.param_groups:
        yield from group["params"]


# Marked constant: torch.compile cannot trace the C probe behind it, so it runs the probe
# while tracing and keeps the answer, and autocast_off compiles with fullgraph=True.
@torch.compiler.assume_constant_result
def _autocast_available(device_type: str) -> bool:
    return torch.amp.is_autocast_available(device_type)


def autocast_off(device_type: str) -> contextlib.AbstractContextManager[Any]:
    """A context that turns autocast off on ``device_type``; nothing to turn off where the
    device type has no autocast (``meta``, on which the levers are dry-run, among them) or has it off
    already: building an autocast context costs more than the small operators it would wrap (the
    decode step's instruction count showed it, +0.45 %)."""
    if _autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


class MixedPrecision:
    """A :class:`PrecisionPolicy` applied to one model: autocast context, fp32 loss and the backward/step."""

    def __init__(self, policy: PrecisionPolicy, model: nn.Module) -> None:
        self.policy = policy
        self.model = model
        if policy.device_type == "auto":
            first = next(model.parameters(), None)
            self.device_type = first.device.type if first is not None else "cpu"
        else:
            self.device_type = policy.device_type
        self.module_precisions = policy.plan(model)
        if set(self.module_precisions.values()) != {"fp32"} and not torch.amp.is_autocast_available(self.device_type):
            raise ValueError(f"autocast is not available on device type {self.device_type!r}")
        self.scaler: torch.amp.GradScaler | None = None
        if "fp16" in self.module_precisions.values():
            # Any module in fp16, the whole model or one override: its gradients can underflow. bf16
            # has fp32's exponent range, so they do not: no scaler.
            self.scaler = torch.amp.GradScaler(
                self.device_type, init_scale=policy.init_scale, growth_interval=policy.growth_interval
            )
        self._saved: list[tuple[nn.Module, Any]] = []
        self._wrap(model)

    # -- installation -----------------------------------------------------------------

    def _wrap(self, model: nn.Module) -> None:
        prec = self.module_precisions
        # The precision each module's forward actually runs at: a module is wrapped where its planned
        # precision differs from what its parent runs at. A container without a forward of its own
        # (nn.ModuleList, nn.ModuleDict) is never called, so a wrap there would do nothing: its
        # children are wrapped instead.
        runs: dict[str, Precision] = {}
        for name, module in model.named_modules():
            if getattr(module, "_perfbudget_precision", None) is not None:
                self.remove()
                raise RuntimeError(
                    f"module {name or '<root>'!r} already has a precision override; call "
                    "remove() on the previous MixedPrecision first"
                )
            parent = name.rpartition(".")[0] if name else None
            inherited = runs[parent] if parent is not None else self.policy.dtype
            target = prec[name]
            called = type(module).forward is not nn.Module.forward
            runs[name] = target if name and called else inherited
            if not name or target == inherited:
                continue
            if target == "fp32":
                module.float()
            if not called:
                continue
            # Keep a user's own instance-level forward, if any, to restore it later.
            self._saved.append((module, module.__dict__.get("forward")))
            module.forward = self._wrapped_forward(module.forward, target)
            module._perfbudget_precision = target

    def _wrapped_forward(self, forward: Callable[..., Any], target: Precision) -> Callable[..., Any]:
        device_type = self.device_type
        if target == "fp32":
            @functools.wraps(forward)
            def fp32_forward(*args: Any, **kwargs: Any) -> Any:
                with autocast_off(device_type):
                    return forward(*_upcast(args), **_upcast(kwargs))

            return fp32_forward
        dtype = _TORCH_DTYPES[target]

        @functools.wraps(forward)
        def low_forward(*args: Any, **kwargs: Any) -> Any:
            with torch.autocast(device_type, dtype=dtype):
                return forward(*args, **kwargs)

        return low_forward

    def remove(self) -> None:
        """Restore the original ``forward`` of every wrapped module (parameter dtypes stay)."""
        for module, original in reversed(self._saved):
            if original is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = original
            module.__dict__.pop("_perfbudget_precision", None)
        self._saved.clear()

    @property
    def overridden(self) -> dict[str, Precision]:
        """Modules whose forward carries its own precision, by qualified name."""
        names = {id(m): n for n, m in self.model.named_modules()}
        return {names[id(m)]: self.module_precisions[names[id(m)]] for m, _ in self._saved}

    # -- running ----------------------------------------------------------------------

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Context for the forward pass: autocast at the policy's dtype (a no-op for fp32)."""
        if self.policy.dtype == "fp32":
            return autocast_off(self.device_type)
        return torch.autocast(self.device_type, dtype=_TORCH_DTYPES[self.policy.dtype])

    def loss(self, loss_fn: Callable[..., torch.Tensor], *args: Any, **kwargs: Any) -> torch.Tensor:
        """Call ``loss_fn`` with autocast off and fp16/bf16 inputs upcast (if ``loss_in_fp32``)."""
        if not self.policy.loss_in_fp32:
            with self.autocast():
                return loss_fn(*args, **kwargs)
        with autocast_off(self.device_type):
            return loss_fn(*_upcast(args), **_upcast(kwargs))

    def backward_and_step(
        self,
        loss: torch.Tensor,
        optimizer: torch.optim.Optimizer,
        *,
        before_step: Callable[[], object] | None = None,
        zero_grad: bool = True,
    ) -> StepReport:
        """Backward (scaled for fp16), unscale, optional hook, optimizer step.

        Args:
            loss: scalar loss from :meth:`loss`.
            optimizer: the optimizer over the model's parameters.
            before_step: called on *unscaled* gradients right before the step,
                e.g. gradient clipping (clipping scaled gradients would use a
                threshold off by the loss scale).
            zero_grad: clear gradients after the step (``set_to_none``).

        Returns:
            :class:`StepReport`; costs one host sync to read the loss and the flags (with
            fp16, one more for the loss scale, besides the GradScaler's own in its step).
        """
        scale = None
        if self.scaler is not None:
            scale = float(self.scaler.get_scale())
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(optimizer)
        else:
            loss.backward()
        # One host read for all the report needs before the skip decision: the loss and the
        # non-finite count (a GPU step synchronises here once, not once per value).
        values = [loss.detach().reshape(1).double()]
        count = _nonfinite_count(_optimizer_params(optimizer))
        if count is not None:
            values.append(count.to(loss.device, torch.float64).reshape(1))
        host = torch.cat(values).tolist()
        value = host[0]
        nonfinite = int(host[1]) if count is not None else 0
        if before_step is not None:
            before_step()
        if self.scaler is not None:
            self.scaler.step(optimizer)  # skips the step itself on inf/nan
            self.scaler.update()
            skipped = nonfinite > 0
        else:
            skipped = nonfinite > 0 and self.policy.skip_nonfinite
            if not skipped:
                optimizer.step()
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)
        return StepReport(
            loss=value,
            loss_finite=math.isfinite(value),
            nonfinite_grads=nonfinite,
            skipped=skipped,
            scale=scale,
        )

    def step(
        self,
        forward: Callable[[], Any],
        loss_fn: Callable[[Any], torch.Tensor],
        optimizer: torch.optim.Optimizer,
        *,
        before_step: Callable[[], object] | None = None,
    ) -> StepReport:
        """One training step: ``forward()`` under :meth:`autocast`, ``loss_fn(output)``
        through :meth:`loss`, then :meth:`backward_and_step`."""
        with self.autocast():
            out = forward()
        loss = self.loss(loss_fn, out)
        return self.backward_and_step(loss, optimizer, before_step=before_step)

    def state_dict(self) -> dict[str, Any]:
        """GradScaler state (empty without a scaler), for checkpoints."""
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
