"""DAPO (dynamic sampling, overlong shaping) and Safe-RLHF (costs, multiplier, combination)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hybridflow.algorithms import (
    AdvantageConfig,
    LagrangeMultiplier,
    combine_reward_cost_advantages,
    compute_cost_advantages,
    dynamic_sampling_filter,
    overlong_reward_penalty,
)


def test_dynamic_sampling_drops_all_equal_groups_and_reports():
    uid = np.array(["a", "a", "b", "b", "c", "d", "d"])
    keep, m = dynamic_sampling_filter(uid, np.array([1.0, 0.0, 1.0, 1.0, 0.5, 0.0, 0.0]))
    assert keep.tolist() == [True, True, False, False, False, False, False]
    assert m == {
        "num_groups": 4.0, "kept_groups": 1.0, "dropped_groups": 3.0,
        "kept_samples": 2.0, "dropped_samples": 5.0, "kept_group_ratio": 0.25,
    }


def test_dynamic_sampling_accepts_tensors_and_empty_batches():
    keep, _ = dynamic_sampling_filter(np.array([0, 0]), torch.tensor([0.0, 1.0]))
    assert keep.tolist() == [True, True]
    keep, m = dynamic_sampling_filter(np.array([], dtype=object), np.array([]))
    assert keep.shape == (0,) and m["num_groups"] == 0.0
    with pytest.raises(ValueError, match="NaN"):
        dynamic_sampling_filter(np.array([0, 0]), np.array([0.0, float("nan")]))


def test_overlong_penalty_hand_computed():
    lengths = torch.tensor([5, 6, 7, 8, 10, 12])
    # L = 10, buffer 4: no penalty up to 6, linear to -factor at 10, capped beyond.
    got = overlong_reward_penalty(lengths, max_response_length=10, overlong_buffer_len=4, penalty_factor=1.0)
    assert got.tolist() == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    half = overlong_reward_penalty(lengths, 10, 4, 0.5)
    assert half.tolist() == [0.0, 0.0, -0.125, -0.25, -0.5, -0.5]


def test_overlong_penalty_validation():
    with pytest.raises(ValueError, match="overlong_buffer_len"):
        overlong_reward_penalty(torch.tensor([1]), 10, 0, 1.0)
    with pytest.raises(ValueError, match="overlong_buffer_len"):
        overlong_reward_penalty(torch.tensor([1]), 10, 11, 1.0)
    with pytest.raises(ValueError, match="penalty_factor"):
        overlong_reward_penalty(torch.tensor([1]), 10, 4, -1.0)


def test_cost_advantages_are_gae_on_costs():
    costs = torch.tensor([[0.0, 2.0]], dtype=torch.float64)
    cost_values = torch.tensor([[0.5, 1.0]], dtype=torch.float64)
    cfg = AdvantageConfig(gamma=1.0, lam=1.0, whiten_gae_advantages=False)
    adv, ret = compute_cost_advantages(costs, torch.ones(1, 2), cost_values, cfg)
    assert adv[0].tolist() == pytest.approx([1.5, 1.0]) and ret[0].tolist() == pytest.approx([2.0, 2.0])


def test_lagrange_multiplier_update_in_log_space():
    lag = LagrangeMultiplier(init=1.0, lr=0.1, cost_limit=0.0)
    assert lag.update(2.0) == pytest.approx(math.exp(0.2))  # ln l += 0.1 * 1 * (2 - 0)
    lag.update(-1.0)
    assert lag.value == pytest.approx(math.exp(0.2 - 0.1 * math.exp(0.2)))
    capped = LagrangeMultiplier(init=1.0, lr=1.0, cost_limit=0.0, max=1.1)
    capped.update(5.0)
    assert capped.value == pytest.approx(1.1)
    for _ in range(100):  # a long run of violations stays finite
        lag.update(1e6)
    assert math.isfinite(lag.value)


def test_lagrange_multiplier_state_and_validation():
    lag = LagrangeMultiplier(init=0.5, lr=0.2, cost_limit=1.0, max=4.0)
    lag.update(3.0)
    other = LagrangeMultiplier(init=1.0, lr=0.0, cost_limit=0.0)
    other.load_state_dict(lag.state_dict())
    assert (other.value, other.lr, other.cost_limit, other.max) == (lag.value, 0.2, 1.0, 4.0)
    with pytest.raises(ValueError, match="init"):
        LagrangeMultiplier(init=0.0, lr=0.1, cost_limit=0.0)
    with pytest.raises(ValueError, match="max"):
        LagrangeMultiplier(init=2.0, lr=0.1, cost_limit=0.0, max=1.0)


def test_combined_advantage_hand_computed():
    r = torch.tensor([1.0, 2.0])
    c = torch.tensor([0.5, -1.0])
    assert combine_reward_cost_advantages(r, c, 1.0).tolist() == [0.25, 1.5]
    assert torch.equal(combine_reward_cost_advantages(r, c, 0.0), r)
    with pytest.raises(ValueError, match="lagrange_value"):
        combine_reward_cost_advantages(r, c, -1.0)
