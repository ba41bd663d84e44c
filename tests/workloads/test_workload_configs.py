"""Size presets, config validation and the by-name catalogue."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from torchlevers.workloads import (
    SIZES,
    WORKLOADS,
    DecoderConfig,
    EncoderConfig,
    SegConfig,
    build_workload,
    check_size,
    config_for,
)


@pytest.mark.parametrize("name", WORKLOADS)
@pytest.mark.parametrize("size", SIZES)
def test_every_preset_is_a_valid_config(name: str, size: str) -> None:
    # Building configs allocates nothing, so even "large" is checked here.
    cfg = config_for(name, size, "cuda:0")
    assert cfg.device == "cuda:0"
    assert dataclasses.is_dataclass(cfg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 1  # type: ignore[misc]


def test_sizes_grow() -> None:
    tiny, small, large = (config_for("encoder", s) for s in SIZES)
    assert tiny.d_model < small.d_model < large.d_model
    assert tiny.n_layers <= small.n_layers < large.n_layers


def test_tiny_is_the_default_config() -> None:
    assert config_for("encoder") == EncoderConfig()
    assert config_for("decoder") == DecoderConfig()
    assert config_for("segmentation") == SegConfig()


def test_overrides_replace_fields() -> None:
    cfg = config_for("encoder", "small", extra_ffn_matmul=True, seed=3)
    assert cfg.extra_ffn_matmul is True
    assert cfg.seed == 3
    assert cfg.d_model == config_for("encoder", "small").d_model


def test_configs_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        EncoderConfig(2048)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: EncoderConfig(d_model=0), r"EncoderConfig\.d_model: expected an int >= 1, got 0"),
        (
            lambda: EncoderConfig(d_model=130),
            r"EncoderConfig\.d_model: expected a multiple of n_heads \(4\), got 130",
        ),
        (
            lambda: EncoderConfig(n_layers=2.0),  # type: ignore[arg-type]
            r"EncoderConfig\.n_layers: .* got 2\.0",
        ),
        (lambda: EncoderConfig(batch_size=True), r"EncoderConfig\.batch_size: .* got True"),
        (
            lambda: EncoderConfig(seq_len=600),
            r"EncoderConfig\.seq_len: expected <= max_seq_len \(512\), got 600",
        ),
        (
            lambda: EncoderConfig(norm_position="middle"),  # type: ignore[arg-type]
            r"EncoderConfig\.norm_position: expected one of 'pre', 'post', got 'middle'",
        ),
        (
            lambda: EncoderConfig(dropout=1.0),
            r"EncoderConfig\.dropout: expected a number in \[0\.0, 1\.0\), got 1\.0",
        ),
        (lambda: EncoderConfig(lr=0), r"EncoderConfig\.lr: .* got 0"),
        (
            lambda: EncoderConfig(extra_ffn_matmul=1),  # type: ignore[arg-type]
            r"EncoderConfig\.extra_ffn_matmul: expected True or False, got 1",
        ),
        (
            lambda: EncoderConfig(device="gpu"),
            r"EncoderConfig\.device: expected a device string .* got 'gpu'",
        ),
        (
            lambda: DecoderConfig(n_requests=10),
            r"DecoderConfig\.n_requests: expected an int >= 64, got 10",
        ),
        (
            lambda: DecoderConfig(max_prompt_tokens=250),
            r"DecoderConfig\.max_prompt_tokens: expected <= max_seq_len - max_new_tokens \(256 - 16\), got 250",
        ),
        (
            lambda: SegConfig(image_size=60),
            r"SegConfig\.image_size: expected a multiple of 2 \*\* depth \(8\), got 60",
        ),
        (
            lambda: SegConfig(groups=3),
            r"SegConfig\.base_channels: expected a multiple of groups \(3\), got 16",
        ),
        (
            lambda: SegConfig(memory_format="nhwc"),  # type: ignore[arg-type]
            r"SegConfig\.memory_format: expected one of 'channels_last', 'contiguous', got 'nhwc'",
        ),
    ],
)
def test_bad_values_are_named(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_unknown_size_name_and_field_are_refused() -> None:
    with pytest.raises(
        ValueError, match=r"size: expected one of 'tiny', 'small', 'large', got 'huge'"
    ):
        config_for("encoder", "huge")
    with pytest.raises(ValueError, match=r"workload name: expected one of .*got 'resnet'"):
        config_for("resnet")
    with pytest.raises(ValueError, match=r"EncoderConfig: unknown field\(s\) \['d_modle'\]"):
        config_for("encoder", d_modle=64)
    assert check_size("small") == "small"


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)
def test_building_on_missing_cuda_says_why() -> None:
    with pytest.raises(
        RuntimeError, match=r"EncoderConfig\.device is 'cuda' but CUDA is not available"
    ):
        build_workload(config_for("encoder", device="cuda"))
