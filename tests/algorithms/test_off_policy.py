"""Off-policy correction (algorithms/off_policy.py) against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.algorithms import PolicyLossConfig, get_policy_loss
from hybridflow.algorithms.off_policy import (
    OffPolicyConfig,
    apply_behaviour_weights,
    staleness_metrics,
    truncated_is_weights,
)

LOG = math.log


def _lp(rows):
    return torch.tensor([[LOG(p) for p in row] for row in rows], dtype=torch.float32)


# pi_prox / mu per token: row 0: 2, 0.5, 3 ; row 1: 1.5, (masked), (masked)
PROX = _lp([[0.5, 0.2, 0.9], [0.6, 0.1, 0.1]])
BEHAV = _lp([[0.25, 0.4, 0.3], [0.4, 0.9, 0.9]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def test_token_level_weights_and_metrics_by_hand():
    w, m = truncated_is_weights(PROX, BEHAV, MASK, level="token", cap=2.5)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 2.5], [1.5, 0.0, 0.0]]), atol=1e-6)
    assert float(m["is_weight_mean"]) == pytest.approx((2 + 0.5 + 2.5 + 1.5) / 4, rel=1e-6)
    assert float(m["is_weight_max"]) == pytest.approx(2.5, rel=1e-6)
    assert float(m["is_weight_min"]) == pytest.approx(0.5, rel=1e-6)
    assert float(m["is_frac_capped"]) == pytest.approx(1 / 4)  # only the ratio 3 exceeds 2.5
    # KL(mu || pi_prox) k1 = mean(log mu - log pi_prox) over the 4 tokens
    assert float(m["behaviour_kl"]) == pytest.approx(-(LOG(2) + LOG(0.5) + LOG(3) + LOG(1.5)) / 4, rel=1e-5)


def test_sequence_level_weights_by_hand():
    w, m = truncated_is_weights(PROX, BEHAV, MASK, level="sequence", cap=2.5)
    # row 0: 2 * 0.5 * 3 = 3 -> capped at 2.5 on every token; row 1: 1.5 on its one token
    assert torch.allclose(w, torch.tensor([[2.5, 2.5, 2.5], [1.5, 0.0, 0.0]]), atol=1e-6)
    assert float(m["is_weight_mean"]) == pytest.approx((2.5 + 1.5) / 2, rel=1e-6)
    assert float(m["is_frac_capped"]) == pytest.approx(0.5)
    w_big, _ = truncated_is_weights(PROX, BEHAV, MASK, level="sequence", cap=10.0)
    assert torch.allclose(w_big[0], torch.full((3,), 3.0), atol=1e-5)


def test_sequence_level_does_not_overflow_and_padding_is_ignored():
    prox = torch.zeros(1, 400)
    behav = torch.full((1, 400), -1.0)  # product e^400: overflows fp32 if not done in log space
    behav_nan = behav.clone()
    mask = torch.ones(1, 400)
    mask[0, -1] = 0
    behav_nan[0, -1] = float("nan")
    w, m = truncated_is_weights(prox, behav_nan, mask, level="sequence", cap=2.0)
    assert torch.isfinite(w).all() and float(w[0, 0]) == pytest.approx(2.0) and float(w[0, -1]) == 0.0
    assert float(m["is_frac_capped"]) == 1.0


def test_decoupled_ppo_equals_the_formula_by_hand():
    # r = pi_theta / pi_prox, w = pi_prox / mu; l = w * max(-A r, -A clip(r, 0.8, 1.2))
    theta = _lp([[0.75, 0.1]])  # r = 1.5, 0.5
    prox = _lp([[0.5, 0.2]])
    behav = _lp([[0.25, 0.4]])  # w = 2, 0.5
    adv = torch.tensor([[1.0, -2.0]])
    mask = torch.ones(1, 2)
    cfg = OffPolicyConfig(is_level="token", is_cap=10.0)
    weighted, metrics = apply_behaviour_weights(adv, prox, behav, mask, cfg)
    loss, _ = get_policy_loss("vanilla")(prox, theta, weighted, mask, config=PolicyLossConfig(loss_agg_mode="token-mean"))
    tok0 = 2.0 * max(-1.0 * 1.5, -1.0 * 1.2)  # -2.4
    tok1 = 0.5 * max(2.0 * 0.5, 2.0 * 0.8)  # 0.8 (A < 0, r < 0.8: clipped; dual clip 3 * 2 = 6 not hit)
    assert float(loss) == pytest.approx((tok0 + tok1) / 2, rel=1e-5)
    assert float(metrics["is_weight_mean"]) == pytest.approx(1.25, rel=1e-6)


def test_decoupled_gradient_is_weighted_ppo_gradient():
    torch.manual_seed(0)
    theta = torch.randn(3, 5).log_softmax(-1).requires_grad_(True)
    prox, behav = theta.detach() + 0.05 * torch.randn(3, 5), theta.detach() + 0.3 * torch.randn(3, 5)
    adv, mask = torch.randn(3, 5), torch.ones(3, 5)
    cfg = OffPolicyConfig(is_level="token", is_cap=1.5)
    w, _ = truncated_is_weights(prox, behav, mask, level="token", cap=1.5)
    weighted, _ = apply_behaviour_weights(adv, prox, behav, mask, cfg)
    pcfg = PolicyLossConfig(loss_agg_mode="token-mean")
    loss, _ = get_policy_loss("vanilla")(prox, theta, weighted, mask, config=pcfg)
    (g,) = torch.autograd.grad(loss, theta)
    # per-token reference: d/dtheta of w_t * ppo_t / N
    ratio = torch.exp(theta - prox)
    ref_mat = w * torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    ref_mat = torch.where(adv < 0, torch.minimum(ref_mat, -adv * 3.0 * w), ref_mat)
    (g_ref,) = torch.autograd.grad(ref_mat.mean(), theta)
    assert torch.allclose(g, g_ref, atol=1e-6)


def test_off_means_unchanged_and_config_checks():
    adv = torch.randn(2, 3)
    out, metrics = apply_behaviour_weights(adv, PROX, BEHAV, MASK, OffPolicyConfig())
    assert out is adv and metrics == {}
    with pytest.raises(ValueError, match="is_level"):
        OffPolicyConfig(is_level="tokens")
    with pytest.raises(ValueError, match="is_cap"):
        OffPolicyConfig(is_level="token", is_cap=0.5)


def test_staleness_histogram_by_hand():
    version = torch.tensor([[5, 5, 4, 0], [3, 3, 3, 3]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    m = staleness_metrics(version, mask, current_version=5, max_bucket=2)
    # lags of the 5 tokens: 0, 0, 1, 2, 2
    assert m["staleness/mean"] == pytest.approx(1.0)
    assert m["staleness/max"] == 2.0
    assert m["staleness/frac_0"] == pytest.approx(2 / 5)
    assert m["staleness/frac_1"] == pytest.approx(1 / 5)
    assert m["staleness/frac_ge2"] == pytest.approx(2 / 5)
    with pytest.raises(ValueError, match="newer"):
        staleness_metrics(version, mask, current_version=4)
