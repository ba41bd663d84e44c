"""The training-step machinery shared by the workloads, and the injection points levers plug into."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import torch
from torch import Tensor, nn
from torch.profiler import record_function

__all__ = [
    "PHASES",
    "AutocastArg",
    "GradClipper",
    "NamedParameters",
    "NormFactory",
    "OptimizerFactory",
    "PrecisionArg",
    "SupportsAutocast",
    "SupportsMixedPrecision",
    "Sync",
    "TrainingWorkload",
    "apply_precision",
    "default_sync",
    "resolve_device",
    "seeded",
]

PHASES = ("forward", "backward", "optimizer")
"""Phase names of a training step. Each phase runs inside a profiler range named
``perfbudget::<phase>`` so per-phase memory and operator time can be read from one
profiled step (with a precision policy, backward and optimizer are one range,
``perfbudget::backward_and_optimizer``, because the policy owns both)."""


class NormFactory(Protocol):
    """Builds a normalisation layer: ``factory(d_model, eps=...)``.

    ``torch.nn.LayerNorm`` satisfies it, and so does a LayerNorm that keeps its
    statistics in fp32 for low-precision inputs.
    """

    def __call__(self, normalized_shape: int, *, eps: float) -> nn.Module: ...


@runtime_checkable
class SupportsAutocast(Protocol):
    """What serving needs from a mixed-precision policy: a context for the forward pass."""

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Context under which the model's forward runs."""
        ...


@runtime_checkable
class SupportsMixedPrecision(SupportsAutocast, Protocol):
    """A mixed-precision policy applied to a model, as the training workloads drive it.

    The workload runs the model's forward inside :meth:`autocast` and computes the
    loss in fp32 outside it; then hands the loss to :meth:`backward_and_step`, which
    owns backward and the optimizer step because a loss scaler must wrap both.
    Per-module overrides (embeddings in fp32, ...) are the policy's business, installed
    on the model by module name (the names are stable). ``levers.precision``'s
    ``MixedPrecision`` has this shape.
    """

    def backward_and_step(
        self,
        loss: Tensor,
        optimizer: torch.optim.Optimizer,
        *,
        before_step: Callable[[], object] | None = None,
    ) -> object:
        """Backward pass and optimizer step; returns a report (kept as ``last_step_report``).

        ``before_step`` must be called after gradients are final and unscaled and
        before the optimizer step (gradient clipping goes there).
        """
        ...


PrecisionArg = SupportsMixedPrecision | Callable[[nn.Module], SupportsMixedPrecision]
"""A training workload's ``precision``: an applied policy, or a callable that applies one
to the model (e.g. ``PrecisionPolicy(dtype="bf16").apply``), called once the model is on
its device and before the optimizer is built."""

AutocastArg = SupportsAutocast | Callable[[nn.Module], SupportsAutocast]
"""The decoder's ``precision``: like :data:`PrecisionArg`, but only ``autocast()`` is used."""

NamedParameters = Iterator[tuple[str, nn.Parameter]]

GradClipper = Callable[[NamedParameters], object]
"""Called with ``model.named_parameters()`` between backward and the optimizer step
(gradients already unscaled); clips gradients in place and may return a report (kept as
``last_clip_report``). ``levers.clipping``'s ``PerLayerClipper().clip`` and
``functools.partial(clip_global_norm, max_norm=1.0)`` fit; so does an observer that only
records gradient statistics."""

OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]
"""Builds the optimizer for a model (so it can form parameter groups by name)."""

Sync = Callable[[], None]
"""Blocks until queued device work is done; called before reading a host clock."""


def _no_sync() -> None:
    """CPU work is synchronous: nothing to wait for."""


def default_sync(device: torch.device | str) -> Sync:
    """The synchronisation a host-clock timer needs on ``device``.

    Args:
        device: where the timed work runs.

    Returns:
        ``torch.cuda.synchronize`` bound to that device for CUDA, a no-op otherwise.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return _no_sync


def resolve_device(device: str, owner: str) -> torch.device:
    """Parse ``device`` and refuse one that this process cannot use.

    Raises:
        RuntimeError: the device is CUDA and CUDA is unavailable (with the reason).
    """
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"{owner}.device is {device!r} but CUDA is not available in this process "
            f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}); "
            "build the workload with device='cpu' or run on a GPU machine"
        )
    return dev


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the block with the global CPU RNG seeded, restoring its state afterwards.

    Models are initialised on the CPU inside this, so a seed gives the same weights on
    every device and building a workload leaves the caller's RNG untouched.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


P = TypeVar("P", bound=SupportsAutocast)


def apply_precision(
    precision: P | Callable[[nn.Module], P] | None,
    model: nn.Module,
    protocol: Any,
) -> P | None:
    """Resolve a ``precision`` argument: an applied policy as is, a factory called on ``model``.

    ``protocol`` is the runtime-checkable Protocol the result must satisfy (typed ``Any``
    because type checkers refuse a Protocol class where a ``type`` is expected).

    Raises:
        TypeError: neither, or a factory that returned something without the methods
            of ``protocol``.
    """
    if precision is None or isinstance(precision, protocol):
        return precision
    if callable(precision):
        applied = precision(model)
        if isinstance(applied, protocol):
            return applied
        raise TypeError(
            f"precision: the factory returned {type(applied).__name__}, which lacks the methods "
            f"of {protocol.__name__}"
        )
    raise TypeError(
        f"precision: expected an object with the methods of {protocol.__name__} or a callable "
        f"applying one to the model (e.g. PrecisionPolicy(...).apply), got {type(precision).__name__}"
    )


BatchT = TypeVar("BatchT")


class TrainingWorkload(ABC, Generic[BatchT]):
    """One training step of a model: forward, fp32 loss, backward, optional clip, step, zero_grad.

    Subclasses build the model and provide the model call and the loss; this class owns
    the step so that the encoder and the segmentation network are measured the same way.

    Attributes:
        model: the ``nn.Module`` being trained (module names are stable; budgets and
            precision overrides refer to them).
        optimizer: its optimizer.
        precision: the applied mixed-precision policy, or None (fp32).
        clip: the gradient clipper, or None.
        last_step_report: what the precision policy's ``backward_and_step`` returned
            on the last step (e.g. non-finite gradient counts, scaler skips), or None.
        last_clip_report: what the clipper returned on the last step, or None.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer

    def __init__(
        self,
        model: nn.Module,
        *,
        precision: PrecisionArg | None,
        clip: GradClipper | None,
        optimizer_factory: OptimizerFactory,
    ) -> None:
        """Args:
        model: the model, already on its device and in its memory format.
        precision: see :data:`PrecisionArg`; applied before the optimizer is built.
        clip: see :data:`GradClipper`.
        optimizer_factory: builds the optimizer from the model.
        """
        self.model = model
        self.precision = apply_precision(precision, model, SupportsMixedPrecision)
        self.optimizer = optimizer_factory(model)
        self.clip = clip
        self.last_step_report: object | None = None
        self.last_clip_report: object | None = None
        # What forward_loss calls: the model itself, or a compiled wrapper of it.
        self._forward_module: Callable[..., Any] = model

    # -- what subclasses provide ---------------------------------------------------------

    @abstractmethod
    def make_batch(self, *args: Any, **kwargs: Any) -> BatchT:
        """A batch on the workload's device (see the subclass for arguments)."""

    @abstractmethod
    def _model_inputs(self, batch: BatchT) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Positional and keyword arguments of the model call for ``batch``."""

    @abstractmethod
    def _loss(self, output: Tensor, batch: BatchT) -> Tensor:
        """Loss of the model's output (already fp32) against ``batch``'s targets."""

    # -- the step --------------------------------------------------------------------------

    def compile(self, **compile_kwargs: Any) -> None:
        """Run the model's forward through ``torch.compile(model, **compile_kwargs)``.

        ``self.model`` stays the eager module (its parameter and module names do not
        gain an ``_orig_mod.`` prefix); only the call in :meth:`forward_loss` changes.
        """
        self._forward_module = torch.compile(self.model, **compile_kwargs)

    def forward_loss(self, batch: BatchT) -> Tensor:
        """Forward pass (under the precision policy's autocast) and the fp32 loss.

        Returns:
            The scalar loss, still attached to the graph.
        """
        args, kwargs = self._model_inputs(batch)
        with record_function("perfbudget::forward"):
            ctx = (
                self.precision.autocast()
                if self.precision is not None
                else contextlib.nullcontext()
            )
            with ctx:
                output = self._forward_module(*args, **kwargs)
            # The loss is computed in fp32 whatever the blocks ran in: a low-precision
            # softmax/log over classes loses exactly the small probabilities that matter.
            return self._loss(output.float(), batch)

    def _before_step(self) -> None:
        if self.clip is not None:
            self.last_clip_report = self.clip(self.model.named_parameters())

    def backward(self, loss: Tensor) -> None:
        """Backward pass alone (no precision policy only; lets memory be read per phase).

        Raises:
            RuntimeError: a precision policy is set (it owns backward and step together).
        """
        self._refuse_split_phases("backward")
        with record_function("perfbudget::backward"):
            loss.backward()

    def optimizer_step(self) -> None:
        """Clip (if set), optimizer step and ``zero_grad(set_to_none=True)``.

        Raises:
            RuntimeError: a precision policy is set (it owns backward and step together).
        """
        self._refuse_split_phases("optimizer_step")
        with record_function("perfbudget::optimizer"):
            self._before_step()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def backward_and_step(self, loss: Tensor) -> None:
        """Backward, clip, optimizer step and zero_grad, through the precision policy if set."""
        if self.precision is None:
            self.backward(loss)
            self.optimizer_step()
            return
        with record_function("perfbudget::backward_and_optimizer"):
            self.last_step_report = self.precision.backward_and_step(
                loss, self.optimizer, before_step=self._before_step
            )
            # Whether or not the policy zeroes gradients itself (a no-op then).
            self.optimizer.zero_grad(set_to_none=True)

    def step(self, batch: BatchT) -> Tensor:
        """One full training step on ``batch``.

        Returns:
            The loss as a detached 0-dim tensor on the workload's device. It is not
            converted to a float here because that would synchronise a GPU inside the
            timed region; call ``float(loss)`` when the value is needed.
        """
        self.model.train()
        loss = self.forward_loss(batch)
        self.backward_and_step(loss)
        return loss.detach()

    def _refuse_split_phases(self, what: str) -> None:
        if self.precision is not None:
            raise RuntimeError(
                f"{type(self).__name__}.{what}() is unavailable with a precision policy: "
                "the policy's backward_and_step owns backward and the optimizer step "
                "together (a loss scaler wraps both); call backward_and_step(loss)"
            )

    @property
    def num_parameters(self) -> int:
        """Number of trainable parameter elements."""
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)
