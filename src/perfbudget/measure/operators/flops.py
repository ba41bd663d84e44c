"""FLOPs of a step from FlopCounterMode, with the attention kernels it and the profiler count as 0 on CPU (torch 2.13)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FlopCount", "attention_flops", "count_flops"]


_ATTENTION_FORWARD = frozenset(
    {
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
    }
)
# Every backward overload takes (grad_out, query, key, value, ...).
_ATTENTION_BACKWARD = frozenset(f"{name}_backward" for name in _ATTENTION_FORWARD)


def attention_flops(
    query_shape: Sequence[int],
    key_shape: Sequence[int],
    value_shape: Sequence[int],
    *,
    backward: bool = False,
) -> int:
    """FLOPs of scaled-dot-product attention from the q/k/v shapes ``[batch, heads, seq, dim]``.

    The two matmuls at 2 FLOPs per multiply-add, as ``torch.utils.flop_counter`` counts CUDA kernels (no
    softmax, no causal discount); grouped-query attention runs at the query's head count.

    Args:
        query_shape: ``[b, h_q, s_q, d_qk]``.
        key_shape: ``[b, h_kv, s_k, d_qk]``.
        value_shape: ``[b, h_kv, s_k, d_v]``.
        backward: count the backward pass instead (recomputed scores plus four matmuls).
    """
    if len(query_shape) != 4 or len(key_shape) != 4 or len(value_shape) != 4:
        raise ValueError(
            f"attention shapes must be 4-D [batch, heads, seq, dim], got q={list(query_shape)}, "
            f"k={list(key_shape)}, v={list(value_shape)}"
        )
    b, h_q, s_q, d_q = (int(x) for x in query_shape)
    s_k = int(key_shape[2])
    d_v = int(value_shape[3])
    per_head = s_q * s_k
    if backward:
        # scores recompute (d_q), grad scores (d_v), grad V (d_v), grad Q (d_q), grad K (d_q)
        return 2 * b * h_q * per_head * (3 * d_q + 2 * d_v)
    return 2 * b * h_q * per_head * (d_q + d_v)


def _attention_flops_from_shapes(name: str, shapes: Sequence[Sequence[int]]) -> int:
    """Attention FLOPs of one recorded call, or 0 when ``name`` is not an attention kernel."""
    try:
        if name in _ATTENTION_FORWARD and len(shapes) >= 3:
            return attention_flops(shapes[0], shapes[1], shapes[2])
        if name in _ATTENTION_BACKWARD and len(shapes) >= 4:
            return attention_flops(shapes[1], shapes[2], shapes[3], backward=True)
    except (ValueError, IndexError, TypeError):
        return 0
    return 0


def _flop_counter_attention_mapping() -> dict[Any, Callable[..., int]]:
    """Formulas for FlopCounterMode(custom_mapping=...) covering the attention ops it misses."""
    import torch

    def forward(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return attention_flops(q, k, v)

    def backward(
        grad_out: Any, q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any
    ) -> int:
        return attention_flops(q, k, v, backward=True)

    name = "_scaled_dot_product_flash_attention_for_cpu"
    found = ((getattr(torch.ops.aten, name, None), forward),
             (getattr(torch.ops.aten, f"{name}_backward", None), backward))
    return {packet: formula for packet, formula in found if packet is not None}


@dataclass(frozen=True, kw_only=True)
class FlopCount:
    """FLOPs of one call of a step, from ``torch.utils.flop_counter.FlopCounterMode``."""

    total_flops: int
    """All counted FLOPs."""
    by_op: Mapping[str, int]
    """FLOPs per operator, keyed like the profiler (``"aten::mm"``)."""
    by_module: Mapping[str, int]
    """FLOPs per module path (``"layers.0.linear1"``); empty when no module ran."""


def _op_key(packet: Any) -> str:
    """``aten.mm`` (an OpOverloadPacket) -> ``"aten::mm"``, the profiler's spelling."""
    text = str(packet)
    ns, _, rest = text.partition(".")
    return f"{ns}::{rest}" if rest else text


def _flop_counter() -> Any:
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False, custom_mapping=_flop_counter_attention_mapping())


def _flop_count_from_counter(counter: Any) -> FlopCount:
    counts: dict[str, dict[Any, int]] = counter.get_flop_counts()
    glob = counts.get("Global", {})
    by_op = {_op_key(k): int(v) for k, v in glob.items()}
    by_module = {mod: int(sum(ops.values())) for mod, ops in counts.items() if mod != "Global"}
    return FlopCount(total_flops=int(sum(glob.values())), by_op=by_op, by_module=by_module)


def count_flops(step: Callable[[], Any]) -> FlopCount:
    """Count the FLOPs of one (executed) call of ``step`` with ``FlopCounterMode``, CPU attention included.

    Args:
        step: zero-argument callable, e.g. forward + backward + optimizer step.
    """
    counter = _flop_counter()
    with counter:
        step()
    return _flop_count_from_counter(counter)
