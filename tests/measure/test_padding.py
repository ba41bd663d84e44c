"""Tests of measure.padding against hand-counted tokens."""

from __future__ import annotations

import random

import pytest
import torch

from perfbudget.measure.padding import (
    PaddingStats,
    padding_rate,
    padding_rate_by_width,
    padding_rate_from_mask,
    padding_stats,
    sorted_batching_padding_rate,
)


def test_padding_rate_counts_padded_away_tokens() -> None:
    # [3, 5] padded to 5: 10 tokens, 8 real; [2] padded to 4: 4 tokens, 2 real -> 4 pad of 14.
    assert padding_rate([[3, 5], [2]], [5, 4]) == pytest.approx(4 / 14)


def test_no_padding_and_no_tokens() -> None:
    assert padding_rate([[4, 4, 4]], [4]) == 0.0
    assert padding_rate([], []) == 0.0


def test_stats_and_addition() -> None:
    a = padding_stats([[1, 2]], [2])
    b = padding_stats([[3]], [5])
    assert (a.real_tokens, a.padded_tokens, a.pad_tokens) == (3, 4, 1)
    total = a + b
    assert total == PaddingStats(real_tokens=6, padded_tokens=9, batches=2)
    assert total.rate == pytest.approx(3 / 9)


def test_rate_by_width_groups_batches_padded_alike() -> None:
    # Width 5: [3, 5] -> 8 real of 10. Width 4: [2] and [4] -> 6 real of 8.
    by_width = padding_rate_by_width([[3, 5], [2], [4]], [5, 4, 4])
    assert list(by_width) == [4, 5]
    assert by_width == {4: pytest.approx(2 / 8), 5: pytest.approx(2 / 10)}
    assert padding_rate_by_width([], []) == {}


def test_rate_by_width_names_the_batch_in_the_whole_list() -> None:
    with pytest.raises(ValueError, match="batch 2, sequence 0: length 6 exceeds the padded length 5"):
        padding_rate_by_width([[3], [4], [6]], [5, 4, 5])
    with pytest.raises(ValueError, match="2 batches"):
        padding_rate_by_width([[1], [2]], [2])


def test_truncation_is_an_error_naming_the_batch() -> None:
    with pytest.raises(
        ValueError, match="batch 1, sequence 0: length 9 exceeds the padded length 8"
    ):
        padding_rate([[1], [9]], [1, 8])


def test_mismatched_batch_counts() -> None:
    with pytest.raises(ValueError, match="2 batches"):
        padding_rate([[1], [2]], [2])


def test_rate_from_mask_tensor_and_list() -> None:
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert padding_rate_from_mask(mask) == pytest.approx(4 / 8)
    assert padding_rate_from_mask([[True, False], [True, True]]) == pytest.approx(1 / 4)


def test_sorted_batching_is_a_lower_bound_for_random_batching() -> None:
    rng = random.Random(0)
    lengths = [rng.randint(1, 512) for _ in range(1000)]
    sorted_rate = sorted_batching_padding_rate(lengths, 16)
    shuffled = lengths[:]
    rng.shuffle(shuffled)
    batches = [shuffled[i : i + 16] for i in range(0, len(shuffled), 16)]
    random_rate = padding_rate(batches, [max(b) for b in batches])
    assert 0.0 <= sorted_rate < 0.05 < random_rate


def test_sorted_batching_hand_example() -> None:
    # sorted [1, 2, 3, 10] in pairs: [1, 2] -> 4 tokens, 3 real; [3, 10] -> 20 tokens, 13 real.
    assert sorted_batching_padding_rate([10, 1, 3, 2], 2) == pytest.approx(8 / 24)
