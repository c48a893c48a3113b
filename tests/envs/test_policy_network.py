"""The policy networks of environment tasks: MLP widths and activation from the config,
shared or separate value network (which parameters the value loss reaches), orthogonal
init with the PPO gains, and the running observation normaliser against numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from hybridflow.engines.policy.actor_critic import ActorCritic, NetworkSpec
from hybridflow.engines.policy.mlp import ObsNormalizer
from hybridflow.engines.policy.spaces import ActionSpec

DISCRETE = ActionSpec("discrete", nvec=(3,), start=(0,))


def _linears(module: nn.Module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def test_hidden_sizes_and_activation_shape_the_trunks():
    net = ActorCritic(NetworkSpec(obs_dim=5, action=DISCRETE, hidden_size=(32, 16), activation="gelu",
                                  value_hidden_size=(8,)))
    assert [(l.in_features, l.out_features) for l in _linears(net.pi_trunk)] == [(5, 32), (32, 16)]
    assert [(l.in_features, l.out_features) for l in _linears(net.v_trunk)] == [(5, 8)]
    assert sum(isinstance(m, nn.GELU) for m in net.pi_trunk) == 2
    assert net.value_head.in_features == 8
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        ActorCritic(NetworkSpec(obs_dim=5, action=DISCRETE, activation="swish"))


@pytest.mark.parametrize("shared", [True, False])
def test_the_value_loss_reaches_the_policy_trunk_only_when_shared(shared):
    net = ActorCritic(NetworkSpec(obs_dim=4, action=DISCRETE, hidden_size=(8, 8), shared=shared))
    assert (net.v_trunk is None) == shared
    _, _, values = net.evaluate(torch.randn(6, 4), torch.zeros(6, 1, dtype=torch.long))  # stored: one index per dimension
    values.square().mean().backward()
    policy_trunk_grads = [p.grad for p in net.pi_trunk.parameters()]
    if shared:
        assert all(g is not None and g.abs().sum() > 0 for g in policy_trunk_grads)
    else:
        assert all(g is None for g in policy_trunk_grads)
        assert all(p.grad is not None for p in net.v_trunk.parameters())


def test_orthogonal_init_uses_the_ppo_gains_and_can_be_turned_off():
    net = ActorCritic(NetworkSpec(obs_dim=4, action=DISCRETE, hidden_size=(64, 32), ortho_init=True))
    for layer, gain in [*((l, math.sqrt(2.0)) for l in _linears(net.pi_trunk)),
                        (_linears(net.head)[0], 0.01), (net.value_head, 1.0)]:
        w = layer.weight.detach().double()
        gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w  # the smaller side is orthonormal
        assert torch.allclose(gram, gain**2 * torch.eye(len(gram), dtype=torch.float64), atol=1e-5)
        assert torch.count_nonzero(layer.bias) == 0
    default = ActorCritic(NetworkSpec(obs_dim=4, action=DISCRETE, hidden_size=(64, 32), ortho_init=False))
    w = _linears(default.pi_trunk)[0].weight.detach().double()
    assert not torch.allclose(w.T @ w, 2.0 * torch.eye(4, dtype=torch.float64), atol=1e-2)
    assert torch.count_nonzero(_linears(default.pi_trunk)[0].bias) > 0  # PyTorch's default init


def test_observation_normaliser_tracks_the_running_mean_and_variance():
    rng = np.random.default_rng(0)
    a, b = rng.normal(3.0, 2.0, (50, 3)), rng.normal(-1.0, 0.5, (30, 3))
    norm = ObsNormalizer(3, enabled=True, clip=5.0)
    norm.update(torch.tensor(a, dtype=torch.float32))
    norm.update(torch.tensor(b, dtype=torch.float32))
    both = np.concatenate([a, b])
    assert np.allclose(norm.mean.numpy(), both.mean(0), atol=1e-5) and np.allclose(norm.var.numpy(), both.var(0), atol=1e-4)
    x = torch.tensor([[100.0, 0.0, -100.0]])
    want = np.clip((x.numpy() - both.mean(0)) / np.sqrt(both.var(0) + 1e-8), -5, 5)
    assert np.allclose(norm(x).numpy(), want, atol=1e-5) and norm(x).abs().max() == 5.0
    off = ObsNormalizer(3, enabled=False)
    off.update(x)
    assert torch.equal(off(x), x) and off.count == 0
