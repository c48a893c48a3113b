"""Token-level estimators (gae, reinforce_plus_plus, remax): hand-computed cases and masking."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.algorithms import AdvantageConfig, compute_advantage, masked_whiten

from ._helpers import mask_from_lengths, poison_masked

NO_WHITEN = AdvantageConfig(gamma=0.9, lam=0.8, whiten_gae_advantages=False)


def test_gae_hand_computed():
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.6, 0.7]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    adv, ret = compute_advantage("gae", rewards, mask, values=values, config=NO_WHITEN)
    # delta = [0.9*0.6-0.5, 0.9*0.7-0.6, 1-0.7] = [0.04, 0.03, 0.3]; gamma*lam = 0.72
    a2 = 0.3
    a1 = 0.03 + 0.72 * a2
    a0 = 0.04 + 0.72 * a1
    assert adv[0].tolist() == pytest.approx([a0, a1, a2])
    assert ret[0].tolist() == pytest.approx([a0 + 0.5, a1 + 0.6, a2 + 0.7])


def test_gae_returns_come_from_unwhitened_advantages():
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(3, 5, generator=g, dtype=torch.float64)
    values = torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = mask_from_lengths([5, 3, 1], 5)
    raw, ret_raw = compute_advantage("gae", rewards, mask, values=values, config=NO_WHITEN)
    white_cfg = AdvantageConfig(gamma=0.9, lam=0.8, whiten_gae_advantages=True)
    white, ret = compute_advantage("gae", rewards, mask, values=values, config=white_cfg)
    torch.testing.assert_close(ret, ret_raw)
    torch.testing.assert_close(ret, torch.where(mask, raw + values, torch.zeros(())))
    torch.testing.assert_close(white, masked_whiten(raw, mask))


def test_gae_trailing_padding_and_inner_masked_tokens_are_skipped():
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.6, 0.7]], dtype=torch.float64)
    full, full_ret = compute_advantage("gae", rewards, torch.ones(1, 3), values=values, config=NO_WHITEN)
    # The same response with a masked token (e.g. a tool output) inserted and padding after.
    r2 = torch.tensor([[0.0, 5.0, 0.0, 1.0, 7.0]], dtype=torch.float64)
    v2 = torch.tensor([[0.5, 9.0, 0.6, 0.7, 3.0]], dtype=torch.float64)
    m2 = torch.tensor([[1, 0, 1, 1, 0]])
    adv, ret = compute_advantage("gae", r2, m2, values=v2, config=NO_WHITEN)
    assert adv[0, [0, 2, 3]].tolist() == pytest.approx(full[0].tolist())
    assert ret[0, [0, 2, 3]].tolist() == pytest.approx(full_ret[0].tolist())
    assert adv[0, [1, 4]].tolist() == [0.0, 0.0] and ret[0, [1, 4]].tolist() == [0.0, 0.0]


def test_gae_with_gamma_lam_one_and_zero_values_is_reward_to_go():
    rewards = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    cfg = AdvantageConfig(whiten_gae_advantages=False)
    adv, _ = compute_advantage("gae", rewards, torch.ones(1, 3), values=torch.zeros(1, 3), config=cfg)
    assert adv[0].tolist() == [6.0, 5.0, 3.0]


def test_gae_needs_values():
    with pytest.raises(ValueError, match="values"):
        compute_advantage("gae", torch.zeros(1, 2), torch.ones(1, 2), config=AdvantageConfig())


def test_reinforce_plus_plus_hand_computed():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 9.0]], dtype=torch.float64)
    mask = mask_from_lengths([3, 2], 3)
    adv, ret = compute_advantage("reinforce_plus_plus", rewards, mask, config=AdvantageConfig(gamma=0.5))
    # Returns reset per response: row 0 [0.25, 0.5, 1], row 1 [1, 2] (the 9 is padding).
    assert ret.tolist() == [[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]
    # Batch whitening over the 5 tokens: mean 0.95, unbiased var 1.8 / 4 = 0.45.
    expected = [(v - 0.95) / math.sqrt(0.45 + 1e-8) for v in (0.25, 0.5, 1.0, 1.0, 2.0)]
    assert adv[mask].tolist() == pytest.approx(expected)
    assert adv[1, 2].item() == 0.0


def test_reinforce_plus_plus_discounting_skips_inner_masked_tokens():
    rewards = torch.tensor([[0.0, 3.0, 0.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 0, 1, 1]])
    _, ret = compute_advantage("reinforce_plus_plus", rewards, mask, config=AdvantageConfig(gamma=0.5))
    assert ret.tolist() == [[0.25, 0.0, 0.5, 1.0]]


def test_remax_hand_computed():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0]], dtype=torch.float64)
    mask = mask_from_lengths([3, 2], 3)
    baseline = torch.tensor([0.4, 1.0], dtype=torch.float64)
    adv, ret = compute_advantage("remax", rewards, mask, config=AdvantageConfig(), baseline_rewards=baseline)
    assert ret.tolist() == [[1.0, 1.0, 1.0], [0.5, 0.5, 0.0]]
    torch.testing.assert_close(adv, torch.tensor([[0.6, 0.6, 0.6], [-0.5, -0.5, 0.0]], dtype=torch.float64))


def test_remax_needs_baseline_rewards():
    with pytest.raises(ValueError, match="baseline_rewards"):
        compute_advantage("remax", torch.zeros(2, 2), torch.ones(2, 2), config=AdvantageConfig())
    with pytest.raises(ValueError, match="baseline_rewards"):
        compute_advantage(
            "remax", torch.zeros(2, 2), torch.ones(2, 2), config=AdvantageConfig(), baseline_rewards=torch.zeros(3)
        )


@pytest.mark.parametrize("name", ["gae", "reinforce_plus_plus", "remax"])
def test_masked_positions_never_change_token_level_estimators(name):
    g = torch.Generator().manual_seed(3)
    rewards = torch.randn(4, 6, generator=g, dtype=torch.float64)
    values = torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = torch.rand(4, 6, generator=g) < 0.6
    mask[3] = False  # an empty response
    cfg = AdvantageConfig(gamma=0.9, lam=0.95)
    extra = {"baseline_rewards": torch.randn(4, generator=g, dtype=torch.float64)}
    clean = compute_advantage(name, rewards, mask, values=values, config=cfg, **extra)
    dirty = compute_advantage(
        name, poison_masked(rewards, mask, 1, nan=True), mask, values=poison_masked(values, mask, 2), config=cfg, **extra
    )
    for c, d in zip(clean, dirty):
        torch.testing.assert_close(c, d, rtol=0, atol=0)
        assert torch.isfinite(d).all() and d[~mask].abs().sum() == 0


def test_config_validation():
    with pytest.raises(ValueError, match="gamma"):
        AdvantageConfig(gamma=1.5)
    with pytest.raises(ValueError, match="lam"):
        AdvantageConfig(lam=-0.1)
    with pytest.raises(ValueError, match="epsilon"):
        AdvantageConfig(epsilon=0.0)
