"""A GPT-like causal decoder with a KV cache, and its serving path (TTFT, per-token and E2E latency)."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .data import FIRST_TOKEN_ID, QueryLengthDistribution
from .layers import TransformerBlock, init_weights
from .sizes import (
    Size,
    check_bool,
    check_device,
    check_float,
    check_int,
    check_size,
    preset_with_overrides,
)
from .training import (
    AutocastArg,
    NormFactory,
    SupportsAutocast,
    Sync,
    apply_precision,
    default_sync,
    resolve_device,
    seeded,
)

__all__ = [
    "Decoder",
    "DecoderConfig",
    "DecoderWorkload",
    "GenerationTiming",
    "KVCache",
    "Request",
]

MIN_REQUESTS_FOR_P90 = 64
"""Fewest requests a serving run may have: with 64, the p90 of end-to-end latency has
six samples above it; with 10 it would be the second-worst request."""


@dataclass(frozen=True, kw_only=True)
class DecoderConfig:
    """Geometry and serving load of the decoder workload."""

    vocab_size: int = 2048
    """Vocabulary size in tokens."""
    max_seq_len: int = 256
    """Context length: prompt plus generated tokens, in tokens."""
    d_model: int = 128
    """Hidden width, in features."""
    n_heads: int = 4
    """Attention heads; must divide ``d_model``."""
    d_ff: int = 512
    """FFN inner width, in features."""
    n_layers: int = 2
    """Transformer blocks (pre-LayerNorm, as in GPT-2)."""
    norm_eps: float = 1e-5
    """LayerNorm epsilon."""
    extra_ffn_matmul: bool = False
    """Plant a regression: one extra ``aten::mm`` per FFN, numerically a no-op."""
    n_requests: int = 64
    """Requests in a serving run (>= 64 so p90 latency means something)."""
    max_prompt_tokens: int = 128
    """Longest prompt, in tokens; prompt lengths follow the query distribution clipped here."""
    max_new_tokens: int = 16
    """Tokens generated per request (greedy, no early stop, so every request costs the same
    number of decode steps)."""
    seed: int = 0
    """Seed of the weights and of the requests."""
    device: str = "cpu"
    """Where the workload runs, as a ``torch.device`` string."""

    def __post_init__(self) -> None:
        o = type(self).__name__
        check_int(o, "vocab_size", self.vocab_size, minimum=FIRST_TOKEN_ID + 1)
        for name in ("max_seq_len", "d_model", "n_heads", "d_ff", "n_layers", "max_new_tokens"):
            check_int(o, name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(
                f"{o}.d_model: expected a multiple of n_heads ({self.n_heads}), got {self.d_model!r}"
            )
        check_float(o, "norm_eps", self.norm_eps, low=0.0, high=1.0, low_inclusive=False)
        check_bool(o, "extra_ffn_matmul", self.extra_ffn_matmul)
        check_int(o, "n_requests", self.n_requests, minimum=MIN_REQUESTS_FOR_P90)
        check_int(o, "max_prompt_tokens", self.max_prompt_tokens, minimum=2)
        if self.max_prompt_tokens + self.max_new_tokens > self.max_seq_len:
            raise ValueError(
                f"{o}.max_prompt_tokens: expected <= max_seq_len - max_new_tokens "
                f"({self.max_seq_len} - {self.max_new_tokens}), got {self.max_prompt_tokens!r}"
            )
        check_int(o, "seed", self.seed, minimum=0)
        check_device(o, self.device)

    @classmethod
    def for_size(cls, size: Size, *, device: str = "cpu", **overrides: Any) -> DecoderConfig:
        """The preset for ``size`` on ``device``, with ``overrides`` replacing fields.

        Raises:
            ValueError: unknown size, unknown field in ``overrides``, or a bad value.
        """
        return preset_with_overrides(cls, _DECODER_PRESETS[check_size(size)], device, overrides)


_DECODER_PRESETS: dict[str, dict[str, Any]] = {
    # Sized for one CPU thread: milliseconds per token, about a second for the 64 requests.
    "tiny": {},
    "small": dict(
        vocab_size=8192,
        max_seq_len=512,
        d_model=256,
        n_heads=4,
        d_ff=1024,
        n_layers=4,
        max_prompt_tokens=256,
        max_new_tokens=32,
    ),
    # GPT-2-small geometry (~124M parameters), batch-1 serving as in a latency SLO.
    "large": dict(
        vocab_size=50257,
        max_seq_len=1024,
        d_model=768,
        n_heads=12,
        d_ff=3072,
        n_layers=12,
        n_requests=128,
        max_prompt_tokens=512,
        max_new_tokens=64,
    ),
}


def _compute_dtype(weight: Tensor) -> torch.dtype:
    """What a layer holding ``weight`` computes in here: autocast's dtype where it is on, else the weight's."""
    kind = weight.device.type
    on = torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind)
    return torch.get_autocast_dtype(kind) if on else weight.dtype


class KVCache:
    """Preallocated keys and values of every layer, filled up to :attr:`length`.

    Preallocating the whole capacity once per request (as serving engines do) keeps
    each decode step free of allocations and ``torch.cat`` copies.
    """

    def __init__(
        self,
        *,
        n_layers: int,
        batch_size: int,
        n_heads: int,
        head_dim: int,
        capacity: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        shape = (batch_size, n_heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.capacity = capacity
        self.length = 0
        """Positions filled so far (the next token's position)."""

    def layer(self, i: int) -> tuple[Tensor, Tensor]:
        """Key and value buffers of layer ``i``."""
        return self.keys[i], self.values[i]


class _Embeddings(nn.Module):
    """Token and learned position tables (``tok``, ``pos``)."""

    def __init__(self, vocab_size: int, max_seq_len: int, d_model: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_seq_len, d_model)


class Decoder(nn.Module):
    """GPT-like causal language model (pre-LN, learned positions, tied output embedding).

    Module names: ``embed.tok``, ``embed.pos``, ``blocks.{i}.norm1``,
    ``blocks.{i}.attn.qkv``, ``blocks.{i}.attn.out``, ``blocks.{i}.norm2``,
    ``blocks.{i}.ffn.fc1``, ``blocks.{i}.ffn.fc2``, ``blocks.{i}.ffn.extra`` (planted),
    ``final_norm``, ``lm_head`` (weight tied to ``embed.tok``).
    """

    def __init__(self, config: DecoderConfig, *, norm_factory: NormFactory = nn.LayerNorm) -> None:
        super().__init__()
        self.config = config
        self.embed = _Embeddings(config.vocab_size, config.max_seq_len, config.d_model)
        self.blocks = nn.ModuleList(
            TransformerBlock(
                config.d_model,
                config.n_heads,
                config.d_ff,
                norm_position="pre",
                norm_factory=norm_factory,
                norm_eps=config.norm_eps,
                extra_ffn_matmul=config.extra_ffn_matmul,
            )
            for _ in range(config.n_layers)
        )
        self.final_norm = norm_factory(config.d_model, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        init_weights(self)
        self.lm_head.weight = self.embed.tok.weight

    def new_cache(
        self, batch_size: int, capacity: int, *, dtype: torch.dtype | None = None
    ) -> KVCache:
        """An empty cache for ``batch_size`` sequences of up to ``capacity`` tokens, in ``dtype`` (default: what
        the attention computes in here: autocast's dtype where it is on, else the weights'; a cache in another
        dtype would be cast whole at every decode step)."""
        cfg = self.config
        if capacity > cfg.max_seq_len:
            raise ValueError(
                f"Decoder.new_cache: capacity {capacity} exceeds max_seq_len {cfg.max_seq_len}"
            )
        weight = self.embed.tok.weight
        return KVCache(
            n_layers=cfg.n_layers,
            batch_size=batch_size,
            n_heads=cfg.n_heads,
            head_dim=cfg.d_model // cfg.n_heads,
            capacity=capacity,
            device=weight.device,
            dtype=dtype or _compute_dtype(weight),
        )

    def forward(
        self, input_ids: Tensor, cache: KVCache | None = None, *, last_only: bool = False
    ) -> Tensor:
        """Next-token logits.

        Args:
            input_ids: ``(B, T)`` int64: a whole sequence (no cache), a prompt (empty
                cache) or the newest token(s) (cache holding what came before).
            cache: keys/values of earlier positions; extended in place by ``T``.
            last_only: return logits of the last position only (what serving needs;
                skips the ``T x vocab`` projection of the others).

        Returns:
            ``(B, T, vocab)`` logits, or ``(B, vocab)`` with ``last_only``.
        """
        t = input_ids.shape[1]
        start = 0 if cache is None else cache.length
        if start + t > self.config.max_seq_len:
            raise ValueError(
                f"Decoder: position {start + t} exceeds max_seq_len {self.config.max_seq_len}"
            )
        pos = torch.arange(start, start + t, device=input_ids.device)
        x = self.embed.tok(input_ids) + self.embed.pos(pos)
        for i, block in enumerate(self.blocks):
            x = block(
                x, causal=True, kv_buffers=None if cache is None else cache.layer(i), start=start
            )
        if cache is not None:
            cache.length = start + t
        if last_only:
            x = x[:, -1]
        return self.lm_head(self.final_norm(x))


@dataclass(frozen=True)
class Request:
    """One generation request of a serving run."""

    request_id: int
    """Index in the run."""
    prompt_ids: Tensor
    """``(P,)`` int64 prompt tokens, on the CPU (moving them is part of the request's latency)."""
    max_new_tokens: int
    """Tokens to generate."""

    @property
    def prompt_tokens(self) -> int:
        """Prompt length P."""
        return int(self.prompt_ids.shape[0])


@dataclass(frozen=True)
class GenerationTiming:
    """Host-clock timing of one greedy generation, in milliseconds from the request's start.

    Every time point is read after synchronising the device, so it covers the work, not
    just its launch.
    """

    prompt_tokens: int
    """Prompt length, in tokens."""
    ttft_ms: float
    """Time to first token: request start (prompt still on the host) to the first
    generated token (prefill + first sample)."""
    token_latencies_ms: tuple[float, ...]
    """Latency of each later token (one decode step each); ``new_tokens - 1`` entries."""
    e2e_ms: float
    """Request start to the last generated token."""
    token_ids: tuple[int, ...]
    """The generated tokens (greedy), for checking that a change kept the output."""

    @property
    def new_tokens(self) -> int:
        """Generated tokens."""
        return len(self.token_ids)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of end-to-end latency."""
        return self.new_tokens / (self.e2e_ms / 1e3) if self.e2e_ms > 0 else math.inf


class DecoderWorkload:
    """Greedy batch-1 serving of :class:`Decoder`: prefill, decode steps with a KV cache, requests.

    Example::

        w = DecoderWorkload(DecoderConfig.for_size("tiny"))
        timings = [w.generate(r.prompt_ids, r.max_new_tokens) for r in w.requests()]

    Args:
        config: the workload's configuration.
        norm_factory: builds every norm layer; default ``nn.LayerNorm``.
        precision: optional policy whose ``autocast()`` wraps prefill and decode, applied
            or as a factory applied to the model (``PrecisionPolicy(...).apply``).
        sync: waits for queued device work before the clock is read; default
            ``torch.cuda.synchronize`` on CUDA, nothing on CPU.
        clock: seconds, monotonic; default ``time.perf_counter``.
    """

    def __init__(
        self,
        config: DecoderConfig,
        *,
        norm_factory: NormFactory | None = None,
        precision: AutocastArg | None = None,
        sync: Sync | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.config = config
        self.device = resolve_device(config.device, type(config).__name__)
        with seeded(config.seed):
            model = Decoder(config, norm_factory=norm_factory or nn.LayerNorm)
        self.model = model.to(self.device).eval()
        self.precision = apply_precision(precision, self.model, SupportsAutocast)
        self.sync = sync if sync is not None else default_sync(self.device)
        self.clock = clock
        # What prefill and decode_step call: the model itself, or a compiled wrapper of it.
        self._forward: Callable[..., Tensor] = self.model

    def compile(self, **compile_kwargs: Any) -> None:
        """Run prefill and decode steps through ``torch.compile(model, **compile_kwargs)``.

        The cache length is a Python int that grows every step: expect one recompile
        before dynamo marks it dynamic (or pass ``dynamic=True``), and warm up with a
        prompt length and a few decode steps before measuring.
        """
        self._forward = torch.compile(self.model, **compile_kwargs)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        return self.precision.autocast() if self.precision is not None else contextlib.nullcontext()

    def requests(self, n: int | None = None, *, seed: int | None = None) -> list[Request]:
        """A deterministic serving load: prompts with query-like lengths.

        Args:
            n: number of requests (default ``config.n_requests``).
            seed: default ``config.seed``; the same seed gives the same requests.

        Returns:
            ``n`` requests; prompt lengths follow :class:`QueryLengthDistribution`
            clipped to ``[2, config.max_prompt_tokens]``, tokens are uniform.
        """
        cfg = self.config
        n = cfg.n_requests if n is None else n
        check_int("DecoderWorkload.requests", "n", n)
        seed = cfg.seed if seed is None else seed
        # No long tail: prompts are clipped at max_prompt_tokens, far below where the tail starts.
        lengths = QueryLengthDistribution(max_tokens=cfg.max_prompt_tokens, tail_fraction=0.0).sample(
            n, seed=seed
        )
        g = torch.Generator().manual_seed(seed + 1)
        return [
            Request(
                request_id=i,
                prompt_ids=torch.randint(FIRST_TOKEN_ID, cfg.vocab_size, (length,), generator=g),
                max_new_tokens=cfg.max_new_tokens,
            )
            for i, length in enumerate(lengths)
        ]

    @torch.inference_mode()
    def prefill(self, prompt_ids: Tensor, *, capacity: int | None = None) -> tuple[Tensor, KVCache]:
        """Run the prompt through the model and fill a new KV cache.

        Args:
            prompt_ids: ``(P,)`` or ``(B, P)`` int64 (moved to the device if needed).
            capacity: cache size in tokens (default ``config.max_seq_len``); generation
                can continue until it is full.

        Returns:
            ``(logits, cache)``: last-position logits ``(B, vocab)`` and the cache.
        """
        ids = prompt_ids.to(self.device)
        if ids.dim() == 1:
            ids = ids[None]
        capacity = self.config.max_seq_len if capacity is None else capacity
        if ids.shape[1] > capacity:
            raise ValueError(
                f"DecoderWorkload.prefill: prompt of {ids.shape[1]} tokens exceeds capacity {capacity}"
            )
        with self._autocast():
            cache = self.model.new_cache(ids.shape[0], capacity)
            logits = self._forward(ids, cache, last_only=True)
        return logits, cache

    @torch.inference_mode()
    def decode_step(self, token_ids: Tensor, cache: KVCache) -> Tensor:
        """Feed one new token per sequence and return the next logits.

        Args:
            token_ids: ``(B,)`` or ``(B, 1)`` int64.
            cache: from :meth:`prefill`; extended by one position in place.

        Returns:
            ``(B, vocab)`` logits.
        """
        ids = token_ids.to(self.device).reshape(-1, 1)
        if cache.length >= cache.capacity:
            raise ValueError(
                f"DecoderWorkload.decode_step: KV cache is full ({cache.capacity} tokens)"
            )
        with self._autocast():
            return self._forward(ids, cache, last_only=True)

    @torch.inference_mode()
    def generate(self, prompt_ids: Tensor, max_new_tokens: int | None = None) -> GenerationTiming:
        """Greedily generate ``max_new_tokens`` tokens for one prompt and time it.

        The clock starts with the prompt on the host, so TTFT includes moving it to the
        device, allocating the cache and the prefill.

        Args:
            prompt_ids: ``(P,)`` int64.
            max_new_tokens: default ``config.max_new_tokens``.

        Returns:
            A :class:`GenerationTiming`.
        """
        n_new = self.config.max_new_tokens if max_new_tokens is None else max_new_tokens
        check_int("DecoderWorkload.generate", "max_new_tokens", n_new)
        if prompt_ids.dim() != 1:
            raise ValueError(
                f"DecoderWorkload.generate: expected a 1-D prompt, got shape {tuple(prompt_ids.shape)}"
            )
        prompt_tokens = int(prompt_ids.shape[0])
        self.sync()
        t0 = self.clock()
        logits, cache = self.prefill(prompt_ids, capacity=prompt_tokens + n_new)
        # Tokens stay on the device: reading them back each step would add a
        # device-to-host copy that a streaming server overlaps with the next step.
        token = logits.argmax(dim=-1)
        tokens = [token]
        self.sync()
        t_prev = t_first = self.clock()
        latencies = []
        for _ in range(n_new - 1):
            token = self.decode_step(token, cache).argmax(dim=-1)
            tokens.append(token)
            self.sync()
            t = self.clock()
            latencies.append((t - t_prev) * 1e3)
            t_prev = t
        return GenerationTiming(
            prompt_tokens=prompt_tokens,
            ttft_ms=(t_first - t0) * 1e3,
            token_latencies_ms=tuple(latencies),
            e2e_ms=(t_prev - t0) * 1e3,
            token_ids=tuple(int(x) for x in torch.cat(tokens).tolist()),
        )

    def stream(self, prompt_ids: Tensor, max_new_tokens: int | None = None) -> Iterator[Tensor]:
        """Greedily generate tokens for one prompt, yielding each as soon as it is produced.

        The device is *not* synchronised here: a caller timing the stream synchronises at
        each token (see ``perfbudget.measure.timing.time_stream``). Moving the prompt to the
        device, allocating the cache and the prefill happen before the first token.

        Args:
            prompt_ids: ``(P,)`` int64.
            max_new_tokens: default ``config.max_new_tokens``.

        Yields:
            Each generated token, a 1-element tensor on the device.
        """
        n_new = self.config.max_new_tokens if max_new_tokens is None else max_new_tokens
        check_int("DecoderWorkload.stream", "max_new_tokens", n_new)
        if prompt_ids.dim() != 1:
            raise ValueError(f"DecoderWorkload.stream: expected a 1-D prompt, got shape {tuple(prompt_ids.shape)}")
        logits, cache = self.prefill(prompt_ids, capacity=int(prompt_ids.shape[0]) + n_new)
        token = logits.argmax(dim=-1)
        yield token
        for _ in range(n_new - 1):
            token = self.decode_step(token, cache).argmax(dim=-1)
            yield token

    def serve(self, requests: Iterable[Request] | None = None) -> list[GenerationTiming]:
        """Run requests one after another (default: :meth:`requests`) and time each."""
        reqs: Sequence[Request] = list(self.requests() if requests is None else requests)
        return [self.generate(r.prompt_ids, r.max_new_tokens) for r in reqs]

    @property
    def num_parameters(self) -> int:
        """Number of parameter elements (the tied output embedding counted once)."""
        return sum(p.numel() for p in self.model.parameters())
