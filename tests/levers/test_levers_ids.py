"""Vocabulary-bound normalisation of hashed ids."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from torchlevers.ids import IdSpace, check_ids, normalize_ids

VOCAB = 30522


def _raw_ids() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    wide = torch.randint(-(2**62), 2**62, (4096,), generator=g) * 2
    edges = torch.tensor([0, 1, -1, 2**63 - 1, -(2**63), VOCAB, -VOCAB, 10**6])
    return torch.cat([wide, edges, torch.arange(VOCAB, 3 * VOCAB, 7)])


def _seed_modulo(ids: torch.Tensor, space: IdSpace) -> torch.Tensor:
    return ids % space.vocab_size  # lands on reserved ids (0 is padding)


def _ours(ids: torch.Tensor, space: IdSpace) -> torch.Tensor:
    return normalize_ids(ids, space)


@pytest.mark.parametrize(
    ("fold", "method"),
    [
        pytest.param(_ours, "hash", id="hash"),
        pytest.param(_ours, "modulo", id="modulo"),
        pytest.param(
            _seed_modulo,
            "modulo",
            id="negative-control-plain-modulo",
            marks=pytest.mark.xfail(strict=True, reason="raw id % vocab hits the reserved pad/unk ids"),
        ),
    ],
)
def test_real_ids_land_in_range_and_never_on_reserved_ids(
    fold: Callable[[torch.Tensor, IdSpace], torch.Tensor], method: str
) -> None:
    space = IdSpace(vocab_size=VOCAB, method=method)  # type: ignore[arg-type]
    out = fold(_raw_ids(), space)
    assert out.dtype == torch.int64
    assert int(out.min()) >= space.num_reserved
    assert int(out.max()) < VOCAB


def test_deterministic_and_seeded() -> None:
    ids = _raw_ids()
    a = normalize_ids(ids, IdSpace(vocab_size=VOCAB, seed=3))
    assert torch.equal(a, normalize_ids(ids.clone(), IdSpace(vocab_size=VOCAB, seed=3)))
    assert not torch.equal(a, normalize_ids(ids, IdSpace(vocab_size=VOCAB, seed=4)))
    # Same id in any position and any batch maps to the same row.
    assert torch.equal(normalize_ids(ids[:10].reshape(2, 5), IdSpace(vocab_size=VOCAB, seed=3)), a[:10].reshape(2, 5))


def test_hash_spreads_structured_ids_where_modulo_collapses_them() -> None:
    multiples = torch.arange(1, 1001) * (VOCAB - 2)
    hashed = normalize_ids(multiples, IdSpace(vocab_size=VOCAB))
    modulo = normalize_ids(multiples, IdSpace(vocab_size=VOCAB, method="modulo"))
    assert modulo.unique().numel() == 1
    # 1000 balls into 30520 bins: ~984 distinct expected.
    assert hashed.unique().numel() >= 960


def test_hash_is_roughly_uniform() -> None:
    space = IdSpace(vocab_size=18, num_reserved=2)  # 16 real rows
    counts = torch.bincount(normalize_ids(torch.arange(160_000), space), minlength=18)
    assert counts[:2].sum() == 0
    expected = 10_000
    chi2 = float(((counts[2:].double() - expected) ** 2 / expected).sum())
    assert chi2 < 40  # 15 d.o.f.: p ~ 5e-4 at 40


def test_modulo_keeps_in_range_ids_distinct_and_handles_negatives() -> None:
    space = IdSpace(vocab_size=10, num_reserved=2, method="modulo")
    assert normalize_ids(torch.arange(8), space).tolist() == list(range(2, 10))
    assert normalize_ids(torch.tensor([-1]), space).tolist() == [9]


def test_pad_and_unknown_inputs_map_to_reserved_ids() -> None:
    space = IdSpace(vocab_size=100, input_pad=-1, input_unknown=-2)
    out = normalize_ids(torch.tensor([[5, -1, -2, 7]]), space)
    assert out[0, 1] == space.pad_id and out[0, 2] == space.unk_id
    assert int(out[0, 0]) >= 2 and int(out[0, 3]) >= 2


def test_float_ids_are_refused() -> None:
    with pytest.raises(TypeError, match="2\\*\\*24"):
        normalize_ids(torch.tensor([1.0, 2.0]), IdSpace(vocab_size=10))
    with pytest.raises(TypeError, match="bool"):
        normalize_ids(torch.tensor([True]), IdSpace(vocab_size=10))


def test_check_ids_names_position_and_value() -> None:
    check_ids(torch.tensor([[0, 9]]), 10)
    with pytest.raises(ValueError, match=r"ids\[1, 0\] = 10 is outside \[0, 10\)"):
        check_ids(torch.tensor([[0, 9], [10, 3]]), 10)
    with pytest.raises(ValueError, match=r"tokens\[0\] = -3"):
        check_ids([-3], 10, name="tokens")


def test_ids_a_mersenne_prime_apart_do_not_collide_under_any_seed() -> None:
    p = (1 << 31) - 1
    base = torch.tensor([5, 7, 123456789, -9, (1 << 40) + 3], dtype=torch.int64)
    for seed in range(5):
        space = IdSpace(vocab_size=1 << 30, seed=seed)  # buckets enough that a collision would be the hash's
        a, b = normalize_ids(base, space), normalize_ids(base + p, space)
        assert not torch.equal(a, b), seed
        assert int((a == b).sum()) <= 1, (seed, a, b)


def test_nothing_reserved_folds_into_the_whole_table() -> None:
    space = IdSpace(vocab_size=16, num_reserved=0)
    out = normalize_ids(torch.arange(-1000, 1000), space)
    assert int(out.min()) == 0 and int(out.max()) == 15
    assert torch.equal(normalize_ids(torch.arange(16), IdSpace(vocab_size=16, num_reserved=0, method="modulo")),
                       torch.arange(16))


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"vocab_size": 2}, "num_reserved"),
        ({"vocab_size": 10, "pad_id": 5}, "pad_id"),
        ({"vocab_size": 10, "unk_id": 0}, "differ"),
        ({"vocab_size": 10, "method": "xor"}, "'xor'"),
        ({"vocab_size": 10, "input_pad": -1, "input_unknown": -1}, "differ"),
        ({"vocab_size": 10.0}, "10.0"),
        ({"vocab_size": 10, "num_reserved": 0, "input_pad": -1}, "pad_id must be a reserved id .* \\(for input_pad\\)"),
    ],
)
def test_id_space_names_bad_values(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        IdSpace(**kwargs)
