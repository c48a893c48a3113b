"""Action-space handling: Gymnasium spaces -> ActionSpec, categorical and tanh-squashed
Gaussian heads (log-probs against hand computations and torch.distributions), and the
mapping of stored actions onto what the environment accepts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch.distributions import AffineTransform, Normal, TanhTransform, TransformedDistribution

from hybridflow.engines.policy.distributions import (
    CategoricalHead,
    SquashedGaussianHead,
    squashed_gaussian_log_prob,
    tanh_log_abs_det,
)
from hybridflow.engines.policy.spaces import ActionSpec
from hybridflow.envs.spaces import action_spec, obs_dim, obs_encoder


def test_specs_of_gymnasium_spaces():
    assert action_spec(spaces.Discrete(3, start=1)) == ActionSpec("discrete", nvec=(3,), start=(1,))
    assert action_spec(spaces.MultiDiscrete([3, 2])).nvec == (3, 2)
    assert action_spec(spaces.MultiBinary(4)).nvec == (2, 2, 2, 2)
    box = action_spec(spaces.Box(low=np.array([-2.0, 0.0], np.float32), high=np.array([2.0, 1.0], np.float32)))
    assert box.is_continuous and box.dim == 2 and box.low == (-2.0, 0.0) and box.high == (2.0, 1.0)
    assert obs_dim(spaces.Box(-1, 1, shape=(2, 3))) == 6 and obs_dim(spaces.Discrete(5)) == 5
    assert obs_encoder(spaces.Discrete(4, start=2))(3).tolist() == [0.0, 1.0, 0.0, 0.0]


def test_unsupported_spaces_say_what_to_do():
    with pytest.raises(ValueError, match="RescaleAction"):
        action_spec(spaces.Box(low=-np.inf, high=np.inf, shape=(2,)))
    with pytest.raises(ValueError, match="not supported"):
        action_spec(spaces.Dict({"a": spaces.Discrete(2)}))
    with pytest.raises(ValueError, match="FlattenObservation"):
        obs_dim(spaces.Dict({"a": spaces.Discrete(2)}))
    with pytest.raises(ValueError, match="low < high"):
        ActionSpec("box", low=(1.0,), high=(1.0,))


def _categorical(spec: ActionSpec, logits: list[float]) -> CategoricalHead:
    head = CategoricalHead(spec, n_in=1, gain=None)
    with torch.no_grad():
        head.logits.weight.zero_()
        head.logits.bias.copy_(torch.tensor(logits))
    return head


def test_categorical_log_prob_entropy_and_sampling_by_hand():
    head = _categorical(ActionSpec("discrete", nvec=(2,), start=(1,)), [0.0, math.log(9.0)])  # p = [0.1, 0.9]
    feats = torch.zeros(4, 1)
    log_prob, entropy = head.log_prob_entropy(feats, torch.tensor([[0], [1], [1], [0]]))
    assert log_prob.tolist() == pytest.approx([math.log(0.1), math.log(0.9), math.log(0.9), math.log(0.1)], abs=1e-6)
    assert entropy[0].item() == pytest.approx(-(0.1 * math.log(0.1) + 0.9 * math.log(0.9)), abs=1e-6)
    actions, sampled_log_prob = head.sample(torch.zeros(20_000, 1), torch.Generator().manual_seed(0))
    assert actions.float().mean().item() == pytest.approx(0.9, abs=0.01)
    assert torch.equal(sampled_log_prob, head.log_prob_entropy(torch.zeros(20_000, 1), actions)[0])
    assert head.to_env(torch.tensor([[0], [1]])).tolist() == [1, 2]  # Discrete(start=1)


def test_multi_discrete_log_prob_is_the_sum_over_dimensions():
    head = _categorical(ActionSpec("multi_discrete", nvec=(3, 2), start=(0, 0)), [1.0, 2.0, 3.0, 0.5, -0.5])
    log_prob, entropy = head.log_prob_entropy(torch.zeros(1, 1), torch.tensor([[2, 1]]))
    first = torch.log_softmax(torch.tensor([1.0, 2.0, 3.0]), -1)
    second = torch.log_softmax(torch.tensor([0.5, -0.5]), -1)
    assert log_prob.item() == pytest.approx((first[2] + second[1]).item(), abs=1e-6)
    want_entropy = -(first.exp() * first).sum() - (second.exp() * second).sum()
    assert entropy.item() == pytest.approx(want_entropy.item(), abs=1e-6)
    assert head.to_env(torch.tensor([[2, 1]])).tolist() == [[2, 1]]


def test_squashed_gaussian_log_prob_by_hand():
    # x = 0 + 2 tanh(u) on [-2, 2], u ~ N(0.5, 0.8), at u = 1:
    # log p(x) = log N(1; 0.5, 0.8) - log(1 - tanh(1)^2) - log 2
    mean, std, u = 0.5, 0.8, 1.0
    log_normal = -0.5 * ((u - mean) / std) ** 2 - math.log(std) - 0.5 * math.log(2 * math.pi)
    want = log_normal - math.log(1 - math.tanh(u) ** 2) - math.log(2.0)
    got = squashed_gaussian_log_prob(torch.tensor([[mean]], dtype=torch.float64),
                                     torch.tensor([[math.log(std)]], dtype=torch.float64),
                                     torch.tensor([[u]], dtype=torch.float64), torch.tensor([2.0], dtype=torch.float64))
    assert got.item() == pytest.approx(want, abs=1e-12)


def test_squashed_gaussian_matches_torch_distributions_and_stays_finite():
    g = torch.Generator().manual_seed(0)
    mean, log_std = torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(5, 3, generator=g, dtype=torch.float64) * 0.3
    u = mean + log_std.exp() * torch.randn(5, 3, generator=g, dtype=torch.float64)
    low, high = torch.tensor([-1.0, 0.0, -3.0], dtype=torch.float64), torch.tensor([1.0, 2.0, 5.0], dtype=torch.float64)
    half, center = (high - low) / 2, (high + low) / 2
    ref = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform(), AffineTransform(center, half)])
    ours = squashed_gaussian_log_prob(mean, log_std, u, half)
    assert torch.allclose(ours, ref.log_prob(center + half * torch.tanh(u)).sum(-1), atol=1e-8)
    # Far in the tails 1 - tanh(u)^2 underflows to 0; the stable form keeps log|det| finite.
    assert torch.isfinite(tanh_log_abs_det(torch.tensor([-40.0, 40.0]))).all()


def test_box_head_maps_any_sample_into_the_bounds_and_scores_its_own_samples():
    spec = ActionSpec("box", low=(-2.0, 0.0), high=(2.0, 1.0))
    head = SquashedGaussianHead(spec, n_in=4, gain=0.01, log_std_init=0.0)
    feats = torch.randn(256, 4, generator=torch.Generator().manual_seed(1))
    u, log_prob = head.sample(feats, torch.Generator().manual_seed(2))
    again, _ = head.log_prob_entropy(feats, u)
    assert torch.allclose(log_prob, again)
    extreme = head.to_env(torch.tensor([[-50.0, 50.0], [50.0, -50.0]]))
    assert extreme.tolist() == [[-2.0, 1.0], [2.0, 0.0]]
    inside = head.to_env(u)
    assert (inside[:, 0] >= -2).all() and (inside[:, 0] <= 2).all() and (inside[:, 1] >= 0).all()
