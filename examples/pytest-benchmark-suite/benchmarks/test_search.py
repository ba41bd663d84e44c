"""vecsearch's speed, as pytest-benchmark measures it (``pytest benchmarks``)."""

import pytest
import torch
import vecsearch


@pytest.fixture(scope="module")
def corpus():
    return torch.randn(2000, 64, generator=torch.Generator().manual_seed(0))


def test_normalize(benchmark, corpus):
    out = benchmark(vecsearch.normalize, corpus)
    assert torch.allclose(out.norm(dim=1), torch.ones(len(corpus)), atol=1e-5)


@pytest.mark.benchmark(group="search", min_rounds=20)
@pytest.mark.parametrize("k", [10])
def test_cosine_topk(benchmark, corpus, k):
    benchmark.extra_info["corpus_rows"] = len(corpus)
    top = benchmark(vecsearch.cosine_topk, corpus[:16], corpus, k=k)
    assert top.shape == (16, k) and (top[:, 0] == torch.arange(16)).all()


def test_tokenize(benchmark):
    assert benchmark(vecsearch.tokenize, "The quick, brown fox!") == ["the", "quick", "brown", "fox"]
