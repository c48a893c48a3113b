"""Loss aggregation: hand-computed modes and micro-batch / data-parallel split invariance.

The invariance tests reproduce what a worker does: one shared parameter, the mini-batch
cut into micro-batches (and shards for simulated dp ranks), one backward per
micro-batch with gradients accumulated, then the FSDP-style mean over ranks. The result
must equal the gradient of the loss of the whole mini-batch in one piece.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hybridflow.algorithms import (
    AggregationScale,
    agg_loss,
    compute_aggregation_scale,
    loss_agg_modes,
)

from ._helpers import FAST

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # third row: an empty response

MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 10 / 4),
        ("seq-mean-token-sum", (6 + 4) / 2),
        ("seq-mean-token-mean", (2 + 4) / 2),
        ("seq-mean-token-sum-norm", 10 / (2 * 3)),
    ],
)
def test_modes_hand_computed(mode, expected):
    # Empty rows do not count as sequences, and their (nonzero) losses are ignored.
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_global_scale_is_used_when_given():
    agg = AggregationScale(global_tokens=8, global_seqs=5, dp_size=2, loss_scale_factor=4)
    assert agg_loss(LOSS, MASK, "token-mean", agg).item() == pytest.approx(10 * 2 / 8)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum", agg).item() == pytest.approx(10 * 2 / 5)
    assert agg_loss(LOSS, MASK, "seq-mean-token-mean", agg).item() == pytest.approx(6 * 2 / 5)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", agg).item() == pytest.approx(10 * 2 / (5 * 4))


@pytest.mark.parametrize("mode", MODES)
def test_all_masked_gives_zero_not_nan(mode):
    empty = torch.zeros_like(MASK)
    assert agg_loss(LOSS, empty, mode).item() == 0.0
    agg = compute_aggregation_scale([empty])
    assert agg_loss(LOSS, empty, mode, agg).item() == 0.0


def test_registered_modes_are_exactly_the_documented_four():
    assert loss_agg_modes() == sorted(MODES)


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="loss_agg_mode"):
        agg_loss(LOSS, MASK, "token_mean")
    with pytest.raises(ValueError, match="dp_size"):
        compute_aggregation_scale([MASK], dp_size=2)
    with pytest.raises(ValueError, match="dp_size"):
        AggregationScale(global_tokens=1, global_seqs=1, dp_size=0)


def test_compute_aggregation_scale_counts_tokens_and_nonempty_sequences():
    agg = compute_aggregation_scale([MASK, MASK[:1]], loss_scale_factor=7)
    assert (agg.global_tokens, agg.global_seqs, agg.dp_size, agg.loss_scale_factor) == (7, 3, 1, 7)


# ----------------------------------------------------------------------------- split invariance


def _token_losses(theta: torch.Tensor, feats: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    """A per-token loss that depends nonlinearly on one shared parameter vector."""
    return -adv * torch.tanh(feats @ theta) + 0.1 * (feats @ theta) ** 2


def _full_batch_grad(theta0, feats, adv, mask, mode, scale_factor):
    theta = theta0.clone().requires_grad_(True)
    agg = compute_aggregation_scale([mask], loss_scale_factor=scale_factor)
    agg_loss(_token_losses(theta, feats, adv), mask, mode, agg).backward()
    # agg=None is the single-piece definition; it must agree with the global scale here.
    theta_ref = theta0.clone().requires_grad_(True)
    if scale_factor is None:
        agg_loss(_token_losses(theta_ref, feats, adv), mask, mode).backward()
        torch.testing.assert_close(theta.grad, theta_ref.grad)
    return theta.grad


def _split_grad(theta0, feats, adv, mask, mode, scale_factor, rank_rows, micro_rows):
    """Gradient after per-micro-batch backward on each simulated rank and a mean over ranks."""
    dp = len(rank_rows)
    shards = [[(r[m0:m1]) for m0, m1 in micro_rows[k]] for k, r in enumerate(rank_rows)]

    def all_reduce_sum(local: torch.Tensor) -> torch.Tensor:
        # What a real all-reduce returns on every rank: the counts summed over all ranks.
        per_rank = [compute_aggregation_scale([mask[idx] for idx in micro]) for micro in shards]
        return torch.tensor([sum(a.global_tokens for a in per_rank), sum(a.global_seqs for a in per_rank)])

    rank_grads = []
    for micro in shards:
        agg = compute_aggregation_scale(
            [mask[idx] for idx in micro], dp_size=dp, all_reduce_sum=all_reduce_sum, loss_scale_factor=scale_factor
        )
        theta = theta0.clone().requires_grad_(True)
        for idx in micro:  # gradient accumulation over micro-batches
            agg_loss(_token_losses(theta, feats[idx], adv[idx]), mask[idx], mode, agg).backward()
        # A rank with no rows still takes part in the mean with a zero gradient.
        rank_grads.append(theta.grad if theta.grad is not None else torch.zeros_like(theta0))
    return torch.stack(rank_grads).mean(0)  # the FSDP reduce averages over ranks


def _batch(seed: int, b: int, t: int, d: int = 4):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(b, t, d, generator=g, dtype=torch.float64)
    adv = torch.randn(b, t, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, t + 1, (b,), generator=g)
    lengths[0] = t  # at least one non-empty response
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    theta0 = torch.randn(d, generator=g, dtype=torch.float64)
    return theta0, feats, adv, mask


def _even_chunks(n: int, k: int) -> list[tuple[int, int]]:
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(k)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scale_factor", [None, 11.0])
def test_one_vs_four_micro_batches_same_gradient(mode, scale_factor):
    theta0, feats, adv, mask = _batch(seed=0, b=12, t=7)
    full = _full_batch_grad(theta0, feats, adv, mask, mode, scale_factor)
    rows = torch.arange(12)
    split = _split_grad(theta0, feats, adv, mask, mode, scale_factor, [rows], [_even_chunks(12, 4)])
    torch.testing.assert_close(split, full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_one_vs_two_ranks_same_gradient(mode):
    theta0, feats, adv, mask = _batch(seed=1, b=12, t=7)
    full = _full_batch_grad(theta0, feats, adv, mask, mode, 9.0)
    ranks = [torch.arange(0, 5), torch.arange(5, 12)]  # uneven shards on purpose
    micro = [_even_chunks(5, 2), _even_chunks(7, 3)]
    split = _split_grad(theta0, feats, adv, mask, mode, 9.0, ranks, micro)
    torch.testing.assert_close(split, full, rtol=1e-10, atol=1e-12)


def test_naive_local_normalisation_is_not_split_invariant():
    """Guards the test itself: local token-means summed over micro-batches differ from the full mean."""
    theta0, feats, adv, mask = _batch(seed=2, b=8, t=6)
    full = _full_batch_grad(theta0, feats, adv, mask, "token-mean", None)
    theta = theta0.clone().requires_grad_(True)
    for m0, m1 in _even_chunks(8, 4):
        idx = slice(m0, m1)
        (agg_loss(_token_losses(theta, feats[idx], adv[idx]), mask[idx], "token-mean") / 4).backward()
    assert not torch.allclose(theta.grad, full)


@FAST
@given(
    seed=st.integers(0, 10_000),
    b=st.integers(2, 10),
    t=st.integers(1, 6),
    n_micro=st.integers(1, 4),
    dp=st.integers(1, 3),
    mode=st.sampled_from(MODES),
)
def test_split_invariance_property(seed, b, t, n_micro, dp, mode):
    theta0, feats, adv, mask = _batch(seed, b, t)
    full = _full_batch_grad(theta0, feats, adv, mask, mode, float(t + 3))
    rows = torch.arange(b)
    shards = [rows[m0:m1] for m0, m1 in _even_chunks(b, dp)]
    micro = [_even_chunks(len(s), n_micro) for s in shards]
    split = _split_grad(theta0, feats, adv, mask, mode, float(t + 3), shards, micro)
    torch.testing.assert_close(split, full, rtol=1e-9, atol=1e-12)
