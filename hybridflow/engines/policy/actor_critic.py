"""`ActorCritic`: the PPO network of environment tasks (policy head + value head on MLPs).

    net = ActorCritic(NetworkSpec(obs_dim=4, action=ActionSpec("discrete", (2,)), hidden_size=(64, 64)))
    action, log_prob, value = net.act(obs, generator)      # no grad; stored action, see distributions.py
    log_prob, entropy, value = net.evaluate(obs, action)    # with grad, for the update

Observations go through the `ObsNormalizer` first (identity unless enabled). With
`shared=True` the value head sits on the policy's trunk; otherwise the value function has
its own MLP (`value_hidden_size`), which is the default of most PPO implementations.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hybridflow.engines.policy.distributions import make_head
from hybridflow.engines.policy.mlp import ObsNormalizer, linear, mlp, out_width
from hybridflow.engines.policy.spaces import ActionSpec

Tensor = torch.Tensor


@dataclass(frozen=True)
class NetworkSpec:
    """Everything that shapes a policy network (filled from the env and the `policy` config)."""

    obs_dim: int
    action: ActionSpec
    hidden_size: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    shared: bool = False
    value_hidden_size: tuple[int, ...] | None = None  # None: the same as hidden_size
    ortho_init: bool = True
    log_std_init: float = 0.0
    normalize_obs: bool = False
    clip_obs: float = 10.0


class ActorCritic(nn.Module):
    def __init__(self, spec: NetworkSpec) -> None:
        super().__init__()
        self.spec = spec
        self.obs_norm = ObsNormalizer(spec.obs_dim, spec.normalize_obs, spec.clip_obs)
        self.pi_trunk = mlp(spec.obs_dim, spec.hidden_size, spec.activation, spec.ortho_init)
        self.head = make_head(spec.action, out_width(spec.obs_dim, spec.hidden_size), spec.ortho_init,
                              spec.log_std_init)
        value_hidden = spec.hidden_size if spec.value_hidden_size is None else spec.value_hidden_size
        self.v_trunk = None if spec.shared else mlp(spec.obs_dim, value_hidden, spec.activation, spec.ortho_init)
        width = out_width(spec.obs_dim, spec.hidden_size if spec.shared else value_hidden)
        self.value_head = linear(width, 1, 1.0 if spec.ortho_init else None)

    def _features(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        x = self.obs_norm(obs)
        pi = self.pi_trunk(x)
        return pi, (pi if self.v_trunk is None else self.v_trunk(x))

    @torch.no_grad()
    def act(self, obs: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
        """Sample (stored action, its log-prob [B], value [B]) for raw observations [B, D]."""
        pi, v = self._features(obs)
        action, log_prob = self.head.sample(pi, generator)
        return action, log_prob, self.value_head(v).squeeze(-1)

    def evaluate(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(log-prob [B], entropy [B], value [B]) of stored actions under the current weights."""
        pi, v = self._features(obs)
        log_prob, entropy = self.head.log_prob_entropy(pi, action)
        return log_prob, entropy, self.value_head(v).squeeze(-1)

    @torch.no_grad()
    def value(self, obs: Tensor) -> Tensor:
        _, v = self._features(obs)
        return self.value_head(v).squeeze(-1)

    @torch.no_grad()
    def deterministic(self, obs: Tensor) -> Tensor:
        """The most likely stored action (greedy evaluation)."""
        pi, _ = self._features(obs)
        return self.head.deterministic(pi)
