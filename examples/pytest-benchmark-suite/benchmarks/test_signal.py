"""Array work of vecsearch: sorting in place needs fresh input for every round (pedantic)."""

import numpy as np
import pytest
import vecsearch


def test_sort_inplace(benchmark):
    rng = np.random.default_rng(0)

    def fresh():
        return (rng.random(20_000),), {}

    out = benchmark.pedantic(vecsearch.sort_inplace, setup=fresh, rounds=30, warmup_rounds=2)
    assert (np.diff(out) >= 0).all()


@pytest.mark.benchmark(group="signal", min_rounds=10, max_time=0.5)
def test_smooth(benchmark):
    x = np.random.default_rng(1).random(50_000)
    benchmark.extra_info["samples"] = x.size
    assert benchmark(vecsearch.smooth, x).shape == x.shape
