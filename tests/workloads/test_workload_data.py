"""Synthetic data: the query-length distribution, token and image datasets, batches."""

from __future__ import annotations

import statistics

import pytest
import torch

from torchlevers.workloads import (
    CLS_ID,
    FIRST_TOKEN_ID,
    PAD_ID,
    QueryLengthDistribution,
    SegmentationDataset,
    TokenBatch,
    TokenDataset,
    query_lengths,
    synthetic_segmentation,
    synthetic_token_sequences,
)


def test_query_lengths_are_shaped_like_search_queries() -> None:
    lengths = query_lengths(20_000, seed=0)
    assert 45 <= statistics.fmean(lengths) <= 49
    assert 28 <= statistics.stdev(lengths) <= 36
    assert min(lengths) >= 2
    assert max(lengths) <= 512
    # Skewed: the median sits well below the mean and a long tail exists.
    assert statistics.median(lengths) < statistics.fmean(lengths) - 5
    assert max(lengths) > 250


def test_query_lengths_are_deterministic_per_seed() -> None:
    assert query_lengths(100, seed=7) == query_lengths(100, seed=7)
    assert query_lengths(100, seed=7) != query_lengths(100, seed=8)


def test_query_lengths_clip_to_the_limit() -> None:
    assert max(QueryLengthDistribution(max_tokens=64, tail_fraction=0.0).sample(5000)) == 64
    assert QueryLengthDistribution().sample(0) == []


def test_query_length_distribution_validates() -> None:
    with pytest.raises(
        ValueError, match=r"QueryLengthDistribution\.max_tokens: expected an int >= 10, got 5"
    ):
        QueryLengthDistribution(min_tokens=10, max_tokens=5)
    with pytest.raises(ValueError, match=r"QueryLengthDistribution\.std_tokens: .* got -1"):
        QueryLengthDistribution(std_tokens=-1)


def test_token_dataset_items() -> None:
    ds = TokenDataset([3, 1, 10], vocab_size=50, seed=0, n_classes=3)
    assert len(ds) == 3
    assert ds.lengths == [3, 1, 10]
    for i, n in enumerate(ds.lengths):
        item = ds[i]
        ids, label = item["input_ids"], item["labels"]
        assert ids.dtype == torch.int64 and ids.shape == (n,)
        assert ids[0] == CLS_ID
        assert bool(((ids[1:] >= FIRST_TOKEN_ID) & (ids[1:] < 50)).all())
        assert label.shape == () and 0 <= int(label) < 3
    # A sample can be changed by its reader without changing the dataset.
    ds[2]["input_ids"].zero_()
    assert ds[2]["input_ids"][0] == CLS_ID


def test_token_dataset_is_deterministic_per_seed() -> None:
    a, b, c = (TokenDataset([5, 9, 20], vocab_size=100, seed=s) for s in (1, 1, 2))
    assert all(torch.equal(a[i]["input_ids"], b[i]["input_ids"]) for i in range(3))
    assert not all(torch.equal(a[i]["input_ids"], c[i]["input_ids"]) for i in range(3))


def test_labels_are_the_majority_token_class() -> None:
    g = torch.Generator().manual_seed(0)
    seqs, labels = synthetic_token_sequences([30] * 20, vocab_size=64, n_classes=2, generator=g)
    for seq, label in zip(seqs, labels, strict=True):
        counts = torch.bincount((seq[1:] - FIRST_TOKEN_ID) % 2, minlength=2)
        assert int(label) == int(counts.argmax())


def test_zero_length_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"TokenDataset\.lengths: every length must be >= 1, got \[0\]"
    ):
        TokenDataset([4, 0], vocab_size=10)


def test_token_batch_pads_right_and_counts_tokens() -> None:
    seqs = [torch.tensor([1, 5, 6]), torch.tensor([1, 7])]
    batch = TokenBatch.from_sequences(seqs, [0, 1], pad_to=4)
    assert batch.input_ids.tolist() == [[1, 5, 6, PAD_ID], [1, 7, PAD_ID, PAD_ID]]
    assert batch.attention_mask.tolist() == [[True, True, True, False], [True, True, False, False]]
    assert (batch.num_samples, batch.seq_len, batch.num_tokens, batch.num_positions) == (2, 4, 5, 8)
    again = TokenBatch.from_mapping(
        {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask.long(),
            "labels": batch.labels,
        }
    )
    assert again.num_tokens == 5


def test_token_batch_never_truncates() -> None:
    with pytest.raises(ValueError, match="does not fit pad_to=2; refusing to truncate"):
        TokenBatch.from_sequences([torch.tensor([1, 2, 3])], [0], pad_to=2)


def test_synthetic_segmentation_shapes_and_classes() -> None:
    g = torch.Generator().manual_seed(0)
    images, masks = synthetic_segmentation(
        3, image_size=32, in_channels=3, n_classes=5, generator=g
    )
    assert images.shape == (3, 3, 32, 32) and images.dtype == torch.float32
    assert masks.shape == (3, 32, 32) and masks.dtype == torch.int64
    assert int(masks.min()) >= 0 and int(masks.max()) < 5
    assert len(masks.unique()) >= 3  # objects were painted over the background


def test_segmentation_dataset_items_do_not_depend_on_read_order() -> None:
    ds = SegmentationDataset(4, image_size=16, n_classes=3, seed=5)
    later = ds[3]
    first = ds[0]
    assert torch.equal(ds[3][0], later[0]) and torch.equal(ds[0][1], first[1])
    assert not torch.equal(ds[0][0], ds[1][0])
    with pytest.raises(IndexError):
        ds[4]
