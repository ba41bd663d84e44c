"""imgcolour's speed on image batches of 1 and 8, 128² to 512², as pytest-benchmark measures it."""

import pytest
import torch
import imgcolour


@pytest.fixture(params=[1, 8], ids=lambda b: f"b{b}")
def batch(request):
    return request.param


@pytest.fixture(params=[128, 256, 512], ids=lambda s: f"{s}px")
def image(request, batch):
    return torch.rand(batch, 3, request.param, request.param, generator=torch.Generator().manual_seed(0))


def test_grayscale(benchmark, image):
    out = benchmark(imgcolour.rgb_to_grayscale, image)
    assert out.shape == (image.shape[0], 1, *image.shape[2:])


def test_hsv(benchmark, image):
    out = benchmark(imgcolour.rgb_to_hsv, image)
    assert out.shape == image.shape and bool((out[:, 2] == image.max(dim=1).values).all())
