"""Clipped value loss: hand-computed value and gradient, no-clip mode, masking."""

from __future__ import annotations

import pytest
import torch

from hybridflow.algorithms import value_loss

from ._helpers import poison_masked


def test_clipped_value_loss_hand_computed():
    vpreds = torch.tensor([[2.0, 0.8, 1.0]], dtype=torch.float64, requires_grad=True)
    values = torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64)
    returns = torch.tensor([[3.0, 0.0, 1.5]], dtype=torch.float64)
    loss, m = value_loss(vpreds, values, returns, torch.ones(1, 3), cliprange_value=0.5)
    # t0: unclipped (2-3)^2 = 1, clipped (1.5-3)^2 = 2.25 -> 2.25 (gradient 0: clip is flat);
    # t1: both 0.64; t2: both 0.25.
    assert loss.item() == pytest.approx(0.5 * (2.25 + 0.64 + 0.25) / 3)
    assert m["vf_clipfrac"].item() == pytest.approx(1 / 3)
    loss.backward()
    expected = [0.0, 0.5 * 2 * 0.8 / 3, 0.5 * 2 * (1.0 - 1.5) / 3]
    assert vpreds.grad[0].tolist() == pytest.approx(expected)


def test_clipping_off_is_plain_mse():
    vpreds = torch.tensor([[2.0, 0.0]], dtype=torch.float64)
    returns = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    loss, m = value_loss(vpreds, torch.zeros(1, 2), returns, torch.ones(1, 2), cliprange_value=None)
    assert loss.item() == pytest.approx(0.5 * (4 + 1) / 2) and m["vf_clipfrac"].item() == 0.0


def test_masked_positions_never_change_the_value_loss():
    g = torch.Generator().manual_seed(0)
    v, old, ret = (torch.randn(3, 4, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(3, 4, generator=g) < 0.5
    mask[0] = True
    outs = []
    for poisoned in (False, True):
        vp = (poison_masked(v, mask, 1, nan=True) if poisoned else v.clone()).requires_grad_(True)
        loss, m = value_loss(
            vp, poison_masked(old, mask, 2) if poisoned else old, poison_masked(ret, mask, 3, nan=True) if poisoned else ret,
            mask, cliprange_value=0.2, loss_agg_mode="seq-mean-token-mean",
        )
        loss.backward()
        outs.append((loss.detach(), m, vp.grad))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=0, atol=0)
    torch.testing.assert_close(outs[1][2], outs[0][2], rtol=0, atol=0)
    for k in outs[0][1]:
        torch.testing.assert_close(outs[1][1][k], outs[0][1][k], rtol=0, atol=0)


def test_bad_inputs():
    with pytest.raises(ValueError, match="cliprange_value"):
        value_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), cliprange_value=0.0)
    with pytest.raises(ValueError, match="returns"):
        value_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2), cliprange_value=0.2)
