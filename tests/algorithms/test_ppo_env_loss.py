"""The environment PPO loss (the one clipped policy loss + clipped value loss - entropy bonus)
against values computed by hand; the clipped loss's dense path equals its masked one."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.algorithms.ppo_env import PPOLossConfig, actor_critic_loss, normalize


def _inputs():
    # ratios 1.5 and 0.5; advantages +1 and -1.
    log_probs = torch.tensor([math.log(1.5), math.log(0.5)], dtype=torch.float64, requires_grad=True)
    return dict(log_probs=log_probs, old_log_probs=torch.zeros(2, dtype=torch.float64),
                advantages=torch.tensor([1.0, -1.0], dtype=torch.float64),
                new_values=torch.tensor([1.0, 2.0], dtype=torch.float64),
                old_values=torch.zeros(2, dtype=torch.float64), returns=torch.tensor([1.0, 0.0], dtype=torch.float64),
                entropy=torch.tensor([0.6, 0.4], dtype=torch.float64))


def test_ppo_loss_by_hand():
    cfg = PPOLossConfig(clip_ratio=0.2, clip_value=None, vf_coef=0.5, ent_coef=0.01, normalize_advantages=False)
    loss, m = actor_critic_loss(**_inputs(), config=cfg)
    # policy: sample 0 max(-1.5, -1.2) = -1.2; sample 1 max(0.5, 0.8) = 0.8 -> mean -0.2 (both clipped)
    # value: 1/2 mean((1-1)^2, (2-0)^2) = 1.0; entropy mean 0.5
    assert m["pg_loss"].item() == pytest.approx(-0.2)
    assert m["vf_loss"].item() == pytest.approx(1.0)
    assert m["clipfrac"].item() == pytest.approx(1.0)
    assert loss.item() == pytest.approx(-0.2 + 0.5 * 1.0 - 0.01 * 0.5)
    loss.backward()


def test_value_clipping_by_hand():
    cfg = PPOLossConfig(clip_ratio=0.2, clip_value=0.5, vf_coef=1.0, ent_coef=0.0, normalize_advantages=False)
    _, m = actor_critic_loss(**_inputs(), config=cfg)
    # sample 0: max(0, (0.5-1)^2) = 0.25; sample 1: max(4, (0.5-0)^2) = 4 -> 1/2 * mean = 1.0625
    assert m["vf_loss"].item() == pytest.approx(1.0625)
    assert m["vf_clipfrac"].item() == pytest.approx(0.5)


def test_advantages_are_normalised_over_the_minibatch_or_with_given_statistics():
    adv = torch.tensor([1.0, 3.0], dtype=torch.float64)
    assert normalize(adv).tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)], abs=1e-7)
    assert normalize(adv, (torch.tensor(1.0), torch.tensor(2.0))).tolist() == pytest.approx([0.0, 1.0], abs=1e-7)
    inputs = _inputs()
    inputs["advantages"] = adv
    cfg = PPOLossConfig(clip_ratio=0.2, normalize_advantages=True, vf_coef=0.0)
    _, m = actor_critic_loss(**inputs, config=cfg)
    a0, a1 = -1 / math.sqrt(2), 1 / math.sqrt(2)
    want = (max(-a0 * 1.5, -a0 * 1.2) + max(-a1 * 0.5, -a1 * 0.8)) / 2
    assert m["pg_loss"].item() == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("dual_clip", [math.inf, 3.0])
def test_the_dense_path_of_ppo_clip_loss_equals_its_masked_path(dual_clip):
    # response_mask None (environment steps) skips the masking; loss and gradient are the same.
    from hybridflow.algorithms import PolicyLossConfig
    from hybridflow.algorithms.policy_loss import ppo_clip_loss

    g = torch.Generator().manual_seed(0)
    old, adv = (torch.randn(64, generator=g, dtype=torch.float64) for _ in range(2))
    new = (old + torch.randn(64, generator=g, dtype=torch.float64) * 0.5).requires_grad_()
    config = PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.3, clip_ratio_c=dual_clip)
    dense, dense_m = ppo_clip_loss(old, new, adv, None, config=config)
    (dense_grad,) = torch.autograd.grad(dense, new)
    masked, masked_m = ppo_clip_loss(old[:, None], new[:, None], adv[:, None], torch.ones(64, 1), config=config)
    (masked_grad,) = torch.autograd.grad(masked, new)
    assert dense.item() == pytest.approx(masked.item(), abs=1e-12)
    assert torch.allclose(dense_grad, masked_grad, atol=1e-12)
    for key in ("pg_clipfrac", "ppo_kl"):
        assert dense_m[key].item() == pytest.approx(masked_m[key].item(), abs=1e-12)
