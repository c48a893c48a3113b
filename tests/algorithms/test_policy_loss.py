"""Policy losses: hand-computed values, metrics, gradients vs the written formulas, masking."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hybridflow.algorithms import (
    PolicyLossConfig,
    compute_aggregation_scale,
    compute_policy_loss,
    get_policy_loss,
    policy_losses,
)

from ._helpers import FAST, poison_masked

ALL = torch.ones(1, 4, dtype=torch.bool)


def _logp(ratios, requires_grad=True):
    return torch.log(torch.tensor([ratios], dtype=torch.float64)).requires_grad_(requires_grad)


def _run(mode, ratios, adv, mask=None, **cfg):
    new = _logp(ratios)
    old = torch.zeros_like(new)
    adv_t = torch.tensor([adv], dtype=torch.float64)
    mask = torch.ones_like(adv_t, dtype=torch.bool) if mask is None else mask
    config = PolicyLossConfig(loss_mode=mode, **cfg)
    loss, metrics = compute_policy_loss(old, new, adv_t, mask, config=config)
    loss.backward()
    return loss.item(), metrics, new.grad[0].tolist()


def test_ppo_clip_dual_clip_hand_computed():
    loss, m, grad = _run("vanilla", [1.5, 0.5, 1.1, 4.0], [1.0, -1.0, -1.0, -1.0])
    # token 0: A>0, r=1.5 clipped to 1.2 -> -1.2; token 1: A<0, r=0.5 clipped to 0.8 -> 0.8;
    # token 2: inside the range -> 1.1; token 3: A<0, r=4 > c=3 -> dual clip -> 3.
    assert loss == pytest.approx((-1.2 + 0.8 + 1.1 + 3.0) / 4)
    assert grad == pytest.approx([0.0, 0.0, 1.1 / 4, 0.0])  # d/dlogp of -A r is -A r
    assert m["pg_clipfrac"].item() == 0.5
    assert m["pg_clipfrac_high"].item() == 0.25
    assert m["pg_clipfrac_low"].item() == 0.25
    assert m["pg_clipfrac_dual"].item() == 0.25
    assert m["ppo_kl"].item() == pytest.approx(-sum(math.log(r) for r in (1.5, 0.5, 1.1, 4.0)) / 4)
    assert all(not t.requires_grad for t in m.values())


def test_clip_higher_lets_positive_advantages_grow_further():
    _, m, grad = _run("vanilla", [1.25, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0])
    assert grad[0] == 0.0 and m["pg_clipfrac_high"].item() == 0.25
    _, m, grad = _run("vanilla", [1.25, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], clip_ratio_high=0.28)
    assert grad[0] == pytest.approx(-1.25 / 4) and m["pg_clipfrac_high"].item() == 0.0


def test_log_ratio_is_clamped_for_stability():
    new = torch.tensor([[50.0]], dtype=torch.float64, requires_grad=True)
    loss, _ = compute_policy_loss(
        torch.zeros(1, 1), new, -torch.ones(1, 1), torch.ones(1, 1), config=PolicyLossConfig(clip_ratio_c=1e30)
    )
    assert loss.item() == pytest.approx(math.exp(20.0))


def test_gspo_hand_computed():
    new = torch.tensor([[0.1, 0.3], [-0.1, 0.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    cfg = PolicyLossConfig(loss_mode="gspo", loss_agg_mode="seq-mean-token-mean")
    loss, m = compute_policy_loss(torch.zeros_like(new), new, adv, mask, config=cfg)
    loss.backward()
    # s_0 = exp(mean(0.1, 0.3)) = e^0.2 > 1.2 -> clipped; s_1 = e^-0.1, inside the range.
    assert loss.item() == pytest.approx((-1.2 + math.exp(-0.1)) / 2)
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, 0.0], [math.exp(-0.1) / 2, 0.0]], dtype=torch.float64))
    assert m["pg_clipfrac_high"].item() == pytest.approx(2 / 3)


def test_gspo_gradient_equals_the_sequence_level_objective():
    g = torch.Generator().manual_seed(0)
    b, t = 5, 6
    old = torch.randn(b, t, generator=g, dtype=torch.float64) * 0.1
    new0 = old + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.05
    mask = torch.arange(t) < torch.tensor([6, 4, 1, 3, 5]).unsqueeze(1)
    seq_adv = torch.randn(b, generator=g, dtype=torch.float64)
    adv = seq_adv.unsqueeze(1).expand(b, t)
    cfg = PolicyLossConfig(loss_mode="gspo", clip_ratio_low=0.03, clip_ratio_high=0.04, loss_agg_mode="seq-mean-token-mean")
    new = new0.clone().requires_grad_(True)
    compute_policy_loss(old, new, adv, mask, config=cfg)[0].backward()
    # The paper's objective written directly: s_i = (pi/pi_old)^(1/|y_i|) per sequence.
    ref = new0.clone().requires_grad_(True)
    s = torch.exp(((ref - old) * mask).sum(1) / mask.sum(1))
    obj = torch.maximum(-seq_adv * s, -seq_adv * s.clamp(0.97, 1.04)).mean()
    obj.backward()
    torch.testing.assert_close(new.grad, ref.grad)


def test_cispo_hand_computed():
    loss, m, grad = _run("cispo", [1.5, 0.5, 1.0, 1.0], [1.0, -1.0, 2.0, 0.0])
    w = [1.2, 0.8, 1.0, 1.0]  # clipped, detached importance weights
    assert loss == pytest.approx((-1.2 * math.log(1.5) + 0.8 * math.log(0.5)) / 4)
    assert grad == pytest.approx([-w[0] * 1 / 4, w[1] * 1 / 4, -w[2] * 2 / 4, 0.0])
    assert m["pg_clipfrac_high"].item() == 0.25 and m["pg_clipfrac_low"].item() == 0.25


def test_reinforce_and_gpg_hand_computed():
    loss, _, grad = _run("reinforce", [1.5, 0.5, 1.0, 1.0], [1.0, -1.0, 2.0, 0.0])
    assert loss == pytest.approx((-1.5 + 0.5 - 2.0) / 4)
    assert grad == pytest.approx([-1.5 / 4, 0.5 / 4, -2.0 / 4, 0.0])
    loss, m, grad = _run("gpg", [1.5, 0.5, 1.0, 1.0], [1.0, -1.0, 2.0, 0.0])
    assert loss == pytest.approx((-math.log(1.5) + math.log(0.5)) / 4)
    assert grad == pytest.approx([-0.25, 0.25, -0.5, 0.0])
    assert "ppo_kl" in m


def test_ppo_gradient_matches_the_written_piecewise_formula():
    g = torch.Generator().manual_seed(1)
    old = torch.randn(6, 8, generator=g, dtype=torch.float64)
    new = (old + torch.randn(6, 8, generator=g, dtype=torch.float64) * 0.6).requires_grad_(True)
    adv = torch.randn(6, 8, generator=g, dtype=torch.float64)
    mask = torch.rand(6, 8, generator=g) < 0.8
    cfg = PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=2.0)
    loss, _ = compute_policy_loss(old, new, adv, mask, config=cfg)
    loss.backward()
    r = torch.exp(new.detach() - old)
    # d l / d log pi = -A r where the unclipped term is active, 0 where a clip is active.
    active = torch.where(adv > 0, r <= 1.28, (r >= 0.8) & (r <= 2.0))
    expected = torch.where(mask & active, -adv * r, torch.zeros(())) / mask.sum()
    torch.testing.assert_close(new.grad, expected)


def test_config_validation():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        PolicyLossConfig(clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="clip_ratio_low"):
        PolicyLossConfig(clip_ratio_low=1.0)
    with pytest.raises(ValueError, match="token-mean"):
        PolicyLossConfig(loss_agg_mode="token_mean")
    with pytest.raises(ValueError, match="did you mean 'gspo'"):
        PolicyLossConfig(loss_mode="gpso")
    with pytest.raises(ValueError, match="shape"):
        get_policy_loss("vanilla")(torch.zeros(2, 3), torch.zeros(2, 2), torch.zeros(2, 2), torch.ones(2, 2), config=PolicyLossConfig())


AGG_MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@FAST
@given(seed=st.integers(0, 10_000), mode=st.sampled_from(policy_losses()), agg_mode=st.sampled_from(AGG_MODES))
def test_masked_positions_never_change_loss_metrics_or_gradient(seed, mode, agg_mode):
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(4, 5, generator=g, dtype=torch.float64)
    new0 = old + 0.3 * torch.randn(4, 5, generator=g, dtype=torch.float64)
    adv = torch.randn(4, 5, generator=g, dtype=torch.float64)
    mask = torch.rand(4, 5, generator=g) < 0.6
    mask[0] = False  # an empty response
    cfg = PolicyLossConfig(loss_mode=mode, loss_agg_mode=agg_mode)
    results = []
    for poisoned in (False, True):
        new = (poison_masked(new0, mask, seed, nan=True) if poisoned else new0.clone()).requires_grad_(True)
        o = poison_masked(old, mask, seed + 1) if poisoned else old
        a = poison_masked(adv, mask, seed + 2, nan=True) if poisoned else adv
        loss, metrics = compute_policy_loss(o, new, a, mask, config=cfg)
        loss.backward()
        results.append((loss.detach(), metrics, new.grad))
    (l0, m0, g0), (l1, m1, g1) = results
    torch.testing.assert_close(l1, l0, rtol=0, atol=0)
    assert m0.keys() == m1.keys()
    for k in m0:
        torch.testing.assert_close(m1[k], m0[k], rtol=0, atol=0)
    torch.testing.assert_close(g1, g0, rtol=0, atol=0)
    assert torch.isfinite(g1).all() and g1[~mask].abs().sum() == 0


@pytest.mark.parametrize("mode", policy_losses())
def test_all_masked_batch_gives_zero_loss_and_finite_metrics(mode):
    new = torch.zeros(3, 4, requires_grad=True)
    loss, metrics = compute_policy_loss(
        torch.zeros(3, 4), new, torch.ones(3, 4), torch.zeros(3, 4), config=PolicyLossConfig(loss_mode=mode)
    )
    loss.backward()
    assert loss.item() == 0.0 and all(torch.isfinite(v) for v in metrics.values())
    assert new.grad.abs().sum() == 0


@pytest.mark.parametrize("mode", policy_losses())
def test_policy_loss_gradient_is_micro_batch_invariant(mode):
    g = torch.Generator().manual_seed(2)
    old = torch.randn(8, 5, generator=g, dtype=torch.float64)
    new0 = old + 0.3 * torch.randn(8, 5, generator=g, dtype=torch.float64)
    adv = torch.randn(8, 5, generator=g, dtype=torch.float64)
    mask = torch.arange(5) < torch.randint(0, 6, (8, 1), generator=g)
    cfg = PolicyLossConfig(loss_mode=mode)
    full = new0.clone().requires_grad_(True)
    compute_policy_loss(old, full, adv, mask, config=cfg)[0].backward()
    split = new0.clone().requires_grad_(True)
    pieces = [slice(0, 3), slice(3, 4), slice(4, 8)]
    agg = compute_aggregation_scale([mask[p] for p in pieces])
    for p in pieces:
        compute_policy_loss(old[p], split[p], adv[p], mask[p], config=cfg, agg=agg)[0].backward()
    torch.testing.assert_close(split.grad, full.grad)


def test_bf16_log_probs_are_compared_to_old_log_probs_in_fp32():
    old = torch.tensor([[-2.3456789, -0.0012345]], dtype=torch.float32)
    new = old.to(torch.bfloat16).requires_grad_(True)
    loss, metrics = compute_policy_loss(old, new, torch.ones(1, 2), torch.ones(1, 2), config=PolicyLossConfig())
    assert loss.dtype == torch.float32
    # The ratio uses the exact fp32 difference between the bf16 value and the fp32 old value.
    expected_kl = (old - new.detach().float()).mean()
    torch.testing.assert_close(metrics["ppo_kl"], expected_kl)
    loss.backward()
    assert new.grad.dtype == torch.bfloat16
