"""GAE over environment rows: equals the LM `compute_gae` where the math is the same (one
episode ending in a terminal state), and handles truncation and rollout ends by hand."""

from __future__ import annotations

import pytest
import torch

from hybridflow.algorithms import AdvantageConfig, compute_gae
from hybridflow.algorithms.env_advantages import compute_env_gae


def test_one_terminal_episode_per_row_equals_compute_gae():
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(3, 6, generator=g, dtype=torch.float64), torch.randn(3, 6, generator=g, dtype=torch.float64)
    terminated = torch.zeros(3, 6, dtype=torch.bool)
    terminated[:, -1] = True
    next_values = torch.cat([values[:, 1:], torch.zeros(3, 1, dtype=torch.float64)], dim=1)
    adv, ret = compute_env_gae(rewards, values, next_values, terminated, terminated, gamma=0.9, lam=0.8)
    want_adv, want_ret = compute_gae(rewards, torch.ones(3, 6), values=values,
                                     config=AdvantageConfig(gamma=0.9, lam=0.8, whiten_gae_advantages=False))
    assert torch.allclose(adv, want_adv) and torch.allclose(ret, want_ret)


def test_truncation_bootstraps_from_the_final_observation_and_cuts_the_chain():
    gamma, lam = 0.9, 0.8
    rewards, values = torch.tensor([[1.0, 2.0]]), torch.tensor([[0.5, 0.25]])
    # step 0 is truncated (V(final obs) = 2), step 1 starts a new episode and ends the segment (V = 1).
    next_values, dones = torch.tensor([[2.0, 1.0]]), torch.tensor([[True, False]])
    adv, ret = compute_env_gae(rewards, values, next_values, torch.zeros(1, 2, dtype=torch.bool), dones,
                               gamma=gamma, lam=lam)
    a1 = 2.0 + gamma * 1.0 - 0.25
    a0 = 1.0 + gamma * 2.0 - 0.5  # no gamma*lam*a1: the episode ended
    assert adv[0].tolist() == pytest.approx([a0, a1])
    assert ret[0].tolist() == pytest.approx([a0 + 0.5, a1 + 0.25])


def test_an_episode_running_through_the_segment_chains_advantages_and_terminal_zeroes_next_value():
    gamma, lam = 0.9, 0.8
    rewards, values = torch.tensor([[1.0, 0.0, 3.0]]), torch.tensor([[0.5, 0.25, 0.75]])
    next_values = torch.tensor([[0.25, 0.75, 99.0]])  # 99 at a terminal step must not count
    terminated = torch.tensor([[False, False, True]])
    adv, _ = compute_env_gae(rewards, values, next_values, terminated, terminated, gamma=gamma, lam=lam)
    a2 = 3.0 - 0.75
    a1 = 0.0 + gamma * 0.75 - 0.25 + gamma * lam * a2
    a0 = 1.0 + gamma * 0.25 - 0.5 + gamma * lam * a1
    assert adv[0].tolist() == pytest.approx([a0, a1, a2])


def test_bad_shapes_and_ranges_raise():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="next_values shape"):
        compute_env_gae(x, x, torch.zeros(2, 2), x.bool(), x.bool(), gamma=0.9, lam=0.9)
    with pytest.raises(ValueError, match="gamma and lam"):
        compute_env_gae(x, x, x, x.bool(), x.bool(), gamma=1.5, lam=0.9)
