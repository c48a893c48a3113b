"""Masked statistics: hand-computed values, degenerate inputs, masked positions ignored."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hybridflow.algorithms import masked_mean, masked_sum, masked_var, masked_whiten

from ._helpers import FAST, poison_masked

X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
M = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_masked_mean_hand_computed():
    assert masked_mean(X, M).item() == pytest.approx(7 / 3)
    assert masked_mean(X, M, dim=-1).tolist() == pytest.approx([1.5, 4.0])
    assert masked_sum(X, M).item() == 7.0


def test_masked_var_hand_computed():
    # kept values 1, 2, 4: mean 7/3, squared deviations sum to 42/9.
    assert masked_var(X, M).item() == pytest.approx(42 / 9 / 2)
    assert masked_var(X, M, unbiased=False).item() == pytest.approx(42 / 9 / 3)
    assert masked_var(X, M, dim=-1).tolist() == pytest.approx([0.5, 0.0])


def test_empty_and_single_selections_are_zero_not_nan():
    none = torch.zeros_like(M)
    assert masked_mean(X, none).item() == 0.0
    assert masked_var(X, none).item() == 0.0
    one = torch.tensor([[0, 1, 0], [0, 0, 0]])
    assert masked_var(X, one).item() == 0.0
    assert torch.equal(masked_whiten(X, none), torch.zeros_like(X))
    assert torch.equal(masked_whiten(X, one), torch.zeros_like(X))


def test_whiten_is_batch_level_zero_mean_unit_variance():
    w = masked_whiten(X, M)
    assert masked_mean(w, M).item() == pytest.approx(0.0, abs=1e-12)
    assert masked_var(w, M).item() == pytest.approx(1.0, rel=1e-6)
    assert w[~M.bool()].abs().sum().item() == 0.0
    expected = (torch.tensor([1.0, 2.0, 4.0]) - 7 / 3) / math.sqrt(7 / 3 + 1e-8)
    assert w[M.bool()].tolist() == pytest.approx(expected.tolist())


def test_whiten_without_mean_shift_keeps_the_mean():
    w = masked_whiten(X, M, shift_mean=False)
    assert masked_mean(w, M).item() == pytest.approx(7 / 3)


def test_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="shape"):
        masked_mean(X, M[:, :2])


@FAST
@given(st.integers(1, 5), st.integers(1, 6), st.integers(0, 10_000), st.booleans())
def test_masked_positions_never_change_results(b, t, seed, use_nan):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, generator=g, dtype=torch.float64)
    mask = torch.rand(b, t, generator=g) < 0.6
    dirty = poison_masked(x, mask, seed + 1, nan=use_nan)
    for fn in (masked_sum, masked_mean, masked_var):
        assert torch.equal(fn(x, mask), fn(dirty, mask))
        assert torch.equal(fn(x, mask, dim=-1), fn(dirty, mask, dim=-1))
    assert torch.equal(masked_whiten(x, mask), masked_whiten(dirty, mask))
    assert torch.isfinite(masked_whiten(dirty, mask)).all()
